%% EUnit: heap dump reading (summary figures computed by hand for a
%% synthetic heap), rendering (colours of known chunks read back from the
%% PNG), and every way a dump or a path can be wrong.
-module(mallocinfo_heapmap_tests).
-include_lib("eunit/include/eunit.hrl").

-define(W, mi_heapdump_writer).
-define(PAGE, 4096).
-define(MAIN, 16#10000).
-define(HEAP, 16#4000000).
-define(HEAP_HDR, 2224).

%%% The synthetic heap ----------------------------------------------------------
%%
%% Arena 0, the main heap: 8 pages at 0x10000, first chunk at the base.
%%
%%   offset  size   kind     pages                 notes
%%        0    512  in_use   0
%%      512    512  in_use   0                     adjacent to the one before
%%     1024     32  free     0                     pinned: no whole page
%%     1056    992  in_use   0
%%     2048     64  fast     0                     pinned
%%     2112   1984  in_use   0
%%     4096  12288  free     1-3                   whole pages [4096+48, 16384) = 2, 3;
%%                                                 page 3 not resident
%%    16384     48  tcache   4
%%    16432   4048  in_use   4
%%    20480  12288  top      5-7                   pages 6, 7 past 33 bytes from the end
%%                                                 (systrim); page 7 not resident
%%
%% Arena 1, one non-main heap of 4 pages at 0x4000000, first chunk after
%% 2224 bytes of heap_info and malloc_state:
%%
%%     2224   1872  in_use   0
%%     4096   8192  free     1-2                   whole page 2 (not resident)
%%    12288   4064  top      3                     no whole page
%%    16352     32  meta     3                     fencepost

main_chunks() ->
    [{in_use, 512}, {in_use, 512}, {free, 32}, {in_use, 992}, {fast, 64}, {in_use, 1984},
     {free, 12288}, {tcache, 48}, {in_use, 4048}, {top, 12288}].

heap_chunks() ->
    [{in_use, 1872}, {free, 8192}, {top, 4064}, {meta, 32}].

known() ->
    #{arenas => [#{segments => [#{base => ?MAIN, chunks => main_chunks(), resident => [3, 7]}]},
                 #{segments => [#{base => ?HEAP, first => ?HEAP + ?HEAP_HDR,
                                  chunks => heap_chunks(), resident => [2]}]}]}.

%% The same heap as the tracker would describe it: the first in_use chunks
%% belong to sites 1 and 2, one is live at a site outside the dumped ones
%% (65535), the rest are not in the live table; one mmapped block.
tracked() ->
    Sited = [{in_use, 512, 1}, {in_use, 512, 2}, {free, 32}, {in_use, 992, 1}, {fast, 64},
             {in_use, 1984}, {free, 12288}, {tcache, 48}, {in_use, 4048, 65535}, {top, 12288}],
    #{arenas := [_, A1]} = known(),
    (known())#{tracker => true,
               arenas => [#{segments => [#{base => ?MAIN, chunks => Sited, resident => [3, 7]}]}, A1],
               mmaps => [{16#7f0000000000, 135168, 1}],
               sites => [{1, 136672, 3, <<"leaky_alloc < leaky_nif_call"/utf8>>},
                         {2, 512, 1, <<"cache_put < <b>&amp;"/utf8>>}]}.

%% The keys of mallocinfo_heap:arena_summary(): the test writer puts arena
%% I at address 0x1000 + I.
arena0() ->
    #{arena => 0,
      address => 16#1000,
      chunks => 10,
      segments => 1,
      system_bytes => 32768,
      in_use_bytes => 32768 - (12320 + 64 + 12288),
      free_bytes => 12320 + 64 + 12288,
      by_kind => #{in_use => 512 + 512 + 992 + 1984 + 4048, free => 32 + 12288, fast => 64,
                   tcache => 48, top => 12288, meta => 0},
      free_chunks => 4,
      largest_free => 12288,
      resident_bytes => 6 * ?PAGE,
      %% page 2 of the free chunk, page 6 of top.
      trimmable_bytes => 2 * ?PAGE,
      %% 32 + 64 + (12288 - 2 whole pages).
      pinned_bytes => 32 + 64 + 4096}.

arena1() ->
    #{arena => 1,
      address => 16#1001,
      chunks => 4,
      segments => 1,
      system_bytes => 16384,
      in_use_bytes => 16384 - (8192 + 4064),
      free_bytes => 8192 + 4064,
      by_kind => #{in_use => 1872, free => 8192, fast => 0, tcache => 0, top => 4064, meta => 32},
      free_chunks => 1,
      largest_free => 8192,
      resident_bytes => 3 * ?PAGE,
      %% Its only whole free page is not resident.
      trimmable_bytes => 0,
      pinned_bytes => 8192 - ?PAGE}.

totals() ->
    #{system_bytes => 49152, in_use_bytes => 8096 + 4128, free_bytes => 24672 + 12256,
      by_kind => #{in_use => 8048 + 1872, free => 12320 + 8192, fast => 64, tcache => 48,
                   top => 12288 + 4064, meta => 32},
      free_chunks => 5, largest_free => 12288, resident_bytes => 9 * ?PAGE,
      trimmable_bytes => 2 * ?PAGE, pinned_bytes => 4192 + 4096,
      tracked_mmap_bytes => 0, tracked_mmap_chunks => 0, arena_count => 2, chunks => 14,
      segments => 2}.

