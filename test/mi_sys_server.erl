%% A server that is no gen_server but speaks sys, as RabbitMQ's gen_server2
%% and ejabberd's p1_server do: started through proc_lib, waiting in a
%% receive loop of its own, hibernating between messages when asked to.
%% Like gen_server2 (RabbitMQ 3.10) it has no system_replace_state/2 and
%% answers {replace_state, Fun} itself: Fun is called on the whole loop
%% data with no catch (a Fun that raises kills the server) and the answer
%% is the new loop data. For mallocinfo_process_SUITE.
-module(mi_sys_server).
-export([start/2, call/2, init/3, wake/3, system_continue/3, system_terminate/4,
         system_code_change/4]).

%% State: {seq, N} (a list of N integers, built in the server) or any term.
%% Opts: #{hibernate => boolean(), dict => [{Key, Value}]}.
start(State, Opts) ->
    proc_lib:start(?MODULE, init, [self(), State, Opts]).

%% The server's state, as a gen_server:call would get it.
call(Pid, get) ->
    Ref = monitor(process, Pid),
    Pid ! {call, self(), Ref, get},
    receive
        {Ref, Reply} -> demonitor(Ref, [flush]), Reply;
        {'DOWN', Ref, _, _, Why} -> exit(Why)
    end.

init(Parent, State0, Opts) ->
    [put(K, V) || {K, V} <- maps:get(dict, Opts, [])],
    State = case State0 of
                {seq, N} -> lists:seq(1, N);
                _ -> State0
            end,
    proc_lib:init_ack({ok, self()}),
    next(Parent, State, Opts).

next(Parent, State, #{hibernate := true} = Opts) ->
    proc_lib:hibernate(?MODULE, wake, [Parent, State, Opts]);
next(Parent, State, Opts) ->
    loop(Parent, State, Opts).

wake(Parent, State, Opts) ->
    loop(Parent, State, Opts).

loop(Parent, State, Opts) ->
    receive
        {system, From, {replace_state, Fun}} ->
            {NState, NOpts} = Misc = Fun({State, Opts}),
            gen:reply(From, Misc),
            next(Parent, NState, NOpts);
        {system, From, Request} ->
            sys:handle_system_msg(Request, From, Parent, ?MODULE, [], {State, Opts});
        {call, From, Ref, get} ->
            From ! {Ref, State},
            next(Parent, State, Opts)
    end.

system_continue(Parent, _Debug, {State, Opts}) ->
    next(Parent, State, Opts).

system_terminate(Reason, _Parent, _Debug, _Misc) ->
    exit(Reason).

system_code_change(Misc, _Module, _OldVsn, _Extra) ->
    {ok, Misc}.
