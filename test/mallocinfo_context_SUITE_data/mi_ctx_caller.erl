%% The Erlang callers of mi_ctx_nif (mallocinfo_context_SUITE), one source
%% compiled as two modules (MI_MODULE: mi_ctx_alpha, mi_ctx_beta): each a
%% registered process that leaks when asked, from a function of its own
%% per scheduler kind, none of the calls to the NIF a tail call (so each
%% function's return address is on the process's stack while the NIF runs).
-module(?MI_MODULE).
-export([start/0, leak/3, loop/0, normal/2, dirty/2, proc_leak/2]).

%% Starts the process, registered as ?MODULE; returns its pid.
start() ->
    Pid = spawn(?MODULE, loop, []),
    true = register(?MODULE, Pid),
    Pid.

%% Asks the process for Count blocks of Size bytes, from a normal or a
%% dirty scheduler; waits for it.
leak(Kind, Count, Size) ->
    Ref = make_ref(),
    ?MODULE ! {leak, self(), Ref, Kind, Count, Size},
    receive {Ref, Result} -> Result after 60000 -> timeout end.

%% A process started with proc_lib:start(?MODULE, proc_leak, [Count,
%% Size]), not registered: it leaks from normal/2, acknowledges, and stays
%% (its name is its '$initial_call', {?MODULE, proc_leak, 2}).
proc_leak(Count, Size) ->
    ok = normal(Count, Size),
    proc_lib:init_ack({ok, self()}),
    receive stop -> ok end.

loop() ->
    receive
        {leak, From, Ref, Kind, Count, Size} ->
            From ! {Ref, ?MODULE:Kind(Count, Size)},
            ?MODULE:loop()
    end.

normal(Count, Size) ->
    R = mi_ctx_nif:leak(Count, Size),
    kept(R).

dirty(Count, Size) ->
    R = mi_ctx_nif:leak_dirty(Count, Size),
    kept(R).

kept(R) -> R.
