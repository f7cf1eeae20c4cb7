%% make run's workload (demo/, built by `make demo' into _build/demo, not
%% part of the application): it is built outside the application, and its
%% options are checked like the tool's.
-module(mallocinfo_demo_tests).
-include_lib("eunit/include/eunit.hrl").

setup() ->
    true = code:add_patha(mi_ct:demo_dir()),
    ok.

%% Not one of the application's modules, and its NIF is not in priv/.
outside_the_application_test() ->
    setup(),
    _ = application:load(mallocinfo),
    {ok, Mods} = application:get_key(mallocinfo, modules),
    ?assertEqual([], [M || M <- Mods, lists:prefix("mallocinfo_demo", atom_to_list(M))]),
    ?assertEqual([], filelib:wildcard("*demo*", code:priv_dir(mallocinfo))),
    ?assertEqual(filename:dirname(code:which(mallocinfo_demo)),
                 filename:dirname(code:which(mallocinfo_demo_nif))),
    ?assertEqual(ok, mallocinfo_demo_nif:load()).

%% Wrong options raise badarg before anything is started (valid ones would
%% start the workload: none are passed here).
bad_options_test_() ->
    setup(),
    [?_assertError(badarg, mallocinfo_demo:run(Bad))
     || Bad <- [junk, [a | b], #{junk => 1}, #{leak_blocks => -1}, #{threads => 0},
                #{leak_size => 1.5}, #{hoard_terms => junk}]] ++
    [?_assertError(badarg, mallocinfo_demo:make_run(Bad))
     || Bad <- [42, [a | b], {a}, <<"a", 0>>, #{}]].
