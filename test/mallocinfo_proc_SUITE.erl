%% mallocinfo_proc: what processes keep on their heaps.
-module(mallocinfo_proc_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_testcase/2, end_per_testcase/2]).
-export([gen_server_state_and_dictionary/1, plain_process_messages/1, dead_pid/1,
         blocked_in_long_call/1, shared_subterms/1, refc_binaries/1, self_pid/1,
         limits/1, bad_arguments/1, top_ranks/1, print_report/1, remote_pid/1,
         exponential_sharing/1, no_stray_messages/1, binary_held_twice/1,
         unreachable_node/1, top_million/1]).

all() ->
    [gen_server_state_and_dictionary, plain_process_messages, dead_pid, blocked_in_long_call,
     shared_subterms, refc_binaries, self_pid, limits, bad_arguments, top_ranks, print_report,
     remote_pid, exponential_sharing, no_stray_messages, binary_held_twice, unreachable_node,
     top_million].

init_per_testcase(_, Config) ->
    Config.

end_per_testcase(_, _Config) ->
    ok.

kinds(Items, Kind) -> [I || #{kind := K} = I <- Items, K =:= Kind].

gen_server_state_and_dictionary(_Config) ->
    State = {state, lists:seq(1, 100), <<"abc">>, #{a => 1}},
    Dict = [{k1, {a, b}}, {k2, "hello"}, {k3, lists:duplicate(50, x)}],
    {ok, Pid} = mi_test_server:start(State, Dict),
    Heap = mallocinfo_proc:inspect_heap(Pid),
    ct:pal("~p", [Heap]),
    ?assert(lists:member({State, erts_debug:size(State)}, Heap)),
    [?assert(lists:member({KV, erts_debug:size(KV)}, Heap)) || KV <- Dict],
    %% proc_lib's own entries are on the heap too.
    ?assert(lists:keymember({'$initial_call', {mi_test_server, init, 1}}, 1, Heap)),
    {ok, Items} = mallocinfo_proc:inspect(Pid, #{}),
    [#{term := State}] = kinds(Items, state),
    {ok, H} = mallocinfo_proc:heap(Pid),
    ct:pal("~p", [H]),
    ?assertEqual(lists:sum([W || {_, W} <- Heap]), maps:get(live_words, H)),
    ?assertMatch(#{heap_size := _, total_heap_size := T, stack_size := _,
                   unseen_words := _, message_queue_len := 0,
                   binaries := #{count := _, bytes := _, shared_bytes := _},
                   garbage_collection := [_ | _], fullsweep_after := _} when T > 0, H),
    exit(Pid, kill).

plain_process_messages(_Config) ->
    Pid = spawn(fun() -> receive stop -> ok end end),
    Msgs = [{m, 1}, {m, lists:seq(1, 20)}, <<"a binary message">>],
    [Pid ! M || M <- Msgs],
    {ok, Items} = mallocinfo_proc:inspect(Pid, #{}),
    ?assertEqual([{M, erts_debug:size(M)} || M <- Msgs],
                 [{T, W} || #{kind := message, term := T, words := W} <- Items]),
    ?assertEqual([], kinds(Items, state)),
    {ok, #{message_queue_len := 3}} = mallocinfo_proc:heap(Pid),
    Pid ! stop.

dead_pid(_Config) ->
    Pid = spawn(fun() -> ok end),
    Ref = monitor(process, Pid),
    receive {'DOWN', Ref, _, _, _} -> ok end,
    ?assertEqual({error, noproc}, mallocinfo_proc:inspect_heap(Pid)),
    ?assertEqual({error, noproc}, mallocinfo_proc:heap(Pid)),
    ?assertEqual({error, noproc}, mallocinfo_proc:print(Pid)).

%% A gen_server busy in a callback gets no system message: no state, the
%% rest in bounded time, and the server is none the worse.
blocked_in_long_call(_Config) ->
    {ok, Pid} = mi_test_server:start({big, lists:seq(1, 1000)}, [{k, v}]),
    spawn(fun() -> gen_server:call(Pid, {block, 3000}, infinity) end),
    timer:sleep(100),
    {T, Heap} = timer:tc(mallocinfo_proc, inspect_heap, [Pid]),
    ct:pal("blocked: ~p us, ~p", [T, Heap]),
    ?assert(T < 500000),
    ?assert(lists:member({{k, v}, erts_debug:size({k, v})}, Heap)),
    ?assertNot(lists:keymember({big, lists:seq(1, 1000)}, 1, Heap)),
    ?assertMatch({big, _}, gen_server:call(Pid, get, 10000)),
    exit(Pid, kill).

shared_subterms(_Config) ->
    {ok, Pid} = mi_test_server:start({shared, 1000, 4}, []),
    {total_heap_size, Before} = process_info(Pid, total_heap_size),
    {ok, Items} = mallocinfo_proc:inspect(Pid, #{size_budget => 10000}),
    %% Measuring inside the server allocated there; it was collected again.
    {total_heap_size, After} = process_info(Pid, total_heap_size),
    ct:pal("heap before ~p, after ~p words", [Before, After]),
    ?assert(After =< 2 * Before),
    [#{words := W, flat_words := F}] = kinds(Items, state),
    ct:pal("shared state: ~p words, ~p flat", [W, F]),
    %% Inside the server the four elements are one list.
    ?assertEqual(5 + 2000, W),
    ?assertEqual(5 + 4 * 2000, F),
    {ok, #{live_words := Live, flat_words := Flat}} =
        mallocinfo_proc:heap(Pid, #{size_budget => 10000}),
    ?assert(Flat - Live >= 6000),
    %% With the default budget the 8005-word state is too big to measure
    %% inside: its flat size is reported, and says so.
    {ok, Default} = mallocinfo_proc:inspect(Pid, #{}),
    [#{words := 8005, sharing := not_computed}] = kinds(Default, state),
    exit(Pid, kill).

refc_binaries(_Config) ->
    Bin = binary:copy(<<7>>, 4 * 1024 * 1024),
    Holder = fun() -> receive {hold, B} -> receive stop -> byte_size(B) end end end,
    P1 = spawn(Holder),
    P2 = spawn(Holder),
    P1 ! {hold, Bin},
    P2 ! {hold, Bin},
    timer:sleep(50),
    {ok, #{binaries := #{count := C, bytes := B, shared_bytes := S}, verdict := V}} =
        mallocinfo_proc:heap(P1),
    ct:pal("binaries ~p ~p ~p: ~ts", [C, B, S, V]),
    ?assert(C >= 1),
    ?assert(B >= 4 * 1024 * 1024),
    ?assert(S >= 4 * 1024 * 1024),
    ?assertMatch(<<"mostly binary references", _/binary>>, V),
    P1 ! stop,
    P2 ! stop.

self_pid(_Config) ->
    put(mi_self_test, {some, value}),
    Heap = mallocinfo_proc:inspect_heap(self()),
    ?assert(lists:member({{mi_self_test, {some, value}},
                          erts_debug:size({mi_self_test, {some, value}})}, Heap)),
    erase(mi_self_test).

limits(_Config) ->
    Dict = [{N, N} || N <- lists:seq(1, 50)],
    {ok, Pid} = mi_test_server:start(lists:seq(1, 100000), Dict),
    {ok, Items} = mallocinfo_proc:inspect(Pid, #{max_terms => 10, max_words => 1000}),
    ?assertEqual(11, length(Items)),
    ?assertMatch(#{kind := omitted, term := {terms, {max_terms, 10}}}, lists:last(Items)),
    {ok, All} = mallocinfo_proc:inspect(Pid, #{max_words => 1000}),
    [#{term := {'$mallocinfo_truncated', 200000, Preview}, words := 200000}] =
        kinds(All, state),
    ?assert(is_list(Preview) andalso length(Preview) =< 300),
    %% A long queue is counted, not copied.
    Q = spawn(fun() -> receive stop -> ok end end),
    [Q ! {msg, N} || N <- lists:seq(1, 200)],
    {ok, QItems} = mallocinfo_proc:inspect(Q, #{max_terms => 100}),
    ?assertMatch([#{term := {messages, {queue_too_long, 200}}}], kinds(QItems, omitted)),
    %% A heap above max_heap_words is not walked: nothing is copied.
    {ok, Big} = mallocinfo_proc:inspect(Pid, #{max_heap_words => 100}),
    ?assertMatch([#{term := {dictionary, {heap_too_large, _}}} | _], kinds(Big, omitted)),
    Q ! stop,
    exit(Pid, kill).

bad_arguments(_Config) ->
    Port = hd(erlang:ports()),
    [?assertError(badarg, mallocinfo_proc:F(A))
     || F <- [inspect_heap, heap, print], A <- [not_a_pid, Port, "<0.1.0>", 42]],
    ?assertError(badarg, mallocinfo_proc:inspect_heap(self(), #{max_terms => 0})),
    ?assertError(badarg, mallocinfo_proc:inspect_heap(self(), #{bogus => 1})),
    ?assertError(badarg, mallocinfo_proc:heap(self(), [])),
    ?assertError(badarg, mallocinfo_proc:top(-1, memory)),
    ?assertError(badarg, mallocinfo_proc:top(5, size)).

top_ranks(_Config) ->
    Big = spawn(fun() -> L = lists:seq(1, 500000), receive stop -> length(L) end end),
    Busy = spawn(fun() -> receive stop -> ok end end),
    [Busy ! x || _ <- lists:seq(1, 5000)],
    timer:sleep(100),
    [#{pid := Big, value := Mem, name := Name} | _] = Rows = mallocinfo_proc:top(5, memory),
    ct:pal("top memory: ~p", [Rows]),
    ?assert(Mem > 4000000),
    ?assertMatch({erlang, apply, 2}, Name),
    ?assertEqual(5, length(Rows)),
    Values = [V || #{value := V} <- Rows],
    ?assertEqual(lists:reverse(lists:sort(Values)), Values),
    [#{pid := Busy, value := 5000} | _] = mallocinfo_proc:top(3, message_queue_len),
    [#{name := code_server} | _] = [R || #{pid := P} = R <- mallocinfo_proc:top(1000, reductions),
                                         P =:= whereis(code_server)],
    ?assertEqual([], mallocinfo_proc:top(0, binary)),
    ?assertMatch([_ | _], mallocinfo_proc:top(3, heap_waste)),
    ?assertMatch([_ | _], mallocinfo_proc:top(3, binary)),
    Big ! stop,
    Busy ! stop.

print_report(_Config) ->
    {ok, Pid} = mi_test_server:start({state, lists:seq(1, 300)}, [{cfg, "x"}]),
    ct:capture_start(),
    ok = mallocinfo_proc:print(Pid),
    ct:capture_stop(),
    Out = lists:flatten(ct:capture_get()),
    ct:pal("~ts", [Out]),
    ?assertNotEqual(nomatch, string:find(Out, "verdict")),
    ?assertNotEqual(nomatch, string:find(Out, "state")),
    ?assertNotEqual(nomatch, string:find(Out, "{cfg,\"x\"}")),
    %% Biggest first: the 300-element state before the small dictionary entry.
    ?assert(string:str(Out, "{state,") < string:str(Out, "{cfg,")),
    exit(Pid, kill).

%% A pid on another node is inspected there; the node did not have
%% mallocinfo_proc loaded, it gets it from this node.
remote_pid(_Config) ->
    ensure_distributed(),
    {ok, Peer, Node} = peer:start_link(#{name => peer:random_name()}),
    try
        ?assertEqual(non_existing, erpc:call(Node, code, which, [mallocinfo_proc])),
        %% The helper server is loaded there by hand; mallocinfo_proc is not.
        {Mod, Bin, File} = code:get_object_code(mi_test_server),
        {module, Mod} = erpc:call(Node, code, load_binary, [Mod, File, Bin]),
        {ok, Pid} = erpc:call(Node, mi_test_server, start,
                              [{remote_state, 42}, [{remote_key, lists:seq(1, 10)}]]),
        ?assertEqual(Node, node(Pid)),
        Heap = mallocinfo_proc:inspect_heap(Pid),
        ?assert(lists:member({{remote_key, lists:seq(1, 10)},
                              erts_debug:size({remote_key, lists:seq(1, 10)})}, Heap)),
        ?assert(lists:member({{remote_state, 42}, 3}, Heap)),
        {ok, #{live_words := _}} = mallocinfo_proc:heap(Pid),
        ?assertMatch({file, _}, erpc:call(Node, code, is_loaded, [mallocinfo_proc]))
    after
        peer:stop(Peer)
    end.

%% {T, T} nested 30 levels: 61 words on the heap, 2^31 flat. Nothing may
%% walk or copy it flat: the answer is quick, bounded and says so.
exponential_sharing(_Config) ->
    {ok, Pid} = mi_test_server:start({doubled, 30}, []),
    {T, {ok, Items}} = timer:tc(mallocinfo_proc, inspect, [Pid, #{}]),
    ct:pal("exponential: ~p us ~p", [T, kinds(Items, state)]),
    ?assert(T < 1000000),
    [#{term := {'$mallocinfo_truncated', {more_than, _}, _}, sharing := not_computed}] =
        kinds(Items, state),
    {ok, #{complete := false, verdict := none}} = mallocinfo_proc:heap(Pid),
    %% The server lives on, idle (asking it for its state would copy 2^31).
    ?assertEqual({current_function, {gen_server, loop, 7}},
                 process_info(Pid, current_function)),
    exit(Pid, kill).

%% However the target answers (late, or not at all), nothing is left in the
%% caller's mailbox, and the target's state is untouched.
no_stray_messages(_Config) ->
    {ok, Pid} = mi_test_server:start({kept, lists:seq(1, 10)}, []),
    flush(),
    [{ok, _} = mallocinfo_proc:inspect(Pid, #{timeout => T}) || T <- [0, 0, 1, 100]],
    timer:sleep(200),
    ?assertEqual({messages, []}, process_info(self(), messages)),
    ?assertEqual({kept, lists:seq(1, 10)}, gen_server:call(Pid, get)),
    exit(Pid, kill).

flush() -> receive _ -> flush() after 0 -> ok end.

%% One binary referenced twice by one process is one binary, and not shared.
binary_held_twice(_Config) ->
    Bin = binary:copy(<<1>>, 2 * 1024 * 1024),
    {ok, Pid} = mi_test_server:start({twice, Bin}, []),
    erlang:garbage_collect(),
    {ok, #{binaries := #{count := C, bytes := B, shared_bytes := S}}} =
        mallocinfo_proc:heap(Pid),
    ct:pal("held twice: ~p ~p ~p", [C, B, S]),
    ?assertEqual(1, C),
    ?assertEqual(2 * 1024 * 1024, B),
    exit(Pid, kill).

unreachable_node(_Config) ->
    ensure_distributed(),
    %% A pid of a node that does not exist.
    Ghost = ghost_pid('mi_ghost@nohost'),
    ?assertMatch({error, {erpc, _}}, mallocinfo_proc:inspect_heap(Ghost)),
    ?assertMatch({error, {erpc, _}}, mallocinfo_proc:heap(Ghost)).

%% A pid on Node, made from the external term format (version 4 NEW_PID_EXT).
ghost_pid(Node) ->
    NodeBin = atom_to_binary(Node, utf8),
    binary_to_term(<<131, 88, 119, (byte_size(NodeBin)), NodeBin/binary,
                     0:32, 0:32, 0:32>>).

%% top/2 over a million processes: the time is reported, not asserted.
top_million(Config) ->
    {ok, Peer, _Node} =
        peer:start_link(#{connection => standard_io,
                          args => ["+P", "2000000",
                                   "-pa", filename:dirname(code:which(mallocinfo_proc)),
                                   "-pa", filename:dirname(code:which(mi_test_server))]}),
    try
        N = 1000000,
        ok = peer:call(Peer, mi_test_server, spawn_idle, [N], 120000),
        Count = peer:call(Peer, erlang, system_info, [process_count]),
        ?assert(Count >= N),
        Times = [{By, element(1, peer:call(Peer, timer, tc,
                                          [mallocinfo_proc, top, [10, By]], 120000))}
                 || By <- [memory, heap_waste, binary, message_queue_len, reductions]],
        ct:pal("top/2 over ~p processes: ~p (us)", [Count, Times]),
        ok = file:write_file(filename:join(?config(priv_dir, Config), "top_million.txt"),
                             io_lib:format("~p ~p~n", [Count, Times]))
    after
        peer:stop(Peer)
    end.

ensure_distributed() ->
    case node() of
        nonode@nohost ->
            os:cmd("epmd -daemon"),
            {ok, _} = net_kernel:start([list_to_atom("mi_ct_" ++ os:getpid()), shortnames]);
        _ ->
            ok
    end.
