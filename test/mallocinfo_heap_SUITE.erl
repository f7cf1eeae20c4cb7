%% The heap map dump, end to end on peer nodes: a heap fragmented on purpose
%% by a test NIF, totals checked against glibc's own figures from the same
%% snapshot, the tracker's call sites, dumps taken while threads churn, and
%% every error path.
-module(mallocinfo_heap_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2,
         end_per_testcase/2]).
-export([agrees_with_glibc/1, fragmentation_is_pinned/1, trim_returns_trimmable/1,
         tracker_sites_and_caches/1, dumps_under_churn/1, node_keeps_running/1,
         path_errors/1, bad_arguments/1, other_allocator/1]).

all() ->
    [agrees_with_glibc, fragmentation_is_pinned, trim_returns_trimmable,
     tracker_sites_and_caches, dumps_under_churn, node_keeps_running, path_errors,
     bad_arguments, other_allocator].

init_per_suite(Config) ->
    ok = mi_ct:build_nif(Config, "mi_frag_nif"),
    Config.

end_per_suite(_Config) ->
    ok.

init_per_testcase(tracker_sites_and_caches, Config) ->
    start_peer(Config, mallocinfo_trace:preload_env());
init_per_testcase(node_keeps_running, Config) ->
    start_peer(Config, [], ["+S", "1"]);
