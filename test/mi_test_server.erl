%% A gen_server with a state and dictionary chosen by the test
%% (mallocinfo_process_SUITE).
-module(mi_test_server).
-behaviour(gen_server).
-export([start/2, start/3, init/1, handle_call/3, handle_cast/2, spawn_idle/1]).

start(State, Dict) ->
    gen_server:start(?MODULE, {State, Dict}, []).

%% Registered as Name.
start(Name, State, Dict) ->
    gen_server:start({local, Name}, ?MODULE, {State, Dict}, []).

init({State, Dict}) ->
    [put(K, V) || {K, V} <- Dict],
    {ok, make(State)}.

%% Terms with sharing must be built inside the server: sending them to it
%% (as start arguments) copies the shared parts apart.
make({shared, N, Copies}) ->
    L = lists:seq(1, N),
    list_to_tuple(lists:duplicate(Copies, L));
make({doubled, Levels}) ->
    lists:foldl(fun(_, T) -> {T, T} end, leaf, lists:seq(1, Levels));
make({twice, Bin}) ->
    {Bin, Bin};
%% A big state built here, so that the test process does not grow as big.
make({seq, N}) ->
    lists:seq(1, N);
make(State) ->
    State.

%% Spawns N processes that wait for `stop'.
spawn_idle(N) ->
    [spawn(fun() -> receive stop -> ok end end) || _ <- lists:seq(1, N)],
    ok.

%% Busy in a callback until the test says so: tells Test it is blocked,
%% then waits for `release' (anything else, a system message included,
%% stays queued meanwhile).
handle_call({block, Test}, _From, State) ->
    Test ! {blocked, self()},
    receive release -> ok end,
    {reply, ok, State};
handle_call(get, _From, State) ->
    {reply, State, State};
%% Hibernates after replying: waits in erlang:hibernate/3, not in the loop.
handle_call(hibernate, _From, State) ->
    {reply, ok, State, hibernate}.

handle_cast(_Msg, State) ->
    {noreply, State}.
