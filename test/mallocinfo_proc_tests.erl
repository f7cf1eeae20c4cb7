%% EUnit: mallocinfo_proc's verdict rules on crafted heap figures.
-module(mallocinfo_proc_tests).
-include_lib("eunit/include/eunit.hrl").

base() ->
    #{total_heap_size => 100000, live_words => 90000, stack_size => 100,
      message_queue_len => 0, complete => true,
      binaries => #{count => 0, bytes => 0, shared_bytes => 0}}.

healthy_test() ->
    ?assertEqual(none, mallocinfo_proc:verdict(base())).

garbage_test() ->
    V = mallocinfo_proc:verdict((base())#{live_words => 10000}),
    ?assertMatch(<<"mostly garbage: 89% of the ", _/binary>>, V).

incomplete_view_is_not_garbage_test() ->
    %% The state was not seen (a plain process, or a limit): its data would
    %% count as "unseen"; no garbage verdict then.
    ?assertEqual(none, mallocinfo_proc:verdict((base())#{live_words => 10000,
                                                          complete => false})).

small_heap_is_not_garbage_test() ->
    %% A tiny heap that is mostly unseen is not worth a sentence.
    ?assertEqual(none, mallocinfo_proc:verdict((base())#{total_heap_size => 2000,
                                                          live_words => 10})).

binary_test() ->
    Bins = #{count => 3, bytes => 50 * 1024 * 1024, shared_bytes => 10 * 1024 * 1024},
    V = mallocinfo_proc:verdict((base())#{binaries => Bins}),
    ?assertMatch(<<"mostly binary references: 3 refc binaries hold 50.0 MiB (10.0 MiB shared",
                   _/binary>>, V).

small_binaries_are_not_a_verdict_test() ->
    Bins = #{count => 1, bytes => 512 * 1024, shared_bytes => 0},
    ?assertEqual(none, mallocinfo_proc:verdict((base())#{total_heap_size => 1000,
                                                          live_words => 900,
                                                          binaries => Bins})).

queue_test() ->
    V = mallocinfo_proc:verdict((base())#{message_queue_len => 250000}),
    ?assertMatch(<<"message queue of 250000 messages", _/binary>>, V).
