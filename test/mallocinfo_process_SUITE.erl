%% mallocinfo_process: what processes keep on their heaps.
-module(mallocinfo_process_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_testcase/2, end_per_testcase/2]).
-export([gen_server_state_and_dictionary/1, plain_process_messages/1, dead_pid/1,
         blocked_in_long_call/1, shared_subterms/1, refc_binaries/1, self_pid/1,
         limits/1, bad_arguments/1, top_ranks/1, print_report/1, remote_pid/1,
         exponential_sharing/1, no_stray_messages/1, binary_held_twice/1,
         unreachable_node/1, top_million/1, top_binary_one_binary_many_refs/1,
         top_binary_sub_binaries/1, top_binary_distinct/1, names/1, report_names/1,
         heap_above_limit/1, queue_above_limit/1, hibernated_state_not_measured/1,
         sys_loop_state_not_measured/1, plain_loop_state_not_measured/1,
         sys_not_answered/1, name_labels/1, name_whatever_the_size/1,
         report_label_names/1, gen_statem_state/1]).

all() ->
    [gen_server_state_and_dictionary, plain_process_messages, dead_pid, blocked_in_long_call,
     shared_subterms, refc_binaries, self_pid, limits, bad_arguments, top_ranks, print_report,
     remote_pid, exponential_sharing, no_stray_messages, binary_held_twice, unreachable_node,
     top_million, top_binary_one_binary_many_refs, top_binary_sub_binaries, top_binary_distinct,
     names, report_names, heap_above_limit, queue_above_limit, hibernated_state_not_measured,
     sys_loop_state_not_measured, plain_loop_state_not_measured, sys_not_answered, name_labels,
     name_whatever_the_size, report_label_names, gen_statem_state].