init_per_testcase(other_allocator, Config) ->
    start_peer(Config, [{"LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}]);
init_per_testcase(path_errors, Config) ->
    Config;
init_per_testcase(bad_arguments, Config) ->
    Config;
init_per_testcase(_, Config) ->
    start_peer(Config, []).

end_per_testcase(_, Config) ->
    mi_ct:stop_peer(Config).

start_peer(Config, Env) ->
    mi_ct:start_peer(Config, Env).

start_peer(Config, Env, Args) ->
    mi_ct:start_peer(Config, Env, Args).

call(Config, M, F, A) ->
    mi_ct:call(Config, M, F, A).

dump_path(Config, Name) ->
    filename:join(?config(priv_dir, Config), Name).

%%% Cases --------------------------------------------------------------------

%% Totals from the walk equal mallinfo2() and malloc_info() taken in the
%% child right after it: the same snapshot, so exactly equal.
agrees_with_glibc(Config) ->
    ok = call(Config, mi_frag_nif, fragment, [4, 20000, 1000, 2]),
    Path = dump_path(Config, "agree.heapdump"),
    {ok, S} = call(Config, mallocinfo_heap, dump, [Path, #{info_xml => true}]),
    #{total := T, mallinfo := M, arenas := Arenas, info_xml := Xml} = S,
    ct:pal("total: ~p~nmallinfo: ~p", [T, M]),
    ?assertEqual(maps:get(arena, M), maps:get(system_bytes, T)),
    ?assertEqual(maps:get(fordblks, M), maps:get(free_bytes, T)),
    ?assertEqual(maps:get(uordblks, M), maps:get(in_use_bytes, T)),
    ?assertEqual(maps:get(fsmblks, M), maps:get(fast, maps:get(by_kind, T))),
    %% Per arena against malloc_info's XML of the same snapshot.
    #{heaps := Heaps} = mallocinfo_glibc_parse:heaps(Xml),
    ?assertEqual(length(Heaps), length(Arenas)),
    lists:foreach(
      fun({H, A}) ->
              #{system := #{current := Sys}, free_bytes := XmlFree,
                rest := #{count := RestCount}} = H,
              ?assertEqual(Sys, maps:get(system_bytes, A)),
              %% malloc_info sums bin chunks with chunksize_nomask(): each
              %% free chunk may add its PREV_INUSE bit (1) to "rest".
              Over = XmlFree - maps:get(free_bytes, A),
              ct:pal("arena ~p: xml free ~p (rest ~p, fast ~p), walk free ~p",
                     [maps:get(arena, A), XmlFree, maps:get(rest, H), maps:get(fast, H),
                      maps:get(free_bytes, A)]),
              ?assert(Over >= 0 andalso Over =< RestCount)
      end, lists:zip(Heaps, Arenas)),
    %% Four threads: more than one arena holds fragments.
    ?assert(length([A || #{arena := I, pinned_bytes := P} = A <- Arenas, I > 0, P > 0]) >= 1),
    {ok, #{size := Size}} = file_info(Path),
    ?assertEqual(maps:get(file_bytes, S), Size),
    same_as_file(Path, S),
    ok = call(Config, mi_frag_nif, release, []).

%% 4 x 20000 blocks of 1000 bytes, every other one freed: about 40 MB of
%% free holes pinned between live blocks, none of it returnable by trim.
fragmentation_is_pinned(Config) ->
    ok = call(Config, mi_frag_nif, fragment, [4, 20000, 1000, 2]),
    {ok, #{total := T}} = call(Config, mallocinfo_heap, summary, []),
    #{pinned_bytes := Pinned, trimmable_bytes := Trimmable, free_chunks := FreeChunks} = T,
    ct:pal("pinned ~p trimmable ~p free_chunks ~p", [Pinned, Trimmable, FreeChunks]),
    Holes = 4 * 10000 * 1008,
    ?assert(Pinned >= Holes * 9 div 10),
    ?assert(Pinned =< Holes * 2),
    ?assert(FreeChunks >= 4 * 10000 * 9 div 10),
    ok = call(Config, mi_frag_nif, release, []).

%% Free everything: the holes merge into whole free pages; they are
%% resident and trimmable until malloc_trim returns them.
trim_returns_trimmable(Config) ->
    %% Keeps only the first and the last block: ~48 MB of free, resident
    %% pages between them.
    ok = call(Config, mi_frag_nif, fragment, [1, 50000, 1000, 50000]),
    {ok, #{total := Before}} = call(Config, mallocinfo_heap, summary, []),
    ct:pal("before trim: ~p", [Before]),
    ?assert(maps:get(trimmable_bytes, Before) >= 30 * 1024 * 1024),
    {ok, _} = call(Config, mallocinfo, trim, []),
    {ok, #{total := After}} = call(Config, mallocinfo_heap, summary, []),
    ct:pal("after trim: ~p", [After]),
    ?assert(maps:get(trimmable_bytes, After) < 1024 * 1024),
    ?assert(maps:get(resident_bytes, After) + 30 * 1024 * 1024 =< maps:get(resident_bytes, Before)),
    ok = call(Config, mi_frag_nif, release, []).

%% With the interposer: live blocks carry their call site; blocks the
%% application freed but ptmalloc caches (tcache, fastbins) are not live.
tracker_sites_and_caches(Config) ->
    ok = call(Config, mi_frag_nif, fragment, [2, 5000, 200, 2]),
    %% Above the mmap threshold: mmapped chunks, known only to the tracker.
    ok = call(Config, mi_frag_nif, fragment, [1, 3, 400000, 1]),
    Path = dump_path(Config, "tracked.heapdump"),
    {ok, S} = call(Config, mallocinfo_heap, dump, [Path]),
    #{tracker := true, sites := Sites, total := T} = S,
    ct:pal("sites: ~p~ntotal: ~p", [lists:sublist(Sites, 5), T]),
    [Frag | _] = [X || #{label := L} = X <- Sites,
                       binary:match(L, <<"mi_frag_alloc">>) =/= nomatch],
    %% 2 x 2500 kept blocks of 200 bytes.
    %% Per thread: every other one of 5000, plus the last; and the 3 big ones.
    ?assertEqual(2 * 2501 + 3, maps:get(count, Frag)),
    ?assertEqual(2 * 2501 * 200 + 3 * 400000, maps:get(live_bytes, Frag)),
    #{live_chunks := LiveChunks, by_kind := #{tcache := Tc, fast := Fast},
      tracked_mmap_chunks := MmapChunks, tracked_mmap_bytes := MmapBytes} = T,
    ?assert(MmapChunks >= 3),
    ?assert(MmapBytes >= 3 * 400000),
    %% glibc's own count of every mmapped block, of which the tracker's are
    %% a part.
    #{mallinfo := #{hblks := Hblks, hblkhd := Hblkhd}} = S,
    ?assertMatch(#{mmap_chunks := Hblks, mmap_bytes := Hblkhd}, T),
    ?assert(Hblks >= MmapChunks),
    ?assert(Hblkhd >= MmapBytes),
    ?assert(LiveChunks >= 5000),
    ?assert(Tc + Fast > 0),
    same_as_file(Path, S),
    ok = call(Config, mi_frag_nif, release, []).

%% 50 dumps while two threads allocate and free without pause: every one
%% succeeds and is self-consistent.
dumps_under_churn(Config) ->
    ok = call(Config, mi_frag_nif, churn_start, [2]),
    Path = dump_path(Config, "churn.heapdump"),
    lists:foreach(
      fun(I) ->
              R = case I rem 2 of
                      0 -> call(Config, mallocinfo_heap, dump, [Path]);
                      1 -> call(Config, mallocinfo_heap, summary, [])
                  end,
              {ok, #{total := T, mallinfo := M} = S} = R,
              I rem 2 =:= 0 andalso same_as_file(Path, S),
              ?assertEqual(maps:get(arena, M), maps:get(system_bytes, T)),
              ?assertEqual(maps:get(fordblks, M), maps:get(free_bytes, T)),
              ?assert(maps:get(arena_count, T) >= 3)
      end, lists:seq(1, 50)),
    ok = call(Config, mi_frag_nif, churn_stop, []).

%% The dump runs on a dirty scheduler and the walk in a child: a process on
%% a normal scheduler keeps running the whole time.
node_keeps_running(Config) ->
    ok = call(Config, mi_frag_nif, fragment, [2, 100000, 100, 2]),
    Path = dump_path(Config, "running.heapdump"),
    {{ok, _}, Reads} = call(Config, mi_frag_nif, progress_during,
                            [{mallocinfo_heap, dump, [Path]}]),
    ct:pal("~b counter reads while the dump ran", [length(Reads)]),
    ?assert(length(Reads) >= 3),
    ?assertEqual(lists:usort(Reads), Reads),
    ok = call(Config, mi_frag_nif, release, []).

path_errors(Config) ->
    Dir = filename:join(?config(priv_dir, Config), "paths"),
    ok = file:make_dir(Dir),
    File = filename:join(Dir, "plain"),
    ok = file:write_file(File, <<>>),
    Sub = filename:join(Dir, "sub"),
    ok = file:make_dir(Sub),
    ok = file:write_file(filename:join(Sub, "x"), <<>>),
    ?assertEqual({error, enoent}, mallocinfo_heap:dump(filename:join([Dir, "missing", "x"]))),
    ?assertEqual({error, enotdir}, mallocinfo_heap:dump(filename:join(File, "x"))),
    %% The whole file is written beside Sub, then the rename onto a
    %% directory fails: the temporary file must go.
    {error, E1} = mallocinfo_heap:dump(Sub),
    ?assert(lists:member(E1, [eisdir, eexist, enotempty])),
    %% Root may write almost anywhere: /proc refuses new files.
    {error, E2} = mallocinfo_heap:dump("/proc/mallocinfo.heapdump"),
    ?assert(lists:member(E2, [eacces, enoent, eperm, erofs])),
    {ok, Left} = file:list_dir(Dir),
    ?assertEqual(["plain", "sub"], lists:sort(Left)),
    ?assertEqual({ok, ["x"]}, file:list_dir(Sub)).

%% Under jemalloc glibc's arenas are idle bookkeeping: refuse, and write
%% nothing.
other_allocator(Config) ->
    Path = dump_path(Config, "jemalloc.heapdump"),
    ?assertEqual({error, {wrong_allocator, jemalloc}}, call(Config, mallocinfo_heap, dump, [Path])),
    ?assertEqual({error, {wrong_allocator, jemalloc}}, call(Config, mallocinfo_heap, summary, [])),
    ?assertNot(filelib:is_file(Path)).

bad_arguments(_Config) ->
    ?assertError(badarg, mallocinfo_heap:dump(42)),
    ?assertError(badarg, mallocinfo_heap:dump(<<>>)),
    ?assertError(badarg, mallocinfo_heap:dump("/tmp/x", [])),
    ?assertError(badarg, mallocinfo_heap:dump("/tmp/x", #{max_sites => -1})),
    ?assertError(badarg, mallocinfo_heap:dump("/tmp/x", #{max_sites => 65535})),
    ?assertError(badarg, mallocinfo_heap:dump("/tmp/x", #{timeout => 0})),
    ?assertError(badarg, mallocinfo_heap:dump("/tmp/x", #{info_xml => yes})),
    ?assertError(badarg, mallocinfo_heap:summary(nope)),
    ?assertError(badarg, mallocinfo_heap:dump(<<"/tmp/a", 0, "b">>)).

%%% Helpers ------------------------------------------------------------------

%% The summary the dumper computed in its child and the one the offline
%% reader computes from the file are one type (mallocinfo_heap:
%% arena_summary()): equal arena for arena, every key; the totals too, but
%% for glibc's own count of its mmapped blocks, which the file does not
%% hold.
same_as_file(Path, #{arenas := Arenas, total := Total}) ->
    {ok, #{arenas := FileArenas, total := FileTotal}} = mallocinfo_heapmap:read_summary(Path),
    ?assertEqual(length(Arenas), length(FileArenas)),
    lists:foreach(fun({A, F}) -> ?assertEqual(F, A) end, lists:zip(Arenas, FileArenas)),
    ?assertEqual(maps:without([mmap_bytes, mmap_chunks], Total), FileTotal),
    true.

file_info(Path) ->
    case file:read_file_info(Path) of
        {ok, I} -> {ok, #{size => element(2, I)}};
        E -> E
    end.
