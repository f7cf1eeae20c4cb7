%% The query side of mallocinfo_stress_SUITE, run on the peer node: callers
%% that each call every query in turn until stopped, with counters the
%% suite's watchdog reads through progress/0.
-module(mi_stress).
-export([start/2, progress/0, stop/1, queries/0]).

-define(KEY, ?MODULE).
-define(MAX_FAILURES, 20).

%% Query names, in the order of the counters.
queries() ->
    [olds, status, sites, reset, summary, heap_dump, report, symbolize].

%% Starts Callers processes; Dir is a scratch directory the suite made
%% (heap dumps are written there, then deleted).
start(Callers, Dir) ->
    N = length(queries()),
    %% 1..N: answers per query; N + 1: failures; N + 2..2N + 1: microseconds
    %% spent per query.
    Counters = counters:new(2 * N + 1, [write_concurrency]),
    Stop = atomics:new(1, []),
    %% Owned by the output sink, which lives on after this call returns.
    Sink = spawn(fun null_io/0),
    Failures = ets:new(?MODULE, [public, bag]),
    true = ets:give_away(Failures, Sink, none),
    Pids = [spawn(fun() ->
                          group_leader(Sink, self()),
                          loop(I, Dir, Counters, Stop, Failures)
                  end)
            || I <- lists:seq(1, Callers)],
    persistent_term:put(?KEY, {Counters, Stop, Failures, Pids}),
    ok.

%% {Queries answered so far (all kinds together), the NIF threads' rounds}.
progress() ->
    {Counters, _, _, _} = persistent_term:get(?KEY),
    {lists:sum([counters:get(Counters, K) || K <- lists:seq(1, length(queries()))]),
     mi_stress_nif:progress()}.

%% Stops the callers, waiting at most Timeout ms for each one's current
%% query. Returns #{answered => #{Query => Count}, mean_ms => #{Query => Ms},
%% failures => Count, first_failures => [...], unfinished => Count}.
stop(Timeout) ->
    {Counters, Stop, Failures, Pids} = persistent_term:get(?KEY),
    atomics:put(Stop, 1, 1),
    Refs = [monitor(process, P) || P <- Pids],
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    Unfinished = length([R || R <- Refs, not wait_down(R, Deadline)]),
    N = length(queries()),
    Indexed = lists:zip(lists:seq(1, N), queries()),
    Answered = maps:from_list([{Q, counters:get(Counters, K)} || {K, Q} <- Indexed]),
    MeanMs = maps:from_list([{Q, counters:get(Counters, N + 1 + K) div
                                 max(1, 1000 * counters:get(Counters, K))}
                             || {K, Q} <- Indexed]),
    #{answered => Answered,
      mean_ms => MeanMs,
      failures => counters:get(Counters, length(queries()) + 1),
      first_failures => ets:tab2list(Failures),
      unfinished => Unfinished}.

wait_down(Ref, Deadline) ->
    Left = max(0, Deadline - erlang:monotonic_time(millisecond)),
    receive {'DOWN', Ref, process, _, _} -> true after Left -> false end.

loop(I, Dir, Counters, Stop, Failures) ->
    case atomics:get(Stop, 1) of
        1 ->
            ok;
        0 ->
            Qs = queries(),
            K = I rem length(Qs) + 1,
            Q = lists:nth(K, Qs),
            T0 = erlang:monotonic_time(microsecond),
            try query(Q, Dir, I) of
                true ->
                    counters:add(Counters, length(Qs) + 1 + K,
                                 erlang:monotonic_time(microsecond) - T0),
                    counters:add(Counters, K, 1);
                Bad ->
                    failed(Counters, Failures, {Q, bad_answer, Bad})
            catch
                Class:Reason:Stack -> failed(Counters, Failures, {Q, Class, Reason, Stack})
            end,
            loop(I + 1, Dir, Counters, Stop, Failures)
    end.

failed(Counters, Failures, What) ->
    counters:add(Counters, length(queries()) + 1, 1),
    ets:info(Failures, size) < ?MAX_FAILURES andalso ets:insert(Failures, {failure, What}).

%% Each query, and what a right answer looks like. The heap walker may
%% refuse a heap other threads are changing ({error, _}); an answer is what
%% matters here.
query(olds, _, _) ->
    is_ok(mallocinfo_trace:olds(10), fun is_list/1);
query(status, _, _) ->
    case mallocinfo_trace:status() of
        #{recording := true, mode := full} -> true;
        Other -> Other
    end;
query(sites, _, _) ->
    is_ok(mallocinfo_trace:sites(10, [demangle]), fun is_list/1);
query(reset, _, _) ->
    is_ok(mallocinfo_trace:reset(), fun is_integer/1);
query(summary, _, _) ->
    is_ok(mallocinfo:summary(), fun is_map/1);
query(heap_dump, Dir, I) ->
    Path = filename:join(Dir, "dump-" ++ integer_to_list(erlang:unique_integer([positive]))
                         ++ "-" ++ integer_to_list(I)),
    R = mallocinfo_heap:dump(Path),
    _ = file:delete(Path),
    case R of
        {ok, #{}} -> true;
        {error, _} -> true;
        Other -> Other
    end;
query(report, _, _) ->
    mallocinfo:report() =:= ok;
query(symbolize, _, I) ->
    %% Return addresses from the tracker's stacks, and addresses outside
    %% every loaded object (each one a miss for the symbolizer).
    {ok, Sites} = mallocinfo_trace:sites(3),
    Known = [A || #{stack := Stack} <- Sites, #{address := A} <- Stack],
    Unknown = [16#10000 + 64 * (I rem 1000) + K || K <- lists:seq(1, 50)],
    Addrs = Known ++ Unknown,
    Frames = mallocinfo_nif:trace_symbolize(Addrs, true),
    length(Frames) =:= length(Addrs).

%% {ok, Value} with a value of the right kind: true; else the answer.
is_ok({ok, Value}, Is) -> Is(Value);
is_ok(Other, _) -> Other.

%% A group leader that swallows output (report/0 prints).
null_io() ->
    receive
        {io_request, From, Ref, _} ->
            From ! {io_reply, Ref, ok},
            null_io();
        _ ->
            null_io()
    end.
