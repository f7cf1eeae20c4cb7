%% The heap map as its users meet it: the mallocinfo-heapmap escript run as
%% a command (exit status, what it prints), and index.html opened in
%% headless Chromium (no script or load errors, every image decoded, and a
%% screenshot whose pixels match the PNG we wrote).
-module(mallocinfo_heapmap_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1]).
-export([real_dump/1, cli_renders/1, cli_bad_dump/1, cli_missing_dump/1, cli_fifo_dump/1,
         cli_escapes_names/1, cli_outdir_is_file/1, cli_usage/1, cli_in_tarball/1, chromium_page_loads/1,
         chromium_harness_catches_errors/1, chromium_shows_our_pixels/1]).

all() ->
    [real_dump, cli_renders, cli_bad_dump, cli_missing_dump, cli_fifo_dump, cli_escapes_names,
     cli_outdir_is_file, cli_usage, cli_in_tarball, chromium_page_loads, chromium_harness_catches_errors,
     chromium_shows_our_pixels].

init_per_suite(Config) ->
    Priv = ?config(priv_dir, Config),
    Cli = filename:join(code:priv_dir(mallocinfo), "mallocinfo-heapmap"),
    true = filelib:is_regular(Cli),
    %% The synthetic heap of mallocinfo_heapmap_tests, with tracker data, and
    %% a 64 MiB fragmented one that is drawn scaled.
    Dump = filename:join(Priv, "t.heapdump"),
    ok = mi_heapdump_writer:write(Dump, tracked()),
    Big = filename:join(Priv, "big.heapdump"),
    #{chunks := _} = mi_heapdump_writer:write_big(Big, #{main_bytes => 4 bsl 20, heaps => 2,
                                                         heap_bytes => 64 bsl 20}),
    [{cli, Cli}, {dump, Dump}, {big, Big} | Config].

end_per_suite(_Config) ->
    ok.

