%% The growth of every layer from crafted samples (mallocinfo_layers_growth
%% is pure): which part grew, at what rate, who holds it, the noise
%% threshold, and no growth verdict for an idle node.
-module(mallocinfo_layers_growth_tests).
-include_lib("eunit/include/eunit.hrl").

-define(MiB, (1 bsl 20)).

%% A sample at T ms whose layers are Base with the given changes.
sample(T, Changes) ->
    Base = #{rss => 100 * ?MiB, {memory, total} => 50 * ?MiB, {memory, binary} => 2 * ?MiB,
             {memory, ets} => 3 * ?MiB, {memory, processes} => 10 * ?MiB,
             {memory, system} => 40 * ?MiB, {memory, code} => 5 * ?MiB,
             {memory, atom} => ?MiB, {allocated, binary_alloc} => 4 * ?MiB,
             {used, binary_alloc} => 2 * ?MiB, {libc, arena} => 8 * ?MiB,
             {libc, in_use} => 3 * ?MiB, {libc, free} => 5 * ?MiB, {libc, mmap} => 0,
             {smaps, anon} => 60 * ?MiB, {smaps, arenas} => 8 * ?MiB},
    #{t => T, time => T, layers => maps:merge(Base, Changes), culprits => #{}}.

idle_node_has_no_growth_verdict_test() ->
    %% Changes below the threshold, up and down.
    Samples = [sample(0, #{}), sample(5000, #{{memory, binary} => 2 * ?MiB + 300000}),
               sample(10000, #{{memory, processes} => 10 * ?MiB + 600000,
                               rss => 100 * ?MiB - 2000000})],
    G = mallocinfo_layers_growth:growth(Samples),
    ?assertEqual([], maps:get(growing, G)),
    ?assertEqual([], mallocinfo_layers_growth:verdicts(G)),
    ?assertEqual(?MiB, maps:get(noise_bytes, G)).

