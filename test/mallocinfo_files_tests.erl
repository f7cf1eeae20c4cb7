%% Every writer of a file the caller names (mallocinfo:info/1,
%% mallocinfo_heap:dump/1, mallocinfo_heapmap:render/2, and under the last
%% the Erlang writers' one helper, mallocinfo_file:write_all/3) replaces a regular
%% file or fills a missing name, and refuses anything else, leaving it
%% exactly as it was: a directory with `eisdir'; a symbolic link (to a file,
%% or dangling), a character or block device, a FIFO and a unix socket with
%% `eexist'. Every target is made inside a scratch directory made by
%% `mktemp -d' for the test and removed after it; nothing else is touched.
-module(mallocinfo_files_tests).
-include_lib("eunit/include/eunit.hrl").
-include_lib("kernel/include/file.hrl").

%%% Fixtures -----------------------------------------------------------------

%% Runs Fun(Dir, Targets) in a fresh scratch directory holding one target of
%% each kind: [{Kind, Path, ExpectedReason}].
with_targets(Fun) ->
    Dir = string:trim(os:cmd("mktemp -d")),
    true = lists:prefix(string:trim(os:cmd("dirname $(mktemp -u)")), Dir),
    {ok, Sock} = socket:open(local, stream),
    try
        Fun(Dir, make_targets(Dir, Sock))
    after
        socket:close(Sock),
        ok = file:del_dir_r(Dir)
    end.

make_targets(Dir, Sock) ->
    At = fun(Name) -> filename:join(Dir, Name) end,
    ok = file:make_dir(At("directory")),
    ok = file:write_file(At("directory/inside"), <<"kept">>),
    ok = file:write_file(At("link-target"), <<"the link's target">>),
    ok = file:make_symlink("link-target", At("symlink")),
    ok = file:make_symlink("nothing-here", At("dangling")),
    %% Device nodes with /dev/null's numbers (and a RAM disk's for the block
    %% device): made here, never opened. mknod needs root.
    "" = os:cmd("mknod " ++ At("char-device") ++ " c 1 3 2>&1"),
    "" = os:cmd("mknod " ++ At("block-device") ++ " b 1 3 2>&1"),
    "" = os:cmd("mkfifo " ++ At("fifo") ++ " 2>&1"),
    ok = socket:bind(Sock, #{family => local, path => At("socket")}),
    Targets = [{directory, At("directory"), eisdir},
               {symlink, At("symlink"), eexist},
               {dangling_symlink, At("dangling"), eexist},
               {char_device, At("char-device"), eexist},
               {block_device, At("block-device"), eexist},
               {fifo, At("fifo"), eexist},
               {socket, At("socket"), eexist}],
    %% Each is what its name says.
    Types = [{K, (info(P))#file_info.type} || {K, P, _} <- Targets],
    ?assertEqual([{directory, directory}, {symlink, symlink}, {dangling_symlink, symlink},
                  {char_device, device}, {block_device, device}, {fifo, other},
                  {socket, other}], Types),
    Targets.

info(Path) ->
    {ok, I} = file:read_link_info(Path, [raw]),
    I.

%% What identifies an entry: inode, type, mode, device numbers, and what it
%% holds (a link's text and its target's bytes, a file's bytes, a
%% directory's names).
fingerprint(Path) ->
    #file_info{inode = Ino, type = Type, mode = Mode, major_device = Maj,
               minor_device = Min} = info(Path),
    Content = case Type of
                  symlink ->
                      {ok, To} = file:read_link(Path),
                      {To, file:read_file(Path)};
                  regular -> file:read_file(Path);
                  directory -> file:list_dir(Path);
                  _ -> none
              end,
    {Ino, Type, Mode, Maj, Min, Content}.

entries(Dir) ->
    {ok, Names} = file:list_dir(Dir),
    lists:sort(Names).

%% Every target refused with its reason and left as it was, and nothing new
%% in the directory (no temporary left beside a target).
refuses_all(Write, Check) ->
    with_targets(
      fun(Dir, Targets) ->
              Before = entries(Dir),
              [begin
                   Print = fingerprint(Path),
                   ?assertEqual({Kind, {error, Reason}}, {Kind, Write(Path)}),
                   ?assertEqual({Kind, Print}, {Kind, fingerprint(Path)})
               end || {Kind, Path, Reason} <- Targets],
              ?assertEqual(Before, entries(Dir)),
              %% A missing name is filled, a regular file replaced by a new
              %% file (another inode), whole.
              Fresh = filename:join(Dir, "fresh"),
              ok = ok_of(Write(Fresh)),
              ?assertEqual(regular, (info(Fresh))#file_info.type),
              Plain = filename:join(Dir, "plain"),
              ok = file:write_file(Plain, <<"old contents">>),
              Old = info(Plain),
              ok = ok_of(Write(Plain)),
              New = info(Plain),
              ?assertEqual(regular, New#file_info.type),
              ?assertNotEqual(Old#file_info.inode, New#file_info.inode),
              Check(Fresh),
              Check(Plain)
      end).

ok_of(ok) -> ok;
ok_of({ok, _}) -> ok.

%%% The writers --------------------------------------------------------------

info_file_test() ->
    refuses_all(fun mallocinfo:info/1,
                fun(P) -> ?assertMatch({ok, <<"<malloc version=", _/binary>>},
                                       file:read_file(P))
                end).

heap_dump_test_() ->
    {timeout, 60,
     fun() ->
             refuses_all(fun mallocinfo_heap:dump/1,
                         fun(P) -> ?assertMatch({ok, _}, mallocinfo_heapmap:read_summary(P)) end)
     end}.

%% Issue 28: any legal name, up to NAME_MAX (255) bytes, is written: the
%% temporary beside it has a name that fits too. One more byte is the
%% system's enametoolong.
long_names_test_() ->
    {timeout, 60,
     fun() ->
             with_targets(
               fun(Dir, _) ->
                       Before = entries(Dir),
                       Name = fun(C, N) -> filename:join(Dir, lists:duplicate(N, C)) end,
                       [begin
                            ?assertEqual({N, ok}, {N, mallocinfo:info(Name($i, N))}),
                            ?assertMatch({N, {ok, _}}, {N, mallocinfo_heap:dump(Name($d, N))}),
                            ?assertMatch({ok, _}, mallocinfo_heapmap:read_summary(Name($d, N))),
                            ok = file:delete(Name($i, N)),
                            ok = file:delete(Name($d, N))
                        end || N <- [245, 250, 255]],
                       ?assertEqual({error, enametoolong}, mallocinfo:info(Name($i, 256))),
                       ?assertEqual(Before, entries(Dir))
               end)
     end}.

%% render/2 writes index.html and the PNGs into OutDir: any of those names
%% taken by something that is not a regular file refuses the whole render,
%% before anything is drawn.
heapmap_render_test_() ->
    {timeout, 300, fun heapmap_render/0}.

heapmap_render() ->
    with_targets(
      fun(Dir, Targets) ->
              Dump = filename:join(Dir, "node.heapdump"),
              {ok, _} = mallocinfo_heap:dump(Dump),
              Out = filename:join(Dir, "out"),
              {ok, [Index, FirstPng | _] = Files} = mallocinfo_heapmap:render(Dump, Out),
              ?assertEqual("index.html", filename:basename(Index)),
              [begin
                   %% The target takes the place of a file render/2 wrote.
                   _ = file:delete(Name),
                   ok = file:rename(Path, Name),
                   Print = fingerprint(Name),
                   Listing = entries(Out),
                   ?assertEqual({Kind, Name, {error, Reason}},
                                {Kind, Name, mallocinfo_heapmap:render(Dump, Out)}),
                   ?assertEqual({Kind, Print}, {Kind, fingerprint(Name)}),
                   ?assertEqual(Listing, entries(Out)),
                   ok = file:rename(Name, Path)
               end || {Kind, Path, Reason} <- Targets, Name <- [Index, FirstPng]],
              %% With the names free again, or regular files, it renders.
              {ok, Files} = mallocinfo_heapmap:render(Dump, Out),
              Old = info(Index),
              {ok, Files} = mallocinfo_heapmap:render(Dump, Out),
              ?assertNotEqual(Old#file_info.inode, (info(Index))#file_info.inode)
      end).

%%% The readers ----------------------------------------------------------------

%% Issue 28: the dump readers (read_summary/1, render/2's input, the
%% escript's) open only a regular file: a FIFO nobody writes to would
%% block open(2) for good. Links are followed (reading through one is
%% harmless); a directory is eisdir, a device, a FIFO or a socket eftype,
%% nothing is written. Each call runs in a process of its own: one still
%% blocked after 10 s has the FIFO opened for writing, which frees it,
%% and fails the test.
readers_refuse_what_is_not_a_regular_file_test_() ->
    {timeout, 120, fun readers_refuse/0}.

readers_refuse() ->
    with_targets(
      fun(Dir, Targets) ->
              Out = filename:join(Dir, "out"),
              Fifo = filename:join(Dir, "fifo"),
              Want = fun(directory) -> {error, eisdir};
                        (symlink) -> {error, {bad_dump, bad_magic}};  % a text file
                        (dangling_symlink) -> {error, enoent};
                        (_) -> {error, eftype}
                     end,
              Before = entries(Dir),
              Readers = [{read_summary, fun(P) -> mallocinfo_heapmap:read_summary(P) end},
                         {heapmap_render, fun(P) -> mallocinfo_heapmap:render(P, Out) end},
                         {heap_render, fun(P) -> mallocinfo_heap:render(P, Out) end}],
              ?assertEqual([{Kind, R, Want(Kind)} || {Kind, _, _} <- Targets, {R, _} <- Readers],
                           [{Kind, R, unblocked(fun() -> Read(Path) end, Fifo)}
                            || {Kind, Path, _} <- Targets, {R, Read} <- Readers]),
              ?assertEqual(Before, entries(Dir))
      end).

unblocked(Fun, Fifo) ->
    Self = self(),
    {Pid, Ref} = spawn_monitor(fun() -> Self ! {self(), Fun()} end),
    receive
        {Pid, Result} ->
            receive {'DOWN', Ref, _, _, _} -> ok end,
            Result
    after 10000 ->
            %% Blocked in open(2) on the FIFO: a writer frees it.
            {ok, W} = file:open(Fifo, [write, raw]),
            ok = file:close(W),
            receive {'DOWN', Ref, _, _, _} -> ok end,
            blocked
    end.

%%% mallocinfo_file: the Erlang side's one writer --------------------------------

%% Writes `Names' into Dir through write_all/3, each holding its own name.
write_names(Dir, Names) ->
    mallocinfo_file:write_all(
      Dir, Names,
      fun(TempOf) -> [mallocinfo_file:write_file(TempOf(N), N) || N <- Names] end).

write_all_targets_test() ->
    refuses_all(fun(Path) -> write_names(filename:dirname(Path), [filename:basename(Path)]) end,
                fun(Path) ->
                        ?assertEqual({ok, list_to_binary(filename:basename(Path))},
                                     file:read_file(Path))
                end).

%% A set of names is written or refused whole: one name taken by a
%% directory refuses every other, before anything is written.
write_all_is_all_or_nothing_test() ->
    with_targets(
      fun(Dir, _) ->
              Before = entries(Dir),
              ?assertEqual({error, eisdir}, write_names(Dir, ["a", "directory", "b"])),
              ?assertEqual(Before, entries(Dir)),
              ?assertEqual({ok, [filename:join(Dir, N) || N <- ["a", "b"]]},
                           write_names(Dir, ["a", "b"])),
              ?assertEqual(lists:sort(["a", "b" | Before]), entries(Dir))
      end).

%% A failure while writing (here a thrown enospc after the first file)
%% leaves nothing: no temporary, no final name, and no directory that
%% write_all/3 made; any other exception is raised again after the same
%% cleaning.
write_all_cleans_up_test() ->
    with_targets(
      fun(Dir, _) ->
              Before = entries(Dir),
              Deep = filename:join([Dir, "new", "deeper"]),
              Failing = fun(Thrown) ->
                                fun(TempOf) ->
                                        mallocinfo_file:write_file(TempOf("one"), <<"1">>),
                                        throw(Thrown)
                                end
                        end,
              ?assertEqual({error, enospc},
                           mallocinfo_file:write_all(Deep, ["one", "two"], Failing({posix, enospc}))),
              ?assertEqual(Before, entries(Dir)),
              ?assertThrow({bad_dump, changed_while_reading},
                           mallocinfo_file:write_all(Deep, ["one", "two"],
                                                     Failing({bad_dump, changed_while_reading}))),
              ?assertEqual(Before, entries(Dir)),
              %% The same into an existing directory: its entries are kept.
              ?assertEqual({error, enospc},
                           mallocinfo_file:write_all(Dir, ["one"], Failing({posix, enospc}))),
              ?assertEqual(Before, entries(Dir))
      end).

%% A temporary is never an existing name, whatever it is.
open_temp_refuses_existing_names_test() ->
    with_targets(
      fun(Dir, Targets) ->
              [?assertEqual({Kind, {posix, eexist}},
                            {Kind, mi_ct:caught(fun() -> mallocinfo_file:open_temp(Path) end)})
               || {Kind, Path, _} <- Targets],
              Plain = filename:join(Dir, "plain"),
              ok = file:write_file(Plain, <<"kept">>),
              ?assertEqual({posix, eexist},
                           mi_ct:caught(fun() -> mallocinfo_file:open_temp(Plain) end)),
              ?assertEqual({ok, <<"kept">>}, file:read_file(Plain))
      end).

%%% Temporary directories ------------------------------------------------------

%% $TMPDIR when set and not empty, else /tmp: the rule of the profilers'
%% files and of the NIF sent to another node.
tmp_dir_test() ->
    ?assertEqual("/tmp", mallocinfo_file:tmp_dir(false)),
    ?assertEqual("/tmp", mallocinfo_file:tmp_dir("")),
    ?assertEqual("/var/tmp/x", mallocinfo_file:tmp_dir("/var/tmp/x")),
    ?assertEqual(mallocinfo_file:tmp_dir(os:getenv("TMPDIR")), mallocinfo_file:tmp_dir()).

%% A fresh directory of mode 0700 under the parent, a new random name each
%% time.
private_dir_test() ->
    with_targets(
      fun(Dir, _) ->
              Local = fun(F, A) -> apply(file, F, A) end,
              {ok, One} = mallocinfo_file:private_dir(Dir, "mi-test-", Local),
              {ok, Two} = mallocinfo_file:private_dir(Dir, "mi-test-", Local),
              ?assertNotEqual(One, Two),
              [begin
                   ?assertEqual(Dir, filename:dirname(D)),
                   ?assertMatch("mi-test-" ++ _, filename:basename(D)),
                   ?assertEqual(8 + 16, length(filename:basename(D))),
                   {ok, #file_info{type = directory, mode = Mode}} = file:read_link_info(D),
                   ?assertEqual(8#700, Mode band 8#777)
               end || D <- [One, Two]],
              ?assertMatch({error, {make_dir, _, enoent}},
                           mallocinfo_file:private_dir(filename:join(Dir, "missing"), "mi-",
                                                       Local))
      end).

%% A name that exists (made meanwhile, or planted) is never used: another
%% random name is tried, three in all; a directory whose mode cannot be
%% set is removed again.
private_dir_refusals_test() ->
    with_targets(
      fun(Dir, _) ->
              Self = self(),
              Planted = fun(make_dir, [D]) -> Self ! {tried, D}, {error, eexist};
                           (F, A) -> apply(file, F, A)
                        end,
              ?assertMatch({error, {make_dir, _, eexist}},
                           mallocinfo_file:private_dir(Dir, "mi-", Planted)),
              ?assertEqual(3, length(lists:usort(tried([])))),
              %% The third try succeeds after two planted names.
              Counter = counters:new(1, []),
              TwoPlanted = fun(make_dir, [D]) ->
                                   counters:add(Counter, 1, 1),
                                   case counters:get(Counter, 1) of
                                       N when N =< 2 -> {error, eexist};
                                       _ -> file:make_dir(D)
                                   end;
                              (F, A) -> apply(file, F, A)
                           end,
              {ok, Made} = mallocinfo_file:private_dir(Dir, "mi-", TwoPlanted),
              ?assertEqual(3, counters:get(Counter, 1)),
              ?assert(filelib:is_dir(Made)),
              NoMode = fun(change_mode, _) -> {error, eperm};
                          (F, A) -> apply(file, F, A)
                       end,
              {error, {chmod, Gone, eperm}} = mallocinfo_file:private_dir(Dir, "mi-", NoMode),
              ?assertEqual(Dir, filename:dirname(Gone)),
              ?assertNot(filelib:is_dir(Gone))
      end).

tried(Names) ->
    receive {tried, Name} -> tried([Name | Names])
    after 0 -> Names
    end.
