%% EUnit: the dump reader's own interface, below mallocinfo_heapmap's
%% (whose tests check the figures and every bad dump): what it hands the
%% drawer (segments, their offsets, the second pass over their chunk
%% records, the MMAP records), that the second pass notices a file changed
%% since the first, and its bitmap counting.
-module(mallocinfo_heapmap_read_tests).
-include_lib("eunit/include/eunit.hrl").

-define(W, mi_heapdump_writer).
-define(R, mallocinfo_heapmap_read).

main_chunks() ->
    [{in_use, 512, 1}, {free, 32}, {in_use, 992, 2}, {fast, 64}, {in_use, 2496},
     {free, 12288}, {tcache, 48}, {in_use, 4048, 65535}, {top, 12288}].

%% Arena 0 with one segment, arena 1 with two, three mmapped blocks; the
%% chunk records are cut every 2 words so that a segment spans several.
spec() ->
    #{tracker => true, chunks_per_record => 2,
      arenas => [#{segments => [#{base => 16#10000, chunks => main_chunks(), resident => [3, 7]}]},
                 #{segments => [#{base => 16#4000000, first => 16#4000000 + 2224,
                                  chunks => [{in_use, 1872}, {free, 8192}, {in_use, 4064},
                                             {meta, 32}]},
                                #{base => 16#8000000, first => 16#8000000 + 32,
                                  chunks => [{in_use, 4064}, {top, 8192}]}]}],
      mmaps => [{16#7f0000000000, 135168, 1}, {16#7f0000100000, 4096, 0},
                {16#7f0000200000, 8192, 2}],
      sites => [{1, 136672, 2, <<"a">>}, {2, 9184, 2, <<"b">>}]}.

with_dump(Spec, Fun) ->
    Dir = string:trim(os:cmd("mktemp -d -t mi_heapmap_read_XXXXXX")),
    Path = filename:join(Dir, "d.heapdump"),
    try
        ok = ?W:write(Path, Spec),
        Fun(Path)
    after
        file:del_dir_r(Dir)
    end.

segments_test() ->
    with_dump(spec(),
              fun(Path) ->
                      {ok, #{segments := Segs, header := H}} = ?R:read(Path),
                      ?assertMatch(#{page_size := 4096, tracker := true, pid := 4242}, H),
                      ?assertEqual([{0, 0, 16#10000, 32768, 16#10000, 9, 8},
                                    {1, 0, 16#4000000, 16384, 16#4000000 + 2224, 4, 4},
                                    {1, 1, 16#8000000, 12288, 16#8000000 + 32, 2, 3}],
                                   [{A, I, B, S, F, C, N}
                                    || #{arena := A, index := I, base := B, size := S, first := F,
                                         chunks := C, n_pages := N} <- Segs]),
                      %% Pages 3 and 7 of the first segment are not resident.
                      #{pages := Bitmap} = hd(Segs),
                      ?assertEqual(<<2#01110111>>, Bitmap)
              end).

%% The second pass gives back exactly the words the writer wrote, record
%% by record, for every segment; and the MMAP records' pairs.
second_pass_test() ->
    with_dump(spec(),
              fun(Path) ->
                      {ok, #{segments := Segs, mmap_offsets := Offsets} = Dump} = ?R:read(Path),
                      {ok, Fd} = ?R:open(Path),
                      try
                          Words = [?R:fold_chunks(Fd, Seg, fun(P, Acc) -> Acc ++ [P] end, [])
                                   || Seg <- Segs],
                          Expected = [[<< <<(?W:chunk_word(element(1, C), element(2, C), site(C))):64/little>>
                                          || C <- Group >>
                                       || Group <- groups(Chunks, 2)]
                                      || Chunks <- [main_chunks(),
                                                    [{in_use, 1872}, {free, 8192}, {in_use, 4064},
                                                     {meta, 32}],
                                                    [{in_use, 4064}, {top, 8192}]]],
                          ?assertEqual(Expected, Words),
                          Pairs = ?R:fold_mmaps(Fd, Offsets, fun(P, Acc) -> [P | Acc] end, []),
                          ?assertEqual([<< <<A:64/little, (?W:chunk_word(mmap, S, Site)):64/little>>
                                           || {A, S, Site} <- maps:get(mmaps, spec()) >>],
                                       Pairs),
                          ?assertMatch(#{summary := #{total := #{tracked_mmap_chunks := 3,
                                                                 tracked_mmap_bytes := 147456}}},
                                       Dump)
                      after
                          file:close(Fd)
                      end
              end).

site({_, _}) -> 0;
site({_, _, S}) -> S.

groups([], _) -> [];
groups(L, N) when length(L) =< N -> [L];
groups(L, N) -> {H, T} = lists:split(N, L), [H | groups(T, N)].

%% A file replaced between the passes by one with other chunk records is
%% noticed: the second pass never draws what the first did not check.
changed_between_passes_test() ->
    with_dump(spec(),
              fun(Path) ->
                      {ok, #{segments := [Seg | _], mmap_offsets := Offsets}} = ?R:read(Path),
                      %% One chunk fewer in the first segment (two merged),
                      %% in records of 3 words: every later offset moves.
                      #{arenas := [#{segments := [S0]} = A0 | As]} = Spec = spec(),
                      [C0, _, _ | Rest] = main_chunks(),
                      Merged = S0#{chunks => [C0, {in_use, 1024, 2} | Rest]},
                      ok = ?W:write(Path, Spec#{chunks_per_record => 3,
                                                arenas => [A0#{segments => [Merged]} | As]}),
                      {ok, Fd} = ?R:open(Path),
                      try
                          ?assertThrow({bad_dump, changed_while_reading},
                                       ?R:fold_chunks(Fd, Seg, fun(_, A) -> A end, ok)),
                          ?assertThrow({bad_dump, changed_while_reading},
                                       ?R:fold_mmaps(Fd, Offsets, fun(_, A) -> A end, ok))
                      after
                          file:close(Fd)
                      end
              end).

%% Against a bit-by-bit count, at every alignment and length.
count_bits_test() ->
    rand:seed(exsss, {1, 2, 3}),
    Bm = rand:bytes(40),
    Naive = fun(P, N) ->
                    length([I || I <- lists:seq(P, P + N - 1),
                                 (binary:at(Bm, I div 8) bsr (I rem 8)) band 1 =:= 1])
            end,
    [?assertEqual({P, N, Naive(P, N)}, {P, N, ?R:count_bits(Bm, P, N)})
     || P <- lists:seq(0, 70), N <- lists:seq(0, 320 - P, 7)].
