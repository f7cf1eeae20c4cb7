%% EUnit: mallocinfo_process's verdict rules on crafted heap figures.
-module(mallocinfo_process_tests).
-include_lib("eunit/include/eunit.hrl").

base() ->
    #{total_heap_size => 100000, live_words => 90000, stack_size => 100,
      message_queue_len => 0, complete => true,
      binaries => #{count => 0, bytes => 0, shared_bytes => 0}}.

healthy_test() ->
    ?assertEqual(none, mallocinfo_process:verdict(base())).

garbage_test() ->
    V = mallocinfo_process:verdict((base())#{live_words => 10000}),
    ?assertMatch(<<"mostly garbage: 89% of the ", _/binary>>, V).

incomplete_view_is_not_garbage_test() ->
    %% The state was not seen (a plain process, or a limit): its data would
    %% count as "unseen"; no garbage verdict then, and no "none" either:
    %% most of the heap was not measured, and the verdict says what.
    Gap = #{what => state, reason => not_asked, option => #{sys => true},
            detail => <<"the process is hibernated, not idle in a gen_server or gen_statem loop, "
                        "so it was not sent a system message for its state">>},
    M = (base())#{live_words => 10000, complete => false, not_measured => [Gap]},
    ?assertEqual(<<"not measured: 89% of the 781.3 KiB heap is unseen: state: the process is "
                   "hibernated, not idle in a gen_server or gen_statem loop, so it was not sent "
                   "a system message for its state; the option #{sys => true} would ask for it, "
                   "if the process handles system messages (OTP behaviours and sys-based loops "
                   "such as gen_server2 or p1_server do)">>, mallocinfo_process:verdict(M)),
    %% Figures alone (no gaps listed) still say it.
    ?assertEqual(<<"not measured: 89% of the 781.3 KiB heap is unseen">>,
                 mallocinfo_process:verdict((base())#{live_words => 10000, complete => false})),
    %% Half or less unseen: nothing to say.
    ?assertEqual(none, mallocinfo_process:verdict(M#{live_words => 60000})).

%% How names print, in print/1, the report and its verdicts alike.
name_text_test() ->
    T = fun(N) -> lists:flatten(mallocinfo_process:name_text(N)) end,
    ?assertEqual("", T(undefined)),
    ?assertEqual(" (code_server)", T(code_server)),
    ?assertEqual(" (rabbit_prequeue:init/1)", T({rabbit_prequeue, init, 1})),
    ?assertEqual(" ({rabbit_amqqueue_process,{resource,<<\"/\">>,queue,<<\"q1\">>}})",
                 T({rabbit_amqqueue_process, {resource, <<"/">>, queue, <<"q1">>}})),
    ?assertEqual(T({a, b, 1}), lists:flatten(mallocinfo_report_verdicts:proc_name({a, b, 1}))),
    ?assertEqual(" ({a,b,c})", T({a, b, c})).

small_heap_is_not_garbage_test() ->
    %% A tiny heap that is mostly unseen is not worth a sentence.
    ?assertEqual(none, mallocinfo_process:verdict((base())#{total_heap_size => 2000,
                                                          live_words => 10})).

binary_test() ->
    Bins = #{count => 3, bytes => 50 * 1024 * 1024, shared_bytes => 10 * 1024 * 1024},
    V = mallocinfo_process:verdict((base())#{binaries => Bins}),
    ?assertMatch(<<"mostly binary references: 3 refc binaries hold 50.0 MiB (10.0 MiB shared",
                   _/binary>>, V).

small_binaries_are_not_a_verdict_test() ->
    Bins = #{count => 1, bytes => 512 * 1024, shared_bytes => 0},
    ?assertEqual(none, mallocinfo_process:verdict((base())#{total_heap_size => 1000,
                                                          live_words => 900,
                                                          binaries => Bins})).

queue_test() ->
    V = mallocinfo_process:verdict((base())#{message_queue_len => 250000}),
    ?assertMatch(<<"message queue of 250000 messages", _/binary>>, V).

%% Nothing measured: no "none", but what was not measured, why, and the
%% option that would measure it.
not_measured_test() ->
    Why = <<"the heap (2000000 words) is above max_heap_words (1000000)">>,
    Gap = fun(What) -> #{what => What, reason => heap_too_large, detail => Why,
                         option => #{max_heap_words => 3000000}}
          end,
    M = (base())#{total_heap_size => 2000000, live_words => not_measured, complete => false,
                  not_measured => [Gap(dictionary), Gap(state)]},
    ?assertEqual(<<"not measured: dictionary and state: the heap (2000000 words) is above "
                   "max_heap_words (1000000); the option #{max_heap_words => 3000000} would "
                   "measure it">>, mallocinfo_process:verdict(M)),
    OffHeap = #{what => messages, reason => off_heap_queue,
                detail => <<"the 5 messages are in an off_heap queue">>, option => #{}},
    ?assertMatch(<<"not measured: messages: the 5 messages are in an off_heap queue; "
                   "no option measures it">>,
                 mallocinfo_process:verdict(M#{not_measured => [OffHeap]})),
    %% A rule that needs no walk still speaks.
    ?assertMatch(<<"message queue of 20000 messages", _/binary>>,
                 mallocinfo_process:verdict(M#{message_queue_len => 20000})).

%% process_info(P, binary) has one entry per reference: the same id many
%% times is one binary.
binaries_test() ->
    TenMiB = 10 * 1024 * 1024,
    Same = lists:duplicate(1000, {1, TenMiB, 5000}),
    ?assertEqual(#{count => 1, bytes => TenMiB, shared_bytes => TenMiB},
                 mallocinfo_process:binaries(Same)),
    %% Referenced only by these 1000: not shared.
    ?assertEqual(#{count => 1, bytes => TenMiB, shared_bytes => 0},
                 mallocinfo_process:binaries(lists:duplicate(1000, {1, TenMiB, 1000}))),
    Mixed = [{2, 100, 1}, {3, 200, 2}, {3, 200, 2}, {4, 300, 3}] ++ Same,
    ?assertEqual(#{count => 4, bytes => 100 + 200 + 300 + TenMiB, shared_bytes => 300 + TenMiB},
                 mallocinfo_process:binaries(Mixed)),
    ?assertEqual(#{count => 0, bytes => 0, shared_bytes => 0}, mallocinfo_process:binaries([])).

%% The old name still answers, with the new module's results, and says it
%% is deprecated (xref and the compiler warn its callers).
old_name_test() ->
    Self = self(),
    P = spawn(fun() -> put(k, lists:seq(1, 100)), Self ! {ready, self()}, receive stop -> ok end end),
    receive {ready, P} -> ok end,
    try
        %% The old name keeps 0.1.0's result: the list, not {ok, List}.
        {ok, New} = mallocinfo_process:inspect_heap(P),
        ?assertMatch([{{k, [1 | _]}, _}], New),
        ?assertEqual(New, mallocinfo_proc:inspect_heap(P)),
        ?assertEqual(New, mallocinfo_proc:inspect_heap(P, #{}))
    after
        P ! stop
    end,
    ?assertMatch({ok, #{}}, mallocinfo_proc:heap(self())),
    ?assertError(badarg, mallocinfo_proc:print(junk)),
    Attrs = mallocinfo_proc:module_info(attributes),
    ?assertMatch([[{'_', '_', _}]], proplists:get_all_values(deprecated, Attrs)).

%% Issue 28: print/1 shows a registered name it did not write escaped: a
%% name holding a terminal payload (colour, window title, screen clear)
%% and bytes past ASCII reaches the terminal as text, never as control
%% characters.
print_escapes_names_test() ->
    Name = list_to_atom("ansi\e[31mRED\e]0;pwned-title\^G\e[2Jend\x{9B}"),
    Self = self(),
    P = spawn(fun() -> register(Name, self()), Self ! {ready, self()}, receive stop -> ok end end),
    receive {ready, P} -> ok end,
    try
        Out = unicode:characters_to_binary(printed(fun() -> mallocinfo_process:print(P) end)),
        ?assertMatch({_, _}, binary:match(Out, <<" (ansi\\x1B[31mRED\\x1B]0;pwned-title\\x07"
                                                 "\\x1B[2Jend\\u009B): heap ">>)),
        ?assertEqual([], [C || <<C/utf8>> <= Out, C =/= $\n, C < 32 orelse C =:= 127
                                                  orelse (C >= 16#80 andalso C =< 16#9F)])
    after
        P ! stop
    end.

%% What Fun writes to its group leader (the io protocol's put_chars).
printed(Fun) ->
    Self = self(),
    Leader = spawn_link(fun() -> collect(Self, []) end),
    Old = group_leader(),
    group_leader(Leader, self()),
    try
        ok = Fun()
    after
        group_leader(Old, self())
    end,
    Leader ! {done, self()},
    receive {printed, Leader, Chars} -> Chars end.

collect(Owner, Acc) ->
    receive
        {io_request, From, ReplyAs, {put_chars, unicode, Chars}} ->
            From ! {io_reply, ReplyAs, ok},
            collect(Owner, [Chars | Acc]);
        {io_request, From, ReplyAs, {put_chars, unicode, M, F, A}} ->
            From ! {io_reply, ReplyAs, ok},
            collect(Owner, [apply(M, F, A) | Acc]);
        {io_request, From, ReplyAs, _} ->
            From ! {io_reply, ReplyAs, {error, enotsup}},
            collect(Owner, Acc);
        {done, Owner} ->
            Owner ! {printed, self(), lists:reverse(Acc)}
    end.
