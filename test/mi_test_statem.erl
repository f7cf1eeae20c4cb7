%% A gen_statem with data chosen by the test, idle or hibernating in its
%% loop (mallocinfo_process_SUITE): the state to measure is {State, Data}.
-module(mi_test_statem).
-behaviour(gen_statem).
-export([start/2, init/1, callback_mode/0, idle/3]).

%% Opts: #{hibernate => boolean()} (hibernates after init and each event).
start(Data, Opts) ->
    gen_statem:start(?MODULE, {Data, Opts}, []).

callback_mode() -> state_functions.

init({{seq, N}, Opts}) ->
    init({lists:seq(1, N), Opts});
init({Data, #{hibernate := true}}) ->
    {ok, idle, Data, [hibernate]};
init({Data, _}) ->
    {ok, idle, Data}.

idle({call, From}, get, Data) ->
    {keep_state_and_data, [{reply, From, Data}]};
idle(_, _, _) ->
    keep_state_and_data.
