-module(mi_frag_nif).
-define(NIFS, [fragment/4, release/0, churn_start/1, churn_stop/0]).
-export([counter_start/0, counter_read/1, progress_during/1]).
-include("mi_test_nif.hrl").

fragment(_Threads, _N, _Size, _KeepEvery) -> erlang:nif_error(not_loaded).
release() -> erlang:nif_error(not_loaded).
churn_start(_Threads) -> erlang:nif_error(not_loaded).
churn_stop() -> erlang:nif_error(not_loaded).

%% A process that counts as fast as it can on a normal scheduler.
counter_start() ->
    spawn(fun() -> count(0) end).

counter_read(Pid) ->
    Pid ! {read, self()},
    receive {count, N} -> N after 5000 -> erlang:error(timeout) end.

count(N) ->
    receive {read, From} -> From ! {count, N}, count(N + 1)
    after 0 -> count(N + 1)
    end.

%% Runs M:F(A...) in a process and, from the moment it starts until it
%% returns, reads a counting process as often as it can. Returns {Result,
%% Reads}: a call that held the only normal scheduler (+S 1) leaves at most
%% one read; a dirty NIF leaves many, increasing.
progress_during({M, F, A}) ->
    Counter = counter_start(),
    Self = self(),
    _ = spawn(fun() -> Self ! started, Self ! {done, apply(M, F, A)} end),
    receive started -> ok end,
    sample(Counter, []).

sample(Counter, Acc) ->
    receive
        {done, R} -> exit(Counter, kill), {R, lists:reverse(Acc)}
    after 0 ->
        sample(Counter, [counter_read(Counter) | Acc])
    end.
