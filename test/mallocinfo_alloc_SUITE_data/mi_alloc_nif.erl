%% Loader for mi_alloc_nif.so, and helpers for concurrent calls on the peer
%% (test helpers of mallocinfo_alloc_SUITE).
-module(mi_alloc_nif).
-define(NIFS, [hold/2, release/0, alloc/1, free/1, dlopen_global/1]).
-export([parallel/1, alloc_then/2]).
-include("mi_test_nif.hrl").

hold(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
alloc(_Size) -> erlang:nif_error(nif_not_loaded).
free(_Address) -> erlang:nif_error(nif_not_loaded).
dlopen_global(_Path) -> erlang:nif_error(nif_not_loaded).

%% Runs each {M, F, A} in its own process, all at once, and returns their
%% results in order (an exception becomes {'EXIT', Class, Reason}).
parallel(Calls) ->
    Self = self(),
    Pids = [spawn_link(fun() ->
                               R = try apply(M, F, A) catch C:E -> {'EXIT', C, E} end,
                               Self ! {self(), R}
                       end) || {M, F, A} <- Calls],
    [receive {P, R} -> R end || P <- Pids].

%% alloc(Size), then the call: its result with the block's address.
alloc_then(Size, {M, F, A}) ->
    Addr = alloc(Size),
    {Addr, apply(M, F, A)}.
