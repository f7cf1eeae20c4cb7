%% Test-only writer of heap dumps (c_src/heapwalk/dump_format.h, version 1):
%% synthetic heaps described as terms, one record at a time so tests can cut
%% and corrupt dumps at record boundaries, and a streamed generator of a
%% large fragmented heap for the render measurement.
-module(mi_heapdump_writer).

-export([dump/1, records/1, write/2, record/2, chunk_word/3, tag/1, kind/1,
         write_big/2]).

%% The format's constants, from the reader's own copy: a writer and a
%% reader that disagree about a tag cannot both pass.
-include_lib("mallocinfo/src/mallocinfo_heapdump.hrl").

-define(PER_RECORD, ?MAX_CHUNKS_PER_RECORD).

%% Spec:
%%   #{page_size => 4096, tracker => false, pid => 4242, time_ms => ...,
%%     heap_max => 64 MiB, glibc => <<"2.36">>, chunks_per_record => 65536,
%%     arenas => [#{system => Bytes (default: the segments' sizes),
%%                  top => {Address, Size} (default: the top chunk's),
%%                  segments => [#{base, first (default base),
%%                                 size (default: up to the last chunk's end),
%%                                 chunks => [{Kind, Size} | {Kind, Size, Site}],
%%                                 resident => all | none | [PageIndex]}]}],
%%     mmaps => [{Address, Size, Site}],
%%     sites => [{Id, LiveBytes, LiveBlocks, Label}]}
%% Kinds: in_use, free, fast, tcache, top, mmap, meta.

%% The whole file.
dump(Spec) ->
    iolist_to_binary([<<?MAGIC>> | records(Spec)]).

write(Path, Spec) ->
    file:write_file(Path, dump(Spec)).

%% The records after the magic, each a binary.
records(Spec) ->
    PS = maps:get(page_size, Spec, 4096),
    Per = maps:get(chunks_per_record, Spec, ?PER_RECORD),
    Arenas = maps:get(arenas, Spec, []),
    ArenaRecs = [arena_records(I, A, PS, Per)
                 || {I, A} <- lists:zip(lists:seq(0, length(Arenas) - 1), Arenas)],
    Mmaps = case maps:get(mmaps, Spec, []) of
                [] -> [];
                Ms -> [record(mmap, << <<A:64/little, (chunk_word(mmap, S, Site)):64/little>>
                                       || {A, S, Site} <- Ms >>)]
            end,
    Sites = [record(site, <<Id:32/little, 0:32, B:64/little, N:64/little, Label/binary>>)
             || {Id, B, N, Label} <- maps:get(sites, Spec, [])],
    Chunks = lists:sum([length(maps:get(chunks, S)) || A <- Arenas,
                                                       S <- maps:get(segments, A)]),
    Segs = lists:sum([length(maps:get(segments, A)) || A <- Arenas]),
    [header(Spec) | lists:append(ArenaRecs)] ++ Mmaps ++ Sites
        ++ [record('end', <<Chunks:64/little, Segs:64/little, (length(Arenas)):32/little, 0:32>>)].

header(Spec) ->
    Flags = case maps:get(tracker, Spec, false) of true -> ?FLAG_TRACKER; false -> 0 end,
    record(header, <<?VERSION:32/little, (maps:get(page_size, Spec, 4096)):32/little,
                     ?ALIGNMENT:32/little,
                     Flags:32/little, (maps:get(pid, Spec, 4242)):64/little,
                     (maps:get(time_ms, Spec, 1764000000000)):64/little,
                     (maps:get(heap_max, Spec, 64 bsl 20)):64/little,
                     (maps:get(glibc, Spec, <<"2.36">>))/binary>>).

