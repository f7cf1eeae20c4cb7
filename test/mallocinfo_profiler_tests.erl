%% mallocinfo_profiler on a node without a tracker, served by glibc (the
%% EUnit node): the tracker is the profiler, and every call says it is not
%% there. jemalloc's, tcmalloc's and a preloaded tracker's profilers are
%% driven through /heap_profile in mallocinfo_http_SUITE.
-module(mallocinfo_profiler_tests).
-include_lib("eunit/include/eunit.hrl").

no_tracker_test() ->
    ?assertEqual(glibc, mallocinfo:allocator()),
    ?assertEqual(tracker, mallocinfo_profiler:profiler()),
    Status = mallocinfo_profiler:status(),
    ?assertMatch(#{profiler := tracker, allocator := glibc, active := false,
                   error := not_preloaded, tracker := #{preloaded := false}}, Status),
    ?assertEqual(mallocinfo_trace:status(), maps:get(tracker, Status)),
    ?assertEqual({error, not_preloaded}, mallocinfo_profiler:start()),
    ?assertEqual({error, not_preloaded}, mallocinfo_profiler:stop()),
    ?assertEqual({error, not_preloaded}, mallocinfo_profiler:dump()).