%% The system message that reads an idle gen_server's state waits 100 ms by
%% default; a loaded CI machine can take longer to schedule the server, and
%% the state is then reported as not measured (sys_timeout). Cases that
%% expect the state give it time; no_stray_messages tests the short ones.
-define(SYS(Opts), maps:merge(#{timeout => 60000}, Opts)).

init_per_testcase(_, Config) ->
    Config.

end_per_testcase(_, _Config) ->
    ok.

wait_waiting(Pid, 0) ->
    {not_waiting, erlang:process_info(Pid, [status, current_function])};
wait_waiting(Pid, N) ->
    case erlang:process_info(Pid, status) of
        {status, waiting} -> ok;
        _ -> timer:sleep(1), wait_waiting(Pid, N - 1)
    end.

kinds(Items, Kind) -> [I || #{kind := K} = I <- Items, K =:= Kind].

gen_server_state_and_dictionary(_Config) ->
    State = {state, lists:seq(1, 100), <<"abc">>, #{a => 1}},
    Dict = [{k1, {a, b}}, {k2, "hello"}, {k3, lists:duplicate(50, x)}],
    {ok, Pid} = mi_test_server:start(State, Dict),
    %% The state is read from a server waiting in its loop: start/2 returns
    %% once init/1 has answered, which on a busy machine can be before the
    %% server reaches its receive.
    ok = wait_waiting(Pid, 5000),
    {ok, Heap} = mallocinfo_process:inspect_heap(Pid, ?SYS(#{})),
    ct:pal("~p", [Heap]),
    ?assert(lists:member({State, erts_debug:size(State)}, Heap)),
    [?assert(lists:member({KV, erts_debug:size(KV)}, Heap)) || KV <- Dict],
    %% proc_lib's own entries are on the heap too.
    ?assert(lists:keymember({'$initial_call', {mi_test_server, init, 1}}, 1, Heap)),
    {ok, Items} = mallocinfo_process:inspect(Pid, ?SYS(#{})),
    [#{term := State}] = kinds(Items, state),
    {ok, H} = mallocinfo_process:heap(Pid, ?SYS(#{})),
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
    {ok, Items} = mallocinfo_process:inspect(Pid, ?SYS(#{})),
    ?assertEqual([{M, erts_debug:size(M)} || M <- Msgs],
                 [{T, W} || #{kind := message, term := T, words := W} <- Items]),
    ?assertEqual([], kinds(Items, state)),
    {ok, #{message_queue_len := 3}} = mallocinfo_process:heap(Pid, ?SYS(#{})),
    Pid ! stop.

dead_pid(_Config) ->
    Pid = spawn(fun() -> ok end),
    Ref = monitor(process, Pid),
    receive {'DOWN', Ref, _, _, _} -> ok end,
    ?assertEqual({error, noproc}, mallocinfo_process:inspect_heap(Pid)),
    ?assertEqual({error, noproc}, mallocinfo_process:heap(Pid)),
    ?assertEqual({error, noproc}, mallocinfo_process:print(Pid)).

%% A gen_server busy in a callback gets no system message: no state, the
%% rest without waiting for the callback, and the server is none the worse.
blocked_in_long_call(_Config) ->
    {ok, Pid} = mi_test_server:start({big, lists:seq(1, 1000)}, [{k, v}]),
    Test = self(),
    spawn(fun() -> Test ! {released, gen_server:call(Pid, {block, Test}, infinity)} end),
    receive {blocked, Pid} -> ok end,
    {ok, Heap} = mallocinfo_process:inspect_heap(Pid, ?SYS(#{})),
    ct:pal("blocked: ~p", [Heap]),
    %% Only this process releases the server: inspect_heap/1 returned while
    %% it was still in its callback, so it did not wait for it; and nothing
    %% was queued for it, so no system message was sent.
    ?assertEqual({current_function, {mi_test_server, handle_call, 3}},
                 process_info(Pid, current_function)),
    ?assertEqual({message_queue_len, 0}, process_info(Pid, message_queue_len)),
    ?assert(lists:member({{k, v}, erts_debug:size({k, v})}, Heap)),
    ?assertNot(lists:keymember({big, lists:seq(1, 1000)}, 1, Heap)),
    Pid ! release,
    receive {released, ok} -> ok end,
    ?assertMatch({big, _}, gen_server:call(Pid, get)),
    exit(Pid, kill).

shared_subterms(_Config) ->
    {ok, Pid} = mi_test_server:start({shared, 1000, 4}, []),
    %% Each call finds the server back in its loop: after start/2, and
    %% after the previous call, which returns once the server has ended its
    %% helper, a moment before sys hands it back to gen_server's loop (a
    %% loaded machine once caught it there: state not asked).
    ok = wait_waiting(Pid, 5000),
    {total_heap_size, Before} = process_info(Pid, total_heap_size),
    {ok, Items} = mallocinfo_process:inspect(Pid, ?SYS(#{size_budget => 10000})),
    %% Measuring inside the server allocated there; it was collected again.
    {total_heap_size, After} = process_info(Pid, total_heap_size),
    ct:pal("heap before ~p, after ~p words", [Before, After]),
    ?assert(After =< 2 * Before),
    [#{words := W, flat_words := F}] = kinds(Items, state),
    ct:pal("shared state: ~p words, ~p flat", [W, F]),
    %% Inside the server the four elements are one list.
    ?assertEqual(5 + 2000, W),
    ?assertEqual(5 + 4 * 2000, F),
    ok = wait_waiting(Pid, 5000),
    {ok, #{live_words := Live, flat_words := Flat}} =
        mallocinfo_process:heap(Pid, ?SYS(#{size_budget => 10000})),
    ?assert(Flat - Live >= 6000),
    %% With the default budget the 8005-word state is too big to measure
    %% inside: its flat size is reported, and says so.
    ok = wait_waiting(Pid, 5000),
    {ok, Default} = mallocinfo_process:inspect(Pid, ?SYS(#{})),
    [#{words := 8005, sharing := not_computed}] = kinds(Default, state),
    exit(Pid, kill).

refc_binaries(_Config) ->
    Bin = binary:copy(<<7>>, 4 * 1024 * 1024),
    P1 = holder([Bin]),
    P2 = holder([Bin]),
    {ok, #{binaries := #{count := C, bytes := B, shared_bytes := S}, verdict := V}} =
        mallocinfo_process:heap(P1),
    ct:pal("binaries ~p ~p ~p: ~ts", [C, B, S, V]),
    ?assert(C >= 1),
    ?assert(B >= 4 * 1024 * 1024),
    ?assert(S >= 4 * 1024 * 1024),
    ?assertMatch(<<"mostly binary references", _/binary>>, V),
    P1 ! stop,
    P2 ! stop.

self_pid(_Config) ->
    put(mi_self_test, {some, value}),
    {ok, Heap} = mallocinfo_process:inspect_heap(self()),
    ?assert(lists:member({{mi_self_test, {some, value}},
                          erts_debug:size({mi_self_test, {some, value}})}, Heap)),
    erase(mi_self_test).

limits(_Config) ->
    Dict = [{N, N} || N <- lists:seq(1, 50)],
    {ok, Pid} = mi_test_server:start(lists:seq(1, 100000), Dict),
    {ok, Items} = mallocinfo_process:inspect(Pid, ?SYS(#{max_terms => 10, max_words => 1000})),
    ?assertEqual(11, length(Items)),
    ?assertMatch(#{kind := omitted, term := {terms, {max_terms, 10}}}, lists:last(Items)),
    {ok, All} = mallocinfo_process:inspect(Pid, ?SYS(#{max_words => 1000})),
    [#{term := {'$mallocinfo_truncated', 200000, Preview}, words := 200000}] =
        kinds(All, state),
    ?assert(is_list(Preview) andalso length(Preview) =< 300),
    %% A long queue is counted, not copied.
    Q = spawn(fun() -> receive stop -> ok end end),
    [Q ! {msg, N} || N <- lists:seq(1, 200)],
    {ok, QItems} = mallocinfo_process:inspect(Q, ?SYS(#{max_terms => 100})),
    ?assertMatch([#{term := {messages, {queue_too_long, 200}}},
                  #{term := {state, {no_sys, {erlang, apply, 2}}}}], kinds(QItems, omitted)),
    %% A heap above max_heap_words is not walked: nothing is copied.
    {ok, Big} = mallocinfo_process:inspect(Pid, ?SYS(#{max_heap_words => 100})),
    ?assertMatch([#{term := {dictionary, {heap_too_large, _}}} | _], kinds(Big, omitted)),
    Q ! stop,
    exit(Pid, kill).

bad_arguments(_Config) ->
    Port = hd(erlang:ports()),
    [?assertError(badarg, mallocinfo_process:F(A))
     || F <- [inspect_heap, heap, print], A <- [not_a_pid, Port, "<0.1.0>", 42]],
    ?assertError(badarg, mallocinfo_process:inspect_heap(self(), #{max_terms => 0})),
    ?assertError(badarg, mallocinfo_process:inspect_heap(self(), #{bogus => 1})),
    ?assertError(badarg, mallocinfo_process:heap(self(), [])),
    ?assertError(badarg, mallocinfo_process:top(-1, memory)),
    ?assertError(badarg, mallocinfo_process:top(5, size)).

top_ranks(_Config) ->
    Test = self(),
    Len = outgrow(500000),
    Big = spawn(fun() ->
                        L = lists:seq(1, Len),
                        Test ! {built, self()},
                        receive stop -> length(L) end
                end),
    receive {built, Big} -> ok end,
    Busy = spawn(fun() -> receive stop -> ok end end),
    %% Signals from one process to another stay in order: the process_info/2
    %% calls of top/2 see all 5000 messages queued.
    [Busy ! x || _ <- lists:seq(1, 5000)],
    [#{pid := Big, value := Mem, name := Name} | _] = Rows = mallocinfo_process:top(5, memory),
    ct:pal("top memory: ~p", [Rows]),
    ?assert(Mem > 4000000),
    ?assertMatch({erlang, apply, 2}, Name),
    ?assertEqual(5, length(Rows)),
    Values = [V || #{value := V} <- Rows],
    ?assertEqual(lists:reverse(lists:sort(Values)), Values),
    [#{pid := Busy, value := 5000} | _] = mallocinfo_process:top(3, message_queue_len),
    [#{name := code_server} | _] = [R || #{pid := P} = R <- mallocinfo_process:top(1000, reductions),
                                         P =:= whereis(code_server)],
    ?assertEqual([], mallocinfo_process:top(0, binary)),
    ?assertMatch([_ | _], mallocinfo_process:top(3, heap_waste)),
    ?assertMatch([_ | _], mallocinfo_process:top(3, binary)),
    Big ! stop,
    Busy ! stop.

print_report(_Config) ->
    {ok, Pid} = mi_test_server:start({state, lists:seq(1, 300)}, [{cfg, "x"}]),
    ct:capture_start(),
    ok = mallocinfo_process:print(Pid, ?SYS(#{})),
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
%% mallocinfo_process loaded, it gets it from this node.
remote_pid(_Config) ->
    mi_ct:ensure_distributed(),
    {ok, Peer, Node} = peer:start_link(#{name => peer:random_name()}),
    try
        ?assertEqual(non_existing, erpc:call(Node, code, which, [mallocinfo_process])),
        %% The helper server is loaded there by hand; mallocinfo_process is not.
        {Mod, Bin, File} = code:get_object_code(mi_test_server),
        {module, Mod} = erpc:call(Node, code, load_binary, [Mod, File, Bin]),
        {ok, Pid} = erpc:call(Node, mi_test_server, start,
                              [{remote_state, 42}, [{remote_key, lists:seq(1, 10)}]]),
        ?assertEqual(Node, node(Pid)),
        {ok, Heap} = mallocinfo_process:inspect_heap(Pid, ?SYS(#{})),
        ?assert(lists:member({{remote_key, lists:seq(1, 10)},
                              erts_debug:size({remote_key, lists:seq(1, 10)})}, Heap)),
        ?assert(lists:member({{remote_state, 42}, 3}, Heap)),
        {ok, #{live_words := _}} = mallocinfo_process:heap(Pid, ?SYS(#{})),
        ?assertMatch({file, _}, erpc:call(Node, code, is_loaded, [mallocinfo_process]))
    after
        peer:stop(Peer)
    end.

%% {T, T} nested 30 levels: 61 words on the heap, 2^31 flat. Nothing may
%% walk or copy it flat: the work is bounded by the node bound of item/4
%% (max_words, or twice the heap), and the answer says so. A flat walk
%% would cost billions of reductions; the bound is asserted on them (they
%% count calls, not time) for two values of max_words.
exponential_sharing(_Config) ->
    {ok, Pid} = mi_test_server:start({doubled, 30}, []),
    Reds = fun(P) -> {reductions, R} = process_info(P, reductions), R end,
    lists:foreach(
      fun(MaxWords) ->
              {Target0, Caller0} = {Reds(Pid), Reds(self())},
              {ok, Items} = mallocinfo_process:inspect(Pid, ?SYS(#{max_words => MaxWords})),
              {Target, Caller} = {Reds(Pid) - Target0, Reds(self()) - Caller0},
              ct:pal("exponential, max_words ~b: ~b reductions in the target, ~b here: ~p",
                     [MaxWords, Target, Caller, kinds(Items, state)]),
              ?assert(Target < 10 * MaxWords),
              ?assert(Caller < 10 * MaxWords),
              [#{term := {'$mallocinfo_truncated', {more_than, MaxWords}, _},
                 sharing := not_computed}] = kinds(Items, state)
      end, [100000, 10000]),
    {ok, #{complete := false, verdict := none, not_measured := Gaps}} = mallocinfo_process:heap(Pid, ?SYS(#{})),
    ?assertMatch([#{what := [state], reason := shared_too_much, option := #{}}], Gaps),
    %% The server lives on, idle (asking it for its state would copy 2^31).
    ?assertEqual({current_function, gen_server_idle()}, process_info(Pid, current_function)),
    exit(Pid, kill).

%% However the target answers (late, or not at all), nothing is left in the
%% caller's mailbox, and the target's state is untouched.
no_stray_messages(_Config) ->
    {ok, Pid} = mi_test_server:start({kept, lists:seq(1, 10)}, []),
    flush(),
    [{ok, _} = mallocinfo_process:inspect(Pid, #{timeout => T}) || T <- [0, 0, 1, 100]],
    %% The call is queued behind every system message sent above, and the
    %% server answers in order: whatever those would send has arrived once
    %% the call returns.
    ?assertEqual({kept, lists:seq(1, 10)}, gen_server:call(Pid, get)),
    ?assertEqual({messages, []}, process_info(self(), messages)),
    exit(Pid, kill).

flush() -> receive _ -> flush() after 0 -> ok end.

%% One binary referenced twice by one process is one binary, and not shared.
binary_held_twice(_Config) ->
    Bin = binary:copy(<<1>>, 2 * 1024 * 1024),
    {ok, Pid} = mi_test_server:start({twice, Bin}, []),
    erlang:garbage_collect(),
    {ok, #{binaries := #{count := C, bytes := B, shared_bytes := S}}} =
        mallocinfo_process:heap(Pid, ?SYS(#{})),
    ct:pal("held twice: ~p ~p ~p", [C, B, S]),
    ?assertEqual(1, C),
    ?assertEqual(2 * 1024 * 1024, B),
    exit(Pid, kill).

unreachable_node(_Config) ->
    mi_ct:ensure_distributed(),
    %% A pid of a node that does not exist.
    Ghost = ghost_pid('mi_ghost@nohost'),
    ?assertMatch({error, {erpc, _}}, mallocinfo_process:inspect_heap(Ghost)),
    ?assertMatch({error, {erpc, _}}, mallocinfo_process:heap(Ghost)).

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
                                   "-pa", filename:dirname(code:which(mallocinfo_process)),
                                   "-pa", filename:dirname(code:which(mi_test_server))]}),
    try
        N = 1000000,
        ok = peer:call(Peer, mi_test_server, spawn_idle, [N], 120000),
        Count = peer:call(Peer, erlang, system_info, [process_count]),
        ?assert(Count >= N),
        Times = [{By, element(1, peer:call(Peer, timer, tc,
                                          [mallocinfo_process, top, [10, By]], 120000))}
                 || By <- [memory, heap_waste, binary, message_queue_len, reductions]],
        ct:pal("top/2 over ~p processes: ~p (us)", [Count, Times]),
        ok = file:write_file(filename:join(?config(priv_dir, Config), "top_million.txt"),
                             io_lib:format("~p ~p~n", [Count, Times]))
    after
        peer:stop(Peer)
    end.


%% A process that has received each of Terms in a message of its own and
%% keeps them all, once it has them all.
holder(Terms) ->
    Test = self(),
    %% Only the count goes into the closure: Terms themselves would be
    %% copied into the new process, one more reference each.
    N = length(Terms),
    Pid = spawn(fun() ->
                        Held = [receive {hold, T} -> T end || _ <- lists:seq(1, N)],
                        Test ! {holding, self()},
                        receive stop -> length(Held) end
                end),
    [Pid ! {hold, T} || T <- Terms],
    receive {holding, Pid} -> Pid end.

%% Every process's value in top(all, By).
top_values(By) ->
    All = mallocinfo_process:top(erlang:system_info(process_count) + 100, By),
    maps:from_list([{P, V} || #{pid := P, value := V} <- All]).

-define(MiB, (1024 * 1024)).

%% One 10 MiB binary received 1000 times by each of five processes: 1000
%% references each (process_info/2 lists every one), one binary. Each
%% process's figure is 10 MiB, not 10 GiB, and all of it is shared.
top_binary_one_binary_many_refs(_Config) ->
    Big = binary:copy(<<7>>, 10 * ?MiB),
    Holders = [holder(lists:duplicate(1000, Big)) || _ <- lists:seq(1, 5)],
    [?assertMatch({binary, L} when length(L) =:= 1000, process_info(H, binary))
     || H <- Holders],
    Values = top_values(binary),
    [?assertEqual(10 * ?MiB, maps:get(H, Values)) || H <- Holders],
    [?assertMatch({ok, #{binaries := #{count := 1, bytes := 10 * ?MiB,
                                       shared_bytes := 10 * ?MiB}}},
                  mallocinfo_process:heap(H)) || H <- Holders],
    [H ! stop || H <- Holders].

%% 1000 sub-binaries of one 10 MiB binary, each received apart: each copy
%% references the whole binary. 10 MiB, once.
top_binary_sub_binaries(_Config) ->
    Big = binary:copy(<<7>>, 10 * ?MiB),
    H = holder([binary:part(Big, I * 100, 100) || I <- lists:seq(1, 1000)]),
    {binary, Entries} = process_info(H, binary),
    ?assertEqual(1000, length(Entries)),
    ?assertEqual(10 * ?MiB, maps:get(H, top_values(binary))),
    ?assertMatch({ok, #{binaries := #{count := 1, bytes := 10 * ?MiB}}},
                 mallocinfo_process:heap(H)),
    H ! stop.

%% 100 distinct binaries, made by the process itself (nothing else
%% references them): their exact sum, none shared.
top_binary_distinct(_Config) ->
    Test = self(),
    H = spawn(fun() ->
                      Bins = [binary:copy(<<I>>, 100000 + I) || I <- lists:seq(1, 100)],
                      Test ! {holding, self()},
                      receive stop -> length(Bins) end
              end),
    receive {holding, H} -> ok end,
    Sum = 100 * 100000 + 5050,
    ?assertEqual(Sum, maps:get(H, top_values(binary))),
    ?assertMatch({ok, #{binaries := #{count := 100, bytes := Sum, shared_bytes := 0}}},
                 mallocinfo_process:heap(H)),
    H ! stop.

%% Names: the registered name first; for processes started through
%% proc_lib the function they were started with, whatever the heap size;
%% else the initial call. The same in top/2, heap/1 and print/1.
names(_Config) ->
    {ok, Reg} = mi_test_server:start(mi_named_server, {s, 1}, []),
    Small = started(mi_test_server:start({s, 2}, [])),
    %% Heaps above the 100,000 words that once stopped the lookup, and
    %% above max_heap_words (1,000,000): that one is asked from inside.
    Mid = started(mi_test_server:start({seq, 200000}, [])),
    Huge = started(mi_test_server:start({seq, 1000000}, [])),
    {total_heap_size, MidHeap} = process_info(Mid, total_heap_size),
    {total_heap_size, HugeHeap} = process_info(Huge, total_heap_size),
    ?assert(MidHeap > 100000 andalso MidHeap =< 1000000),
    ?assert(HugeHeap > 1000000),
    Plain = spawn(fun() -> receive stop -> ok end end),
    Mfa = spawn(timer, sleep, [infinity]),
    Test = self(),
    Spawned = proc_lib:spawn(fun() -> Test ! {up, self()}, receive stop -> ok end end),
    receive {up, Spawned} -> ok end,
    ?assertMatch({initial_call, {proc_lib, init_p, 3}}, process_info(Spawned, initial_call)),
    {dictionary, SpawnedDict} = process_info(Spawned, dictionary),
    {?MODULE, _, 0} = SpawnedMfa = proplists:get_value('$initial_call', SpawnedDict),
    Server = {mi_test_server, init, 1},
    Expected = [{Reg, mi_named_server}, {Small, Server}, {Mid, Server}, {Huge, Server},
                {Plain, {erlang, apply, 2}}, {Mfa, {timer, sleep, 1}}, {Spawned, SpawnedMfa}],
    All = mallocinfo_process:top(erlang:system_info(process_count) + 100, memory),
    Names = maps:from_list([{P, N} || #{pid := P, name := N} <- All]),
    [?assertEqual({P, Name}, {P, maps:get(P, Names)}) || {P, Name} <- Expected],
    [?assertMatch({P, {ok, #{name := Name}}}, {P, mallocinfo_process:heap(P, ?SYS(#{}))})
     || {P, Name} <- Expected],
    [?assertNotEqual(nomatch, string:find(print_out(P, #{}), Text))
     || {P, Text} <- [{Reg, " (mi_named_server): heap "},
                      {Mid, " (mi_test_server:init/1): heap "},
                      {Huge, " (mi_test_server:init/1): heap "},
                      {Plain, " (erlang:apply/2): heap "}]],
    %% The servers are idle and none the worse (the huge one was asked).
    Idle = gen_server_idle(),
    [?assertEqual({current_function, Idle}, process_info(P, current_function))
     || P <- [Reg, Small, Mid, Huge]],
    ?assertEqual({message_queue_len, 0}, process_info(Huge, message_queue_len)),
    [exit(P, kill) || {P, _} <- Expected].

started({ok, Pid}) -> Pid.

%% Where an idle gen_server waits, asked of the running release (loop/7
%% up to OTP 28, loop/5 from OTP 29): a fresh server's current function.
gen_server_idle() ->
    Ref = started(mi_test_server:start(reference, [])),
    ok = wait_waiting(Ref, 5000),
    {current_function, {gen_server, _, _} = Idle} = process_info(Ref, current_function),
    exit(Ref, kill),
    Idle.

%% Elements of a lists:seq/2 whose heap (2 words a cell) is at least
%% twice the memory of the node's largest process now, and at least Min:
%% the node's own processes (user, test_server_io) are bigger on some
%% releases than on others.
outgrow(Min) ->
    Largest = lists:max([M || P <- erlang:processes(), {memory, M} <- [process_info(P, memory)]]),
    max(Min, Largest div erlang:system_info(wordsize)).

print_out(Pid, Opts) ->
    ct:capture_start(),
    ok = mallocinfo_process:print(Pid, Opts),
    ct:capture_stop(),
    lists:flatten(ct:capture_get()).

%% The report's largest processes and its process verdict name the
%% gen_server by its callback module, not proc_lib:init_p/5.
report_names(_Config) ->
    Pid = started(mi_test_server:start({seq, outgrow(2000000)}, [])),
    R = mallocinfo_report:collect(),
    #{erts := #{processes := [#{pid := Largest, name := Name} | _]}, verdicts := Verdicts} = R,
    ?assertEqual({Pid, {mi_test_server, init, 1}}, {Largest, Name}),
    Text = lists:flatten(io_lib:format("~ts", [mallocinfo_report:format(R)])),
    ct:pal("~ts", [Text]),
    Named = pid_to_list(Pid) ++ " (mi_test_server:init/1)",
    ?assertNotEqual(nomatch, string:find(Text, "largest processes: " ++ Named)),
    ?assertMatch([_], [V || V <- Verdicts,
                            string:find(V, "process " ++ Named ++ " holds ") =/= nomatch]),
    exit(Pid, kill).

%% A heap above max_heap_words is not walked: heap/1 and print/1 say it
%% was not measured, why, and the option that would measure it (never
%% "live 0 words" or "verdict: none"); that option does.
heap_above_limit(_Config) ->
    Pid = started(mi_test_server:start(lists:seq(1, 10000), [{k, v}])),
    Opts = #{max_heap_words => 1000},
    {ok, H} = mallocinfo_process:heap(Pid, Opts),
    ct:pal("~p", [H]),
    #{total_heap_size := Heap, live_words := not_measured, flat_words := not_measured,
      unseen_words := not_measured, items := 0, complete := false,
      name := {mi_test_server, init, 1},
      not_measured := [#{what := dictionary, reason := heap_too_large,
                         option := #{max_heap_words := Suggested} = Option},
                       #{what := state, reason := heap_too_large, option := Option}],
      verdict := Verdict} = H,
    ?assert(Suggested > Heap),
    Why = io_lib:format("the heap (~b words) is above max_heap_words (1000)", [Heap]),
    ?assertEqual(iolist_to_binary(["not measured: dictionary and state: ", Why,
                                   "; the option ", io_lib:format("~0p", [Option]),
                                   " would measure it"]), Verdict),
    Out = print_out(Pid, Opts),
    ct:pal("~ts", [Out]),
    ?assertEqual(nomatch, string:find(Out, "live 0 words")),
    ?assertEqual(nomatch, string:find(Out, "verdict: none")),
    ?assertNotEqual(nomatch, string:find(Out, "live words not measured")),
    ?assertNotEqual(nomatch, string:find(Out, lists:flatten(
        ["not measured: dictionary and state: ", Why, "; ",
         io_lib:format("mallocinfo_process:print(~p, ~0p) would measure it", [Pid, Option])]))),
    ?assertNotEqual(nomatch, string:find(Out, "verdict: cannot tell, nothing was measured")),
    %% The option named measures it.
    {ok, Measured} = mallocinfo_process:heap(Pid, Option),
    #{live_words := Live, items := Items, not_measured := Gaps} = Measured,
    ?assert(Live >= 20000),
    ?assert(Items >= 4),
    ?assertEqual([], [G || #{reason := heap_too_large} = G <- Gaps]),
    %% A plain process: its dictionary is the part not measured.
    Test = self(),
    Plain = spawn(fun() ->
                          put(k, lists:seq(1, 10000)),
                          Test ! {put, self()},
                          receive stop -> ok end
                  end),
    receive {put, Plain} -> ok end,
    {ok, #{live_words := not_measured,
           not_measured := [#{what := dictionary, reason := heap_too_large},
                            #{what := state, reason := no_sys, option := #{}}]}} =
        mallocinfo_process:heap(Plain, Opts),
    Plain ! stop,
    exit(Pid, kill).

%% A queue longer than max_terms is counted, not copied, and says which
%% max_terms would copy it.
queue_above_limit(_Config) ->
    Q = spawn(fun() -> receive stop -> ok end end),
    [Q ! {msg, N} || N <- lists:seq(1, 200)],
    %% A plain process: its state is never measured, and says so.
    {ok, #{live_words := not_measured,
           not_measured := [#{what := messages, reason := queue_too_long,
                              detail := <<"the queue (200 messages) is longer than "
                                          "max_terms (100)">>,
                              option := #{max_terms := 200} = Option},
                            #{what := state, reason := no_sys}]}} =
        mallocinfo_process:heap(Q, ?SYS(#{max_terms => 100})),
    {ok, Items} = mallocinfo_process:inspect(Q, Option),
    ?assertEqual(200, length(kinds(Items, message))),
    ?assertMatch({ok, #{live_words := 600, not_measured := [#{what := state, reason := no_sys}]}},
                 mallocinfo_process:heap(Q, Option)),
    Q ! stop.

%%% ---------------------------------------------------------------------------
%%% What was not measured, on the shapes two real servers showed

wait_hibernated(Pid) -> wait_hibernated(Pid, 5000).

wait_hibernated(Pid, 0) ->
    {not_hibernated, process_info(Pid, current_function)};
wait_hibernated(Pid, N) ->
    %% erlang:hibernate/3 is the current function before the heap is
    %% collected: wait for that too (no old heap, the young one filled).
    %% From OTP 29 gen_server and gen_statem hibernate with
    %% erlang:hibernate/0, which has no frame: their loop_hibernate is the
    %% current function.
    case {process_info(Pid, current_function), process_info(Pid, garbage_collection_info)} of
        {{current_function, CF}, {garbage_collection_info, GI}}
          when CF =:= {erlang, hibernate, 3}; CF =:= {gen_server, loop_hibernate, 4};
               CF =:= {gen_statem, loop_hibernate, 3} ->
            G = fun(K) -> proplists:get_value(K, GI) end,
            case G(old_heap_block_size) =:= 0
                andalso G(heap_block_size) - G(heap_size) =< G(heap_block_size) div 100 of
                true -> ok;
                false -> timer:sleep(1), wait_hibernated(Pid, N - 1)
            end;
        _ ->
            timer:sleep(1), wait_hibernated(Pid, N - 1)
    end.

%% "N words (X KiB)", as heap/1's sentences and print/1 say an amount.
words_text(N) ->
    lists:flatten(io_lib:format("~b words (~ts)",
                                [N, mallocinfo_units:bytes(N * erlang:system_info(wordsize))])).

has(Text, Part) ->
    string:find(Text, lists:flatten(Part)) =/= nomatch.

%% RabbitMQ's queue process: a gen_server2 (a loop of its own that
%% handles system messages, without system_replace_state/2), hibernated
%% with a large state. heap/1 used to count its small dictionary as the
%% live data ("live 97 words" for a 2,185,112-word heap), with no word of
%% the state and "verdict: none". Now: what was not measured (the state),
%% how much (the unseen words, and bytes), why (hibernated, not idle in a
%% gen_server or gen_statem loop, so not asked), and the call that
%% measures it; and that call does.
hibernated_state_not_measured(_Config) ->
    N = 100000,
    {ok, Pid} = mi_sys_server:start({seq, N}, #{hibernate => true, dict => [{k, v}]}),
    ok = wait_hibernated(Pid),
    {ok, H} = mallocinfo_process:heap(Pid),
    ct:pal("~p", [H]),
    #{total_heap_size := Total, stack_size := Stack, live_words := Live,
      unseen_words := Unseen, complete := false, verdict := Verdict,
      not_measured := [#{what := state, reason := not_asked, detail := Detail,
                         option := Option}]} = H,
    ?assertEqual(#{sys => true}, Option),
    ?assert(Live < 100),
    ?assertEqual(Total - Live - Stack, Unseen),
    ?assert(Unseen >= 2 * N),
    ?assert(has(Detail, "the process is hibernated, not idle in a gen_server or gen_statem "
                        "loop, so it was not sent a system message for its state")),
    ?assert(has(Detail, [words_text(Unseen), " of the heap are unseen, all of them live"])),
    ?assert(has(Verdict, io_lib:format("not measured: ~b% of the ", [Unseen * 100 div Total]))),
    ?assert(has(Verdict, "the option #{sys => true} would ask for it")),
    Out = print_out(Pid, #{}),
    ct:pal("~ts", [Out]),
    ?assertEqual(nomatch, re:run(Out, "live [0-9]")),
    ?assert(has(Out, ["measured ", integer_to_list(Live), " words"])),
    ?assert(has(Out, ["unseen ", words_text(Unseen)])),
    ?assert(has(Out, io_lib:format("mallocinfo_process:print(~p, #{sys => true}) would ask for it",
                                   [Pid]))),
    ?assertNot(has(Out, "verdict: none")),
    ?assert(has(Out, "verdict: cannot tell, ")),
    %% The call named measures it: sys gives a loop without
    %% system_replace_state/2 its whole loop data, the state in it.
    {ok, Items} = mallocinfo_process:inspect(Pid, ?SYS(Option)),
    [#{words := StateWords}] = kinds(Items, state),
    ?assert(StateWords >= 2 * N),
    %% (Once it hibernates again: woken, its heap has room to spare.)
    ok = wait_hibernated(Pid),
    {ok, #{complete := true, live_words := Live2}} = mallocinfo_process:heap(Pid, ?SYS(Option)),
    ?assert(Live2 >= 2 * N),
    %% The server is none the worse, and hibernates again.
    ok = wait_hibernated(Pid),
    ?assertEqual(lists:seq(1, N), mi_sys_server:call(Pid, get)),
    %% With a heap above max_heap_words too (the default on the real
    %% server): both options, and the caller's own kept in the call.
    ok = wait_hibernated(Pid),
    {ok, #{not_measured := Gaps, total_heap_size := Total3}} =
        mallocinfo_process:heap(Pid, #{max_heap_words => 1000, timeout => 60000}),
    [#{reason := heap_too_large, option := DictOption},
     #{reason := not_asked, option := #{sys := true, max_heap_words := Bigger,
                                        timeout := 60000} = Both}] = Gaps,
    ?assertEqual(maps:remove(sys, Both), DictOption),
    ?assert(Bigger >= Total3),
    {ok, #{complete := true}} = mallocinfo_process:heap(Pid, Both),
    %% A hibernated gen_server: the same, and sys => true measures it.
    Gen = started(mi_test_server:start({seq, N}, [])),
    ok = gen_server:call(Gen, hibernate),
    ok = wait_hibernated(Gen),
    {ok, #{not_measured := [#{what := state, reason := not_asked, option := #{sys := true}}]}} =
        mallocinfo_process:heap(Gen),
    {ok, #{complete := true}} = mallocinfo_process:heap(Gen, ?SYS(#{sys => true})),
    ?assertEqual(lists:seq(1, N), gen_server:call(Gen, get)),
    exit(Gen, kill),
    exit(Pid, kill).

%% ejabberd's connection processes: p1_server, a loop of its own that
%% handles system messages, idle in it. heap/1 used to say "live 63 words"
%% for a 591,271-word heap, and "verdict: none".
sys_loop_state_not_measured(_Config) ->
    N = 100000,
    {ok, Pid} = mi_sys_server:start({seq, N}, #{}),
    ok = wait_waiting(Pid, 5000),
    {ok, H} = mallocinfo_process:heap(Pid),
    ct:pal("~p", [H]),
    #{total_heap_size := Total, unseen_words := Unseen, verdict := Verdict,
      not_measured := [#{what := state, reason := not_asked, detail := Detail,
                         option := #{sys := true} = Option}]} = H,
    ?assert(Unseen * 2 > Total),
    ?assert(has(Detail, "the process is in mi_sys_server:loop/3, not idle in a gen_server or "
                        "gen_statem loop")),
    ?assert(has(Detail, [words_text(Unseen), " of the heap are unseen"])),
    ?assertMatch(<<"not measured: ", _/binary>>, Verdict),
    Out = print_out(Pid, #{}),
    ?assertEqual(nomatch, re:run(Out, "live [0-9]")),
    ?assertNot(has(Out, "verdict: none")),
    {ok, #{complete := true, live_words := Live}} = mallocinfo_process:heap(Pid, ?SYS(Option)),
    ?assert(Live >= 2 * N),
    ?assertEqual(lists:seq(1, N), mi_sys_server:call(Pid, get)),
    exit(Pid, kill).

%% A gen_server-like loop that is not OTP at all (spawned, no proc_lib):
%% nothing can ask for its state, and it says so, with the unseen words;
%% sys => true sends it nothing.
plain_loop_state_not_measured(_Config) ->
    N = 100000,
    Test = self(),
    Pid = spawn(fun() ->
                        State = lists:seq(1, N),
                        put(k, v),
                        Test ! {ready, self()},
                        plain_loop(State)
                end),
    receive {ready, Pid} -> ok end,
    ok = wait_waiting(Pid, 5000),
    {ok, H} = mallocinfo_process:heap(Pid),
    ct:pal("~p", [H]),
    #{live_words := Live, unseen_words := Unseen, complete := false, verdict := Verdict,
      not_measured := [#{what := state, reason := no_sys, detail := Detail, option := #{}}]} = H,
    ?assert(Live < 100),
    ?assert(Unseen >= 2 * N),
    ?assert(has(Detail, "the process was not started through proc_lib (initial call "
                        "erlang:apply/2)")),
    ?assert(has(Detail, [words_text(Unseen), " of the heap are unseen"])),
    ?assertMatch(<<"not measured: ", _/binary>>, Verdict),
    ?assert(has(Verdict, "no option measures it")),
    Out = print_out(Pid, #{}),
    ct:pal("~ts", [Out]),
    ?assertEqual(nomatch, re:run(Out, "live [0-9]")),
    ?assert(has(Out, ["unseen ", words_text(Unseen)])),
    ?assert(has(Out, "no option measures it")),
    ?assertNot(has(Out, "verdict: none")),
    {ok, #{not_measured := [#{reason := no_sys}]}} =
        mallocinfo_process:heap(Pid, #{sys => true}),
    ?assertEqual({message_queue_len, 0}, process_info(Pid, message_queue_len)),
    Ref = make_ref(),
    Pid ! {call, self(), Ref, get},
    receive {Ref, State} -> ?assertEqual(lists:seq(1, N), State) end,
    Pid ! stop.

plain_loop(State) ->
    receive
        {call, From, Ref, get} -> From ! {Ref, State}, plain_loop(State);
        stop -> ok
    end.

%% sys => true on a process started through proc_lib that does not handle
%% system messages: no answer within timeout, said so; the message stays
%% in its queue (the reason sys => true is not the default).
sys_not_answered(_Config) ->
    Test = self(),
    Pid = proc_lib:spawn(fun() -> Test ! {ready, self()}, receive stop -> ok end end),
    receive {ready, Pid} -> ok end,
    {ok, #{not_measured := [#{what := state, reason := not_asked}]}} = mallocinfo_process:heap(Pid),
    {ok, #{not_measured := [#{what := state, reason := sys_timeout,
                              option := #{sys := true, timeout := 1000}}]}} =
        mallocinfo_process:heap(Pid, #{sys => true, timeout => 10}),
    ?assertMatch({messages, [{system, _, {replace_state, _}}]}, process_info(Pid, messages)),
    Pid ! stop.

%%% ---------------------------------------------------------------------------
%%% Names

%% The label comes before the initial call: RabbitMQ's process_name entry,
%% or the '$process_label' that proc_lib:set_label/1 (OTP 27) sets, which
%% wins over process_name; a registered name wins over both. The same in
%% top/2, heap/1 and print/1, whatever loop the process waits in.
name_labels(_Config) ->
    Label = {rabbit_amqqueue_process, {resource, <<"/">>, queue, <<"q1">>}},
    Gen = started(mi_test_server:start({s, 1}, [{process_name, Label}])),
    {ok, Hib} = mi_sys_server:start({seq, 1000}, #{hibernate => true,
                                                   dict => [{process_name, Label}]}),
    ok = wait_hibernated(Hib),
    Both = started(mi_test_server:start({s, 2}, [{process_name, other},
                                                 {'$process_label', {worker, 7}}])),
    {ok, Reg} = mi_test_server:start(mi_labelled_server, {s, 3}, [{process_name, Label}]),
    Test = self(),
    Plain = spawn(fun() -> put(process_name, {plain, 1}), Test ! {ready, self()},
                           receive stop -> ok end
                  end),
    receive {ready, Plain} -> ok end,
    Expected = [{Gen, Label}, {Hib, Label}, {Both, {worker, 7}}, {Reg, mi_labelled_server},
                {Plain, {plain, 1}}],
    All = mallocinfo_process:top(erlang:system_info(process_count) + 100, memory),
    Names = maps:from_list([{P, N} || #{pid := P, name := N} <- All]),
    [?assertEqual({P, Name}, {P, maps:get(P, Names)}) || {P, Name} <- Expected],
    [?assertMatch({P, {ok, #{name := Name}}}, {P, mallocinfo_process:heap(P)})
     || {P, Name} <- Expected],
    ?assert(has(print_out(Gen, #{}), [pid_to_list(Gen), " ({rabbit_amqqueue_process,{resource,"
                                      "<<\"/\">>,queue,<<\"q1\">>}}): heap "])),
    ?assert(has(print_out(Both, #{}), [pid_to_list(Both), " ({worker,7}): heap "])),
    %% The key read is the one proc_lib:get_label/1 reads, where the release
    %% has it.
    case erlang:function_exported(proc_lib, get_label, 1) of
        true -> ?assertEqual({worker, 7}, proc_lib:get_label(Both));
        false -> ok
    end,
    Plain ! stop,
    [exit(P, kill) || {P, _} <- Expected].

%% The same process keeps its name as it grows. Where the VM reads one key
%% of another process's dictionary (OTP 26.2), always; on OTP 25 the
%% dictionary is copied only for a heap within 1,000,000 words (or
%% max_heap_words, when heap/2 is given a larger one), and a bigger
%% hibernated process keeps its raw initial call in top/2, as the
%% documentation says; heap/2 with max_heap_words above its heap, or with
%% sys => true, names it.
name_whatever_the_size(_Config) ->
    Label = {rabbit_amqqueue_process, {resource, <<"/">>, queue, <<"q1">>}},
    Keyed = try process_info(self(), {dictionary, x}) of
                _ -> true
            catch error:badarg -> false
            end,
    Name = fun(P) ->
                   All = mallocinfo_process:top(erlang:system_info(process_count) + 100, memory),
                   hd([N || #{pid := Q, name := N} <- All, Q =:= P])
           end,
    {ok, Small} = mi_sys_server:start({seq, 1000}, #{hibernate => true,
                                                     dict => [{process_name, Label}]}),
    {ok, Big} = mi_sys_server:start({seq, 600000}, #{hibernate => true,
                                                     dict => [{process_name, Label}]}),
    [ok = wait_hibernated(P) || P <- [Small, Big]],
    {total_heap_size, BigHeap} = process_info(Big, total_heap_size),
    ?assert(BigHeap > 1000000),
    ?assertEqual(Label, Name(Small)),
    case Keyed of
        true -> ?assertEqual(Label, Name(Big));
        false -> ?assertEqual({proc_lib, init_p, 5}, Name(Big))
    end,
    {ok, #{name := ByCopy}} = mallocinfo_process:heap(Big, #{max_heap_words => 2 * BigHeap}),
    ?assertEqual(Label, ByCopy),
    {ok, #{name := ByAsking}} = mallocinfo_process:heap(Big, ?SYS(#{sys => true})),
    ?assertEqual(Label, ByAsking),
    [exit(P, kill) || P <- [Small, Big]].

%% The report's largest processes and its process verdict name the process
%% by its label, read from inside the big idle gen_server.
report_label_names(_Config) ->
    Label = {rabbit_amqqueue_process, {resource, <<"/">>, queue, <<"q1">>}},
    Pid = started(mi_test_server:start({seq, outgrow(2000000)}, [{process_name, Label}])),
    R = mallocinfo_report:collect(),
    #{erts := #{processes := [#{pid := Largest, name := Name} | _]}, verdicts := Verdicts} = R,
    ?assertEqual({Pid, Label}, {Largest, Name}),
    %% The text is wrapped at spaces: a long name may be split.
    Text = re:replace(mallocinfo_report:format(R), "\\s+", " ", [global, unicode, {return, list}]),
    Named = pid_to_list(Pid) ++ " ({rabbit_amqqueue_process,{resource,<<\"/\">>,queue,"
        "<<\"q1\">>}})",
    ?assert(has(Text, "largest processes: " ++ Named)),
    ?assertMatch([_], [V || V <- Verdicts, has(V, "process " ++ Named ++ " holds ")]),
    exit(Pid, kill).

%% A gen_statem idle in its loop is asked for its state ({State, Data}, as
%% sys gives it), whatever function the release waits in (loop_receive/3
%% on OTP 25 and 27, loop/3 on OTP 29); a hibernated one is not asked,
%% and sys => true measures it.
gen_statem_state(_Config) ->
    N = 10000,
    {ok, Idle} = mi_test_statem:start({seq, N}, #{}),
    ok = wait_waiting(Idle, 5000),
    {ok, Items} = mallocinfo_process:inspect(Idle, ?SYS(#{size_budget => 4 * N})),
    ct:pal("idle in ~p: ~p", [process_info(Idle, current_function), kinds(Items, omitted)]),
    [#{term := {idle, Data}, words := Words, sharing := preserved}] = kinds(Items, state),
    ?assertEqual(lists:seq(1, N), Data),
    ?assertEqual(erts_debug:size({idle, Data}), Words),
    {ok, #{complete := true}} = mallocinfo_process:heap(Idle, ?SYS(#{})),
    ?assertEqual(lists:seq(1, N), gen_statem:call(Idle, get)),
    {ok, Hib} = mi_test_statem:start({seq, N}, #{hibernate => true}),
    ok = wait_hibernated(Hib),
    {ok, #{not_measured := [#{what := state, reason := not_asked, detail := Detail,
                              option := #{sys := true}}]}} = mallocinfo_process:heap(Hib),
    ?assert(has(Detail, "the process is hibernated, ")),
    {ok, #{complete := true, live_words := Live}} =
        mallocinfo_process:heap(Hib, ?SYS(#{sys => true})),
    ?assert(Live >= 2 * N),
    [exit(P, kill) || P <- [Idle, Hib]].
