%% Profiles other tools read, end to end: a peer node with the interposer
%% preloaded and a test NIF that allocates from functions with known names
%% (mi_pprof_nif), serving HTTP. Go's own `go tool pprof' (Debian's
%% golang-go, with the network and the module proxy off) must read
%% mallocinfo_trace:pprof/0's file and /debug/pprof/heap and show the test
%% function's exact in-use bytes; ?seconds=1 must show only what was
%% allocated in that second; /heap.folded must sum to the live total; the
%% flame graph page must draw in headless Chromium with no script error,
%% the test function its widest top frame. Churn (issue 26): a function
%% that allocates and frees 1 GB in 64-byte blocks shows exactly
%% 1,000,000,000 bytes of alloc_space in `full' mode (within 5% in
%% `sample' mode), in mallocinfo_trace:churn/2 and in Go's pprof, from the
%% file and from /debug/pprof/allocs, its blocks temporary and short-lived;
%% /debug/pprof/allocs?seconds=N is the difference of two cumulative
%% profiles.
-module(mallocinfo_pprof_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2,
         end_per_testcase/2]).
-export([go_reads_file/1, go_reads_http/1, delta_seconds/1, folded_sums/1, sample_mode/1,
         small_leak_on_top/1,
         flamegraph_chromium/1, flamegraph_harness_sees_errors/1, flamegraph_prototype_names/1,
         not_preloaded/1,
         bad_params/1, many_sites/1, jemalloc_alone/1, jemalloc_behind_tracker/1,
         churn_full/1, churn_sample/1, allocs_delta/1, churn_old_interposer/1]).
-export([wait_for_window/0, measure/3]).

-define(HTTPC, mallocinfo_pprof_SUITE).
-define(JEMALLOC, "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2").

all() ->
    [not_preloaded, bad_params, go_reads_file, go_reads_http, delta_seconds, folded_sums,
     sample_mode, small_leak_on_top, flamegraph_chromium, flamegraph_harness_sees_errors,
     flamegraph_prototype_names, many_sites,
     jemalloc_alone, jemalloc_behind_tracker, churn_full, churn_sample, allocs_delta,
     churn_old_interposer].

init_per_suite(Config) ->
    ok = mi_ct:build_nif(Config, "mi_pprof_nif"),
    {ok, _} = application:ensure_all_started(inets),
    {ok, _} = inets:start(httpc, [{profile, ?HTTPC}]),
    ok = httpc:set_options([{max_keep_alive_length, 0}, {keep_alive_timeout, 0}], ?HTTPC),
    warm_go_cache(Config).

end_per_suite(_Config) ->
    ok = inets:stop(httpc, ?HTTPC).

