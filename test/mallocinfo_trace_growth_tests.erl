%% The pure parts of growth and culprits on canned data: snapshots, diff,
%% growth classification, the allocator family, labels, roll-ups, and the
%% report's growth and previous-run views and verdicts.
-module(mallocinfo_trace_growth_tests).
-include_lib("eunit/include/eunit.hrl").

-define(G, mallocinfo_trace_growth).
-define(B, mallocinfo_report_build).
-define(V, mallocinfo_report_verdicts).
-define(MiB, (1 bsl 20)).

frames(Addresses) -> << <<A:64/native>> || A <- Addresses >>.

snap(Ms, Sites) ->
    ?G:snapshot(full, {Ms * 1000000, [{C, B, E, frames(F)} || {C, B, E, F} <- Sites]},
                #{node => node(), os_pid => "1", time_ms => Ms, monotonic_ms => Ms}).

%%% Snapshots and diff ---------------------------------------------------------

snapshot_totals_test() ->
    S = snap(0, [{10, 1000, false, [1, 2]}, {1, 5, true, [3]}, {2, 7, false, []}]),
    ?assertMatch(#{live_bytes := 1012, live_blocks := 13, estimated := true, mode := full}, S),
    ?assertEqual([1, 2], ?G:addresses(frames([1, 2]))).

diff_leak_first_exact_test() ->
    Old = snap(0, [{10, 1000, false, [1]}, {5, 50, false, [2]}, {3, 30, false, [3]}]),
    New = snap(1000, [{1010, 101000, false, [1]}, {5, 50, false, [2]}, {7, 700, false, [4]}]),
    Rows = ?G:diff(Old, New),
    ?assertEqual([#{frames => frames([1]), count => 1010, bytes => 101000, count_delta => 1000,
                    bytes_delta => 100000, change => changed, estimated => false},
                  #{frames => frames([4]), count => 7, bytes => 700, count_delta => 7,
                    bytes_delta => 700, change => appeared, estimated => false},
                  #{frames => frames([3]), count => 0, bytes => 0, count_delta => -3,
                    bytes_delta => -30, change => vanished, estimated => false}], Rows).

diff_marks_estimates_test() ->
    Old = snap(0, [{10, 1000, true, [1]}]),
    New = snap(1, [{20, 2000, false, [1]}]),
    ?assertMatch([#{estimated := true, bytes_delta := 1000}], ?G:diff(Old, New)).

%%% Growth ------------------------------------------------------------------------

growth_flags_monotonic_not_cache_test() ->
    %% [1]: a leak, up every time; [2]: a cache, up and down; [3]: flat;
    %% [4]: appears after the first look and keeps growing; [5]: grows then
    %% stays.
    Snaps = [snap(0, [{1, 100, false, [1]}, {5, 500, false, [2]}, {1, 10, false, [3]},
                      {1, 10, false, [5]}]),
             snap(1000, [{2, 200, false, [1]}, {9, 900, false, [2]}, {1, 10, false, [3]},
                         {1, 10, false, [4]}, {2, 20, false, [5]}]),
             snap(2000, [{4, 400, false, [1]}, {0, 0, false, [2]}, {1, 10, false, [3]},
                         {2, 20, false, [4]}, {2, 20, false, [5]}])],
    ?assertEqual([#{frames => frames([1]), bytes => 400, count => 4, growth_bytes => 300,
                    rate => 150, samples => 3, estimated => false},
                  #{frames => frames([4]), bytes => 20, count => 2, growth_bytes => 20,
                    rate => 10, samples => 3, estimated => false}],
                 ?G:growth(Snaps)).

