%% Capture under pressure (issue 24 item 3): mallocinfo:capture_on/1 on a
%% peer whose RSS is driven across the mark by a process holding a large
%% binary (mi_hog): the evidence is written once per crossing into a
%% mktemp -d directory, again only after the RSS fell back under the
%% hysteresis, never over a file that exists, the oldest captures beyond
%% `keep' deleted and nothing else; the rate limit holds a second
%% crossing; a directory it cannot use is refused with {error, Posix}.
-module(mallocinfo_capture_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_testcase/2, end_per_testcase/2]).
-export([capture_once_per_crossing/1, capture_rate_limited/1, capture_refuses_bad_dir/1,
         capture_fraction_of_cgroup/1, capture_with_tracker/1]).

-define(MiB, (1 bsl 20)).
%% What the hog holds, and how far above the node's RSS the mark is.
-define(HOG, (192 * ?MiB)).
-define(ABOVE, (96 * ?MiB)).

all() ->
    [capture_once_per_crossing, capture_rate_limited, capture_refuses_bad_dir,
     capture_fraction_of_cgroup, capture_with_tracker].

init_per_testcase(Case, Config) ->
    Env = case Case of
              capture_with_tracker -> mallocinfo_trace:preload_env(#{});
              _ -> []
          end,
    {ok, Peer, _} = peer:start_link(#{connection => standard_io, env => Env,
                                      args => ["-pa", ebin(), "-pa", test_dir()]}),
    Scratch = string:trim(os:cmd("mktemp -d")),
    true = filelib:is_dir(Scratch),
    [{peer, Peer}, {scratch, Scratch} | Config].

end_per_testcase(_, Config) ->
    mi_ct:caught(fun() -> peer:stop(?config(peer, Config)) end),
    "" = os:cmd("rm -r -- '" ++ ?config(scratch, Config) ++ "'"),
    ok.

ebin() ->
    filename:dirname(code:which(mallocinfo)).

test_dir() ->
    filename:dirname(code:which(mi_hog)).

call(Config, M, F, A) ->
    peer:call(?config(peer, Config), M, F, A, 120000).

status(Config) ->
    {ok, S} = call(Config, mallocinfo_watch_capture, status, []),
    S.

%% Waits (CT's timetrap bounds it) until Pred holds for the capture's
%% status.
wait_status(Config, Pred) ->
    S = status(Config),
    case Pred(S) of
        true -> S;
        false -> timer:sleep(100), wait_status(Config, Pred)
    end.

%% Waits until the watcher has read the RSS N more times (the status's
%% rss changes with each read on a live node: counted by a probe of the
%% watcher's reductions instead, which grow with each check).
checks(Config, N) ->
    Pid = call(Config, erlang, whereis, [mallocinfo_watch_capture_server]),
    Reds = fun() -> {reductions, R} = call(Config, erlang, process_info, [Pid, reductions]), R end,
    R0 = Reds(),
    wait_reds(Reds, R0, N).

wait_reds(_, _, 0) -> ok;
wait_reds(Reds, R0, N) ->
    timer:sleep(100),
    case Reds() of
        R0 -> wait_reds(Reds, R0, N);
        R1 -> wait_reds(Reds, R1, N - 1)
    end.

files(Dir) ->
    {ok, Names} = file:list_dir(Dir),
    lists:sort(Names).

contents(Dir) ->
    maps:from_list([{N, element(2, file:read_file(filename:join(Dir, N)))} || N <- files(Dir)]).

captured(Config, N) ->
    wait_status(Config, fun(#{captures := Cs, busy := B}) -> length(Cs) =:= N andalso not B end).

%% Under the hysteresis again.
rearmed(Config) ->
    wait_status(Config, fun(#{armed := A}) -> A end).

cross(Config) ->
    call(Config, mi_hog, start, [?HOG]).

%%% Cases --------------------------------------------------------------------

%% Below the mark nothing is written. Each crossing writes one capture
%% (report, timeline, top, notes; the profiles left out with a note: the
%% tracker does not record), staying above writes nothing more, falling
%% under the hysteresis re-arms it. With keep => 2 the third capture
%% deletes the first one's files and nothing else: the files that were
%% there before (named as captures are) are never changed, nor the second
%% capture's by the third.
capture_once_per_crossing(Config) ->
    Dir = ?config(scratch, Config),
    Decoys = #{"mallocinfo-decoy-report.txt" => <<"the operator's">>,
               "mallocinfo-20000101T000000.000Z-notes.txt" => <<"older evidence">>},
    [ok = file:write_file(filename:join(Dir, N), C) || {N, C} <- maps:to_list(Decoys)],
    ok = call(Config, mallocinfo, watch, [#{period => 1000}]),
    Mark = call(Config, mallocinfo, rss, []) + ?ABOVE,
    ok = call(Config, mallocinfo, capture_on, [#{rss_above => Mark, dir => Dir, period => 100,
                                                 min_interval => 0, keep => 2}]),
    ?assertEqual({error, already_capturing},
                 call(Config, mallocinfo, capture_on, [#{rss_above => Mark, dir => Dir}])),
    checks(Config, 5),
    ?assertMatch(#{captures := [], armed := true, mark := Mark}, status(Config)),
    ?assertEqual(Decoys, contents(Dir)),

    %% First crossing.
    Hog1 = cross(Config),
    #{captures := [#{stamp := Stamp1, files := Files1}]} = captured(Config, 1),
    Kinds = ["report.txt", "timeline.json", "top.txt", "notes.txt"],
    ?assertEqual(lists:sort([filename:join(Dir, "mallocinfo-" ++ Stamp1 ++ "-" ++ K)
                             || K <- Kinds]), lists:sort(Files1)),
    Read = fun(K) ->
                   {ok, B} = file:read_file(filename:join(Dir, "mallocinfo-" ++ Stamp1
                                                          ++ "-" ++ K)),
                   B
           end,
    ?assertNotEqual(nomatch, binary:match(Read("report.txt"), <<"== mallocinfo report: ">>)),
    #{<<"times_ms">> := [_ | _], <<"layers">> := #{<<"rss">> := _}} =
        mi_json_decode:decode(Read("timeline.json")),
    ?assertNotEqual(nomatch, binary:match(Read("top.txt"), <<"memory (bytes)">>)),
    Notes = Read("notes.txt"),
    ct:log("~s", [Notes]),
    ?assertNotEqual(nomatch, binary:match(Notes, <<"crossed the mark ",
                                                   (integer_to_binary(Mark))/binary>>)),
    ?assertNotEqual(nomatch, binary:match(Notes, <<"heap.pb.gz: skipped: the tracker does not "
                                                   "record">>)),
    %% Above the mark for many more checks: nothing more.
    checks(Config, 10),
    ?assertMatch(#{captures := [_], armed := false, busy := false}, status(Config)),
    ?assertEqual(length(Kinds) + 2, length(files(Dir))),

    %% Second and third crossings.
    ok = call(Config, mi_hog, stop, [Hog1]),
    _ = rearmed(Config),
    Hog2 = cross(Config),
    #{captures := [_, #{stamp := Stamp2}]} = captured(Config, 2),
    Before = contents(Dir),
    ok = call(Config, mi_hog, stop, [Hog2]),
    _ = rearmed(Config),
    _ = cross(Config),
    #{captures := [#{stamp := Stamp2}, #{stamp := Stamp3}]} = captured(Config, 2),
    After = contents(Dir),
    Stamps = lists:usort([S || "mallocinfo-" ++ Rest <- maps:keys(After),
                               [S, _] <- [string:split(Rest, "-")],
                               S =/= "decoy", S =/= "20000101T000000.000Z"]),
    ?assertEqual(lists:sort([Stamp2, Stamp3]), Stamps),
    ?assert(Stamp1 < Stamp2 andalso Stamp2 < Stamp3),
    %% Nothing there before was changed: the decoys, the second capture.
    ?assertEqual(maps:without([N || N <- maps:keys(Before), string:find(N, Stamp1) =/= nomatch],
                              Before),
                 maps:with(maps:keys(Before), After)),
    ?assertEqual(Decoys, maps:with(maps:keys(Decoys), After)),
    %% No temporary file left behind.
    ?assertEqual([], [N || "." ++ _ = N <- files(Dir)]),
    ok = call(Config, mallocinfo, capture_off, []),
    ?assertEqual({error, not_capturing}, call(Config, mallocinfo_watch_capture, status, [])),
    ok = call(Config, mallocinfo, capture_off, []).

%% A second crossing within min_interval is held: armed, no capture, until
%% the interval ends. (And a relative dir stays the one it named.)
capture_rate_limited(Config) ->
    Dir = ?config(scratch, Config),
    Mark = call(Config, mallocinfo, rss, []) + ?ABOVE,
    %% A relative dir is the one it names when capture_on/1 is called,
    %% whatever the node's working directory is later.
    ok = call(Config, file, set_cwd, [filename:dirname(Dir)]),
    ok = call(Config, mallocinfo, capture_on, [#{rss_above => Mark, dir => filename:basename(Dir),
                                                 period => 100}]),
    ok = call(Config, file, set_cwd, ["/"]),
    Hog1 = cross(Config),
    #{captures := [#{stamp := Stamp}]} = captured(Config, 1),
    ?assert(lists:member("mallocinfo-" ++ Stamp ++ "-notes.txt", files(Dir))),
    ok = call(Config, mi_hog, stop, [Hog1]),
    _ = rearmed(Config),
    _ = cross(Config),
    wait_status(Config, fun(#{rss := R}) -> R > Mark end),
    checks(Config, 10),
    ?assertMatch(#{captures := [_], armed := true, busy := false}, status(Config)),
    ok = call(Config, mallocinfo, capture_off, []).

%% enoent, enotdir, and eacces (a node running as nobody, the directory
%% root's own 0700 one); the directory is left as it was; nothing starts.
capture_refuses_bad_dir(Config) ->
    Dir = ?config(scratch, Config),
    File = filename:join(Dir, "a-file"),
    ok = file:write_file(File, <<"x">>),
    On = fun(D) -> call(Config, mallocinfo, capture_on, [#{rss_above => 1, dir => D}]) end,
    ?assertEqual({error, enoent}, On(filename:join(Dir, "missing"))),
    ?assertEqual({error, enoent}, On(filename:join([Dir, "missing", "deeper"]))),
    ?assertEqual({error, enotdir}, On(File)),
    ?assertEqual({error, enotdir}, On(filename:join(File, "sub"))),
    ?assertEqual({error, not_capturing}, call(Config, mallocinfo_watch_capture, status, [])),
    ?assertEqual(["a-file"], files(Dir)),
    Erl = os:find_executable("erl"),
    Out = os:cmd(lists:flatten(
                   io_lib:format("setpriv --reuid=65534 --regid=65534 --clear-groups "
                                 "env HOME=/nonexistent ~s -noshell -pa '~s' -eval "
                                 "'io:format(\"~~p~~n\", [mallocinfo:capture_on(#{rss_above => 1, "
                                 "dir => \"~s\"})]), halt().' 2>&1",
                                 [Erl, ebin(), Dir]))),
    ct:log("as nobody: ~s", [Out]),
    ?assertEqual("{error,eacces}\n", Out),
    ?assertEqual(["a-file"], files(Dir)).

%% A fraction of the node's cgroup v2 limit: the mark is that fraction of
%% what mallocinfo_watch_capture:cgroup_limit/2 reads from this machine's
%% own files, or {error, no_limit} when it reads none (as on a host with
%% no cgroup v2 memory limit).
capture_fraction_of_cgroup(Config) ->
    Dir = ?config(scratch, Config),
    Limit = call(Config, mallocinfo_watch_capture, cgroup_limit,
                 ["/proc/self/cgroup", "/sys/fs/cgroup"]),
    ct:log("cgroup limit: ~p", [Limit]),
    Result = call(Config, mallocinfo, capture_on, [#{rss_above => {fraction, 0.5}, dir => Dir}]),
    case Limit of
        {error, no_limit} ->
            ?assertEqual({error, no_limit}, Result);
        {ok, L} ->
            ?assertEqual(ok, Result),
            ?assertMatch(#{mark := M} when M =:= L div 2 orelse M =:= trunc(0.5 * L),
                         status(Config))
    end.

%% Under the tracker (preloaded, recording), a capture has the pprof
%% profile (gzipped, decoded as profile.proto) and the folded stacks, as
%% mallocinfo_trace:pprof/0 and folded/0 give them. The mark is low: the
%% RSS is above it at once, a crossing.
capture_with_tracker(Config) ->
    Dir = ?config(scratch, Config),
    ?assertMatch(#{recording := true}, call(Config, mallocinfo_trace, status, [])),
    ok = call(Config, mallocinfo, capture_on, [#{rss_above => ?MiB, dir => Dir}]),
    #{captures := [#{stamp := Stamp, files := Files}]} = captured(Config, 1),
    File = fun(K) -> filename:join(Dir, "mallocinfo-" ++ Stamp ++ "-" ++ K) end,
    ?assertEqual(lists:sort([File(K) || K <- ["report.txt", "heap.pb.gz", "heap.folded",
                                              "top.txt", "notes.txt"]]), lists:sort(Files)),
    {ok, Pprof} = file:read_file(File("heap.pb.gz")),
    #{samples := [_ | _]} = mi_pprof_decode:profile(zlib:gunzip(Pprof)),
    {ok, Folded} = file:read_file(File("heap.folded")),
    Lines = [L || L <- binary:split(Folded, <<"\n">>, [global]), L =/= <<>>],
    ?assert(length(Lines) > 0),
    [{match, _} = re:run(L, "^.+ [0-9]+$") || L <- Lines],
    {ok, Notes} = file:read_file(File("notes.txt")),
    ct:log("~s", [Notes]),
    ?assertNotEqual(nomatch, binary:match(Notes, <<"timeline.json: skipped: the sampler does "
                                                   "not run">>)),
    ok = call(Config, mallocinfo, capture_off, []).
