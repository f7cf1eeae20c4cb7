%% Liveness under load (issue 15, item 1): a peer node with the interposer
%% preloaded, native threads allocating in a storm from ever new call sites
%% (some inside dl_iterate_phdr callbacks, one loading and unloading a
%% library), and 16 processes calling every query at once
%% (mallocinfo_trace:olds/status/sites/reset, mallocinfo:summary/0,
%% mallocinfo_heap:dump/1, mallocinfo:report/0, symbolization).
%%
%% A watchdog asks the peer every second for its progress. The run fails,
%% and the peer is killed by its OS pid, when the peer has not answered for
%% 10 s (any call to it after the storm starts is held to that too), when a
%% native thread has made no progress for 10 s, or when no query has
%% completed for 60 s (under the storm a query can take 30 s on 2 shared
%% cores, mostly waiting for a dirty scheduler): a stack capture that waits
%% for a lock its caller holds (the loader lock, libunwind's) freezes first
%% the threads and then the node. Before the kill, the threads' backtraces
%% are saved in the test's priv_dir (gdb, when installed).
%%
%% Duration: MALLOCINFO_STRESS_SECONDS (default 15; `make soak' runs 60).
%% MALLOCINFO_UNWIND, when set in the environment of the test run, is
%% passed on to the peer.
-module(mallocinfo_stress_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([suite/0, all/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2,
         end_per_testcase/2]).
-export([queries_during_allocation_storm/1]).

-define(DEFAULT_SECONDS, 15).
-define(CALLERS, 16).
-define(SITE_THREADS, 2).
-define(PHDR_THREADS, 2).
-define(ANSWER_LIMIT_MS, 10000).
-define(THREAD_LIMIT_MS, 10000).
-define(QUERY_LIMIT_MS, 60000).

suite() ->
    [{timetrap, {seconds, seconds() + 300}}].

all() ->
    [queries_during_allocation_storm].

seconds() ->
    case os:getenv("MALLOCINFO_STRESS_SECONDS") of
        false -> ?DEFAULT_SECONDS;
        S -> list_to_integer(S)
    end.

init_per_suite(Config) ->
    %% mi_stress_target.so is a plain shared object (the dlopen loop's),
    %% built the same way as the NIF.
    ok = mi_ct:build_nif(Config, "mi_stress_target"),
    ok = mi_ct:compile_module(Config, "mi_stress.erl"),
    [{target, filename:join(?config(priv_dir, Config), "mi_stress_target.so")}
     | mi_ct:init_tracker_suite(Config, "mi_stress_nif")].

end_per_suite(_Config) ->
    ok.

init_per_testcase(_, Config) ->
    Ebin = filename:dirname(code:which(mallocinfo)),
    Unwind = case os:getenv("MALLOCINFO_UNWIND") of
                 false -> [];
                 U -> [{"MALLOCINFO_UNWIND", U}]
             end,
    %% Not linked: the watchdog may have to kill the peer's OS process.
    {ok, Peer, _Node} =
        peer:start(#{connection => standard_io,
                     env => mallocinfo_trace:preload_env() ++ Unwind,
                     args => ["-pa", Ebin, "-pa", ?config(priv_dir, Config)]}),
    OsPid = peer:call(Peer, os, getpid, []),
    [{peer, Peer}, {os_pid, OsPid} | Config].

%% A frozen peer may not stop: it is killed by its OS pid after 15 s.
end_per_testcase(_, Config) ->
    Peer = ?config(peer, Config),
    {Pid, Ref} = spawn_monitor(fun() -> mi_ct:caught(fun() -> peer:stop(Peer) end) end),
    receive
        {'DOWN', Ref, process, Pid, _} -> ok
    after 15000 ->
        exit(Pid, kill),
        kill_peer(Config)
    end.

%%% The case ------------------------------------------------------------------

queries_during_allocation_storm(Config) ->
    Peer = ?config(peer, Config),
    Dir = filename:join(?config(priv_dir, Config), "dumps"),
    ok = filelib:ensure_path(Dir),
    Seconds = seconds(),
    ?assertMatch(#{recording := true, mode := full}, peer:call(Peer, mallocinfo_trace, status, [])),
    %% From here on the peer may freeze at any moment: every call is guarded.
    ok = guarded(Config, start_threads, mi_stress_nif, start,
                 [?SITE_THREADS, ?PHDR_THREADS, ?config(target, Config)], ?ANSWER_LIMIT_MS),
    ok = guarded(Config, start_callers, mi_stress, start, [?CALLERS, Dir], ?ANSWER_LIMIT_MS),
    Start = now_ms(),
    Threads = watch(Config, Start + Seconds * 1000, #{answer => Start, query => {0, Start}}),
    NifRounds = guarded(Config, stop_threads, mi_stress_nif, stop, [], 60000),
    Result = guarded(Config, stop_callers, mi_stress, stop, [60000], 70000),
    Status = guarded(Config, status, mallocinfo_trace, status, [], ?ANSWER_LIMIT_MS),
    ct:pal("~p s: native threads ~p~nqueries ~p~ntracker: ~p stacks, ~p live entries",
           [Seconds, NifRounds, Result, maps:get(stacks, Status), maps:get(live_entries, Status)]),
    #{answered := Answered, failures := Failures, first_failures := First,
      unfinished := Unfinished} = Result,
    ?assertEqual({0, []}, {Failures, First}),
    ?assertEqual(0, Unfinished),
    %% Every query kind answered, every native thread kept going.
    ?assertEqual([], [Q || {Q, 0} <- maps:to_list(Answered)]),
    ?assertEqual(length(guarded(Config, queries, mi_stress, queries, [], ?ANSWER_LIMIT_MS)),
                 maps:size(Answered)),
    ?assertEqual(length(Threads), length(NifRounds)),
    ?assertEqual([], [T || {_, 0} = T <- NifRounds]),
    ?assert(maps:get(stacks, Status) > 0).

%%% The watchdog --------------------------------------------------------------

%% Asks the peer once a second until Deadline; returns the last thread
%% counts. Fails (killing the peer) as described at the top.
watch(Config, Deadline, State) ->
    Now = now_ms(),
    case Now >= Deadline of
        true ->
            maps:get(threads, State, []);
        false ->
            Asked = now_ms(),
            Answer = mi_ct:caught(
                       fun() -> peer:call(?config(peer, Config), mi_stress, progress, [], 1000) end),
            timer:sleep(max(0, 1000 - (now_ms() - Asked))),
            watch(Config, Deadline, check(Config, update(Answer, now_ms(), State)))
    end.

update({Queries, Threads}, Now, State) when is_integer(Queries), is_list(Threads) ->
    {LastQueries, QueryAt} = maps:get(query, State),
    QueryState = case Queries > LastQueries of
                     true -> {Queries, Now};
                     false -> {LastQueries, QueryAt}
                 end,
    Old = maps:get(threads, State, []),
    At = case length(Old) =:= length(Threads) of
             true ->
                 [case Count =:= OldCount of
                      true -> T;
                      false -> Now
                  end
                  || {{_, Count}, {_, OldCount}, T} <- lists:zip3(Threads, Old,
                                                                  maps:get(thread_at, State))];
             false ->
                 [Now || _ <- Threads]
         end,
    State#{answer => Now, query => QueryState, threads => Threads, thread_at => At, now => Now};
update(_NoAnswer, Now, State) ->
    State#{now => Now}.

check(Config, #{now := Now, answer := Answer, query := {_, QueryAt}} = State) ->
    Stuck = [Kind || {{Kind, _}, At} <- lists:zip(maps:get(threads, State, []),
                                                   maps:get(thread_at, State, [])),
                     Now - At >= ?THREAD_LIMIT_MS],
    if
        Now - Answer >= ?ANSWER_LIMIT_MS ->
            frozen(Config, {no_answer_for_ms, Now - Answer});
        Stuck =/= [] ->
            frozen(Config, {native_threads_stuck, Stuck});
        Now - QueryAt >= ?QUERY_LIMIT_MS ->
            frozen(Config, {no_query_answered_for_ms, Now - QueryAt});
        true ->
            State
    end.

%% A call after the storm, under the same rule: no answer in time is a hang.
guarded(Config, What, M, F, A, Timeout) ->
    case mi_ct:caught(fun() -> peer:call(?config(peer, Config), M, F, A, Timeout) end) of
        {'EXIT', Reason} -> frozen(Config, {What, Reason});
        Result -> Result
    end.

frozen(Config, Why) ->
    OsPid = ?config(os_pid, Config),
    Bt = filename:join(?config(priv_dir, Config), "backtraces-" ++ OsPid ++ ".txt"),
    case os:find_executable("gdb") of
        false ->
            ok;
        Gdb ->
            _ = os:cmd(lists:flatten(io_lib:format(
                         "timeout 120 ~ts -p ~ts -batch -ex 'thread apply all bt 20' > ~ts 2>&1",
                         [Gdb, OsPid, Bt])))
    end,
    kill_peer(Config),
    ct:pal("peer ~ts killed: ~p; backtraces (if gdb is installed): ~ts", [OsPid, Why, Bt]),
    ct:fail({frozen, Why}).

%% kill -9 of the peer's OS process, if that pid is still our peer (its
%% command line names this run's priv_dir).
kill_peer(Config) ->
    OsPid = ?config(os_pid, Config),
    case file:read_file("/proc/" ++ OsPid ++ "/cmdline") of
        {ok, Cmdline} ->
            Priv = unicode:characters_to_binary(string:trim(?config(priv_dir, Config), trailing,
                                                            "/")),
            case binary:match(Cmdline, Priv) of
                nomatch -> ok;
                _ -> _ = os:cmd("kill -9 " ++ OsPid), ok
            end;
        {error, _} ->
            ok
    end.

now_ms() ->
    erlang:monotonic_time(millisecond).