%% mktemp: a name unique across nodes (unique_integer/1 starts over in every
%% VM, so two test runs on one machine made the same directory).
tmpdir() ->
    Dir = string:trim(os:cmd("mktemp -d -t mi_heapmap_XXXXXX")),
    {ok, _} = file:read_file_info(Dir),
    Dir.

%% The tests that write and read a file per case (a hundred and more) get
%% 120 s instead of EUnit's 5: on a loaded CI machine file operations stall
%% (truncated_test, 0.08 s here, once timed out in a fresh-clone make test).
with_tmpdir(Fun) ->
    Dir = tmpdir(),
    try Fun(Dir) after file:del_dir_r(Dir) end.

dump_file(Dir, Name, Bin) ->
    Path = filename:join(Dir, Name),
    ok = file:write_file(Path, Bin),
    Path.

%%% Summary -------------------------------------------------------------------

summary_of_known_heap_test() ->
    with_tmpdir(
      fun(Dir) ->
              Path = dump_file(Dir, "k.heapdump", ?W:dump(known())),
              ?assertEqual({ok, #{arenas => [arena0(), arena1()], total => totals()}},
                           mallocinfo_heapmap:read_summary(Path))
      end).

%% in_use = system - free, as glibc's uordblks: tcache chunks and headers
%% count as in use. A self-check of the expectations above.
expectations_agree_with_glibc_definitions_test() ->
    #{in_use_bytes := U0, by_kind := #{in_use := I0, tcache := T0}} = arena0(),
    ?assertEqual(I0 + T0, U0),
    #{in_use_bytes := U1, by_kind := #{in_use := I1, meta := M1}} = arena1(),
    ?assertEqual(I1 + M1 + ?HEAP_HDR, U1).

%% malloc_trim returns the main arena's top (its whole pages beyond 33
%% bytes, counted from the end) but never another arena's: the same
%% resident 3-page top counts 2 pages in arena 0 and none in arena 1.
top_trimmable_only_in_main_arena_test() ->
    with_tmpdir(
      fun(Dir) ->
              Spec = #{arenas => [#{segments => [#{base => ?MAIN, resident => all,
                                                    chunks => [{in_use, 4096}, {top, 12288}]}]},
                                  #{segments => [#{base => ?HEAP, first => ?HEAP + ?HEAP_HDR,
                                                    resident => all,
                                                    chunks => [{in_use, 4096 - ?HEAP_HDR},
                                                               {top, 12288}]}]}]},
              Path = dump_file(Dir, "t.heapdump", ?W:dump(Spec)),
              {ok, #{arenas := [A0, A1]}} = mallocinfo_heapmap:read_summary(Path),
              ?assertEqual(2 * ?PAGE, maps:get(trimmable_bytes, A0)),
              ?assertEqual(0, maps:get(trimmable_bytes, A1))
      end).

%% Chunks split over many CHUNKS records read the same.
many_chunk_records_test() ->
    with_tmpdir(
      fun(Dir) ->
              Path = dump_file(Dir, "k.heapdump", ?W:dump((known())#{chunks_per_record => 3})),
              {ok, S} = mallocinfo_heapmap:read_summary(Path),
              ?assertEqual(#{arenas => [arena0(), arena1()], total => totals()}, S)
      end).

tracker_summary_test() ->
    with_tmpdir(
      fun(Dir) ->
              Path = dump_file(Dir, "t.heapdump", ?W:dump(tracked())),
              {ok, #{arenas := [A0, A1], total := T}} = mallocinfo_heapmap:read_summary(Path),
              ?assertEqual((arena0())#{live_bytes => 512 + 512 + 992 + 4048, live_chunks => 4,
                                       unrecorded_bytes => 1984}, A0),
              ?assertEqual((arena1())#{live_bytes => 0, live_chunks => 0,
                                       unrecorded_bytes => 1872}, A1),
              ?assertEqual((totals())#{live_bytes => 6064, live_chunks => 4,
                                       unrecorded_bytes => 1984 + 1872,
                                       tracked_mmap_bytes => 135168, tracked_mmap_chunks => 1}, T)
      end).

%% Two segments in one arena, the top chunk in the second: figures add up,
%% and each segment gets its own picture.
two_segments_test() ->
    Old = #{base => ?HEAP, first => ?HEAP + ?HEAP_HDR,
            chunks => [{in_use, 1872}, {free, 8192}, {in_use, 4064}, {meta, 32}]},
    New = #{base => ?HEAP + (64 bsl 20), first => ?HEAP + (64 bsl 20) + 32,
            chunks => [{fast, 32}, {in_use, 4000}, {top, 8192}]},
    with_tmpdir(
      fun(Dir) ->
              Spec = #{arenas => [#{segments => [#{base => ?MAIN, chunks => main_chunks()}]},
                                  #{segments => [Old, New]}]},
              Path = dump_file(Dir, "two.heapdump", ?W:dump(Spec)),
              {ok, #{arenas := [_, A1]}} = mallocinfo_heapmap:read_summary(Path),
              ?assertMatch(#{system_bytes := 16384 + 12256, free_chunks := 2,
                             by_kind := #{top := 8192, fast := 32, free := 8192},
                             resident_bytes := 4 * ?PAGE + 3 * ?PAGE,
                             %% Page 2 of the old heap's free chunk; the new top
                             %% [+4064, +12256) ends inside page 2: no whole page.
                             trimmable_bytes := ?PAGE,
                             pinned_bytes := 32 + (8192 - ?PAGE)}, A1),
              {Out, Files} = render(Path),
              ?assertEqual(["index.html", "arena0-seg0.png", "arena1-seg0.png", "arena1-seg1.png"],
                           [filename:basename(F) || F <- Files]),
              %% 32 bytes of heap_info, then the fastbin chunk at pixel 2.
              assert_pixels(Out, "arena1-seg1.png",
                            [{0, 0, meta, start}, {2, 0, fast, start}, {4, 0, in_use, start}])
      end).

