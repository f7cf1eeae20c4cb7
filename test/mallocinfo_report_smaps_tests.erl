%% EUnit: mallocinfo_report_smaps on canned /proc text (mi_report_data) and on
%% this node's own smaps: parsing, the mappings grouped by kind, glibc's
%% heaps by shape and by their headers, the JIT's pages counted once.
-module(mallocinfo_report_smaps_tests).
-include_lib("eunit/include/eunit.hrl").

-include("mi_report_data.hrl").

-define(S, mallocinfo_report_smaps).

-import(mi_report_data, [vma/6, smaps/0]).

parse_smaps_test() ->
    Vmas = ?S:parse_smaps(smaps()),
    ?assertEqual(19, length(Vmas)),
    [Beam | _] = Vmas,
    ?assertMatch(#{start := 16#55d000000000, stop := 16#55d000100000, perms := <<"r-xp">>,
                   path := <<"/usr/lib/erlang/erts-13.1.5/bin/beam.smp">>,
                   size := 1024 * ?KiB, rss := 1024 * ?KiB, pss := 1024 * ?KiB, anon := 0,
                   flags := [<<"rd">>, <<"ex">>, <<"mr">>, <<"mw">>, <<"me">>]}, Beam),
    %% A path with a space survives.
    ?assert(lists:any(fun(#{path := P}) -> P =:= <<"/memfd:vmem (deleted)">> end, Vmas)),
    %% Without VmFlags (old kernels) the flags are unknown, not empty.
    [NoFlags] = ?S:parse_smaps(<<"00400000-00401000 r--p 00000000 08:01 1 /bin/x\nRss: 4 kB\n">>),
    ?assertMatch(#{flags := undefined, rss := 4096, path := <<"/bin/x">>}, NoFlags).

group_mappings_test() ->
    #{groups := G, files_top := Files, anon_top := Anon} = Grouped =
        ?S:group_mappings(?S:parse_smaps(smaps())),
    Rss = fun(K) -> maps:get(rss, maps:get(K, G)) end,
    Count = fun(K) -> maps:get(count, maps:get(K, G)) end,
    ?assertEqual(3000 * ?KiB, Rss(main_heap)),
    %% Windows 1, 2, 3 (merged) and 8 (tail into a reservation); not the
    %% decoy, not window 12.
    ?assertEqual(4, Count(arenas)),
    ?assertEqual((12000 + 100000 + 4000) * ?KiB, Rss(arenas)),
    ?assertEqual((50000 + 2048) * ?KiB, Rss(noreserve)),
    ?assertEqual((64 + 132) * ?KiB, Rss(stacks)),
    ?assertEqual(2, Count(stacks)),
    %% The JIT's pages once, not once per view.
    ?assertEqual(4100 * ?KiB, Rss(jit)),
    ?assertEqual((1000 + 16384 + 256) * ?KiB, Rss(anon)),
    ?assertEqual((1024 + 512) * ?KiB, Rss(files)),
    ?assertEqual(4 * ?KiB, Rss(special)),
    %% Every resident page is in exactly one group; the kernel's Rss counts
    %% the JIT's shared pages twice.
    Total = lists:sum([R || #{rss := R} <- ?S:parse_smaps(smaps())]),
    ?assertEqual(4000 * ?KiB, maps:get(jit_counted_twice, Grouped)),
    ?assertEqual(Total, lists:sum([R || #{rss := R} <- maps:values(G)]) + 4000 * ?KiB),
    ?assertEqual([#{path => <<"/usr/lib/erlang/erts-13.1.5/bin/beam.smp">>, rss => 1536 * ?KiB}],
                 Files),
    ?assertMatch([#{rss := 16384 * ?KiB, start := S} | _] when S =:= ?H + 16 * ?W, Anon).

%% A heap is a mapping of its own: a NORESERVE mapping that merely covers
%% an aligned window is not one.
unaligned_start_is_not_a_heap_test() ->
    Smaps = iolist_to_binary(
              [vma(?H + ?W - 4 * ?MiB, ?H + ?W + 4 * ?MiB, "rw-p", "", 8000, "rd wr mr mw me nr"),
               vma(?H + 2 * ?W, ?H + 2 * ?W + 4 * ?MiB, "rw-p", "", 4000, "rd wr mr mw me nr"),
               vma(?H + 2 * ?W + 4 * ?MiB, ?H + 3 * ?W, "---p", "", 0, "mr mw me nr")]),
    #{groups := G} = ?S:group_mappings(?S:parse_smaps(Smaps)),
    %% The first mapping starts unaligned: not a heap at all (see the
    %% docs: such a heap is missed); the second is.
    ?assertEqual(1, maps:get(count, maps:get(arenas, G))),
    ?assertEqual(4000 * ?KiB, maps:get(rss, maps:get(arenas, G))),
    ?assertEqual(8000 * ?KiB, maps:get(rss, maps:get(noreserve, G))).

%% From glibc 2.37 heaps are not MAP_NORESERVE (Debian 13 and later):
%% the same shapes without `nr' are heaps too, but a run mixing the two is
%% not one reservation.
heap_without_noreserve_test() ->
    Smaps = iolist_to_binary(
              [vma(?H + ?W, ?H + ?W + 4 * ?MiB, "rw-p", "", 4000, "rd wr mr mw me ac"),
               vma(?H + ?W + 4 * ?MiB, ?H + 2 * ?W, "---p", "", 0, "mr mw me"),
               vma(?H + 2 * ?W, ?H + 2 * ?W + 4 * ?MiB, "rw-p", "[anon: glibc: malloc arena]", 3000,
                   "rd wr mr mw me ac"),
               vma(?H + 2 * ?W + 4 * ?MiB, ?H + 3 * ?W, "---p", "[anon: glibc: malloc arena]", 0,
                   "mr mw me"),
               vma(?H + 4 * ?W, ?H + 4 * ?W + 4 * ?MiB, "rw-p", "", 2000, "rd wr mr mw me nr"),
               vma(?H + 4 * ?W + 4 * ?MiB, ?H + 5 * ?W, "---p", "", 0, "mr mw me")]),
    Vmas = ?S:parse_smaps(Smaps),
    ?assertEqual([?H + ?W, ?H + 2 * ?W], ?S:heap_windows(Vmas, undefined)),
    ?assertEqual([?H + ?W, ?H + 2 * ?W, ?H + 4 * ?W], ?S:heap_candidates(Vmas)),
    #{groups := G} = ?S:group_mappings(Vmas),
    ?assertMatch(#{arenas := #{rss := 7000 * ?KiB, count := 2}}, G).

%% A glibc heap_info: ar_ptr, prev, size, mprotect_size, pagesize.
heap_info(ArPtr, Prev, Size, Mprotect) ->
    <<ArPtr:64/native, Prev:64/native, Size:64/native, Mprotect:64/native, 4096:64/native,
      0:64/native>>.

%% What the process's memory says decides, not the shape: the tracker's
%% table merged with the heap above it (the shape alone misses that heap),
%% a NORESERVE mapping covering an aligned window (zeros there), and a
%% window of plausible shape whose bytes are no heap_info.
heap_headers_test() ->
    Merged = vma(?H + 3 * ?W - 16 * ?MiB, ?H + 3 * ?W + 4 * ?MiB, "rw-p", "", 9000,
                 "rd wr mr mw me nr"),
    Tail = vma(?H + 3 * ?W + 4 * ?MiB, ?H + 4 * ?W, "---p", "", 0, "mr mw me nr"),
    Decoy = vma(?H + 5 * ?W - ?MiB, ?H + 6 * ?W + ?MiB, "rw-p", "", 60000, "rd wr mr mw me nr"),
    Shaped = vma(?H + 8 * ?W, ?H + 8 * ?W + ?MiB, "rw-p", "", 500, "rd wr mr mw me nr"),
    ShapedTail = vma(?H + 8 * ?W + ?MiB, ?H + 9 * ?W, "---p", "", 0, "mr mw me nr"),
    Vmas = ?S:parse_smaps(iolist_to_binary([Merged, Tail, Decoy, Shaped, ShapedTail])),
    ?assertEqual([?H + 3 * ?W, ?H + 5 * ?W, ?H + 6 * ?W, ?H + 8 * ?W], ?S:heap_candidates(Vmas)),
    Headers = #{?H + 3 * ?W => heap_info(?H + 3 * ?W + 16#30, 0, 4 * ?MiB, 4 * ?MiB),
                ?H + 5 * ?W => <<0:384>>,
                ?H + 8 * ?W => <<"not a heap at all, just bytes in a heap's shape..">>},
    ?assertEqual([?H + 3 * ?W], ?S:heap_windows(Vmas, Headers)),
    %% Shape alone gets both wrong.
    ?assertEqual([?H + 8 * ?W], ?S:heap_windows(Vmas, undefined)),
    %% The merged mapping is split: exactly by pagemap when read, else in
    %% proportion to the bytes (4 of 20 MiB).
    ?assertEqual([{?H + 3 * ?W - 16 * ?MiB, 4096, [{?H + 3 * ?W, ?H + 3 * ?W + 4 * ?MiB}]}],
                 ?S:straddling(Vmas, [?H + 3 * ?W])),
    #{groups := Exact} = ?S:group_mappings(Vmas, #{heap_headers => Headers,
                                                   straddle_rss => #{?H + 3 * ?W - 16 * ?MiB =>
                                                                         4000 * ?KiB}}),
    ?assertMatch(#{arenas := #{rss := 4000 * ?KiB, count := 1},
                   noreserve := #{rss := (5000 + 60000 + 500) * ?KiB}}, Exact),
    #{groups := Prorated} = ?S:group_mappings(Vmas, #{heap_headers => Headers}),
    ?assertMatch(#{arenas := #{rss := 1800 * ?KiB}}, Prorated),
    %% Later heaps of an arena point back to its first heap.
    ?assert(lists:member(?H + 8 * ?W,
                         ?S:heap_windows(Vmas, Headers#{?H + 8 * ?W =>
                                                            heap_info(?H + 16#30, ?H, ?MiB, ?MiB)}))),
    %% Sizes glibc cannot have.
    [?assertEqual([], ?S:heap_windows(Vmas, #{?H + 3 * ?W => Bad}))
     || Bad <- [heap_info(?H + 3 * ?W + 16#30, 0, 0, 0),
                heap_info(?H + 3 * ?W + 16#30, 0, ?MiB + 1, 2 * ?MiB),
                heap_info(?H + 3 * ?W + 16#30, 0, 2 * ?MiB, ?MiB),
                heap_info(?H + 3 * ?W + 16#30, 0, 128 * ?MiB, 128 * ?MiB),
                heap_info(?H + 3 * ?W + 16#30, ?H + 1, ?MiB, ?MiB),
                heap_info(12345, 0, ?MiB, ?MiB)]].

parse_fields_test() ->
    Status = <<"Name:\tbeam.smp\nVmHWM:\t  282608 kB\nVmRSS:\t  282608 kB\n"
               "RssAnon:\t  265124 kB\nThreads:\t31\n">>,
    ?assertEqual(#{<<"VmHWM">> => 282608 * ?KiB, <<"VmRSS">> => 282608 * ?KiB,
                   <<"RssAnon">> => 265124 * ?KiB}, ?S:parse_fields(Status)).

%% The JIT's pages on this node, counted by their page frames in
%% /proc/self/pagemap (root reads them): the group counts each once, and
%% jit_counted_twice is what the views' Rss counts beyond that.
jit_counted_once_on_this_node_test() ->
    %% Everything this test runs is loaded (and JIT-compiled) before smaps
    %% is read, so the JIT writes no new code in between.
    _ = ?S:group_mappings(?S:parse_smaps(<<>>)),
    {ok, Smaps} = file:read_file("/proc/self/smaps"),
    Vmas = ?S:parse_smaps(Smaps),
    Views = [V || #{path := <<"/memfd:vmem", _/binary>>} = V <- Vmas],
    %% Each memfd the JIT made, twice (it adds one as code grows).
    ?assert(length(Views) >= 2 andalso length(Views) rem 2 =:= 0),
    Frames = lists:append([present_frames(V) || V <- Views]),
    ?assertNotEqual([], [F || F <- Frames, F =/= 0]),
    #{groups := #{jit := #{rss := Jit}}} = Grouped = ?S:group_mappings(Vmas),
    Page = 4096,
    ?assertEqual(length(lists:usort(Frames)) * Page, Jit),
    Twice = maps:get(jit_counted_twice, Grouped),
    ?assertEqual(lists:sum([Rss || #{rss := Rss} <- Views]) - Jit, Twice),
    ?assert(Twice > 0).

%% The page frame numbers of a mapping's resident pages.
present_frames(#{start := S, stop := E}) ->
    {ok, F} = file:open("/proc/self/pagemap", [read, raw, binary]),
    {ok, Bin} = file:pread(F, S div 4096 * 8, (E - S) div 4096 * 8),
    ok = file:close(F),
    [E1 band (1 bsl 55 - 1) || <<E1:64/native>> <= Bin, E1 bsr 63 =:= 1].
