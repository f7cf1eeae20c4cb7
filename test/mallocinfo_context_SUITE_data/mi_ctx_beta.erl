%% One of the two Erlang callers of mi_ctx_nif (mallocinfo_context_SUITE):
%% a registered process that leaks when asked, from functions of its own,
%% none of the calls to the NIF a tail call (so each function's return
%% address is on the process's stack while the NIF runs).
-module(mi_ctx_beta).
-export([start/0, leak/3, loop/0, normal_beta/2, dirty_beta/2]).

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

loop() ->
    receive
        {leak, From, Ref, normal, Count, Size} ->
            From ! {Ref, normal_beta(Count, Size)},
            ?MODULE:loop();
        {leak, From, Ref, dirty, Count, Size} ->
            From ! {Ref, dirty_beta(Count, Size)},
            ?MODULE:loop()
    end.

normal_beta(Count, Size) ->
    R = mi_ctx_nif:leak(Count, Size),
    kept(R).

dirty_beta(Count, Size) ->
    R = mi_ctx_nif:leak_dirty(Count, Size),
    kept(R).

kept(R) -> R.
