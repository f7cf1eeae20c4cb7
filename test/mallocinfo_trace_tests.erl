%% EUnit: the tracker API without the interposer (this node has no
%% LD_PRELOAD) and its argument validation. The tracker itself is exercised
%% under the interposer by mallocinfo_trace_SUITE.
-module(mallocinfo_trace_tests).
-include_lib("eunit/include/eunit.hrl").

preload_path_test() ->
    Path = mallocinfo_trace:preload_path(),
    ?assertEqual("libmallocinfo_preload.so", filename:basename(Path)),
    ?assert(filelib:is_regular(Path)),
    ?assertEqual(Path, filename:absname(Path)).

preload_env_test() ->
    Path = mallocinfo_trace:preload_path(),
    ?assertEqual([{"LD_PRELOAD", Path}], mallocinfo_trace:preload_env()),
    Env = mallocinfo_trace:preload_env(#{mode => sample, sample_bytes => 1048576,
                                          table_size => 4096, stack_depth => 16,
                                          exe => "beam.smp", unwind => cached,
                                          stack_table_size => 1024}),
    ?assertEqual([{"LD_PRELOAD", Path},
                  {"MALLOCINFO_TRACE", "sample"},
                  {"MALLOCINFO_TABLE_SIZE", "4096"},
                  {"MALLOCINFO_STACK_TABLE_SIZE", "1024"},
                  {"MALLOCINFO_SAMPLE_BYTES", "1048576"},
                  {"MALLOCINFO_STACK_DEPTH", "16"},
                  {"MALLOCINFO_TRACE_EXE", "beam.smp"},
                  {"MALLOCINFO_UNWIND", "cached"}], Env).

preload_env_badarg_test_() ->
    [?_assertError(badarg, mallocinfo_trace:preload_env(#{bogus => 1})),
     ?_assertError(badarg, mallocinfo_trace:preload_env(#{table_size => -1})),
     ?_assertError(badarg, mallocinfo_trace:preload_env(#{exe => [1 bsl 20]})),
     ?_assertError(badarg, mallocinfo_trace:preload_env([{mode, full}])),
     ?_assertError(badarg, mallocinfo_trace:preload_env(#{mode => bogus})),
     ?_assertError(badarg, mallocinfo_trace:preload_env(#{unwind => foo})),
     %% The libunwind back end is gone: it waited for locks a hook's caller
     %% may hold (issue 15).
     ?_assertError(badarg, mallocinfo_trace:preload_env(#{unwind => libunwind})),
     ?_assertError(badarg, mallocinfo_trace:preload_env(#{table_size => 0})),
     ?_assertError(badarg, mallocinfo_trace:preload_env(#{stack_depth => 1000})),
     ?_assertError(badarg, mallocinfo_trace:preload_env(#{sample_bytes => 1.5})),
     ?_assertError(badarg, mallocinfo_trace:preload_env(#{exe => beam}))].

not_preloaded_test_() ->
    [?_assertMatch(#{preloaded := false, recording := false, mode := off},
                   mallocinfo_trace:status()),
     ?_assertEqual({error, not_preloaded}, mallocinfo_trace:set_mode(sample)),
     ?_assertEqual({error, not_preloaded}, mallocinfo_trace:olds(5)),
     ?_assertEqual({error, not_preloaded}, mallocinfo_trace:olds(5, [demangle, {min_size, 8}])),
     ?_assertEqual({error, not_preloaded}, mallocinfo_trace:sites(5, #{demangle => true})),
     ?_assertEqual({error, not_preloaded}, mallocinfo_trace:mappings(5)),
     ?_assertEqual({error, not_preloaded}, mallocinfo_trace:mappings(5, #{by => stack})),
     ?_assertEqual({error, not_preloaded}, mallocinfo_trace:reset()),
     ?_assertEqual({error, not_preloaded}, mallocinfo_trace:stats())].

badarg_test_() ->
    [?_assertError(badarg, mallocinfo_trace:set_mode(on)),
     ?_assertError(badarg, mallocinfo_trace:olds(-1)),
     ?_assertError(badarg, mallocinfo_trace:olds(1, #{min_age_ms => a})),
     ?_assertError(badarg, mallocinfo_trace:olds(1, #{demangle => 1})),
     ?_assertError(badarg, mallocinfo_trace:olds(1, [{bogus, 1}])),
     ?_assertError(badarg, mallocinfo_trace:sites(x)),
     ?_assertError(badarg, mallocinfo_trace:sites(1, #{min_size => 1})),
     ?_assertError(badarg, mallocinfo_trace:sites(1, 42)),
     ?_assertError(badarg, mallocinfo_trace:mappings(-1)),
     ?_assertError(badarg, mallocinfo_trace:mappings(1, #{by => "object"})),
     ?_assertError(badarg, mallocinfo_trace:mappings(1, #{min_size => 1}))].

%%% Churn's lifetime histogram (mallocinfo_trace_churn) ---------------------------

churn_lifetimes_test() ->
    %% Buckets: 0 within 1 ms, k in [2^(k-1), 2^k) ms, the last longer.
    T = list_to_tuple([5, 0, 0, 7] ++ lists:duplicate(19, 0) ++ [2]),
    ?assertEqual(24, tuple_size(T)),
    ?assertEqual([{1, 5}, {8, 7}, {infinity, 2}], mallocinfo_trace_churn:lifetimes(T)),
    ?assertEqual(5, mallocinfo_trace_churn:short_lived(T, 1)),
    ?assertEqual(5, mallocinfo_trace_churn:short_lived(T, 7)),
    ?assertEqual(12, mallocinfo_trace_churn:short_lived(T, 8)),
    ?assertEqual(12, mallocinfo_trace_churn:short_lived(T, 1 bsl 40)),
    ?assertEqual(8, mallocinfo_trace_churn:median_lifetime_ms([{1, 5}, {8, 7}, {infinity, 2}])),
    ?assertEqual(1, mallocinfo_trace_churn:median_lifetime_ms([{1, 5}, {8, 4}])),
    ?assertEqual(infinity, mallocinfo_trace_churn:median_lifetime_ms([{1, 1}, {infinity, 2}])),
    ?assertEqual(undefined, mallocinfo_trace_churn:median_lifetime_ms([])).

churn_badarg_test() ->
    ?assertError(badarg, mallocinfo_trace:churn(-1)),
    ?assertError(badarg, mallocinfo_trace:churn(a)),
    ?assertError(badarg, mallocinfo_trace:churn(1, #{by => process})),
    ?assertError(badarg, mallocinfo_trace:churn(1, #{short_lived_ms => 0})),
    ?assertError(badarg, mallocinfo_trace:churn(1, #{demangle => 1})),
    ?assertError(badarg, mallocinfo_trace:churn(1, #{x => 1})),
    ?assertError(badarg, mallocinfo_trace:churn(1, x)).
