%% The RabbitMQ case of issue 24 on a test node: a queue-like process that
%% keeps the refc binaries it is sent (about 2 MB/s, named as
%% rabbit_amqqueue_process names itself), an ETS table that grows, and a
%% process whose heap grows. Each runs until stop/1.
-module(mi_grower).

-export([start/0, start/1, stop/1]).

%% 100 KiB every 50 ms: 2 MB/s.
-define(BIN_BYTES, 102400).
-define(TICK_MS, 50).

%% @doc Starts the three growers: `#{queue => Pid, owner => Pid, heap =>
%% Pid, table => growing_tab}'. `Which' picks some of them.
start() ->
    start([queue, ets, heap]).

start(Which) ->
    Queue = [{queue, spawn(fun queue/0)} || lists:member(queue, Which)],
    Feeder = [{feeder, spawn(fun() -> feed(P) end)} || {queue, P} <- Queue],
    Self = self(),
    Owner = [{owner, spawn(fun() ->
                                   T = ets:new(mi_growing_tab, [named_table, public]),
                                   Self ! {table, T},
                                   table(T, 0)
                           end)} || lists:member(ets, Which)],
    Table = [{table, receive {table, T} -> T end} || _ <- Owner],
    Heap = [{heap, spawn(fun() -> heap([]) end)} || lists:member(heap, Which)],
    maps:from_list(Queue ++ Feeder ++ Owner ++ Table ++ Heap).

stop(Growers) ->
    [exit(P, kill) || P <- maps:values(Growers), is_pid(P)],
    ok.

%% Keeps every message: a queue with no consumer.
queue() ->
    put(process_name, {resource, <<"/">>, queue, <<"q_grow">>}),
    queue([]).

queue(Kept) ->
    receive {publish, Bin} -> queue([Bin | Kept]) end.

feed(Queue) ->
    receive after ?TICK_MS -> ok end,
    Queue ! {publish, binary:copy(<<"m">>, ?BIN_BYTES)},
    feed(Queue).

%% About 1.5 MB/s of objects.
table(T, N) ->
    receive after ?TICK_MS -> ok end,
    ets:insert(T, [{{N, I}, lists:duplicate(100, I)} || I <- lists:seq(1, 50)]),
    table(T, N + 1).

%% About 0.6 MB/s of live heap.
heap(Kept) ->
    receive after ?TICK_MS -> ok end,
    heap([lists:seq(1, 2000) | Kept]).