arena_records(I, A, PS, Per) ->
    Segs = [complete(S) || S <- maps:get(segments, A)],
    System = maps:get(system, A, lists:sum([maps:get(size, S) || S <- Segs])),
    {TopAddr, TopSize} = maps:get(top, A, top_of(Segs)),
    Flags = case I of 0 -> ?FLAG_MAIN; _ -> 0 end,
    [record(arena, <<I:32/little, Flags:32/little, (16#1000 + I):64/little,
                     System:64/little, TopAddr:64/little, TopSize:64/little>>)
     | lists:append([segment_records(I, S, PS, Per) || S <- Segs])].

complete(#{base := Base, chunks := Chunks} = S) ->
    First = maps:get(first, S, Base),
    End = First + lists:sum([element(2, C) || C <- Chunks]),
    S#{first => First, size => maps:get(size, S, End - Base)}.

top_of(Segs) ->
    Tops = [{Addr, Size} || S <- Segs, {Addr, {top, Size}} <- addressed(S)],
    case Tops of
        [T | _] -> T;
        [] -> {0, 0}
    end.

addressed(#{first := First, chunks := Chunks}) ->
    {L, _} = lists:mapfoldl(fun(C, Addr) -> {{Addr, {element(1, C), element(2, C)}},
                                             Addr + element(2, C)}
                            end, First, Chunks),
    L.

segment_records(I, #{base := Base, size := Size, first := First, chunks := Chunks} = S, PS, Per) ->
    Main = case maps:get(main, S, I =:= 0) of true -> ?FLAG_MAIN; false -> 0 end,
    Words = [chunk_word(element(1, C), element(2, C), site(C)) || C <- Chunks],
    FirstPage = Base div PS,
    NPages = (Base + Size + PS - 1) div PS - FirstPage,
    Res = maps:get(resident, S, all),
    Bits = << <<(resident(P, Res)):1>> || P <- lists:seq(0, NPages - 1) >>,
    [record(segment, <<I:32/little, Main:32/little, Base:64/little, Size:64/little,
                       First:64/little>>)
     | [record(chunks, << <<W:64/little>> || W <- Group >>) || Group <- groups(Words, Per)]]
        ++ [record(pages, <<(FirstPage * PS):64/little, NPages:64/little,
                            (lsb_first(Bits))/binary>>)].

site({_, _}) -> 0;
site({_, _, Site}) -> Site.

resident(_, all) -> 1;
resident(_, none) -> 0;
resident(P, NonResident) when is_list(NonResident) ->
    case lists:member(P, NonResident) of true -> 0; false -> 1 end.

%% The bitstring has page i as its i-th bit (MSB first); the format wants
%% bit i % 8 of byte i / 8, LSB first.
lsb_first(Bits) ->
    Pad = (8 - bit_size(Bits) rem 8) rem 8,
    << <<B0:1, B1:1, B2:1, B3:1, B4:1, B5:1, B6:1, B7:1>>
       || <<B7:1, B6:1, B5:1, B4:1, B3:1, B2:1, B1:1, B0:1>> <= <<Bits/bits, 0:Pad>> >>.

groups([], _) -> [];
groups(L, N) when length(L) =< N -> [L];
groups(L, N) -> {H, T} = lists:split(N, L), [H | groups(T, N)].

record(Tag, Payload) ->
    <<(tag(Tag)):32/little, (byte_size(Payload)):32/little, Payload/binary>>.

tag(header) -> ?T_HEADER;
tag(arena) -> ?T_ARENA;
tag(segment) -> ?T_SEGMENT;
tag(chunks) -> ?T_CHUNKS;
tag(pages) -> ?T_PAGES;
tag(mmap) -> ?T_MMAP;
tag(site) -> ?T_SITE;
tag('end') -> ?T_END.

kind(in_use) -> ?K_IN_USE;
kind(free) -> ?K_FREE;
kind(fast) -> ?K_FAST;
kind(tcache) -> ?K_TCACHE;
kind(top) -> ?K_TOP;
kind(mmap) -> ?K_MMAP;
kind(meta) -> ?K_META.

chunk_word(Kind, Size, Site) ->
    (Size band ?SIZE_MASK) bor kind(Kind) bor (Site bsl ?SITE_SHIFT).

%%% ---------------------------------------------------------------------------
%%% A big fragmented heap, streamed to a file

%% write_big(Path, #{main_bytes, heaps, heap_bytes, seed}): the main arena's
%% sbrk heap of main_bytes, then `heaps' non-main heaps of heap_bytes in two
%% arenas. Chunks: live blocks of 32..640 bytes with small free holes
%% between them (about one chunk in seven free, fast or tcache), and one
%% chunk in 2000 a free run of 4..64 pages of which every other page is not
%% resident; the last segment of an arena ends with its top chunk, the
%% others with a fencepost. The default is 1 GiB in about 3 million chunks.
%% Returns #{chunks, bytes, file_bytes}.
write_big(Path, Opts) ->
    MainBytes = maps:get(main_bytes, Opts, 512 bsl 20),
    Heaps = maps:get(heaps, Opts, 8),
    HeapBytes = maps:get(heap_bytes, Opts, 64 bsl 20),
    rand:seed(exsss, maps:get(seed, Opts, 42)),
    {ok, Fd} = file:open(Path, [write, raw, binary, delayed_write]),
    ok = file:write(Fd, [<<?MAGIC>>, header(#{})]),
    HeapBase = 16#7f0000000000,
    Layout = [{0, [{16#55550000, MainBytes, 16#55550000, 1}]},
              {1, [{HeapBase + N * (64 bsl 20), HeapBytes, HeapBase + N * (64 bsl 20) + 2224, 0}
                   || N <- lists:seq(0, Heaps div 2 - 1)]},
              {2, [{HeapBase + N * (64 bsl 20), HeapBytes, HeapBase + N * (64 bsl 20) + 2224, 0}
                   || N <- lists:seq(Heaps div 2, Heaps - 1)]}],
    Counts = [big_arena(Fd, I, Segs) || {I, Segs} <- Layout],
    Chunks = lists:sum(Counts),
    NSegs = lists:sum([length(S) || {_, S} <- Layout]),
    ok = file:write(Fd, record('end', <<Chunks:64/little, NSegs:64/little, 3:32/little, 0:32>>)),
    ok = file:close(Fd),
    {ok, #{size := FileBytes}} = file_size(Path),
    #{chunks => Chunks, bytes => MainBytes + Heaps * HeapBytes, file_bytes => FileBytes}.

file_size(Path) ->
    {ok, Info} = file:read_file_info(Path),
    {ok, #{size => element(2, Info)}}.

big_arena(Fd, I, Segs) ->
    %% The top chunk is in the last segment; earlier heaps end in a
    %% fencepost. Walk once to learn it, since ARENA comes first.
    {LastBase, LastSize, _, _} = lists:last(Segs),
    TopSize = 1 bsl 16,
    TopAddr = LastBase + LastSize - TopSize,
    System = lists:sum([S || {_, S, _, _} <- Segs]),
    Flags = case I of 0 -> ?FLAG_MAIN; _ -> 0 end,
    ok = file:write(Fd, record(arena, <<I:32/little, Flags:32/little, 0:64, System:64/little,
                                        TopAddr:64/little, TopSize:64/little>>)),
    lists:sum([big_segment(Fd, I, Seg, Seg =:= lists:last(Segs), TopSize) || Seg <- Segs]).

big_segment(Fd, I, {Base, Size, First, Main}, Last, TopSize) ->
    ok = file:write(Fd, record(segment, <<I:32/little, Main:32/little, Base:64/little,
                                          Size:64/little, First:64/little>>)),
    Tail = case Last of true -> TopSize; false -> 32 end,
    {N, NonRes} = big_chunks(Fd, First, Base + Size - Tail, [], 0, []),
    LastWord = case Last of
                   true -> chunk_word(top, TopSize, 0);
                   false -> chunk_word(meta, 32, 0)
               end,
    ok = file:write(Fd, record(chunks, <<LastWord:64/little>>)),
    PS = 4096,
    FirstPage = Base div PS,
    NPages = (Base + Size + PS - 1) div PS - FirstPage,
    Set = sets:from_list([P - FirstPage || P <- NonRes], [{version, 2}]),
    Bits = << <<(case sets:is_element(P, Set) of true -> 0; false -> 1 end):1>>
              || P <- lists:seq(0, NPages - 1) >>,
    ok = file:write(Fd, record(pages, <<(FirstPage * PS):64/little, NPages:64/little,
                                        (lsb_first(Bits))/binary>>)),
    N + 1.

%% Chunk words up to End, flushed 65536 at a time; non-resident pages are
%% collected (a few per free run).
big_chunks(Fd, Addr, End, Words, N, NonRes) when Addr >= End ->
    flush_words(Fd, Words),
    {N, NonRes};
big_chunks(Fd, Addr, End, Words, N, NonRes) ->
    Left = End - Addr,
    {Kind, Size0} = case rand:uniform(2000) of
                        R when R =< 1 -> {free, (4 + rand:uniform(60)) * 4096};
                        R when R =< 300 -> {free, 16 * (1 + rand:uniform(15))};
                        R when R =< 400 -> {fast, 16 * (1 + rand:uniform(4))};
                        R when R =< 460 -> {tcache, 16 * (1 + rand:uniform(8))};
                        _ -> {in_use, 16 * (1 + rand:uniform(39))}
                    end,
    %% Never leave a gap below the 32-byte minimum chunk.
    Size = case Left - Size0 of
               Gap when Gap < 32 -> Left;
               _ -> Size0
           end,
    NonRes1 = case Kind of
                  free when Size >= 4 * 4096 ->
                      P0 = (Addr + 48 + 4095) div 4096,
                      P1 = (Addr + Size) div 4096,
                      [P || P <- lists:seq(P0, P1 - 1), P rem 2 =:= 0] ++ NonRes;
                  _ ->
                      NonRes
              end,
    Words1 = [chunk_word(Kind, Size, 0) | Words],
    case N rem ?PER_RECORD of
        ?PER_RECORD - 1 ->
            flush_words(Fd, Words1),
            big_chunks(Fd, Addr + Size, End, [], N + 1, NonRes1);
        _ ->
            big_chunks(Fd, Addr + Size, End, Words1, N + 1, NonRes1)
    end.

flush_words(_, []) -> ok;
flush_words(Fd, Words) ->
    ok = file:write(Fd, record(chunks, << <<W:64/little>> || W <- lists:reverse(Words) >>)).