binaries_grow_with_their_holder_test() ->
    Holder = #{pid => <<"<0.923.0>">>, name => <<"{resource,<<\"/\">>,queue,<<\"q\">>}">>,
               bytes => 21 * ?MiB, delta => 19 * ?MiB, message_queue_len => 28000},
    Last = sample(10000, #{{memory, binary} => 22 * ?MiB, {memory, system} => 60 * ?MiB,
                           rss => 121 * ?MiB, {smaps, anon} => 81 * ?MiB}),
    Samples = [sample(0, #{}),
               sample(5000, #{{memory, binary} => 12 * ?MiB, {memory, system} => 50 * ?MiB}),
               Last#{culprits => #{binary => [Holder]}}],
    G = mallocinfo_layers_growth:growth(Samples),
    [#{part := binary, delta := D, rate := Rate, culprits := [Holder]}] = maps:get(growing, G),
    ?assertEqual(20 * ?MiB, D),
    ?assertEqual(20 * ?MiB div 10, Rate),
    [{Rank, S}] = mallocinfo_layers_growth:verdicts(G),
    ?assertEqual(Rate * 3600, Rank),
    ?assertEqual(<<"refc binaries grew 2.0 MiB/s (+20.0 MiB over 10 s); 95% of that growth is "
                   "held by <0.923.0> ({resource,<<\"/\">>,queue,<<\"q\">>}) (message queue "
                   "28.0 k), which references 21.0 MiB of binaries now">>, S),
    %% RSS grew by what the binaries explain: no RSS sentence.
    ?assertMatch(#{growing := false, unexplained := _}, maps:get(rss, G)).

a_part_that_fell_between_samples_did_not_grow_test() ->
    Samples = [sample(0, #{}), sample(5000, #{{memory, ets} => 10 * ?MiB}),
               sample(10000, #{{memory, ets} => 5 * ?MiB})],
    G = mallocinfo_layers_growth:growth(Samples),
    ?assertEqual([], maps:get(growing, G)),
    [#{delta := D}] = [R || #{part := ets} = R <- maps:get(parts, G)],
    ?assertEqual(2 * ?MiB, D).

%% A heap that keeps growing through collections that each drop it by more
%% than the noise threshold grew (its last third is above its first); one
%% that is collected back to where it was did not, whatever the window
%% ends on. 60 samples a second apart.
a_part_that_grows_through_its_collections_grew_test() ->
    Series = fun(F) -> [sample(I * 1000, #{{memory, processes} => 10 * ?MiB + F(I)})
                        || I <- lists:seq(0, 59)] end,
    Growing = fun(Samples) ->
                      G = mallocinfo_layers_growth:growth(Samples),
                      [P || #{part := P} <- maps:get(growing, G)]
              end,
    %% 1 MiB/s, and every 10 s a collection gives 4 MiB back.
    Trend = fun(I) -> I * ?MiB - (I div 10) * 4 * ?MiB end,
    ?assertEqual([processes], Growing(Series(Trend))),
    %% A sawtooth: 2 MiB/s for 9 s, then collected to the start, ending on a
    %% peak (+18 MiB over the window).
    Saw = fun(I) -> (I rem 10) * 2 * ?MiB end,
    ?assertEqual([], Growing(Series(Saw))),
    %% The same sawtooth on a slow rise that the drops exceed.
    SlowSaw = fun(I) -> (I rem 10) * 2 * ?MiB + I * 100000 end,
    ?assertEqual([], Growing(Series(SlowSaw))),
    %% Fewer than six samples: one fall of the threshold still says no.
    ?assertEqual([], Growing([sample(I * 1000, #{{memory, processes} => (10 + M) * ?MiB})
                              || {I, M} <- [{0, 0}, {1, 3}, {2, 6}, {3, 2}, {4, 3}]])).

fastest_first_and_free_space_follows_its_use_test() ->
    Samples = [sample(0, #{}),
               sample(5000, #{{memory, ets} => 5 * ?MiB, {memory, processes} => 11 * ?MiB}),
               sample(10000, #{{memory, ets} => 8 * ?MiB, {memory, processes} => 13 * ?MiB,
                               {allocated, binary_alloc} => 10 * ?MiB,
                               {memory, system} => 45 * ?MiB})],
    G = mallocinfo_layers_growth:growth(Samples),
    %% ETS +5 MiB, processes +3 MiB; the carriers' free space grew too but
    %% follows them.
    ?assertEqual([ets, processes], [P || #{part := P} <- maps:get(growing, G)]),
    [S1, S2] = mallocinfo_layers_growth:sentences(G),
    ?assertMatch(<<"ETS tables grew 512.0 KiB/s", _/binary>>, S1),
    ?assertMatch(<<"process memory (heaps, stacks, queues) grew 307.2 KiB/s", _/binary>>, S2).

rss_beyond_the_layers_test() ->
    Samples = [sample(0, #{}), sample(5000, #{rss => 110 * ?MiB, {smaps, anon} => 70 * ?MiB}),
               sample(10000, #{rss => 120 * ?MiB, {smaps, anon} => 80 * ?MiB})],
    G = mallocinfo_layers_growth:growth(Samples),
    [S] = mallocinfo_layers_growth:sentences(G),
    ?assertEqual(<<"RSS grew 2.0 MiB/s (+20.0 MiB over 10 s), 20.0 MiB of it beyond what the "
                   "layers explain; by mapping, anonymous memory (ERTS carriers, libc mmapped "
                   "blocks, mmap by NIFs) grew most (+20.0 MiB)">>, S).

undefined_layers_never_grow_test() ->
    Samples = [sample(0, #{{memory, ets} => undefined}), sample(5000, #{}),
               sample(10000, #{{memory, ets} => 30 * ?MiB})],
    G = mallocinfo_layers_growth:growth(Samples),
    ?assertEqual([], [P || #{part := P} <- maps:get(growing, G), P =:= ets]).

fewer_than_two_samples_test() ->
    ?assertEqual([], mallocinfo_layers_growth:verdicts(mallocinfo_layers_growth:growth([]))).

rss_parts_add_up_test() ->
    #{layers := L} = sample(0, #{}),
    Parts = mallocinfo_layers_growth:rss_parts(L),
    ?assertEqual(mallocinfo_layers_growth:stacked_labels(), [K || {K, _} <- Parts]),
    ?assertEqual(60 * ?MiB + 8 * ?MiB, lists:sum([V || {_, V} <- Parts])).
