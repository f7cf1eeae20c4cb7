%% mallocinfo_heap without a peer node: the pure totals, and a dump of this
%% node checked against itself.
-module(mallocinfo_heap_tests).
-include_lib("eunit/include/eunit.hrl").

arena(I, Extra) ->
    maps:merge(#{arena => I, address => 4096 * (I + 1), system_bytes => 1000,
                 in_use_bytes => 600, free_bytes => 400,
                 by_kind => #{in_use => 500, free => 300, fast => 50, tcache => 20,
                              top => 50, meta => 0},
                 chunks => 10, free_chunks => 4, largest_free => 100 * (I + 1),
                 resident_bytes => 800, trimmable_bytes => 0, pinned_bytes => 250,
                 segments => 1}, Extra).

totals_sum_and_max_test() ->
    T = mallocinfo_heap:totals([arena(0, #{}), arena(1, #{trimmable_bytes => 4096})]),
    ?assertMatch(#{system_bytes := 2000, in_use_bytes := 1200, free_bytes := 800,
                   chunks := 20, free_chunks := 8, resident_bytes := 1600,
                   trimmable_bytes := 4096, pinned_bytes := 500, segments := 2,
                   largest_free := 200, arena_count := 2,
                   by_kind := #{in_use := 1000, free := 600, fast := 100, tcache := 40,
                                top := 100, meta := 0}}, T),
    ?assertNot(maps:is_key(live_bytes, T)).

totals_with_tracker_test() ->
    L = #{live_bytes => 10, live_chunks => 1, unrecorded_bytes => 5},
    T = mallocinfo_heap:totals([arena(0, L), arena(1, L)]),
    ?assertMatch(#{live_bytes := 20, live_chunks := 2, unrecorded_bytes := 10}, T).

totals_empty_test() ->
    ?assertMatch(#{arena_count := 0, largest_free := 0, system_bytes := 0},
                 mallocinfo_heap:totals([])).

summary_of_this_node_test() ->
    {ok, #{total := T, mallinfo := M, arenas := [#{arena := 0} | _] = Arenas,
           file_bytes := 0, tracker := false, sites := []}} = mallocinfo_heap:summary(),
    ?assertEqual(maps:get(arena, M), maps:get(system_bytes, T)),
    ?assertEqual(maps:get(fordblks, M), maps:get(free_bytes, T)),
    ?assertEqual(length(Arenas), maps:get(arena_count, T)).

%% mmap_bytes is glibc's own count of its mmapped blocks (mallinfo2 hblkhd of
%% the same snapshot), not only the ones the tracker could point at: this
%% node has no tracker, and the emulator's own large blocks are mmapped.
mmapped_blocks_are_glibc_s_count_test() ->
    {ok, #{total := T, mallinfo := #{hblks := N, hblkhd := B}} = S} = mallocinfo_heap:summary(),
    ?assert(B > 0),
    ?assertMatch(#{mmap_chunks := N, mmap_bytes := B}, T),
    ?assertMatch(#{mmap_chunks := N, mmap_bytes := B}, S),
    %% What the walker found through the tracker: nothing, without it.
    ?assertMatch(#{tracked_mmap_chunks := 0, tracked_mmap_bytes := 0}, T).

%% One arena_summary() for both sides: the summary of a dump of this node
%% and the summary the offline reader computes from its file are equal,
%% arena for arena, every key; the totals too, but for glibc's own mmap
%% count, which the file does not hold.
live_and_file_summaries_are_one_type_test() ->
    Dir = string:trim(os:cmd("mktemp -d -t mi_heap_XXXXXX")),
    try
        Path = filename:join(Dir, "node.heapdump"),
        {ok, #{arenas := Arenas, total := Total} = Live} = mallocinfo_heap:dump(Path),
        {ok, #{arenas := FileArenas, total := FileTotal} = File} = mallocinfo_heapmap:read_summary(Path),
        ?assertEqual(Arenas, FileArenas),
        ?assertEqual(maps:without([mmap_bytes, mmap_chunks], Total), FileTotal),
        ?assertMatch(#{chunks := C, segments := S} when C > 0 andalso S > 0, FileTotal),
        ?assertEqual(maps:with([chunks, segments], Live), maps:with([chunks, segments], FileTotal)),
        %% So the text formatter takes either.
        ?assertEqual(iolist_to_binary(mallocinfo_heapmap:format_summary(File)),
                     iolist_to_binary(mallocinfo_heapmap:format_summary(
                                        maps:with([arenas, total], Live))))
    after
        file:del_dir_r(Dir)
    end.

bad_arguments_test_() ->
    [?_assertError(badarg, mallocinfo_heap:dump(42)),
     ?_assertError(badarg, mallocinfo_heap:dump("")),
     ?_assertError(badarg, mallocinfo_heap:dump("/tmp/x", #{max_sites => many})),
     ?_assertError(badarg, mallocinfo_heap:summary(#{timeout => -5})),
     ?_assertError(badarg, mallocinfo_heap:summary(#{junk => 1}))].