tracked() ->
    Chunks = [{in_use, 512, 1}, {in_use, 512, 2}, {free, 32}, {in_use, 992, 1}, {fast, 64},
              {in_use, 1984}, {free, 12288}, {tcache, 48}, {in_use, 4048, 65535}, {top, 12288}],
    #{tracker => true,
      arenas => [#{segments => [#{base => 16#10000, chunks => Chunks, resident => [3, 7]}]},
                 #{segments => [#{base => 16#4000000, first => 16#4000000 + 2224,
                                  chunks => [{in_use, 1872}, {free, 8192}, {top, 4064}, {meta, 32}],
                                  resident => [2]}]}],
      mmaps => [{16#7f0000000000, 135168, 1}],
      sites => [{1, 136672, 3, <<"leaky_alloc < leaky_nif_call">>}, {2, 512, 1, <<"cache_put">>}]}.

%% Runs a command through sh; returns {ExitStatus, Stdout, Stderr}.
run(Config, Args) ->
    Priv = ?config(priv_dir, Config),
    Out = filename:join(Priv, "stdout"),
    Err = filename:join(Priv, "stderr"),
    Cmd = lists:flatten([quote(A) ++ " " || A <- Args]) ++ " >" ++ quote(Out) ++ " 2>" ++ quote(Err)
        ++ "; echo $?",
    Status = list_to_integer(string:trim(os:cmd(Cmd))),
    {ok, O} = file:read_file(Out),
    {ok, E} = file:read_file(Err),
    {Status, O, E}.

quote(S) -> "'" ++ lists:flatten(string:replace(lists:flatten(S), "'", "'\\''", all)) ++ "'".

lines(Bin) -> binary:split(Bin, <<"\n">>, [global, trim_all]).

%%% A real dump -----------------------------------------------------------------

%% fragmented.heapdump.gz: written by mallocinfo_heap:dump/1 on a node whose
%% threads fragmented 16 arenas on purpose, with the tracker preloaded.
%% Its figures hold together, and its pictures (all at 16 bytes a pixel)
%% agree with them pixel for pixel.
real_dump(Config) ->
    {ok, Gz} = file:read_file(filename:join(?config(data_dir, Config), "fragmented.heapdump.gz")),
    Dump = filename:join(?config(priv_dir, Config), "fragmented.heapdump"),
    ok = file:write_file(Dump, zlib:gunzip(Gz)),
    {ok, #{arenas := Arenas, total := T}} = mallocinfo_heapmap:read_summary(Dump),
    ?assertMatch(#{arena_count := 16, chunks := 56373, segments := _, tracked_mmap_chunks := 9}, T),
    [begin
         #{system_bytes := Sys, in_use_bytes := InUse, free_bytes := Free, pinned_bytes := Pinned,
           trimmable_bytes := Trim, resident_bytes := Res, live_bytes := Live,
           unrecorded_bytes := Unrec,
           by_kind := #{in_use := KU, free := KF, fast := KFa, top := KT} = ByKind} = A,
         ?assertEqual(Sys, InUse + Free),
         ?assertEqual(Free, KF + KFa + KT),
         ?assertEqual(KU, Live + Unrec),
         ?assert(lists:sum(maps:values(ByKind)) =< Sys),
         ?assert(Pinned =< KF + KFa),
         ?assert(Trim =< Res andalso Res =< Sys + 4096)
     end || A <- Arenas],
    Out = filename:join(?config(priv_dir, Config), "real"),
    {ok, [_Index | Pngs]} = mallocinfo_heapmap:render(Dump, Out),
    {ok, Html} = file:read_file(filename:join(Out, "index.html")),
    {match, Items} = re:run(Html, "data-kind=\"([a-z_]+)\" data-colours=\"([^\"]+)\"",
                            [global, {capture, [1, 2], list}]),
    Legend = maps:from_list([{K, string:lexemes(Cs, " ")} || [K, Cs] <- Items]),
    Hex = fun({R, G, B}) -> lists:flatten(io_lib:format("#~2.16.0b~2.16.0b~2.16.0b", [R, G, B])) end,
    Kind = fun(K) -> maps:get(K, Legend) end,
    [begin
         File = filename:join(Out, io_lib:format("arena~b-seg0.png", [N])),
         ?assert(lists:member(File, Pngs)),
         {ok, Img} = mallocinfo_png:decode(element(2, file:read_file(File))),
         #{width := W, height := H} = Img,
         Hist = lists:foldl(fun(P, M) -> maps:update_with(Hex(P), fun(C) -> C + 1 end, 1, M) end,
                            #{}, [mallocinfo_png:pixel(Img, X, Y)
                                  || Y <- lists:seq(0, H - 1), X <- lists:seq(0, W - 1)]),
         Count = fun(Ks) -> lists:sum([maps:get(C, Hist, 0) || K <- Ks, C <- Kind(K)]) end,
         ?assertEqual(Pinned, 16 * Count(["free", "fast"])),
         ?assertEqual(KF + KFa - Pinned, 16 * Count(["free_pages"])),
         ?assertEqual(KT, 16 * Count(["top"]))
     end || #{arena := N, pinned_bytes := Pinned, by_kind := #{free := KF, fast := KFa, top := KT}}
                <- Arenas].

%%% The command ------------------------------------------------------------------

cli_renders(Config) ->
    Out = filename:join(?config(priv_dir, Config), "cli_out"),
    {0, Stdout, <<>>} = run(Config, [?config(cli, Config), ?config(dump, Config), Out]),
    Lines = lines(Stdout),
    ct:log("~s", [Stdout]),
    [<<"heap of pid 4242 dumped 2025-11-24T16:00:00.000Z, glibc 2.36, page 4.0 KiB, with tracker data">>
     | _] = Lines,
    %% The summary (the same figures as read_summary/1) and the files.
    {ok, Summary} = mallocinfo_heapmap:read_summary(?config(dump, Config)),
    ?assert(lists:member(iolist_to_binary(string:trim(mallocinfo_heapmap:format_summary(Summary),
                                                      trailing)),
                         [iolist_to_binary(lists:join("\n", lists:sublist(Lines, 2, N)))
                          || N <- lists:seq(1, length(Lines) - 1)])),
    Files = [filename:join(Out, F) || F <- ["index.html", "arena0-seg0.png", "arena1-seg0.png",
                                            "mmap.png"]],
    [?assert(lists:member(<<"  ", (list_to_binary(F))/binary>>, Lines)) || F <- Files],
    [?assert(filelib:is_regular(F)) || F <- Files].

cli_bad_dump(Config) ->
    Priv = ?config(priv_dir, Config),
    {ok, Full} = file:read_file(?config(dump, Config)),
    Cut = filename:join(Priv, "cut.heapdump"),
    ok = file:write_file(Cut, binary:part(Full, 0, byte_size(Full) - 30)),
    Out = filename:join(Priv, "cut_out"),
    {1, <<>>, Err} = run(Config, [?config(cli, Config), Cut, Out]),
    ?assertEqual([iolist_to_binary(["mallocinfo-heapmap: ", Cut, ": not a usable heap dump: "
                                    "truncated (the file ends before its END record)"])],
                 lines(Err)),
    ?assertNot(filelib:is_file(Out)),
    %% Not a dump at all.
    {1, <<>>, Err2} = run(Config, [?config(cli, Config), code:which(mallocinfo), Out]),
    [<<"mallocinfo-heapmap: ", _/binary>> = Line] = lines(Err2),
    ?assertNotEqual(nomatch, binary:match(Line, <<"wrong magic">>)),
    ?assertNot(filelib:is_file(Out)).

cli_missing_dump(Config) ->
    Missing = filename:join(?config(priv_dir, Config), "none.heapdump"),
    {1, <<>>, Err} = run(Config, [?config(cli, Config), Missing, "/tmp/mi_unused"]),
    ?assertEqual([iolist_to_binary(["mallocinfo-heapmap: ", Missing, ": no such file or directory"])],
                 lines(Err)).

%% A FIFO given as the dump is refused at once (open(2) would wait for a
%% writer for good): exit 1, one line, nothing written. `timeout' ends a
%% command that blocks anyway (exit 124).
cli_fifo_dump(Config) ->
    Priv = ?config(priv_dir, Config),
    Fifo = filename:join(Priv, "dump.fifo"),
    "" = os:cmd("mkfifo " ++ quote(Fifo) ++ " 2>&1"),
    Out = filename:join(Priv, "fifo_out"),
    {1, <<>>, Err} = run(Config, ["timeout", "60", ?config(cli, Config), Fifo, Out]),
    ?assertEqual([iolist_to_binary(["mallocinfo-heapmap: ", Fifo,
                                    ": not a regular file (a FIFO, device or socket): "
                                    "not read"])],
                 lines(Err)),
    ?assertNot(filelib:is_file(Out)),
    ok = file:delete(Fifo).

%% Issue 28: paths the command prints (the dump's, the files written, a
%% failing one) reach the terminal escaped: a name holding a terminal
%% payload (colour, window title, BEL, clear screen) prints as text.
cli_escapes_names(Config) ->
    Priv = ?config(priv_dir, Config),
    Odd = "\e[31mred\e]0;title\^G\e[2J",
    Dump = filename:join(Priv, "dump" ++ Odd ++ ".heapdump"),
    {ok, _} = file:copy(?config(dump, Config), Dump),
    Out = filename:join(Priv, "out" ++ Odd),
    {0, Stdout, <<>>} = run(Config, [?config(cli, Config), Dump, Out]),
    Missing = filename:join(Priv, "none" ++ Odd),
    {1, <<>>, Stderr} = run(Config, [?config(cli, Config), Missing, Out]),
    Shown = <<"\\x1B[31mred\\x1B]0;title\\x07\\x1B[2J">>,
    [begin
         ?assertEqual({What, []}, {What, [C || <<C>> <= Text, C < 32, C =/= $\n]}),
         ?assertMatch({What, {_, _}}, {What, binary:match(Text, Shown)})
     end || {What, Text} <- [{stdout, Stdout}, {stderr, Stderr}]],
    ?assertMatch({_, _}, binary:match(Stdout, <<"out", Shown/binary, "/index.html">>)),
    ok = file:del_dir_r(Out),
    ok = file:delete(Dump).

cli_outdir_is_file(Config) ->
    {1, <<>>, Err} = run(Config, [?config(cli, Config), ?config(dump, Config), ?config(dump, Config)]),
    ?assertEqual([iolist_to_binary(["mallocinfo-heapmap: ", ?config(dump, Config), ": not a directory"])],
                 lines(Err)).

cli_usage(Config) ->
    {2, <<>>, Err} = run(Config, [?config(cli, Config)]),
    [<<"usage: mallocinfo-heapmap DUMP OUTDIR">> | _] = lines(Err),
    {2, <<>>, _} = run(Config, [?config(cli, Config), "a", "b", "c"]),
    {0, <<"usage: ", _/binary>>, <<>>} = run(Config, [?config(cli, Config), "--help"]).

%% make tarball ships the escript, runnable from the unpacked tree.
cli_in_tarball(Config) ->
    Tarball = mi_ct:tarball(),
    {ok, Names} = erl_tar:table(Tarball, [compressed]),
    ?assert(lists:member("mallocinfo/priv/mallocinfo-heapmap", Names)),
    Dir = filename:join(?config(priv_dir, Config), "unpacked"),
    ok = erl_tar:extract(Tarball, [compressed, {cwd, Dir}]),
    Cli = filename:join([Dir, "mallocinfo", "priv", "mallocinfo-heapmap"]),
    {0, _, <<>>} = run(Config, [Cli, ?config(big, Config), filename:join(Dir, "out")]).

%%% Chromium ---------------------------------------------------------------------

chromium() ->
    case os:find_executable("chromium") of
        false -> ct:fail("chromium is not installed: make deps installs it (docker/packages.txt)");
        Path -> Path
    end.

%% Loads Url headless and returns the DOM after load plus Chromium's stderr.
dump_dom(Config, Url) ->
    {_, Dom, Err} = run(Config, ["timeout", "120", chromium(), "--headless=new", "--disable-gpu",
                                 "--no-sandbox", "--enable-logging=stderr", "--v=0",
                                 "--user-data-dir=" ++ filename:join(?config(priv_dir, Config), "chromium"),
                                 "--virtual-time-budget=10000", "--dump-dom", Url]),
    {Dom, Err}.

%% A copy of index.html with a script run first: it records uncaught errors,
%% failed loads (the capturing error listener sees <img> failures) and
%% console.error calls, and after load writes them and every image's
%% decoded size into <pre id="mi-result">.
harness(Html) ->
    Probe = <<"<script>\n"
              "var miErrors = [];\n"
              "window.addEventListener('error', function (e) {\n"
              "  var t = e.target;\n"
              "  miErrors.push(t && t !== window && t.src ? 'load failed: ' + t.src : 'error: ' + e.message);\n"
              "}, true);\n"
              "console.error = function () { miErrors.push('console.error: ' + Array.prototype.join.call(arguments, ' ')); };\n"
              "window.addEventListener('load', function () {\n"
              "  var imgs = Array.prototype.map.call(document.images, function (i) {\n"
              "    return 'image ' + i.getAttribute('src') + ' ' + (i.complete ? 'complete' : 'incomplete')\n"
              "      + ' ' + i.naturalWidth + 'x' + i.naturalHeight;\n"
              "  });\n"
              "  var p = document.createElement('pre');\n"
              "  p.id = 'mi-result';\n"
              "  p.textContent = miErrors.concat(imgs).join('\\n') + '\\nend';\n"
              "  document.body.appendChild(p);\n"
              "});\n"
              "</script>\n">>,
    [Head, Rest] = binary:split(Html, <<"<head>\n">>),
    <<Head/binary, "<head>\n", Probe/binary, Rest/binary>>.

page_result(Config, Dir, Html) ->
    Test = filename:join(Dir, "harness.html"),
    ok = file:write_file(Test, harness(Html)),
    {Dom, Err} = dump_dom(Config, "file://" ++ Test),
    ct:log("stderr:~n~s", [Err]),
    {match, [Result]} = re:run(Dom, "<pre id=\"mi-result\">(.*?)</pre>",
                               [dotall, {capture, all_but_first, binary}]),
    ct:log("result:~n~s", [Result]),
    Lines = lines(Result),
    <<"end">> = lists:last(Lines),
    Console = [L || L <- lines(Err), binary:match(L, <<"CONSOLE">>) =/= nomatch],
    {[L || <<"image ", L/binary>> <- Lines],
     [L || L <- lists:droplast(Lines), binary:match(L, <<"image ">>) =:= nomatch] ++ Console}.

chromium_page_loads(Config) ->
    Priv = ?config(priv_dir, Config),
    [begin
         Out = filename:join(Priv, Name),
         {ok, [Index | Pngs]} = mallocinfo_heapmap:render(?config(Dump, Config), Out),
         {ok, Html} = file:read_file(Index),
         {Images, Errors} = page_result(Config, Out, Html),
         ?assertEqual([], Errors),
         %% Every PNG shown, decoded by Chromium at the size we wrote.
         Expected = [begin
                         {ok, #{width := W, height := H}} =
                             mallocinfo_png:decode(element(2, file:read_file(P))),
                         iolist_to_binary(io_lib:format("~s complete ~bx~b",
                                                        [filename:basename(P), W, H]))
                     end || P <- Pngs],
         ?assertEqual(Expected, Images)
     end || {Dump, Name} <- [{dump, "page_small"}, {big, "page_big"}]].

%% The harness is not blind: a missing image and a throwing script are seen.
chromium_harness_catches_errors(Config) ->
    Out = filename:join(?config(priv_dir, Config), "page_broken"),
    {ok, [Index | _]} = mallocinfo_heapmap:render(?config(dump, Config), Out),
    {ok, Html} = file:read_file(Index),
    Broken = binary:replace(binary:replace(Html, <<"arena1-seg0.png">>, <<"missing.png">>),
                            <<"</body>">>, <<"<script>undefinedFunction();</script></body>">>),
    {Images, Errors} = page_result(Config, Out, Broken),
    ?assert(lists:member(<<"missing.png complete 0x0">>, Images)),
    ?assert(lists:any(fun(E) -> binary:match(E, <<"load failed: ">>) =/= nomatch end, Errors)),
    ?assert(lists:any(fun(E) -> binary:match(E, <<"undefinedFunction">>) =/= nomatch end, Errors)).

%% A screenshot of one map shown 1:1 has exactly our pixels: Chromium reads
%% our PNG as we do, and our reader reads Chromium's (adaptive filters).
chromium_shows_our_pixels(Config) ->
    Out = filename:join(?config(priv_dir, Config), "shot"),
    {ok, _} = mallocinfo_heapmap:render(?config(big, Config), Out),
    {ok, Ours} = mallocinfo_png:decode(element(2, file:read_file(filename:join(Out, "arena0-seg0.png")))),
    #{width := W, height := H} = Ours,
    Page = filename:join(Out, "shot.html"),
    ok = file:write_file(Page, <<"<!DOCTYPE html><html><head><style>body { margin: 0; background: #000; }"
                                 " img { display: block; }</style></head>"
                                 "<body><img src=\"arena0-seg0.png\"></body></html>">>),
    Shot = filename:join(Out, "shot.png"),
    {_, _, _} = run(Config, ["timeout", "120", chromium(), "--headless=new", "--disable-gpu", "--no-sandbox",
                             "--hide-scrollbars", "--force-device-scale-factor=1",
                             "--user-data-dir=" ++ filename:join(?config(priv_dir, Config), "chromium"),
                             io_lib:format("--window-size=~b,~b", [W + 40, H + 40]),
                             "--screenshot=" ++ Shot, "file://" ++ Page]),
    {ok, Theirs} = mallocinfo_png:decode(element(2, file:read_file(Shot))),
    ?assertMatch(#{width := SW, height := SH} when SW =:= W + 40 andalso SH =:= H + 40, Theirs),
    Differ = [{X, Y} || Y <- lists:seq(0, H - 1), X <- lists:seq(0, W - 1),
                        mallocinfo_png:pixel(Ours, X, Y) =/= mallocinfo_png:pixel(Theirs, X, Y)],
    ?assertEqual([], lists:sublist(Differ, 10)),
    %% Beyond the image: the page's black background.
    ?assertEqual({0, 0, 0}, mallocinfo_png:pixel(Theirs, W + 10, 0)).