%%% Pictures ------------------------------------------------------------------

%% The PNG and the legend's colours, from index.html: what a reader sees.
image(Out, File) ->
    {ok, Png} = file:read_file(filename:join(Out, File)),
    {ok, Img} = mallocinfo_png:decode(Png),
    {ok, Html} = file:read_file(filename:join(Out, "index.html")),
    {Img, legend(Html)}.

legend(Html) ->
    {match, Items} = re:run(Html, "data-(kind|site)=\"([a-z_0-9]+)\" data-colours=\"([^\"]+)\"",
                            [global, {capture, [2, 3], list}]),
    maps:from_list([{Key, [hex(C) || C <- string:lexemes(Cs, " ")]} || [Key, Cs] <- Items]).

hex([$#, R1, R2, G1, G2, B1, B2]) ->
    {list_to_integer([R1, R2], 16), list_to_integer([G1, G2], 16), list_to_integer([B1, B2], 16)}.

colour(Legend, Kind, Variant) ->
    Key = case Kind of
              K when is_atom(K) -> atom_to_list(K);
              K -> K
          end,
    [Normal, Start, Faded, Stroke] = maps:get(Key, Legend),
    case Variant of
        normal -> Normal;
        start -> Start;
        faded -> Faded;
        stroke -> Stroke
    end.

px(Img, X, Y) -> mallocinfo_png:pixel(Img, X, Y).

%% The dump at Path rendered into Path's directory's out/: {Out, Files}.
render(Path) ->
    Out = filename:join(filename:dirname(Path), "out"),
    {ok, Files} = mallocinfo_heapmap:render(Path, Out),
    {Out, Files}.

%% Spec's dump written into Dir as Name, then render/1.
render(Dir, Name, Spec) ->
    render(dump_file(Dir, Name, ?W:dump(Spec))).

%% Each {X, Y, Kind, Variant}: pixel (X, Y) of Out's File has Kind's Variant
%% colour in the legend. One assertion over the whole table, each pixel
%% beside its expected colour, so a failure shows which pixels differ.
%% Returns the image.
assert_pixels(Out, File, Pixels) ->
    {Img, L} = image(Out, File),
    ?assertEqual([{P, colour(L, K, V)} || {_, _, K, V} = P <- Pixels],
                 [{P, px(Img, X, Y)} || {X, Y, _, _} = P <- Pixels]),
    Img.

%% One pixel per 16 bytes, one row per page: pixel (x, y) is offset
%% y * 4096 + x * 16.
known_colours_test() ->
    with_tmpdir(
      fun(Dir) ->
              {Out, Files} = render(Dir, "k.heapdump", known()),
              ?assertEqual([filename:join(Out, F)
                            || F <- ["index.html", "arena0-seg0.png", "arena1-seg0.png"]], Files),
              {Img, L} = image(Out, "arena0-seg0.png"),
              ?assertMatch(#{width := 256, height := 8}, Img),
              C = fun(K, V) -> colour(L, K, V) end,
              %% Every kind has its own colour, and its start shade differs.
              Kinds = [in_use, free, free_pages, fast, tcache, top, mmap, meta],
              ?assertEqual(length(Kinds), length(lists:usort([C(K, normal) || K <- Kinds]))),
              [?assertNotEqual(C(K, normal), C(K, start)) || K <- Kinds],
              [?assertNotEqual(C(K, normal), C(K, faded)) || K <- Kinds],
              assert_pixels(Out, "arena0-seg0.png",
                            %% Two adjacent in_use chunks: the second starts darker.
                            [{0, 0, in_use, start}, {31, 0, in_use, normal},
                             {32, 0, in_use, start}, {33, 0, in_use, normal},
                             %% The 32-byte free hole is two pixels.
                             {64, 0, free, start}, {65, 0, free, normal}, {66, 0, in_use, start},
                             {128, 0, fast, start}, {131, 0, fast, normal},
                             {132, 0, in_use, start}, {255, 0, in_use, normal},
                             %% The big free chunk, pages 1-3: page 1 holds its
                             %% first 48 bytes (pinned), pages 2 and 3 are whole
                             %% free pages; page 3 is not resident.
                             {0, 1, free, start}, {255, 1, free, normal},
                             {0, 2, free_pages, normal}, {200, 2, free_pages, normal},
                             %% Not resident: faded, with a stroke where
                             %% (x + y) mod 4 = 0.
                             {1, 3, free_pages, stroke}, {2, 3, free_pages, faded},
                             {3, 3, free_pages, faded}, {5, 3, free_pages, stroke},
                             {0, 4, tcache, start}, {2, 4, tcache, normal}, {3, 4, in_use, start},
                             {0, 5, top, start}, {17, 6, top, normal}, {2, 7, top, faded}]),
              %% At 16 bytes a pixel, the free and fastbin pixels are exactly
              %% the pinned bytes, the whole free pages the rest.
              Count = fun(Ks) ->
                              Colours = lists:append([maps:get(atom_to_list(K), L) || K <- Ks]),
                              length([1 || Y <- lists:seq(0, 7), X <- lists:seq(0, 255),
                                           lists:member(px(Img, X, Y), Colours)])
                      end,
              ?assertEqual(maps:get(pinned_bytes, arena0()), 16 * Count([free, fast])),
              ?assertEqual(2 * ?PAGE, 16 * Count([free_pages])),
              %% The non-main heap: headers drawn as meta, then the chunks.
              Heap = assert_pixels(Out, "arena1-seg0.png",
                                   [{0, 0, meta, start}, {?HEAP_HDR div 16 - 1, 0, meta, normal},
                                    {?HEAP_HDR div 16, 0, in_use, start},
                                    {0, 1, free, start}, {100, 1, free, normal},
                                    {2, 2, free_pages, stroke}, {3, 2, free_pages, faded},
                                    {100, 3, top, normal},
                                    {254, 3, meta, start}, {255, 3, meta, normal}]),
              ?assertMatch(#{width := 256, height := 4}, Heap)
      end).

%% Issue 28: a dump's site labels are bytes from the symbolizer: invalid
%% UTF-8 and a terminal payload render, escaped, in the page (the reader
%% refuses a glibc version that is not printable ASCII; format_header/1,
%% which the escript prints, escapes one given to it all the same).
odd_text_test() ->
    with_tmpdir(
      fun(Dir) ->
              Bad = <<"bad", 8#377, 8#376, "utf8">>,
              Ansi = <<"ansi\e[31mRED\e]0;pwned-title", 7, "\e[2Jend">>,
              Spec = (tracked())#{sites => [{1, 136672, 3, Bad}, {2, 512, 1, Ansi}]},
              {_, Files} = render(dump_file(Dir, "odd.heapdump", ?W:dump(Spec))),
              {ok, Html} = file:read_file(hd(Files)),
              ?assert(is_binary(unicode:characters_to_binary(Html))),
              ?assertEqual([], [C || <<C/utf8>> <= Html, C < 32, C =/= $\n]),
              [?assertNotEqual({T, nomatch}, {T, binary:match(Html, T)})
               || T <- [<<"bad\\xFF\\xFEutf8">>,
                        <<"ansi\\x1B[31mRED\\x1B]0;pwned-title\\x07">>]],
              Header = #{pid => 1, time_ms => 0, glibc => <<"2.36", 16#9B, "\e]0;t", 7>>,
                         page_size => 4096, heap_max => 1, tracker => false},
              Line = unicode:characters_to_binary(mallocinfo_heapmap:format_header(Header)),
              ?assertMatch({_, _}, binary:match(Line, <<"glibc 2.36\\x9B\\x1B]0;t\\x07, page">>))
      end).

tracked_colours_test() ->
    with_tmpdir(
      fun(Dir) ->
              {Out, Files} = render(Dir, "t.heapdump", tracked()),
              ?assertEqual(["index.html", "arena0-seg0.png", "arena1-seg0.png", "mmap.png"],
                           [filename:basename(F) || F <- Files]),
              %% Site 1 has the most live bytes, then site 2; 65535 is "other".
              assert_pixels(Out, "arena0-seg0.png",
                            [{0, 0, "1", start}, {40, 0, "2", normal}, {70, 0, "1", normal},
                             {140, 0, in_use, normal}, {10, 4, "other", normal},
                             {65, 0, free, normal}]),
              {_, L} = image(Out, "arena0-seg0.png"),
              ?assertEqual(3, length(lists:usort([colour(L, K, normal) || K <- ["1", "2", "other"]]))),
              %% 135168 bytes = 8448 pixels = 33 rows of 256.
              Mmap = assert_pixels(Out, "mmap.png",
                                   [{0, 0, mmap, start}, {1, 0, mmap, normal},
                                    {255, 32, mmap, normal}]),
              ?assertMatch(#{width := 256, height := 33}, Mmap),
              {ok, Html} = file:read_file(filename:join(Out, "index.html")),
              %% Site labels are escaped, the header is there.
              ?assertNotEqual(nomatch, binary:match(Html, <<"cache_put &lt; &lt;b&gt;&amp;amp;">>)),
              ?assertEqual(nomatch, binary:match(Html, <<"<b>&amp;">>)),
              ?assertNotEqual(nomatch, binary:match(Html, <<"glibc 2.36">>)),
              ?assertNotEqual(nomatch, binary:match(Html, <<"Heap map of pid 4242">>))
      end).

%% Big segments are scaled: 128 MiB is 1024 pixels of 64 bytes across
%% (64 KiB per row), 2048 rows. A pixel takes the kind with most of its
%% bytes; on a tie the lower address wins.
scaled_test() ->
    Chunks = [{in_use, 1 bsl 20}, {free, 64 bsl 20}, {in_use, 32}, {free, 96},
              {top, (128 bsl 20) - (1 bsl 20) - (64 bsl 20) - 128}],
    Spec = #{heap_max => 256 bsl 20,
             arenas => [#{segments => [#{base => 16#100000000, chunks => Chunks}]}]},
    with_tmpdir(
      fun(Dir) ->
              {Out, _} = render(Dir, "big.heapdump", Spec),
              Mixed = (1 bsl 20) + (64 bsl 20),
              %% Pixel of the byte at Offset: 64 bytes a pixel, 64 KiB a row.
              At = fun(Offset, K, V) -> {(Offset rem 65536) div 64, Offset div 65536, K, V} end,
              Img = assert_pixels(Out, "arena0-seg0.png",
                                  [At(0, in_use, start), At(1000, in_use, normal),
                                   At(1 bsl 20, free, start), At((1 bsl 20) + 4000, free, normal),
                                   At((1 bsl 20) + 4096, free_pages, normal),
                                   At(2 bsl 20, free_pages, normal),
                                   %% 32 bytes in use + 32 free: a tie, in_use is
                                   %% first (and starts here).
                                   At(Mixed, in_use, start),
                                   %% The rest of the free chunk: 64 bytes, no
                                   %% chunk starts in it.
                                   At(Mixed + 64, free, normal), At(Mixed + 128, top, start)]),
              ?assertMatch(#{width := 1024, height := 2048}, Img),
              {ok, Html} = file:read_file(filename:join(Out, "index.html")),
              ?assertNotEqual(nomatch, binary:match(Html, <<"One pixel = 64 B, one row = 64.0 KiB">>))
      end).

%% Page-per-row until it would take more than 1024 rows, then wider rows
%% (up to 1024 pixels), then bigger pixels.
layouts_test_() ->
    [{integer_to_list(MiB) ++ " MiB",
      fun() ->
              with_tmpdir(
                fun(Dir) ->
                        Bytes = MiB bsl 20,
                        Spec = #{heap_max => 256 bsl 20,
                                 arenas => [#{segments => [#{base => 16#100000000,
                                                             chunks => [{in_use, 4096},
                                                                        {top, Bytes - 4096}]}]}]},
                        {Out, _} = render(Dir, "l.heapdump", Spec),
                        {Img, _} = image(Out, "arena0-seg0.png"),
                        ?assertMatch(#{width := W, height := H}, Img),
                        {ok, Html} = file:read_file(filename:join(Out, "index.html")),
                        ?assertNotEqual(nomatch, binary:match(Html, list_to_binary(Scale)))
                end)
      end}
     || {MiB, W, H, Scale} <- [{4, 256, 1024, "One pixel = 16 B, one row = 4.0 KiB"},
                               {8, 512, 1024, "One pixel = 16 B, one row = 8.0 KiB"},
                               {16, 1024, 1024, "One pixel = 16 B, one row = 16.0 KiB"},
                               {64, 1024, 2048, "One pixel = 32 B, one row = 32.0 KiB"},
                               {1024, 1024, 2048, "One pixel = 512 B, one row = 512.0 KiB"}]].

%% Nothing but the files: the temporaries were renamed away.
no_temporaries_test_() ->
    {timeout, 120, fun no_temporaries/0}.

no_temporaries() ->
    with_tmpdir(
      fun(Dir) ->
              Path = dump_file(Dir, "k.heapdump", ?W:dump(tracked())),
              {Out, Files} = render(Path),
              {ok, Names} = file:list_dir(Out),
              ?assertEqual(lists:sort([filename:basename(F) || F <- Files]), lists:sort(Names)),
              %% Rendering again over the old files works.
              ?assertEqual({ok, Files}, mallocinfo_heapmap:render(Path, Out)),
              %% Binary paths in, binary paths out; parents are created.
              Deep = list_to_binary(filename:join([Dir, "a", "b", "c"])),
              {ok, BinFiles} = mallocinfo_heapmap:render(list_to_binary(Path), Deep),
              ?assert(lists:all(fun is_binary/1, BinFiles)),
              ?assert(filelib:is_regular(filename:join(Deep, "index.html")))
      end).

%%% Bad dumps -------------------------------------------------------------------

%% Each case: the dump, the reason. render/2 must give the same error and
%% leave no output directory behind.
bad(Dir, Name, Bin, Expected) ->
    Path = dump_file(Dir, Name, Bin),
    Out = filename:join(Dir, Name ++ ".out"),
    R1 = mallocinfo_heapmap:read_summary(Path),
    R2 = mallocinfo_heapmap:render(Path, Out),
    case Expected of
        any -> ?assertMatch({error, {bad_dump, _}}, R1);
        _ -> ?assertEqual({error, {bad_dump, Expected}}, R1)
    end,
    ?assertEqual(R1, R2),
    ?assertNot(filelib:is_file(Out)).

records() ->
    ?W:records(tracked()).

bin(Records) ->
    iolist_to_binary([<<"MIHEAPD\n">> | Records]).

replace(Records, Tag, Fun) ->
    T = ?W:tag(Tag),
    [case R of
         <<T:32/little, _/binary>> -> Fun(R);
         _ -> R
     end || R <- Records].

payload(<<_:64, P/binary>>) -> P.

%% Cut at every record boundary and inside every record of a dump.
truncated_test_() ->
    {timeout, 120, fun truncated/0}.

truncated() ->
    with_tmpdir(
      fun(Dir) ->
              Full = bin(records()),
              Bounds = lists:foldl(fun(R, [B | _] = Acc) -> [B + byte_size(R) | Acc] end,
                                   [8], records()),
              ?assertEqual(byte_size(Full), hd(Bounds)),
              Cuts = lists:usort([0, 3 | tl(Bounds)] ++ [B + 5 || B <- tl(Bounds)]
                                 ++ [B + 11 || B <- tl(Bounds)]),
              [bad(Dir, "cut" ++ integer_to_list(N), binary:part(Full, 0, N), truncated)
               || N <- Cuts, N < byte_size(Full)],
              rand:seed(exsss, {4, 5, 6}),
              [bad(Dir, "rand" ++ integer_to_list(N), binary:part(Full, 0, N), truncated)
               || N <- [rand:uniform(byte_size(Full) - 1) || _ <- lists:seq(1, 40)]],
              %% Nothing was left: only the dumps themselves.
              {ok, Names} = file:list_dir(Dir),
              ?assertEqual([], [N || N <- Names, lists:suffix(".out", N)])
      end).

structural_test_() ->
    {timeout, 120, fun structural/0}.

structural() ->
    with_tmpdir(
      fun(Dir) ->
              Rs = records(),
              Full = bin(Rs),
              [Header | _] = Rs,
              <<_:8/binary, _:32, HRest/binary>> = Header,
              Cases =
                  [{"magic", <<"MIHEAPX\n", (binary:part(Full, 8, byte_size(Full) - 8))/binary>>,
                    bad_magic},
                   {"version", bin([?W:record(header, <<2:32/little, HRest/binary>>) | tl(Rs)]),
                    {unsupported_version, 2}},
                   {"unknown_tag", bin(lists:droplast(Rs) ++ [<<99:32/little, 0:32>>, lists:last(Rs)]),
                    {unknown_tag, 99}},
                   {"trailing", <<Full/binary, 0>>, trailing_data},
                   {"twice_the_end", <<Full/binary, (lists:last(Rs))/binary>>, trailing_data},
                   {"huge_length",
                    bin(replace(Rs, chunks, fun(<<T:32, _:32, P/binary>>) ->
                                                    <<T:32, 16#ffffffff:32, P/binary>>
                                            end)),
                    {bad_length, chunks}},
                   {"pages_length",
                    bin(replace(Rs, pages, fun(R) -> ?W:record(pages, <<(payload(R))/binary, 0>>) end)),
                    {bad_length, pages}},
                   {"chunks_before_segment", bin([Header, ?W:record(chunks, <<32:64/little>>) | tl(Rs)]),
                    {unexpected, chunks}},
                   {"no_header", bin(tl(Rs)), {unexpected, arena}},
                   {"mmap_without_tracker",
                    ?W:dump((known())#{mmaps => [{16#7f0000000000, 4096, 0}]}),
                    tracker_record_without_flag},
                   {"site_without_tracker",
                    ?W:dump((known())#{sites => [{1, 10, 1, <<"x">>}]}),
                    tracker_record_without_flag},
                   {"end_chunks", bin(lists:droplast(Rs) ++ [end_record(13, 2, 2)]),
                    {end_mismatch, chunk_count}},
                   {"end_segments", bin(lists:droplast(Rs) ++ [end_record(14, 3, 2)]),
                    {end_mismatch, segment_count}},
                   {"end_arenas", bin(lists:droplast(Rs) ++ [end_record(14, 2, 1)]),
                    {end_mismatch, arena_count}},
                   {"no_end", bin(lists:droplast(Rs)), truncated},
                   {"arena_order", bin(swap_arena_index(Rs)), {bad_arena, 5}}],
              [bad(Dir, Name, Bin, Why) || {Name, Bin, Why} <- Cases]
      end).

end_record(Chunks, Segs, Arenas) ->
    ?W:record('end', <<Chunks:64/little, Segs:64/little, Arenas:32/little, 0:32>>).

swap_arena_index(Rs) ->
    replace(Rs, arena, fun(R) ->
                               case payload(R) of
                                   <<1:32/little, P/binary>> -> ?W:record(arena, <<5:32/little, P/binary>>);
                                   _ -> R
                               end
                       end).

%% Chunk-level lies: each made by editing one segment of the known heap.
chunks_test_() ->
    {timeout, 120, fun chunks/0}.

chunks() ->
    with_tmpdir(
      fun(Dir) ->
              Main = fun(Chunks, Extra) ->
                             Seg = maps:merge(#{base => ?MAIN, chunks => Chunks}, Extra),
                             ?W:dump(#{arenas => [#{segments => [Seg]}]})
                     end,
              Base = main_chunks(),
              Cases =
                  [%% One more chunk than the segment holds.
                   {"overrun", Main(Base ++ [{in_use, 32}], #{size => 32768}), {chunk_overrun, ?MAIN + 32768}},
                   %% A chunk running past the end.
                   {"overrun_inside", Main(lists:droplast(Base) ++ [{top, 12304}], #{size => 32768}),
                    {chunk_overrun, ?MAIN + 20480}},
                   %% The chunks stop short of the segment's end.
                   {"short", Main(lists:droplast(Base) ++ [{top, 8192}], #{size => 32768}),
                    {chunks_short, ?MAIN + 28672}},
                   {"zero_size", Main([{in_use, 0} | Base], #{}), {bad_chunk, ?MAIN}},
                   {"mmap_kind_in_heap", Main([{mmap, 512} | tl(Base)], #{}), {bad_chunk, ?MAIN}},
                   {"site_without_tracker", Main([{in_use, 512, 7} | tl(Base)], #{}), {bad_chunk, ?MAIN}},
                   {"two_tops", Main([{top, 512} | tl(Base)], #{}), {bad_top, 0}},
                   {"first_unaligned", Main(Base, #{first => ?MAIN + 8, size => 32768}),
                    {bad_segment, ?MAIN}},
                   {"top_mismatch",
                    ?W:dump(#{arenas => [#{top => {?MAIN + 20480, 4096},
                                           segments => [#{base => ?MAIN, chunks => Base}]}]}),
                    {bad_top, 0}},
                   {"free_beyond_system",
                    ?W:dump(#{arenas => [#{system => 4096, segments => [#{base => ?MAIN, chunks => Base}]}]}),
                    {bad_system_bytes, 0}},
                   {"overlap",
                    ?W:dump(#{arenas => [#{segments => [#{base => ?MAIN, chunks => Base}]},
                                         #{segments => [#{base => ?MAIN + 4096, chunks => [{top, 4096}]}]}]}),
                    {overlapping_segments, ?MAIN + 4096}},
                   {"unknown_site",
                    ?W:dump((tracked())#{sites => [{1, 10, 1, <<"x">>}]}), {unknown_site, 2}},
                   %% Kind 9 does not exist.
                   {"bad_kind",
                    bin(replace(?W:records(known()), chunks,
                                fun(R) -> <<W:64/little, P/binary>> = payload(R),
                                          ?W:record(chunks, <<(W bor 9):64/little, P/binary>>)
                                end)),
                    {bad_chunk, ?MAIN}}],
              [bad(Dir, Name, Bin, Why) || {Name, Bin, Why} <- Cases]
      end).

%% Flip every byte of a dump in turn: each result is a summary or a
%% bad_dump, never a crash; a failed render leaves nothing. Flips in the
%% structure (tags, lengths, chunk sizes, counts) are always caught.
flipped_bytes_test_() ->
    {timeout, 120,
     fun() ->
             with_tmpdir(
               fun(Dir) ->
                       Full = bin(records()),
                       Results = [flip(Dir, Full, I) || I <- lists:seq(0, byte_size(Full) - 1)],
                       Caught = [I || {I, {error, {bad_dump, _}}} <- Results],
                       Ok = [I || {I, {ok, _}} <- Results],
                       ?assertEqual(byte_size(Full), length(Caught) + length(Ok)),
                       %% The magic, HEADER's tag and length, the version, every
                       %% later tag byte: all caught.
                       [?assert(lists:member(I, Caught)) || I <- lists:seq(0, 19)],
                       [?assert(lists:member(Off, Caught)) || Off <- tag_offsets(records())],
                       %% Chunk words' size bytes are caught: the segment is no
                       %% longer covered exactly.
                       ChunkSizeBytes = chunk_size_offsets(records()),
                       ?assert(length(ChunkSizeBytes) > 20),
                       [?assert(lists:member(Off, Caught)) || Off <- ChunkSizeBytes],
                       %% The pid and time are not checked: flipping them still reads.
                       [?assert(lists:member(I, Ok)) || I <- lists:seq(8 + 8 + 16, 8 + 8 + 31)]
               end)
     end}.

flip(Dir, Full, I) ->
    <<Pre:I/binary, B, Post/binary>> = Full,
    Path = dump_file(Dir, "flip.heapdump", <<Pre/binary, (B bxor 16#ff), Post/binary>>),
    Out = filename:join(Dir, "flip.out"),
    R = mallocinfo_heapmap:render(Path, Out),
    case R of
        {error, {bad_dump, _}} ->
            ?assertNot(filelib:is_file(Out)),
            ?assertMatch({error, {bad_dump, _}}, mallocinfo_heapmap:read_summary(Path));
        {ok, _} ->
            ok = file:del_dir_r(Out)
    end,
    {I, R}.

tag_offsets(Records) ->
    {Offs, _} = lists:mapfoldl(fun(R, Off) -> {lists:seq(Off, Off + 3), Off + byte_size(R)} end,
                               8, Records),
    lists:append(Offs).

%% The bytes holding bits 4-31 of each chunk word's size (flipping them
%% changes the size by at least 16 bytes and at most 2^32).
chunk_size_offsets(Records) ->
    {Offs, _} = lists:mapfoldl(
                  fun(<<4:32/little, Len:32/little, _/binary>> = R, Off) ->
                          {[Off + 8 + W * 8 + B || W <- lists:seq(0, Len div 8 - 1), B <- [1, 2, 3]],
                           Off + byte_size(R)};
                     (R, Off) ->
                          {[], Off + byte_size(R)}
                  end, 8, Records),
    lists:append(Offs).

%%% Paths and arguments ---------------------------------------------------------

paths_test_() ->
    {timeout, 120, fun paths/0}.

paths() ->
    with_tmpdir(
      fun(Dir) ->
              Good = dump_file(Dir, "k.heapdump", ?W:dump(known())),
              Plain = dump_file(Dir, "plain", <<"x">>),
              ?assertEqual({error, enoent}, mallocinfo_heapmap:read_summary(filename:join(Dir, "none"))),
              ?assertEqual({error, enoent}, mallocinfo_heapmap:render(filename:join(Dir, "none"),
                                                                      filename:join(Dir, "o1"))),
              ?assertEqual({error, eisdir}, mallocinfo_heapmap:read_summary(Dir)),
              ?assertEqual({error, enotdir}, mallocinfo_heapmap:read_summary(filename:join(Plain, "x"))),
              ?assertEqual({error, enotdir}, mallocinfo_heapmap:render(Good, Plain)),
              ?assertEqual({error, enotdir}, mallocinfo_heapmap:render(Good, filename:join(Plain, "sub"))),
              unwritable(Dir, Good),
              {ok, Names} = file:list_dir(Dir),
              ?assertEqual(["k.heapdump", "plain"], lists:sort(Names))
      end).

%% Root ignores permissions: as root use /proc (no new entries: enoent)
%% and /sys (eacces for a file in an existing directory, eperm for a new
%% directory); otherwise a mode 0555 directory.
unwritable(Dir, Good) ->
    case os:cmd("id -u") of
        "0\n" ->
            ?assertEqual({error, enoent}, mallocinfo_heapmap:render(Good, "/proc/mi_heapmap_test")),
            ?assertEqual({error, eacces}, mallocinfo_heapmap:render(Good, "/sys/kernel")),
            ?assertMatch({error, R} when R =:= eperm; R =:= eacces; R =:= erofs,
                         mallocinfo_heapmap:render(Good, "/sys/mi_heapmap_test")),
            ?assertNot(filelib:is_file("/sys/mi_heapmap_test"));
        _ ->
            RO = filename:join(Dir, "ro"),
            ok = file:make_dir(RO),
            ok = file:change_mode(RO, 8#555),
            try
                ?assertEqual({error, eacces}, mallocinfo_heapmap:render(Good, RO)),
                ?assertEqual({error, eacces}, mallocinfo_heapmap:render(Good, filename:join(RO, "x"))),
                ?assertEqual({ok, []}, file:list_dir(RO))
            after
                file:change_mode(RO, 8#755),
                file:del_dir(RO)
            end
    end.

badarg_test() ->
    ?assertError(badarg, mallocinfo_heapmap:read_summary(42)),
    ?assertError(badarg, mallocinfo_heapmap:read_summary(<<"a", 0, "b">>)),
    ?assertError(badarg, mallocinfo_heapmap:read_summary("a\0b")),
    ?assertError(badarg, mallocinfo_heapmap:read_summary([-1])),
    ?assertError(badarg, mallocinfo_heapmap:read_summary(#{})),
    ?assertError(badarg, mallocinfo_heapmap:render("x", 42)),
    ?assertError(badarg, mallocinfo_heapmap:render({a}, "/tmp")),
    ?assertError(badarg, mallocinfo_heapmap:render("x", [foo, {x}])),
    %% Atoms and deep lists are file names.
    ?assertEqual({error, enoent}, mallocinfo_heapmap:read_summary(mi_no_such_file)),
    ?assertEqual({error, enoent}, mallocinfo_heapmap:read_summary(["/nonexistent", ["/", <<"x">>]])).

format_summary_test() ->
    Text = lists:flatten(io_lib:format("~s", [mallocinfo_heapmap:format_summary(
                                                 #{arenas => [arena0(), arena1()], total => totals()})])),
    [Head, A0, A1, Total | _] = string:split(Text, "\n", all),
    ?assertMatch(["arena", "system", "in", "use" | _], string:lexemes(Head, " ")),
    ?assertMatch(["0", "32.0", "KiB", "7.9", "KiB" | _], string:lexemes(A0, " ")),
    ?assertMatch(["1", "16.0", "KiB" | _], string:lexemes(A1, " ")),
    ?assertMatch(["total", "48.0", "KiB" | _], string:lexemes(Total, " ")).
