%% EUnit tests of the mallocinfo API against the real NIF (no interposer).
-module(mallocinfo_tests).
-include_lib("eunit/include/eunit.hrl").
-include_lib("kernel/include/file.hrl").
-include_lib("xmerl/include/xmerl.hrl").

-export([log/2]).

%% mktemp: unique across test runs on one machine (unique_integer/1 is not).
tmpdir() ->
    Dir = string:trim(os:cmd("mktemp -d -t mi_eunit_XXXXXX")),
    {ok, _} = file:read_file_info(Dir),
    Dir.

rm_rf(Dir) -> file:del_dir_r(Dir).

with_tmpdir(Fun) ->
    Dir = tmpdir(),
    try Fun(Dir) after rm_rf(Dir) end.

%%% info/1 -------------------------------------------------------------------

info_writes_parseable_xml_test() ->
    with_tmpdir(
      fun(Dir) ->
              Path = filename:join(Dir, "x.xml"),
              ?assertEqual(ok, mallocinfo:info(Path)),
              {Doc, _} = xmerl_scan:file(Path, [{quiet, true}]),
              ?assertEqual(malloc, Doc#xmlElement.name),
              %% Only the target remains: the temporary was renamed into place.
              ?assertEqual({ok, ["x.xml"]}, file:list_dir(Dir)),
              {ok, #file_info{mode = Mode}} = file:read_file_info(Path),
              ?assertEqual(8#644, Mode band 8#777)
      end).

info_accepts_binary_and_unicode_paths_test() ->
    with_tmpdir(
      fun(Dir) ->
              Bin = unicode:characters_to_binary(filename:join(Dir, "b.xml")),
              ?assertEqual(ok, mallocinfo:info(Bin)),
              Uni = filename:join(Dir, [16#00e9, "t", 16#00e9, ".xml"]),
              ?assertEqual(ok, mallocinfo:info(Uni)),
              ?assert(filelib:is_regular(Uni)),
              Deep = [Dir, "/", ["de", "ep"], ".xml"],
              ?assertEqual(ok, mallocinfo:info(Deep)),
              ?assert(filelib:is_regular(filename:join(Dir, "deep.xml")))
      end).

info_error_paths_test_() ->
    {setup, fun tmpdir/0, fun rm_rf/1,
     fun(Dir) ->
             ok = file:write_file(filename:join(Dir, "plain"), <<"x">>),
             ok = file:make_dir(filename:join(Dir, "sub")),
             [?_assertEqual({error, enoent}, mallocinfo:info(filename:join(Dir, "no/x.xml"))),
              ?_assertEqual({error, eisdir}, mallocinfo:info(filename:join(Dir, "sub"))),
              ?_assertEqual({error, enotdir}, mallocinfo:info(filename:join(Dir, "plain/x.xml"))),
              ?_assertEqual({error, enoent}, mallocinfo:info("")),
              ?_test(unwritable(Dir)),
              %% Nothing was left behind by the failures.
              ?_assertEqual({ok, ["plain", "sub"]},
                            begin {ok, L} = file:list_dir(Dir), {ok, lists:sort(L)} end)]
     end}.

%% Root ignores directory permissions, so as root use /sys, which refuses
%% file creation to everyone (eacces; erofs where it is mounted read-only).
unwritable(Dir) ->
    case os:cmd("id -u") of
        "0\n" ->
            ?assertMatch({error, R} when R =:= eacces; R =:= erofs,
                         mallocinfo:info("/sys/mallocinfo_test.xml"));
        _ ->
            RO = filename:join(Dir, "ro"),
            ok = file:make_dir(RO),
            ok = file:change_mode(RO, 8#555),
            try
                ?assertEqual({error, eacces}, mallocinfo:info(filename:join(RO, "x.xml")))
            after
                file:change_mode(RO, 8#755),
                file:del_dir(RO)
            end
    end.

info_bad_types_test_() ->
    [?_assertError(badarg, mallocinfo:info(123)),
     ?_assertError(badarg, mallocinfo:info({"/tmp/x"})),
     ?_assertError(badarg, mallocinfo:info(#{})),
     ?_assertError(badarg, mallocinfo:info(["/tmp/", 16#110000])),
     ?_assertError(badarg, mallocinfo:info(<<"/tmp/a", 0, "b">>)),
     ?_assertError(badarg, mallocinfo:info("/tmp/a\0b"))].

%%% info/0, heaps/0 ----------------------------------------------------------

info_in_memory_test() ->
    {ok, Xml} = mallocinfo:info(),
    ?assertMatch(<<"<malloc version=\"1\">", _/binary>>, Xml),
    ?assertNotEqual(nomatch, binary:match(Xml, <<"</malloc>">>)).

heaps_test() ->
    {ok, H} = mallocinfo:heaps(),
    #{heaps := Heaps, total := Total, system := System} = H,
    ?assert(length(Heaps) >= 1),
    ?assertEqual(lists:seq(0, length(Heaps) - 1), [N || #{nr := N} <- Heaps]),
    %% The document's totals are the sums of its heaps.
    ?assertEqual(maps:get(current, System),
                 lists:sum([C || #{system := #{current := C}} <- Heaps])),
    ?assertEqual(maps:get(size, maps:get(fast, Total)),
                 lists:sum([S || #{fast := #{size := S}} <- Heaps])),
    ?assertMatch(#{mmap := #{count := _, size := _}}, Total),
    [?assertEqual(maps:get(free_bytes, Hp) + maps:get(in_use_bytes, Hp),
                  maps:get(current, maps:get(system, Hp))) || Hp <- Heaps].

load_xmerl_without_candidates_test() ->
    ?assertEqual({error, {missing_application, xmerl}}, mallocinfo_lib:load_xmerl([])),
    ?assertEqual({error, {missing_application, xmerl}},
                 mallocinfo_lib:load_xmerl(["/nonexistent/xmerl/ebin"])).

xmerl_candidates_test() ->
    with_tmpdir(
      fun(Root) ->
              ?assertEqual([], mallocinfo_lib:xmerl_candidates([Root])),
              Old = filename:join([Root, "lib", "xmerl-1.3.30", "ebin"]),
              New = filename:join([Root, "lib", "xmerl-1.3.31", "ebin"]),
              ok = filelib:ensure_dir(filename:join(Old, "x")),
              ok = filelib:ensure_dir(filename:join(New, "x")),
              ?assertEqual([New, Old], mallocinfo_lib:xmerl_candidates([Root, Root])),
              ?assertEqual([], mallocinfo_lib:xmerl_candidates(["/nonexistent"]))
      end).

%%% summary/0, stats/0, log_stats/0 ------------------------------------------

summary_test() ->
    {ok, S} = mallocinfo:summary(),
    #{arenas := Arenas, system_bytes := Sys, in_use_bytes := Used,
      system_incl_mmap_bytes := SysAll, in_use_incl_mmap_bytes := UsedAll,
      mmap_regions := Regions, mmap_bytes := MmapBytes,
      max_mmap_regions := MaxRegions, max_mmap_bytes := MaxBytes} = S,
    ?assertEqual(lists:seq(0, length(Arenas) - 1), [N || #{arena := N} <- Arenas]),
    %% system_bytes and in_use_bytes are the arenas', as in heaps/0 and the
    %% heap map; one frozen snapshot: malloc_stats()'s own totals are
    %% exactly the arenas plus mmap.
    ?assertEqual(Sys, lists:sum([B || #{system_bytes := B} <- Arenas])),
    ?assertEqual(Used, lists:sum([B || #{in_use_bytes := B} <- Arenas])),
    ?assertEqual(SysAll, Sys + MmapBytes),
    ?assertEqual(UsedAll, Used + MmapBytes),
    ?assert(MaxRegions >= Regions),
    ?assert(MaxBytes >= MmapBytes),
    [?assert(U =< Y) || #{system_bytes := Y, in_use_bytes := U} <- Arenas].

%% malloc_stats() writes to the node's stderr: run it in a separate emulator
%% and read what that emulator printed.
stats_prints_to_stderr_test() ->
    Ebin = filename:dirname(code:which(mallocinfo)),
    Erl = os:find_executable("erl"),
    Out = os:cmd(Erl ++ " -noshell -pa " ++ Ebin ++
                     " -eval 'ok = mallocinfo:stats(), halt().' 2>&1 >/dev/null"),
    ?assertMatch({match, _}, re:run(Out, "^Arena 0:$", [multiline])),
    ?assertMatch({match, _}, re:run(Out, "^Total \\(incl. mmap\\):$", [multiline])),
    ?assertMatch({match, _}, re:run(Out, "^max mmap bytes += +[0-9]+$", [multiline])).

log_stats_test() ->
    Self = self(),
    Id = mallocinfo_log_test,
    #{level := OldLevel} = logger:get_primary_config(),
    ok = logger:set_primary_config(level, info),
    ok = logger:add_handler(Id, ?MODULE, #{config => Self, level => info}),
    try
        ?assertEqual(ok, mallocinfo:log_stats()),
        Lines = collect_log([]),
        ?assertMatch(["malloc_stats: Arena 0:" | _], Lines),
        ?assert(lists:member("malloc_stats: Total (incl. mmap):", Lines)),
        ?assert(lists:any(fun(L) -> lists:prefix("malloc_stats: max mmap regions", L) end,
                          Lines))
    after
        logger:remove_handler(Id),
        logger:set_primary_config(level, OldLevel)
    end.

%% logger handler callback: forwards mallocinfo events to the test process.
log(#{level := info, msg := {Fmt, Args}, meta := #{domain := [mallocinfo]}},
    #{config := Pid}) ->
    Pid ! {mallocinfo_log, lists:flatten(io_lib:format(Fmt, Args))};
log(_, _) ->
    ok.

collect_log(Acc) ->
    receive {mallocinfo_log, L} -> collect_log([L | Acc])
    after 200 -> lists:reverse(Acc)
    end.

%%% mallinfo/0, trim/0,1, mallopt/2, version/0 -------------------------------

mallinfo_test() ->
    {ok, M} = mallocinfo:mallinfo(),
    Keys = [arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks,
            fordblks, keepcost],
    ?assertEqual(lists:sort(Keys), lists:sort(maps:keys(M))),
    [?assert(is_integer(V) andalso V >= 0) || V <- maps:values(M)],
    ?assert(maps:get(arena, M) > 0).

trim_test() ->
    {ok, #{released := R, rss_before := B, rss_after := A}} = mallocinfo:trim(),
    ?assert(is_boolean(R)),
    ?assert(is_integer(B) andalso B > 0),
    ?assert(is_integer(A) andalso A > 0),
    ?assertMatch({ok, #{released := _}}, mallocinfo:trim(1024 * 1024)).

trim_badarg_test_() ->
    [?_assertError(badarg, mallocinfo:trim(-1)),
     ?_assertError(badarg, mallocinfo:trim(a)),
     ?_assertError(badarg, mallocinfo:trim(1.0)),
     ?_assertError(badarg, mallocinfo:trim(1 bsl 64))].

mallopt_test_() ->
    [?_assertEqual(ok, mallocinfo:mallopt(perturb, 0)),
     ?_assertEqual(ok, mallocinfo:mallopt(arena_test, 8)),
     ?_assertEqual(ok, mallocinfo:mallopt(top_pad, 128 * 1024)),
     ?_assertEqual({error, einval}, mallocinfo:mallopt(arena_max, 0)),
     ?_assertEqual({error, einval}, mallocinfo:mallopt(mmap_threshold, 1 bsl 30)),
     ?_assertEqual({error, einval}, mallocinfo:mallopt(mmap_max, -1)),
     ?_assertEqual({error, einval}, mallocinfo:mallopt(top_pad, 1 bsl 40)),
     ?_assertError(badarg, mallocinfo:mallopt(no_such_param, 1)),
     ?_assertError(badarg, mallocinfo:mallopt("arena_max", 1)),
     ?_assertError(badarg, mallocinfo:mallopt(arena_max, 1.5)),
     ?_assertError(badarg, mallocinfo:mallopt(arena_max, "2"))].

version_test() ->
    _ = application:load(mallocinfo),
    {ok, AppVsn} = application:get_key(mallocinfo, vsn),
    ?assertEqual(list_to_binary(AppVsn), mallocinfo:version()).

%% rss/0 is /proc/self/statm's resident pages: it agrees with VmRSS from
%% /proc/self/status, read just before, within what a few reads allocate.
rss_test() ->
    {ok, Status} = file:read_file("/proc/self/status"),
    {match, [Kb]} = re:run(Status, "VmRSS:\\s+(\\d+) kB", [{capture, all_but_first, list}]),
    Rss = mallocinfo:rss(),
    ?assert(is_integer(Rss)),
    ?assert(abs(Rss - list_to_integer(Kb) * 1024) < 16 * 1024 * 1024).

%% libc_version/0 is what getconf GNU_LIBC_VERSION says ("glibc 2.36").
libc_version_test() ->
    "glibc " ++ V = string:trim(os:cmd("getconf GNU_LIBC_VERSION")),
    ?assertEqual(list_to_binary(V), mallocinfo:libc_version()).
