%% EUnit tests of allocator detection and of the jemalloc/tcmalloc modules
%% on this node, which runs on glibc. The other allocators are tested on
%% peer nodes in mallocinfo_alloc_SUITE.
-module(mallocinfo_alloc_tests).
-include_lib("eunit/include/eunit.hrl").

-define(WRONG, {error, {wrong_allocator, glibc}}).

allocator_is_glibc_test() ->
    ?assertEqual(glibc, mallocinfo:allocator()),
    %% Detection opens and closes references to loaded objects on every
    %% call: many calls leave the answer and the loaded objects unchanged.
    Maps = loaded_objects(),
    [glibc = mallocinfo:allocator() || _ <- lists:seq(1, 2000)],
    ?assertEqual(Maps, loaded_objects()).

glibc_calls_work_on_glibc_test() ->
    ?assertMatch({ok, #{arena := _}}, mallocinfo:mallinfo()),
    ?assertMatch({ok, <<"<malloc", _/binary>>}, mallocinfo:info()),
    ?assertEqual(ok, mallocinfo:mallopt(perturb, 0)).

jemalloc_wrong_allocator_test_() ->
    [?_assertEqual(?WRONG, mallocinfo_jemalloc:stats()),
     ?_assertEqual(?WRONG, mallocinfo_jemalloc:summary()),
     ?_assertEqual(?WRONG, mallocinfo_jemalloc:profile_status()),
     ?_assertEqual(?WRONG, mallocinfo_jemalloc:profile_active(true)),
     ?_assertEqual(?WRONG, mallocinfo_jemalloc:profile_active(false)),
     ?_assertEqual(?WRONG, mallocinfo_jemalloc:profile_dump())].

tcmalloc_wrong_allocator_test_() ->
    Prefix = filename:join(os:getenv("TMPDIR", "/tmp"), "mi-eunit-tc"),
    [?_assertEqual(?WRONG, mallocinfo_tcmalloc:stats()),
     ?_assertEqual(?WRONG, mallocinfo_tcmalloc:profile_start(Prefix)),
     ?_assertEqual(?WRONG, mallocinfo_tcmalloc:profile_start(list_to_binary(Prefix))),
     ?_assertEqual(?WRONG, mallocinfo_tcmalloc:profile_dump()),
     ?_assertEqual(?WRONG, mallocinfo_tcmalloc:profile_stop()),
     ?_assertEqual(?WRONG, mallocinfo_tcmalloc:profile_running())].

%% Misuse raises whatever the allocator; the prefix's directory is checked
%% before the allocator is.
bad_arguments_test_() ->
    [?_assertError(badarg, mallocinfo_jemalloc:profile_active(yes)),
     ?_assertError(badarg, mallocinfo_jemalloc:profile_active("true")),
     ?_assertError(badarg, mallocinfo_jemalloc:profile_active(1)),
     ?_assertError(badarg, mallocinfo_tcmalloc:profile_start(123)),
     ?_assertError(badarg, mallocinfo_tcmalloc:profile_start("")),
     ?_assertError(badarg, mallocinfo_tcmalloc:profile_start(<<>>)),
     ?_assertError(badarg, mallocinfo_tcmalloc:profile_start(<<"/tmp/a", 0, "b">>)),
     ?_assertError(badarg, mallocinfo_tcmalloc:profile_start("/tmp/a\0b")),
     ?_assertError(badarg, mallocinfo_tcmalloc:profile_start(["/tmp/", 16#110000])),
     ?_assertError(badarg, mallocinfo_tcmalloc:profile_start({"/tmp/x"})),
     ?_assertError(badarg, mallocinfo_nif:jemalloc_profile_active('maybe')),
     ?_assertError(badarg, mallocinfo_nif:jemalloc_profile_dump("/tmp")),
     ?_assertError(badarg, mallocinfo_nif:tcmalloc_profile_start(<<"/tmp/a", 0>>))].

profile_start_prefix_checks_test_() ->
    {ok, Cwd} = file:get_cwd(),
    Plain = filename:join(Cwd, "rebar.config"),
    [?_assertEqual({error, enoent},
                   mallocinfo_tcmalloc:profile_start("/nonexistent/dir/heap")),
     ?_assertEqual({error, enotdir},
                   mallocinfo_tcmalloc:profile_start(filename:join(Plain, "heap"))),
     ?_assertEqual({error, enametoolong},
                   mallocinfo_tcmalloc:profile_start("/tmp/" ++ lists:duplicate(1000, $a)))].

loaded_objects() ->
    {ok, Maps} = file:read_file("/proc/self/maps"),
    lists:usort([lists:last(binary:split(L, <<" ">>, [global, trim_all]))
                 || L <- binary:split(Maps, <<"\n">>, [global, trim_all]),
                    binary:match(L, <<".so">>) =/= nomatch]).