init_per_testcase(not_preloaded, Config) ->
    {ok, #{port := Port}} = mallocinfo_http:start(#{}),
    [{port, Port} | Config];
init_per_testcase(small_leak_on_top, Config) ->
    %% Preloaded but off until the case switches it on: the VM's start-up
    %% carriers (erts_alloc_init's 3 MiB of malloc) are not recorded, so
    %% the largest live blocks are the leak's, or mallocinfo's own if they
    %% were ever recorded.
    start_peer(Config, #{mode => off});
init_per_testcase(flamegraph_prototype_names, Config) ->
    Config;
init_per_testcase(sample_mode, Config) ->
    start_peer(Config, #{mode => sample, sample_bytes => 4096});
init_per_testcase(churn_sample, Config) ->
    %% 64 KiB: 15,000 sample points in 1 GB, so 5% is six standard
    %% deviations of the estimate (the default 512 KiB gives 1,900: 2.2).
    start_peer(Config, #{mode => sample, sample_bytes => 65536});
init_per_testcase(jemalloc_alone, Config) ->
    start_peer(Config, [{"LD_PRELOAD", ?JEMALLOC}]);
init_per_testcase(jemalloc_behind_tracker, Config) ->
    [{"LD_PRELOAD", Tracker} | Knobs] = mallocinfo_trace:preload_env(),
    start_peer(Config, [{"LD_PRELOAD", Tracker ++ " " ++ ?JEMALLOC} | Knobs]);
init_per_testcase(churn_old_interposer, Config) ->
    %% mi_old_abi.so ahead of the interposer: the ABI as the release
    %% before churn answered it (test data's mi_old_abi.c).
    Common = filename:join([mi_ct:project_root(), "c_src", "common"]),
    ok = mi_ct:build_nif(Config, "mi_old_abi", "-I" ++ Common),
    Shim = filename:join(?config(priv_dir, Config), "mi_old_abi.so"),
    [{"LD_PRELOAD", Tracker} | Knobs] = mallocinfo_trace:preload_env(),
    start_peer(Config, [{"LD_PRELOAD", Shim ++ " " ++ Tracker} | Knobs]);
init_per_testcase(_, Config) ->
    start_peer(Config, #{}).

end_per_testcase(not_preloaded, Config) ->
    mallocinfo_http:stop(?config(port, Config));
end_per_testcase(flamegraph_prototype_names, _Config) ->
    ok;
end_per_testcase(_, Config) ->
    peer:stop(?config(peer, Config)).

start_peer(Config, Opts) when is_map(Opts) ->
    start_peer(Config, mallocinfo_trace:preload_env(Opts));
start_peer(Config, Env) ->
    Config1 = mi_ct:start_peer(Config, Env, ["-pa", filename:dirname(code:which(?MODULE))]),
    {ok, #{port := Port}} = mi_ct:call(Config1, mallocinfo_http, start, [#{}]),
    [{port, Port} | Config1].

call(Config, M, F, A) ->
    mi_ct:call(Config, M, F, A).

ok_call(Config, M, F, A) ->
    mi_ct:ok_call(Config, M, F, A).

get(Config, Path) ->
    Url = url(Config, Path),
    {ok, {{_, Code, _}, Headers, Body}} =
        httpc:request(get, {Url, []}, [{timeout, 120000}], [{body_format, binary}], ?HTTPC),
    {Code, Headers, Body}.

url(Config, Path) ->
    "http://127.0.0.1:" ++ integer_to_list(?config(port, Config)) ++ Path.

%% A scratch directory of this test case's own.
scratch(Config, Name) ->
    Dir = filename:join(?config(priv_dir, Config), Name),
    ok = filelib:ensure_path(Dir),
    Dir.

%%% go tool pprof ------------------------------------------------------------------

go() ->
    case os:find_executable("go") of
        false -> ct:fail("go is not installed: make deps installs golang-go (docker/packages.txt)");
        Path -> Path
    end.

%% Go 1.25 and later ship no pprof binary: `go tool pprof' builds it from
%% GOROOT's sources into the build cache on first use (Debian unstable's Go
%% 1.27: 108 s of CPU at a load average of 5, 0.8 s once cached). So the
%% suite's cases share one cache, built here with room for a loaded
%% machine; on a Go with the tool prebuilt this takes a second. (Each case
%% with a cache of its own rebuilt the tool, and a full matrix run on sid at
%% a load average of 9 failed with go_tool_pprof_timeout.)
warm_go_cache(Config) ->
    Cache = filename:join(?config(priv_dir, Config), "gocache"),
    ok = filelib:ensure_path(Cache),
    Config1 = [{go_cache, Cache} | Config],
    T0 = erlang:monotonic_time(millisecond),
    {Status, Lines} = run_go(Config1, scratch(Config, "go-warm"), ["tool", "pprof", "-h"], 900000),
    ct:log("go tool pprof -h (builds pprof when the Go has no prebuilt one): exit ~b in ~b ms~n~ts",
           [Status, erlang:monotonic_time(millisecond) - T0, lists:join($\n, Lines)]),
    ?assertEqual(0, Status),
    Config1.

%% go Args with Go's caches and pprof's copies of fetched profiles in Dir
%% (the build cache the suite's); GOPROXY=off and GOTOOLCHAIN=local keep it
%% off the network. {ExitStatus, Lines}.
run_go(Config, Dir, Args, Timeout) ->
    Env = [{"HOME", Dir}, {"GOPATH", filename:join(Dir, "gopath")},
           {"GOCACHE", ?config(go_cache, Config)}, {"PPROF_TMPDIR", Dir},
           {"GOPROXY", "off"}, {"GOTOOLCHAIN", "local"}, {"GOFLAGS", ""}],
    Port = open_port({spawn_executable, go()},
                     [{args, Args}, {env, Env}, exit_status, stderr_to_stdout, binary,
                      {line, 65536}]),
    collect(Port, [], Timeout).

%% `go tool pprof -top' in bytes, every node shown, as {Function, Flat, Cum}.
go_top(Config, Source) ->
    go_top(Config, Source, "inuse_space").

go_top(Config, Source, Index) ->
    {Status, Lines} = run_go(Config, scratch(Config, "go"),
                             ["tool", "pprof", "-top", "-unit=B", "-nodefraction=0",
                              "-sample_index=" ++ Index, Source], 120000),
    ct:log("go tool pprof -top ~ts: exit ~b~n~ts", [Source, Status, lists:join($\n, Lines)]),
    ?assertEqual(0, Status),
    [{Name, bytes(Flat), bytes(Cum)}
     || L <- Lines,
        {match, [Flat, Cum, Name]} <-
            [re:run(L, "^\\s*(\\d+B)\\s+\\S+%\\s+\\S+%\\s+(\\d+B)\\s+\\S+%\\s+(.*)$",
                    [{capture, all_but_first, binary}])]].

collect(Port, Acc, Timeout) ->
    receive
        {Port, {data, {eol, L}}} -> collect(Port, [L | Acc], Timeout);
        {Port, {data, {noeol, L}}} -> collect(Port, [L | Acc], Timeout);
        {Port, {exit_status, S}} -> {S, lists:reverse(Acc)}
    after Timeout ->
        ct:fail(go_tool_pprof_timeout)
    end.

bytes(B) ->
    binary_to_integer(binary:part(B, 0, byte_size(B) - 1)).

function(Top, Name) ->
    case lists:keyfind(Name, 1, Top) of
        {_, Flat, Cum} -> {Flat, Cum};
        false -> absent
    end.

%%% Cases --------------------------------------------------------------------------

%% This CT node has no tracker: the routes say so (409), and the API too.
not_preloaded(Config) ->
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:pprof()),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:folded()),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:pprof(#{seconds => 1})),
    [begin
         {Code, _, Body} = get(Config, P),
         ?assertEqual({409, P}, {Code, P}),
         ?assertMatch({_, _}, binary:match(Body, <<"not preloaded">>))
     end || P <- ["/debug/pprof/heap", "/debug/pprof/allocs", "/heap.folded",
                  "/flamegraph.html"]].

bad_params(Config) ->
    [?assertEqual({400, P}, {element(1, get(Config, P)), P})
     || P <- ["/debug/pprof/heap?seconds=0", "/debug/pprof/heap?seconds=61",
              "/debug/pprof/heap?seconds=x", "/debug/pprof/heap?seconds=1&seconds=2",
              "/debug/pprof/heap?debug=1", "/debug/pprof/allocs?seconds=0",
              "/debug/pprof/allocs?x=1", "/heap.folded?x=1", "/flamegraph.html?view=tree",
              "/flamegraph.html?view=stack&view=object", "/flamegraph.html?x=1"]],
    %% Go's scrapers send gc=1: accepted.
    ?assertMatch({200, _, _}, get(Config, "/debug/pprof/heap?gc=1")),
    %% Only GET, as every route.
    {ok, {{_, 405, _}, Headers, _}} =
        httpc:request(post, {url(Config, "/debug/pprof/heap"), [], "text/plain", ""}, [], [],
                      ?HTTPC),
    ?assertEqual("GET", proplists:get_value("allow", Headers)),
    ?assertError(badarg, call(Config, mallocinfo_trace, pprof, [#{seconds => 0}])),
    ?assertError(badarg, call(Config, mallocinfo_trace, pprof, [#{seconds => 301}])),
    ?assertError(badarg, call(Config, mallocinfo_trace, pprof, [#{demangle => yes}])),
    ?assertError(badarg, call(Config, mallocinfo_trace, pprof, [#{depth => 1}])),
    ?assertError(badarg, call(Config, mallocinfo_trace, pprof, [[]])),
    ?assertError(badarg, call(Config, mallocinfo_trace, pprof, [#{profile => inuse}])),
    ?assertError(badarg, call(Config, mallocinfo_trace, churn, [-1])),
    ?assertError(badarg, call(Config, mallocinfo_trace, churn, [1, #{by => process}])),
    ?assertError(badarg, call(Config, mallocinfo_trace, churn, [1, #{short_lived_ms => 0}])),
    ?assertError(badarg, call(Config, mallocinfo_trace, churn, [1, #{sort => x}])).

%% mallocinfo_trace:pprof/0's bytes, written to a file, read by Go's pprof:
%% the test function holds exactly what it allocated.
go_reads_file(Config) ->
    ok = call(Config, mi_pprof_nif, leak, [1000, 1000]),
    {ok, Profile} = call(Config, mallocinfo_trace, pprof, []),
    File = filename:join(scratch(Config, "file"), "heap.pb.gz"),
    ok = file:write_file(File, Profile),
    Top = go_top(Config, File),
    ?assertEqual({1000000, 1000000}, function(Top, <<"mi_pprof_leak_here">>)).

%% The same straight from the URL Go's tools scrape.
go_reads_http(Config) ->
    ok = call(Config, mi_pprof_nif, leak, [2000, 700]),
    {200, Headers, _} = get(Config, "/debug/pprof/heap"),
    ?assertEqual("application/octet-stream", proplists:get_value("content-type", Headers)),
    Top = go_top(Config, url(Config, "/debug/pprof/heap")),
    ?assertEqual({1400000, 1400000}, function(Top, <<"mi_pprof_leak_here">>)).

%% ?seconds=1: what was allocated during that second (and is still live),
%% nothing from before. The test allocates inside the window once the
%% request is seen waiting in it (an event, not a guess at timing).
delta_seconds(Config) ->
    ok = call(Config, mi_pprof_nif, leak, [500, 1000]),
    Self = self(),
    Req = spawn_link(fun() ->
                             Self ! {delta, get(Config, "/debug/pprof/heap?seconds=1")}
                     end),
    ok = call(Config, ?MODULE, wait_for_window, []),
    ok = call(Config, mi_pprof_nif, window, [30, 1234]),
    Body = receive {delta, {200, _, B}} -> B after 120000 -> ct:fail(no_delta) end,
    unlink(Req),
    File = filename:join(scratch(Config, "delta"), "delta.pb.gz"),
    ok = file:write_file(File, Body),
    Top = go_top(Config, File),
    ?assertEqual({30 * 1234, 30 * 1234}, function(Top, <<"mi_pprof_window_here">>)),
    ?assertEqual(absent, function(Top, <<"mi_pprof_leak_here">>)),
    %% A full profile has both.
    Full = go_top(Config, url(Config, "/debug/pprof/heap")),
    ?assertEqual({500000, 500000}, function(Full, <<"mi_pprof_leak_here">>)),
    ?assertEqual({30 * 1234, 30 * 1234}, function(Full, <<"mi_pprof_window_here">>)).

%% Runs on the peer: returns once a process waits in a delta profile's
%% window (in timer:sleep/1, called from mallocinfo_trace).
wait_for_window() ->
    Waiting = [P || P <- processes(),
                    {current_stacktrace, Stack} <- [process_info(P, current_stacktrace)],
                    lists:keymember(timer, 1, Stack),
                    lists:any(fun({M, F, _, _}) -> {M, F} =:= {mallocinfo_trace, profile_data} end,
                              Stack)],
    case Waiting of
        [] -> receive after 5 -> wait_for_window() end;
        [_ | _] -> ok
    end.

%% /heap.folded: root-first lines whose bytes sum to the live total of the
%% snapshot they come from (X-Live-Bytes); the test function's lines hold
%% exactly its bytes, and it is their leaf.
folded_sums(Config) ->
    ok = call(Config, mi_pprof_nif, leak, [100, 4096]),
    {200, Headers, Body} = get(Config, "/heap.folded"),
    Lines = binary:split(Body, <<"\n">>, [global, trim_all]),
    Parsed = [begin
                  [Stack, Bytes] = string:split(L, <<" ">>, trailing),
                  {binary:split(Stack, <<";">>, [global]), binary_to_integer(Bytes)}
              end || L <- Lines],
    Total = lists:sum([B || {_, B} <- Parsed]),
    ?assertEqual(list_to_integer(proplists:get_value("x-live-bytes", Headers)), Total),
    Leaks = [{Frames, B} || {Frames, B} <- Parsed,
                            binary:match(lists:last(Frames), <<"mi_pprof_leak_here (">>) =/= nomatch],
    ?assertEqual(409600, lists:sum([B || {_, B} <- Leaks])),
    [{[Root | _], _} | _] = Parsed,
    %% Root first: the stacks start where threads start.
    ct:log("first root: ~ts", [Root]),
    ?assert(lists:all(fun({Frames, _}) -> length(Frames) >= 2 end, Leaks)),
    %% Every frame names its object.
    ?assert(lists:all(fun({Frames, _}) ->
                              lists:all(fun(Fr) -> binary:last(Fr) =:= $) end, Frames)
                      end, [P || {[F | _], _} = P <- Parsed, F =/= <<"[no stack recorded]">>])).

%% Sample mode: values already scaled (the unbiased estimates sites/1
%% gives), and the period says the sampling interval.
sample_mode(Config) ->
    ok = call(Config, mi_pprof_nif, leak, [2000, 10000]),
    {ok, Gz} = call(Config, mallocinfo_trace, pprof, []),
    P = mi_pprof_decode:profile(zlib:gunzip(Gz)),
    ?assertEqual(4096, maps:get(period, P)),
    [#{bytes := Est, count := N}] =
        [S || #{stack := [#{symbol := <<"mi_pprof_leak_here">>} | _]} = S
                  <- ok_call(Config, mallocinfo_trace, sites, [1000])],
    Leaf = [V || #{values := V, leaf := <<"mi_pprof_leak_here">>} <- maps:get(samples, P)],
    %% alloc_* from the churn counters: the same sampled blocks, weighed
    %% apart (the tracker rounds each block's bytes, up to half a byte of
    %% some 11,000: 0.005%).
    [[AN, AEst, N, Est]] = Leaf,
    ct:log("alloc ~b ~b, inuse ~b ~b", [AN, AEst, N, Est]),
    ?assert(abs(AN - N) =< 1 andalso abs(AEst - Est) * 10000 =< Est),
    %% 2000 blocks of 10000 bytes, each sampled with p = 1 - e^(-10000/4096)
    %% = 0.913: the estimate is within a few percent of the truth.
    ?assert(abs(Est - 20000000) < 20000000 div 10).

%%% Churn ------------------------------------------------------------------------------

-define(GB, 1000000000).
-define(BLOCKS, (?GB div 64)).

%% Full mode: 1 GB allocated and freed in 64-byte blocks, one live at a
%% time, from one named function: churn/2 counts it exactly, every block
%% temporary and short-lived; Go's pprof shows its alloc_space exactly,
%% from the file and from /debug/pprof/allocs (whose default sample type
%% is alloc_space), while its inuse_space is 0.
churn_full(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    ok = call(Config, mi_pprof_nif, churn, [?GB, 64]),
    Row = churn_row(Config, #{by => function}),
    ct:log("churn row: ~p", [Row]),
    ?assertMatch(#{allocated_bytes := ?GB, allocated_count := ?BLOCKS, freed_bytes := ?GB,
                   freed_count := ?BLOCKS, estimated := false, stacks := 1}, Row),
    #{temporary_count := Temporary, lifetimes := Lifetimes, short_lived_count := Short} = Row,
    %% Only the first block of the thread can miss (a thread's first
    %% allocation may come before its state is taken).
    ?assert(Temporary >= ?BLOCKS - 1),
    %% Within the clock's tick but for the pairs that straddled one.
    ?assertEqual(Short, proplists:get_value(1, Lifetimes)),
    ?assert(Short >= ?BLOCKS * 99 div 100),
    ?assertEqual(?BLOCKS, lists:sum([C || {_, C} <- Lifetimes])),
    %% By stack: the same figures, the stack as sites/1 gives it.
    [ByStack] = [R || #{stack := [#{symbol := <<"mi_pprof_churn_here">>} | _]} = R
                          <- ok_call(Config, mallocinfo_trace, churn, [20])],
    ?assertMatch(#{allocated_bytes := ?GB, freed_bytes := ?GB, label := native}, ByStack),
    ?assert(is_map_key(erlang, ByStack)),
    {ok, Profile} = call(Config, mallocinfo_trace, pprof, []),
    File = filename:join(scratch(Config, "churn"), "heap.pb.gz"),
    ok = file:write_file(File, Profile),
    ?assertEqual({?GB, ?GB}, function(go_top(Config, File, "alloc_space"), <<"mi_pprof_churn_here">>)),
    ?assertEqual(absent, function(go_top(Config, File), <<"mi_pprof_churn_here">>)),
    Url = url(Config, "/debug/pprof/allocs"),
    {200, Headers, Body} = get(Config, "/debug/pprof/allocs"),
    ?assertEqual("attachment; filename=\"allocs.pb.gz\"",
                 proplists:get_value("content-disposition", Headers)),
    P = mi_pprof_decode:profile(zlib:gunzip(Body)),
    ?assertEqual(<<"alloc_space">>, maps:get(default_sample_type, P)),
    ?assertEqual({?GB, ?GB}, function(go_top(Config, Url, "alloc_space"), <<"mi_pprof_churn_here">>)),
    %% mallocinfo never measures itself: after all these queries (each a
    %% NIF call that allocates), no churn row is in mallocinfo's objects.
    All = ok_call(Config, mallocinfo_trace, churn, [infinity, #{by => object}]),
    ?assertEqual([], [R || #{label := self} = R <- All]),
    ?assertEqual([], [R || #{object := O} = R <- All, is_binary(O),
                           lists:member(filename:basename(O), [<<"mallocinfo_nif.so">>,
                                                               <<"libmallocinfo_preload.so">>])]),
    %% reset() forgets it.
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    ?assertEqual([], [R || #{function := <<"mi_pprof_churn_here">>} = R
                               <- ok_call(Config, mallocinfo_trace, churn,
                                          [infinity, #{by => function}])]).

%% Sample mode: the same within 5%, estimated.
churn_sample(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    ok = call(Config, mi_pprof_nif, churn, [?GB, 64]),
    Row = churn_row(Config, #{by => function}),
    ct:log("churn row: ~p", [Row]),
    #{allocated_bytes := Bytes, allocated_count := Count, freed_bytes := Freed,
      temporary_count := Temporary, lifetimes := Lifetimes, estimated := true} = Row,
    ?assert(abs(Bytes - ?GB) < ?GB div 20),
    ?assert(abs(Count - ?BLOCKS) < ?BLOCKS div 20),
    ?assertEqual(Bytes, Freed),
    ?assert(Temporary >= Count * 95 div 100),
    ?assert(proplists:get_value(1, Lifetimes) >= Count * 95 div 100),
    {ok, Profile} = call(Config, mallocinfo_trace, pprof, []),
    File = filename:join(scratch(Config, "churn"), "heap.pb.gz"),
    ok = file:write_file(File, Profile),
    {Flat, _} = function(go_top(Config, File, "alloc_space"), <<"mi_pprof_churn_here">>),
    ?assert(abs(Flat - ?GB) < ?GB div 20),
    {Flat2, _} = function(go_top(Config, url(Config, "/debug/pprof/allocs"), "alloc_space"),
                          <<"mi_pprof_churn_here">>),
    ?assert(abs(Flat2 - ?GB) < ?GB div 20).

churn_row(Config, Opts) ->
    [Row] = [R || #{function := <<"mi_pprof_churn_here">>} = R
                      <- ok_call(Config, mallocinfo_trace, churn, [infinity, Opts])],
    Row.

%% A NIF of this release beside the interposer of the one before (which
%% had no churn): churn/1,2 answer {error, enotsup}; live sites, pprof
%% (alloc_* then the live figures), /debug/pprof/allocs and the report
%% work as before, the report without its churn section.
churn_old_interposer(Config) ->
    ok = call(Config, mi_pprof_nif, leak, [100, 1000]),
    ?assertEqual({error, enotsup}, call(Config, mallocinfo_trace, churn, [10])),
    ?assertEqual({error, enotsup},
                 call(Config, mallocinfo_trace, churn, [10, #{by => function}])),
    [#{bytes := 100000, count := 100}] =
        [S || #{stack := [#{symbol := <<"mi_pprof_leak_here">>} | _]} = S
                  <- ok_call(Config, mallocinfo_trace, sites, [1000])],
    {ok, Gz} = call(Config, mallocinfo_trace, pprof, []),
    P = mi_pprof_decode:profile(zlib:gunzip(Gz)),
    ?assertEqual([[100, 100000, 100, 100000]],
                 [V || #{values := V, leaf := <<"mi_pprof_leak_here">>} <- maps:get(samples, P)]),
    {200, _, Body} = get(Config, "/debug/pprof/allocs"),
    ?assertEqual(<<"alloc_space">>,
                 maps:get(default_sample_type, mi_pprof_decode:profile(zlib:gunzip(Body)))),
    Collected = call(Config, mallocinfo_report, collect, []),
    Report = unicode:characters_to_binary(call(Config, mallocinfo_report, format, [Collected])),
    ct:log("~ts", [Report]),
    ?assertEqual(nomatch, binary:match(Report, <<"churn">>)),
    ?assertNotEqual(nomatch, binary:match(Report, <<"mi_pprof_leak_here">>)).

%% /debug/pprof/allocs?seconds=1: what was allocated in that second, as
%% the difference of two cumulative profiles: the churn inside the window
%% exactly, nothing of the churn before it.
allocs_delta(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    ok = call(Config, mi_pprof_nif, leak, [100, 1000]),
    ok = call(Config, mi_pprof_nif, churn, [64000000, 64]),
    Self = self(),
    Req = spawn_link(fun() ->
                             Self ! {delta, get(Config, "/debug/pprof/allocs?seconds=1")}
                     end),
    ok = call(Config, ?MODULE, wait_for_window, []),
    ok = call(Config, mi_pprof_nif, churn, [6400000, 64]),
    Body = receive {delta, {200, _, B}} -> B after 120000 -> ct:fail(no_delta) end,
    unlink(Req),
    File = filename:join(scratch(Config, "delta"), "allocs.pb.gz"),
    ok = file:write_file(File, Body),
    Top = go_top(Config, File, "alloc_space"),
    ?assertEqual({6400000, 6400000}, function(Top, <<"mi_pprof_churn_here">>)),
    ?assertEqual(absent, function(Top, <<"mi_pprof_leak_here">>)),
    %% The cumulative profile has both, the churn of both calls.
    Full = go_top(Config, url(Config, "/debug/pprof/allocs"), "alloc_space"),
    ?assertEqual({70400000, 70400000}, function(Full, <<"mi_pprof_churn_here">>)),
    ?assertEqual({100000, 100000}, function(Full, <<"mi_pprof_leak_here">>)).

%%% The flame graph page -------------------------------------------------------------

%% Served over HTTP, drawn by Chromium: no script error, and the test
%% function, holding 64 MB, is the widest frame by function; by object its
%% NIF's file is. A screenshot is kept (README shows one).
flamegraph_chromium(Config) ->
    ok = call(Config, mi_pprof_nif, leak, [1024, 65536]),
    {200, Headers, Page} = get(Config, "/flamegraph.html"),
    ?assertEqual("text/html; charset=utf-8", proplists:get_value("content-type", Headers)),
    %% Self-contained: nothing to fetch.
    nomatch = re:run(Page, "(src|href)=|fetch\\(|XMLHttpRequest|https?://"),
    Views = [{"function", <<"mi_pprof_leak_here">>}, {"object", <<"mi_pprof_nif.so">>}],
    [begin
         Dom = mi_ct:chromium(Config, ["--virtual-time-budget=10000", "--dump-dom",
                                 url(Config, "/flamegraph.html?view=" ++ View)]),
         Attrs = mi_ct:body_attrs(Dom),
         ct:log("view ~s: ~p", [View, Attrs]),
         ?assertMatch(#{<<"data-ok">> := <<"1">>, <<"data-errors">> := <<"0">>}, Attrs),
         ?assertEqual(list_to_binary(View), maps:get(<<"data-view">>, Attrs)),
         ?assertEqual(Widest, maps:get(<<"data-widest">>, Attrs)),
         ?assert(binary_to_integer(maps:get(<<"data-total">>, Attrs)) >= 64 * 1024 * 1024)
     end || {View, Widest} <- Views],
    %% The search box: searching the function highlights exactly its bytes.
    Dom = mi_ct:chromium(Config, ["--virtual-time-budget=10000", "--dump-dom",
                            url(Config, "/flamegraph.html?view=stack&search=mi_pprof_leak")]),
    ?assertMatch(#{<<"data-matched">> := <<"67108864">>, <<"data-ok">> := <<"1">>},
                 mi_ct:body_attrs(Dom)),
    Shot = filename:join(scratch(Config, "shot"), "flamegraph.png"),
    _ = mi_ct:chromium(Config, ["--window-size=1200,700", "--virtual-time-budget=10000",
                          "--screenshot=" ++ Shot,
                          url(Config, "/flamegraph.html?view=function")]),
    {ok, Png} = file:read_file(Shot),
    <<137, "PNG", _/binary>> = Png,
    ct:log("screenshot: <a href=\"~ts\">~ts</a>", [Shot, Shot]).

%% Issue 22's second case: a NIF leaks 1000 x 333 B (333,000 bytes, less
%% than the 512 KiB table a query used to build for itself). The first row
%% of sites(1), the top of go tool pprof and the flame graph's widest frame
%% are the leak, exactly: mallocinfo's own allocations never compete.
small_leak_on_top(Config) ->
    ok = call(Config, mallocinfo_trace, set_mode, [full]),
    ok = call(Config, mi_pprof_nif, leak, [1000, 333]),
    %% Every view once first: whatever they cache is there for the second.
    {ok, _} = call(Config, mallocinfo_trace, sites, [10]),
    {200, _, _} = get(Config, "/flamegraph.html?view=function"),
    ?assertMatch([#{count := 1000, bytes := 333000, estimated := false,
                    stack := [#{symbol := <<"mi_pprof_leak_here">>} | _]}],
                 ok_call(Config, mallocinfo_trace, sites, [1])),
    [{Top, Flat, _} | _] = go_top(Config, url(Config, "/debug/pprof/heap")),
    ?assertEqual({<<"mi_pprof_leak_here">>, 333000}, {Top, Flat}),
    Dom = mi_ct:chromium(Config, ["--virtual-time-budget=10000", "--dump-dom",
                            url(Config, "/flamegraph.html?view=function")]),
    Attrs = mi_ct:body_attrs(Dom),
    ct:log("~p", [Attrs]),
    ?assertMatch(#{<<"data-ok">> := <<"1">>, <<"data-widest">> := <<"mi_pprof_leak_here">>},
                 Attrs),
    %% The page says what it covers, beside the node's RSS.
    ?assertMatch({_, _}, binary:match(Dom, <<"malloc'ed memory seen since the node started">>)),
    ?assertMatch({_, _}, binary:match(Dom, <<" RSS">>)).

%% The page's error capture is not blind: a script error is recorded and
%% data-ok never set.
flamegraph_harness_sees_errors(Config) ->
    {200, _, Page} = get(Config, "/flamegraph.html"),
    Broken = binary:replace(Page, <<"  parse();\n">>, <<"  parse();\n  undefinedFunction();\n">>),
    ?assertNotEqual(Page, Broken),
    File = filename:join(scratch(Config, "broken"), "broken.html"),
    ok = file:write_file(File, Broken),
    Dom = mi_ct:chromium(Config, ["--virtual-time-budget=10000", "--dump-dom", "file://" ++ File]),
    Attrs = mi_ct:body_attrs(Dom),
    ?assertEqual(<<"1">>, maps:get(<<"data-errors">>, Attrs)),
    ?assertNot(maps:is_key(<<"data-ok">>, Attrs)),
    ?assertMatch({_, _}, binary:match(Dom, <<"undefinedFunction">>)).

%% Issue 28: functions and objects named like the members every plain
%% JavaScript object inherits (constructor, __proto__, toString,
%% hasOwnProperty, valueOf) are boxes like any other in every view: the
%% page, made from canned collapsed stacks and opened from a file, draws
%% with no script error and the right widest box.
flamegraph_prototype_names(Config) ->
    Names = ["constructor", "__proto__", "toString", "hasOwnProperty", "valueOf"],
    %% Root first, leaf last: "caller (object);allocator (object) bytes".
    Folded = [[N, " (", N, ".so);", N, " (libx.so) ", integer_to_list(1000 * I), "\n"]
              || {I, N} <- lists:zip(lists:seq(1, length(Names)), Names)],
    File = filename:join(scratch(Config, "prototype"), "flamegraph.html"),
    ok = file:write_file(File, mallocinfo_http_flamegraph:page(Folded, "prototype names")),
    [begin
         Dom = mi_ct:chromium(Config, ["--virtual-time-budget=10000", "--dump-dom",
                                 "'file://" ++ File ++ "?view=" ++ View ++ "'"]),
         Attrs = mi_ct:body_attrs(Dom),
         ct:log("view ~s: ~p", [View, Attrs]),
         ?assertMatch(#{<<"data-ok">> := <<"1">>, <<"data-errors">> := <<"0">>}, Attrs),
         ?assertEqual(list_to_binary(View), maps:get(<<"data-view">>, Attrs)),
         ?assertEqual(<<"15000">>, maps:get(<<"data-total">>, Attrs)),
         ?assertEqual(Widest, maps:get(<<"data-widest">>, Attrs)),
         %% One box per name (and, by object and by stack, per object).
         [?assertMatch({_, _}, binary:match(Dom, <<">", (list_to_binary(N))/binary, "<">>))
          || N <- Boxes]
     end || {View, Widest, Boxes} <-
                [{"function", <<"valueOf">>, Names},
                 {"object", <<"libx.so">>, [N ++ ".so" || N <- Names]},
                 {"stack", <<"valueOf (valueOf.so)">>, [N ++ " (" ++ N ++ ".so)" || N <- Names]}]].

%% 30,000 distinct sites: the profile has them all, and how long it takes
%% is logged (a figure for README; no assertion on time).
many_sites(Config) ->
    ok = call(Config, mi_pprof_nif, spread, [30000, 64]),
    _ = call(Config, mallocinfo_trace, pprof, []),
    {Cpu, Ms, {ok, Gz}} = call(Config, ?MODULE, measure, [mallocinfo_trace, pprof, []]),
    {CpuText, MsText, {ok, _}} = call(Config, ?MODULE, measure, [mallocinfo_trace, heap_profile, []]),
    ct:pal("pprof of ~b sites: ~b ms CPU (~b ms wall), ~b bytes gzipped; "
           "heap_profile (text): ~b ms CPU (~b ms wall)",
           [30000, Cpu, Ms, byte_size(Gz), CpuText, MsText]),
    P = mi_pprof_decode:profile(zlib:gunzip(Gz)),
    Fork = [V || #{values := [_, V, _, _], frames := Frames} <- maps:get(samples, P),
                 lists:member(<<"mi_pprof_fork_a">>, Frames)],
    ?assertEqual(30000, length(Fork)),
    ?assertEqual(30000 * 64, lists:sum(Fork)).

%% Runs on the peer: the node's CPU time (every scheduler, dirty ones too)
%% and the wall time a call takes, in ms, and its result.
measure(M, F, A) ->
    _ = statistics(runtime),
    T0 = erlang:monotonic_time(millisecond),
    R = apply(M, F, A),
    {_, Cpu} = statistics(runtime),
    {Cpu, erlang:monotonic_time(millisecond) - T0, R}.

%% jemalloc without the tracker: the three routes say why not and where
%% jemalloc's own profile is.
jemalloc_alone(Config) ->
    ?assertEqual(jemalloc, call(Config, mallocinfo, allocator, [])),
    [begin
         {Code, _, Body} = get(Config, P),
         ?assertEqual({409, P}, {Code, P}),
         ?assertMatch({_, _}, binary:match(Body, <<"/heap_profile?trigger_dump=true">>))
     end || P <- ["/debug/pprof/heap", "/debug/pprof/allocs", "/heap.folded",
                  "/flamegraph.html"]].

%% The tracker in front of jemalloc: the routes serve the tracker's
%% profile, exact as under glibc.
jemalloc_behind_tracker(Config) ->
    ?assertEqual(jemalloc, call(Config, mallocinfo, allocator, [])),
    ok = call(Config, mi_pprof_nif, leak, [300, 1000]),
    {200, _, Gz} = get(Config, "/debug/pprof/heap"),
    P = mi_pprof_decode:profile(zlib:gunzip(Gz)),
    ?assertEqual([300000], [V || #{values := [_, _, _, V], leaf := <<"mi_pprof_leak_here">>}
                                     <- maps:get(samples, P)]),
    {200, _, Folded} = get(Config, "/heap.folded"),
    ?assertMatch({_, _}, binary:match(Folded, <<";mi_pprof_leak_here (mi_pprof_nif.so) 300000\n">>)).
