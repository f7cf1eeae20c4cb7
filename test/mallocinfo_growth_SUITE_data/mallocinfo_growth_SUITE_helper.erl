%% Workloads mallocinfo_growth_SUITE runs inside its peer node.
-module(mallocinfo_growth_SUITE_helper).
-export([tick/1, leak_mib/0, start_hold/1, hold/2]).

%% Every 20 ms: one 100-byte leak, and the cache either filled with 50
%% blocks (odd ticks) or drained (even ticks).
tick(N) ->
    ok = mi_growth_nif:leak(1, 100),
    ok = case N rem 2 of
             1 -> mi_growth_nif:cache_fill(50, 1000);
             0 -> mi_growth_nif:cache_drain()
         end,
    timer:sleep(20),
    tick(N + 1).

%% 1 MiB leaked every 50 ms, in 64 KiB blocks.
leak_mib() ->
    ok = mi_growth_nif:leak(16, 65536),
    timer:sleep(50),
    leak_mib().

%% A process holding a list of N integers (16 bytes each on its heap)
%% until killed; returns once the list is built.
start_hold(N) ->
    Pid = spawn(?MODULE, hold, [N, self()]),
    receive {ready, Pid} -> Pid end.

hold(N, Parent) ->
    L = lists:seq(1, N),
    Parent ! {ready, self()},
    receive never -> length(L) end.
