%% mallocinfo_trace_pprof: the legacy gperftools heap profile text, exactly, and
%% read back by mi_heap_profile (the reader the HTTP suite uses on real
%% dumps, which jeprof and google-pprof then read too).
-module(mallocinfo_trace_pprof_tests).
-include_lib("eunit/include/eunit.hrl").

-define(MAPS, <<"55d0c19f7000-55d0c1a5d000 r--p 00000000 fe:00 9953300   /usr/bin/beam.smp\n"
                "7f3a1c2b1000-7f3a1c2b2000 r-xp 00001000 fe:00 42   /tmp/nif.so\n">>).

text(Sites, Maps) -> iolist_to_binary(mallocinfo_trace_pprof:heap_profile(Sites, Maps)).

exact_text_test() ->
    ?assertEqual(<<"heap profile:   1002:   100512 [  1002:   100512] @ heapprofile\n"
                   "  1000:   100000 [  1000:   100000] @ 0x00007f3a1c2b1139 0x00007f3a1c2b11c4\n"
                   "     2:      512 [     2:      512] @ 0x000055d0c1a0b2e0\n"
                   "\nMAPPED_LIBRARIES:\n", ?MAPS/binary>>,
                 text([{1000, 100000, [16#7f3a1c2b1139, 16#7f3a1c2b11c4]},
                       {2, 512, [16#55d0c1a0b2e0]}], ?MAPS)).

read_back_test() ->
    Sites = [{N, N * 16, [16#400000 + N, 16#ffffffffffffffff, 0]} || N <- lists:seq(1, 300)],
    P = mi_heap_profile:parse(text(Sites, ?MAPS)),
    ?assertMatch(#{format := legacy, total := {45150, 722400}}, P),
    ?assertEqual(Sites, maps:get(records, P)),
    ?assertEqual(binary:split(?MAPS, <<"\n">>, [global, trim]), maps:get(maps, P)).

%% Figures wider than gperftools' columns are written whole.
wide_figures_test() ->
    P = mi_heap_profile:parse(text([{12345678, 1 bsl 40, [1]}], ?MAPS)),
    ?assertEqual([{12345678, 1 bsl 40, [1]}], maps:get(records, P)).

%% A site without a stack has nothing for the readers to attribute: left
%% out, and out of the header's totals too.
empty_stack_left_out_test() ->
    P = mi_heap_profile:parse(text([{5, 50, []}, {1, 10, [16#1000]}], ?MAPS)),
    ?assertMatch(#{total := {1, 10}, records := [{1, 10, [16#1000]}]}, P).

%% A memory map without its final line feed gets one: the last line is
%% still read whole.
maps_line_feed_test() ->
    Text = text([{1, 8, [16#1000]}], binary:part(?MAPS, 0, byte_size(?MAPS) - 1)),
    ?assertEqual(?MAPS, lists:last(binary:split(Text, <<"MAPPED_LIBRARIES:\n">>))).

bad_input_test_() ->
    Bad = [{[{-1, 0, [1]}], ?MAPS}, {[{1, -1, [1]}], ?MAPS}, {[{1, 1, [-1]}], ?MAPS},
           {[{1, 1, [1 bsl 64]}], ?MAPS}, {[{1, 1, [a]}], ?MAPS}, {[{1, 1}], ?MAPS},
           {[{1, 1, 1}], ?MAPS}, {not_a_list, ?MAPS}, {[], "maps as a string"}],
    [?_assertError(badarg, mallocinfo_trace_pprof:heap_profile(S, M)) || {S, M} <- Bad].

%% The reader refuses what is not whole.
reader_is_strict_test_() ->
    Whole = text([{1, 8, [16#1000]}], ?MAPS),
    Cut = [binary:part(Whole, 0, N) || N <- [10, 60, byte_size(Whole) - 1]],
    NoMaps = <<"heap profile:      1:        8 [     1:        8] @ heapprofile\n"
               "     1:        8 [     1:        8] @ 0x1000\n">>,
    [?_assertError({heap_profile, _, _}, mi_heap_profile:parse(B))
     || B <- [<<>>, NoMaps, <<"garbage\n">> | Cut]].