growth_of_two_test() ->
    ?assertMatch([#{growth_bytes := 10, rate := 20}],
                 ?G:growth([snap(0, [{1, 10, false, [1]}]), snap(500, [{2, 20, false, [1]}])])).

%%% The allocator family, culprits and labels ------------------------------------

f(Object, Symbol) -> #{object => Object, symbol => Symbol, address => 1, offset => 0}.

allocator_family_test() ->
    Libc = <<"/usr/lib/x86_64-linux-gnu/libc.so.6">>,
    Cxx = <<"/usr/lib/x86_64-linux-gnu/libstdc++.so.6">>,
    In = [f(Libc, <<"malloc">>), f(Libc, <<"__strdup">>), f(Libc, <<"strdup">>),
          f(Libc, <<"calloc">>), f(Libc, <<"__libc_malloc">>), f(Cxx, <<"_Znwm">>),
          f(Cxx, <<"std::__cxx11::basic_string<char>::_M_create(unsigned long&, unsigned long)">>),
          f(Cxx, undefined), f(<<"/x/app.so">>, <<"operator new(unsigned long)">>),
          f(<<"/x/app.so">>, <<"_ZnamRKSt9nothrow_t">>),
          f(<<"/x/app.so">>, <<"__gnu_cxx::new_allocator<int>::allocate(unsigned long, void const*)">>),
          f(<<"/x/libcrypto.so.3">>, <<"CRYPTO_zalloc">>),
          f(<<"/p/priv/libmallocinfo_preload.so">>, <<"mi_hook">>)],
    Out = [f(Libc, <<"fopen">>), f(<<"/x/app.so">>, <<"my_alloc_here">>),
           f(<<"/usr/lib/erlang/erts-13/bin/beam.smp">>, <<"erts_sys_alloc">>),
           f(<<"/x/libcrypto.so.3">>, <<"EVP_CIPHER_CTX_new">>),
           f(<<"/x/app.so">>, undefined), #{address => 5}],
    [?assertEqual({F, true}, {F, ?G:allocator_frame(F)}) || F <- In],
    [?assertEqual({F, false}, {F, ?G:allocator_frame(F)}) || F <- Out].

culprit_test() ->
    Libc = <<"libc.so.6">>,
    App = f(<<"/x/app.so">>, <<"my_alloc_here">>),
    ?assertEqual(App, ?G:culprit([f(Libc, <<"strdup">>), App, f(<<"/x/app.so">>, <<"main">>)])),
    %% Only allocator frames: the first.
    ?assertEqual(f(Libc, <<"malloc">>), ?G:culprit([f(Libc, <<"malloc">>), f(Libc, <<"free">>)])),
    ?assertEqual(undefined, ?G:culprit([])).

label_test() ->
    Beam = f(<<"/usr/lib/erlang/erts-13.1.5/bin/beam.smp">>, <<"erts_sys_alloc">>),
    ?assertEqual(erts, ?G:label(Beam, false)),
    ?assertEqual(self, ?G:label(Beam, true)),
    ?assertEqual(native, ?G:label(f(<<"/x/app.so">>, <<"a">>), false)),
    ?assertEqual(native, ?G:label(undefined, false)),
    ?assert(?G:emulator_object(<<"/o/bin/beam.debug.smp">>)),
    ?assertNot(?G:emulator_object(<<"/o/lib/beamish.so">>)),
    ?assert(?G:self_object(<<"/o/priv/mallocinfo_nif.so">>)),
    ?assertNot(?G:self_object(<<"/o/priv/other_nif.so">>)).

%%% Roll-ups --------------------------------------------------------------------------

rollup_test_() ->
    App = <<"/x/app.so">>,
    Lib = <<"/x/libssl.so.3">>,
    Beam = <<"/o/bin/beam.smp">>,
    Sites = [{10, 1000, false, frames([1])}, {20, 2000, false, frames([2])},
             {5, 50, true, frames([3])}, {1, 7, false, frames([4])}, {2, 9, false, <<>>},
             {3, 300, false, frames([5])}, {4, 40, false, frames([6])}],
    Culprits = #{frames([1]) => {native, (f(App, <<"cache_put">>))#{address => 11}},
                 frames([2]) => {native, (f(App, <<"cache_put">>))#{address => 12}},
                 frames([3]) => {native, f(Lib, <<"SSL_new">>)},
                 frames([4]) => {native, #{object => App, symbol => undefined, address => 99}},
                 <<>> => {native, undefined},
                 frames([5]) => {erts, f(Beam, <<"erts_sys_alloc">>)},
                 frames([6]) => {self, f(<<"/p/mallocinfo_nif.so">>, <<"resolve">>)}},
    ByFun = ?G:rollup(function, Sites, Culprits),
    ByObj = ?G:rollup(object, Sites, Culprits),
    Sum = fun(Rows, K) -> lists:sum([maps:get(K, R) || R <- Rows]) end,
    [?_assertEqual(ByObj, ?G:objects_of(ByFun)),
     ?_assertEqual({3406, 45}, {Sum(ByFun, bytes), Sum(ByFun, count)}),
     ?_assertEqual({3406, 45}, {Sum(ByObj, bytes), Sum(ByObj, count)}),
     ?_assertMatch([#{label := native, object := App, function := <<"cache_put">>, count := 30,
                      bytes := 3000, stacks := 2, estimated := false} | _], ByFun),
     ?_assertMatch([#{label := erts, object := Beam, function := <<"erts_sys_alloc">>}],
                   [R || #{label := erts} = R <- ByFun]),
     ?_assertMatch([#{label := self, bytes := 40}], [R || #{label := self} = R <- ByFun]),
     ?_assertMatch([#{function := undefined, bytes := 7, frame := #{address := 99}}],
                   [R || #{function := undefined, object := O} = R <- ByFun, O =:= App]),
     ?_assertMatch([#{object := undefined, function := undefined, bytes := 9, count := 2}],
                   [R || #{object := undefined} = R <- ByFun]),
     ?_assertMatch([#{label := native, object := App, bytes := 3007, stacks := 3},
                    #{label := erts, object := Beam, bytes := 300},
                    #{label := native, object := Lib, bytes := 50, estimated := true},
                    #{label := self, bytes := 40},
                    #{object := undefined, bytes := 9}], ByObj)].

%%% The report -----------------------------------------------------------------------

frame(Object, Symbol) -> #{object => Object, symbol => Symbol, address => 1, offset => 0}.

grower(Label, Symbol, Grew, Bytes) ->
    #{label => Label, culprit => frame(<<"/x/app.so">>, Symbol), stack => [],
      growth_bytes => Grew, rate => Grew div 2, bytes => Bytes, count => 10, samples => 3,
      estimated => false}.

growth_view_test() ->
    G = #{interval_ms => 2000, samples => 3, live_delta => 5 * ?MiB,
          growers => [grower(erts, <<"erts_sys_alloc">>, 50 * ?MiB, 60 * ?MiB),
                      grower(native, <<"leaky">>, 4 * ?MiB, 8 * ?MiB),
                      grower(self, <<"resolve">>, 3 * ?MiB, 3 * ?MiB)]},
    V = ?B:growth_view(G),
    ?assertMatch(#{leak := true, erts_growth := 52428800,
                   growers := [#{culprit := #{symbol := <<"leaky">>}}]}, V),
    %% Only small growth: stable.
    ?assertMatch(#{leak := false},
                 ?B:growth_view(G#{growers => [grower(native, <<"a">>, 1000, 2000)]})),
    ?assertEqual(none, ?B:growth_view(none)).

previous_view_test() ->
    Prev = #{monotonic_ms => 1000, time_ms => 5, live_bytes => 100,
             functions => #{{<<"a.so">>, <<"f">>} => 10, {<<"a.so">>, <<"g">>} => 50}},
    This = #{monotonic_ms => 61000, time_ms => 6, live_bytes => 400,
             functions => #{{<<"a.so">>, <<"f">>} => 210, {<<"a.so">>, <<"h">>} => 30}},
    ?assertEqual(#{age_ms => 60000, time_ms => 5, native_delta => 300,
                   grew => [#{object => <<"a.so">>, function => <<"f">>, bytes_delta => 200},
                            #{object => <<"a.so">>, function => <<"h">>, bytes_delta => 30}]},
                 ?B:previous_view(Prev, This)),
    ?assertEqual(none, ?B:previous_view(undefined, This)).

%% The VM's own malloc is never a native verdict, however large: culprit_view
%% keeps it out of `functions' and sums it apart.
culprit_view_leaves_out_erts_and_self_test() ->
    Fun = fun(Label, Object, Symbol, Bytes) ->
                  #{label => Label, object => Object, function => Symbol,
                    frame => frame(Object, Symbol), count => 10, bytes => Bytes, stacks => 1,
                    estimated => false}
          end,
    Functions = [Fun(erts, <<"/o/bin/beam.smp">>, <<"erts_sys_alloc">>, 900 * ?MiB),
                 Fun(self, <<"/p/mallocinfo_nif.so">>, <<"resolve">>, 300 * ?MiB),
                 Fun(native, <<"/x/app.so">>, <<"small">>, 1 * ?MiB)],
    Objects = [maps:remove(function, maps:remove(frame, F)) || F <- Functions],
    V = ?B:culprit_view(Functions, Objects, #{}),
    ?assertMatch(#{erts_bytes := 943718400, self_bytes := 314572800,
                   functions := [#{function := <<"small">>}],
                   objects := [#{object := <<"/x/app.so">>}], growth := none,
                   previous := none}, V),
    R = #{resident => #{rss => 1024 * ?MiB}, native => V},
    ?assertEqual(none, ?V:rule(native_holder, R)).

native_growth_verdict_test() ->
    Growth = ?B:growth_view(#{interval_ms => 2000, span_ms => 2000, samples => 3,
                              live_delta => 4 * ?MiB,
                              growers => [grower(native, <<"leaky">>, 4 * ?MiB, 8 * ?MiB)]}),
    R = #{resident => #{rss => 1024 * ?MiB}, native => #{growth => Growth}},
    ?assertEqual({8 * ?MiB, <<"leaky (the NIF app.so) grew by 4.0 MiB (2.0 MiB/s) over 2 s, in every "
                              "sample: a leak; it holds 8.0 MiB in 10 blocks now">>},
                 ?V:rule(native_growth, R)),
    ?assertEqual(none, ?V:rule(native_stable, R)),
    Stable = ?B:growth_view(#{interval_ms => 2000, samples => 3, live_delta => -4096,
                              growers => []}),
    {0, S} = ?V:rule(native_stable, #{native => #{growth => Stable}}),
    ?assertNotEqual(nomatch, binary:match(S, <<"stable over 2 s">>)),
    ?assertEqual(none, ?V:rule(native_growth, #{native => #{growth => Stable}})).
