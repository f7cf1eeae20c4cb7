%% @private The heap dump reader: one streaming pass over a dump file
%% (c_src/heapwalk/dump_format.h) that checks everything and sums every
%% arena, and the second pass the drawer makes over the chunk records.
%% Pure Erlang; {@link mallocinfo_heapmap} is its public face.
%%
%% A dump can hold tens of millions of chunks: it is read record by record
%% (`raw', `read_ahead'), chunk words are matched straight out of each
%% record's payload, and nothing proportional to the number of chunks is
%% kept. What is kept per segment is its page bitmap (32 KiB per GiB of
%% heap) and, while its chunks are read, the page ranges of free chunks
%% that span whole pages.
%%
%% Everything in the file is checked before anyone draws it: magic,
%% version, record order and lengths, chunks covering each segment exactly,
%% the top chunk, PAGES geometry, site ids, END counts, nothing after END.
%% A bad file gives `{error, {bad_dump, Why}}'.
-module(mallocinfo_heapmap_read).

-include_lib("kernel/include/file.hrl").
-include("mallocinfo_heapdump.hrl").

-export([read/1, open/1, fold_chunks/4, fold_mmaps/4, count_bits/3]).

-export_type([dump/0, segment/0, sites/0]).

%% What read/1 learnt: the summary and header the public API returns, and
%% what the drawer needs to read the chunks again.
-type dump() :: #{header := mallocinfo_heapmap:header(),
                  summary := mallocinfo_heapmap:summary(),
                  segments := [segment()],
                  mmap_offsets := [non_neg_integer()],
                  sites := sites()}.
%% A heap segment, in dump order. `index' counts the arena's segments
%% from 0; `offset' is where its first CHUNKS record starts in the file;
%% `pages' the PAGES bitmap (LSB first, bit i = page i resident) of its
%% `n_pages' pages, the first being the one holding `base'.
-type segment() :: #{arena := non_neg_integer(), index := non_neg_integer(),
                     base := non_neg_integer(), size := pos_integer(),
                     first := non_neg_integer(), offset := non_neg_integer(),
                     chunks := non_neg_integer(), pages := binary(),
                     n_pages := non_neg_integer()}.
%% SITE records: Id => {LiveBytes, LiveBlocks, Label}.
-type sites() :: #{1..?SITE_OTHER => {non_neg_integer(), non_neg_integer(), binary()}}.

%% sizeof(struct malloc_chunk): malloc_trim keeps a chunk's header and its
%% free-list pointers, so only whole pages beyond them can be released.
-define(CHUNK_KEEP, 48).
%% What glibc's systrim keeps of the main arena's top: MINSIZE + 1.
-define(TOP_KEEP, 33).
-define(MAX_CHUNKS_LEN, (?MAX_CHUNKS_PER_RECORD * 8)).
%% Bounds on what a length field may make us read, before reading it.
-define(MAX_MMAP_LEN, 1 bsl 24).
-define(MAX_SITE_LEN, 24 + 65536).
-define(MAX_HEADER_LEN, 40 + 256).
%% No real heap segment is this big; the cap bounds the PAGES bitmap a
%% corrupt size could make us read (32 MiB at 4 KiB pages).
-define(MAX_SEGMENT, 1 bsl 40).

-record(hdr, {page_size, shift, tracker, flags, pid, time_ms, heap_max, glibc}).

%% Running totals of one arena (and, reset per segment, `ranges').
-record(acc, {in_use = 0, free = 0, fast = 0, tcache = 0, top = 0, meta = 0,
              free_chunks = 0, largest = 0,
              whole = 0,          % bytes of whole pages inside free/fast chunks
              live = 0, live_n = 0, unrec = 0,
              tops = [],          % [{Address, Size}] of top chunks
              ranges = <<>>,      % <<FirstPage:32, Pages:32>> of free/fast/top
                                  % chunks' whole pages, relative to the segment
              resident = 0, trimmable = 0}).

-record(seg, {arena, flags, base, size, first, offset, chunks = 0, pages}).
-record(arena, {index, flags, address, system, top_address, top_size, segs = [],
                acc = #acc{}}).

-record(scan, {fd, hdr,
               phase = header,    % header | arenas | segment | mmap | sites
               arenas = [],       % finished #arena{}, newest first
               arena,             % the open #arena{} or undefined
               seg,               % the open #seg{} or undefined
               addr = 0,          % next chunk address in the open segment
               sites = #{},       % Id => {LiveBytes, LiveBlocks, Label}
               used,              % atomics: site ids seen on chunks
               mmap_bytes = 0, mmap_chunks = 0, mmap_offsets = [],
               chunk_count = 0, seg_count = 0}).

%%% ---------------------------------------------------------------------------
%%% API

%% Reads and checks the whole dump at `Path' (a file name, already
%% validated): `{error, Posix}' when it cannot be read, `{error, {bad_dump,
%% Why}}' when it is not a complete, self-consistent version 1 dump.
-spec read(file:filename_all()) ->
          {ok, dump()} | {error, file:posix() | {bad_dump, mallocinfo_heapmap:bad_dump()}}.
read(Path) ->
    case open(Path) of
        {ok, Fd} ->
            try
                {ok, dump(scan_file(Fd))}
            catch
                throw:{bad_dump, _} = Why -> {error, Why};
                throw:{posix, Posix} -> {error, Posix}
            after
                file:close(Fd)
            end;
        {error, _} = E ->
            E
    end.

%% Opens a dump for reading, as read/1 does. Only a regular file (symbolic
%% links followed) is opened: a directory is `eisdir', a FIFO, device or
%% socket `eftype', refused before open(2), which would block on a FIFO
%% until something writes to it (for good on a FIFO nobody writes).
-spec open(file:filename_all()) -> {ok, file:io_device()} | {error, file:posix()}.
open(Path) ->
    case file:read_file_info(Path, [raw]) of
        {ok, #file_info{type = regular}} ->
            file:open(Path, [read, raw, binary, {read_ahead, 1 bsl 20}]);
        {ok, #file_info{type = directory}} ->
            {error, eisdir};
        {ok, #file_info{}} ->
            {error, eftype};
        {error, _} = E ->
            E
    end.

%% The second pass over one segment of a dump read/1 accepted: folds
%% `Fun(Payload, Acc)' over its CHUNKS records' payloads (whole chunk
%% words), in order. Throws `{bad_dump, changed_while_reading}' when the
%% records are not what read/1 saw, `{posix, Posix}' on a read error.
-spec fold_chunks(file:io_device(), segment(), fun((binary(), Acc) -> Acc), Acc) -> Acc.
fold_chunks(Fd, #{offset := Offset, chunks := N}, Fun, Acc0) ->
    {ok, _} = file:position(Fd, Offset),
    {Count, Acc} = chunk_records(Fd, Fun, 0, Acc0),
    Count =:= N orelse changed(),
    Acc.

chunk_records(Fd, Fun, Count, Acc) ->
    case read_exact(Fd, 8) of
        <<?T_CHUNKS:32/little, Len:32/little>> when Len > 0, Len =< ?MAX_CHUNKS_LEN,
                                                    Len rem 8 =:= 0 ->
            chunk_records(Fd, Fun, Count + Len div 8, Fun(read_exact(Fd, Len), Acc));
        <<?T_PAGES:32/little, _:32>> ->
            {Count, Acc};
        _ ->
            changed()
    end.

%% Likewise over the MMAP records at `Offsets' (the dump's
%% `mmap_offsets'): `Fun(Payload, Acc)', each payload whole
%% <<Address:64, Word:64>> pairs.
-spec fold_mmaps(file:io_device(), [non_neg_integer()], fun((binary(), Acc) -> Acc), Acc) -> Acc.
fold_mmaps(Fd, Offsets, Fun, Acc0) ->
    lists:foldl(
      fun(Offset, Acc) ->
              {ok, _} = file:position(Fd, Offset),
              case read_exact(Fd, 8) of
                  <<?T_MMAP:32/little, Len:32/little>> when Len > 0, Len =< ?MAX_MMAP_LEN,
                                                            Len rem 16 =:= 0 ->
                      Fun(read_exact(Fd, Len), Acc);
                  _ ->
                      changed()
              end
      end, Acc0, Offsets).

changed() -> throw({bad_dump, changed_while_reading}).

%% Set bits among bits [P, P + N) of an LSB-first bitmap (a PAGES bitmap:
%% resident pages).
-spec count_bits(binary(), non_neg_integer(), non_neg_integer()) -> non_neg_integer().
count_bits(_, _, 0) ->
    0;
count_bits(Bm, P, N) when P band 7 =/= 0; N < 8 ->
    bit(Bm, P) + count_bits(Bm, P + 1, N - 1);
count_bits(Bm, P, N) ->
    Bytes = N bsr 3,
    popcount(binary:part(Bm, P bsr 3, Bytes), 0) + count_bits(Bm, P + Bytes * 8, N band 7).

bit(Bm, P) -> (binary:at(Bm, P bsr 3) bsr (P band 7)) band 1.

popcount(<<X:32, Rest/binary>>, N) ->
    X1 = X - ((X bsr 1) band 16#55555555),
    X2 = (X1 band 16#33333333) + ((X1 bsr 2) band 16#33333333),
    X3 = (X2 + (X2 bsr 4)) band 16#0f0f0f0f,
    popcount(Rest, N + (((X3 * 16#01010101) bsr 24) band 16#ff));
popcount(<<X, Rest/binary>>, N) ->
    popcount(Rest, N + bit_count(X));
popcount(<<>>, N) ->
    N.

bit_count(0) -> 0;
bit_count(X) -> (X band 1) + bit_count(X bsr 1).

%%% ---------------------------------------------------------------------------
%%% Reading: one pass, everything checked

bad(Why) -> throw({bad_dump, Why}).

scan_file(Fd) ->
    case read_exact(Fd, 8) of
        <<?MAGIC>> -> ok;
        _ -> bad(bad_magic)
    end,
    records(#scan{fd = Fd, used = atomics:new(?SITE_OTHER, [{signed, false}])}).

read_exact(Fd, N) ->
    case file:read(Fd, N) of
        {ok, Bin} when byte_size(Bin) =:= N -> Bin;
        {ok, _} -> bad(truncated);
        eof -> bad(truncated);
        {error, Posix} -> throw({posix, Posix})
    end.

records(#scan{fd = Fd} = S) ->
    {ok, Offset} = file:position(Fd, cur),
    <<Tag:32/little, Len:32/little>> = read_exact(Fd, 8),
    check_length(Tag, Len, S),
    Payload = read_exact(Fd, Len),
    case record(Tag, Payload, Offset, S) of
        {done, S1} ->
            case file:read(Fd, 1) of
                eof -> S1;
                {ok, _} -> bad(trailing_data);
                {error, Posix} -> throw({posix, Posix})
            end;
        S1 ->
            records(S1)
    end.

%% Lengths are checked before a payload is read, so a corrupt length cannot
%% make us allocate gigabytes.
check_length(?T_HEADER, Len, _) when Len >= 4, Len =< ?MAX_HEADER_LEN -> ok;
check_length(?T_ARENA, 40, _) -> ok;
check_length(?T_SEGMENT, 32, _) -> ok;
check_length(?T_CHUNKS, Len, _) when Len > 0, Len =< ?MAX_CHUNKS_LEN, Len rem 8 =:= 0 -> ok;
check_length(?T_PAGES, Len, #scan{phase = segment, seg = Seg, hdr = H}) ->
    {_, N} = page_span(Seg, H),
    Len =:= 16 + (N + 7) div 8 orelse bad({bad_length, pages}),
    ok;
check_length(?T_PAGES, _, _) -> bad({unexpected, pages});
check_length(?T_MMAP, Len, _) when Len > 0, Len =< ?MAX_MMAP_LEN, Len rem 16 =:= 0 -> ok;
check_length(?T_SITE, Len, _) when Len >= 24, Len =< ?MAX_SITE_LEN -> ok;
check_length(?T_END, 24, _) -> ok;
check_length(Tag, _, _) when Tag >= ?T_HEADER, Tag =< ?T_END -> bad({bad_length, tag_name(Tag)});
check_length(Tag, _, _) -> bad({unknown_tag, Tag}).

tag_name(?T_HEADER) -> header;
tag_name(?T_ARENA) -> arena;
tag_name(?T_SEGMENT) -> segment;
tag_name(?T_CHUNKS) -> chunks;
tag_name(?T_PAGES) -> pages;
tag_name(?T_MMAP) -> mmap;
tag_name(?T_SITE) -> site;
tag_name(?T_END) -> 'end'.

%% The record grammar: HEADER (ARENA (SEGMENT CHUNKS* PAGES)*)* MMAP* SITE* END.
record(?T_HEADER, Payload, _, #scan{phase = header} = S) ->
    S#scan{hdr = header(Payload), phase = arenas};
record(?T_ARENA, Payload, _, #scan{phase = arenas} = S) ->
    S1 = close_arena(S),
    S1#scan{arena = arena(Payload, length(S1#scan.arenas))};
record(?T_SEGMENT, Payload, Offset, #scan{phase = arenas, arena = #arena{} = A} = S) ->
    Seg = segment(Payload, A, S#scan.hdr),
    Acc = A#arena.acc,
    S#scan{phase = segment, seg = Seg#seg{offset = Offset + 8 + 32},
           addr = Seg#seg.first, arena = A#arena{acc = Acc#acc{ranges = <<>>}}};
record(?T_CHUNKS, Payload, _, #scan{phase = segment} = S) ->
    chunks(Payload, S);
record(?T_PAGES, Payload, _, #scan{phase = segment} = S) ->
    pages(Payload, S);
record(?T_MMAP, Payload, Offset, #scan{phase = P} = S) when P =:= arenas; P =:= mmap ->
    S1 = close_arena(S),
    tracker_record(S1),
    {Count, Bytes} = mmaps(Payload, 0, 0, S1#scan.used),
    S1#scan{phase = mmap, mmap_bytes = S1#scan.mmap_bytes + Bytes,
            mmap_chunks = S1#scan.mmap_chunks + Count,
            mmap_offsets = [Offset | S1#scan.mmap_offsets]};
record(?T_SITE, Payload, _, #scan{phase = P} = S) when P =:= arenas; P =:= mmap; P =:= sites ->
    S1 = close_arena(S),
    tracker_record(S1),
    {Id, Site} = site(Payload),
    maps:is_key(Id, S1#scan.sites) andalso bad({duplicate_site, Id}),
    S1#scan{phase = sites, sites = (S1#scan.sites)#{Id => Site}};
record(?T_END, Payload, _, #scan{phase = P} = S) when P =:= arenas; P =:= mmap; P =:= sites ->
    S1 = close_arena(S),
    <<Chunks:64/little, Segs:64/little, Arenas:32/little, Reserved:32/little>> = Payload,
    Chunks =:= S1#scan.chunk_count orelse bad({end_mismatch, chunk_count}),
    Segs =:= S1#scan.seg_count orelse bad({end_mismatch, segment_count}),
    Arenas =:= length(S1#scan.arenas) orelse bad({end_mismatch, arena_count}),
    Reserved =:= 0 orelse bad({end_mismatch, reserved}),
    check_sites(S1),
    check_overlap(S1#scan.arenas),
    {done, S1#scan{arenas = lists:reverse(S1#scan.arenas),
                   mmap_offsets = lists:reverse(S1#scan.mmap_offsets)}};
record(Tag, _, _, _) ->
    bad({unexpected, tag_name(Tag)}).

header(<<Version:32/little, _/binary>>) when Version =/= ?VERSION ->
    bad({unsupported_version, Version});
header(<<_:32, PS:32/little, Align:32/little, Flags:32/little, Pid:64/little,
         Time:64/little, HeapMax:64/little, Glibc/binary>>) ->
    (PS >= 4096 andalso PS =< 1 bsl 30 andalso PS band (PS - 1) =:= 0)
        orelse bad({bad_header, page_size}),
    Align =:= ?ALIGNMENT orelse bad({bad_header, alignment}),
    Flags band (bnot ?FLAG_TRACKER) =:= 0 orelse bad({bad_header, flags}),
    (HeapMax > 0 andalso HeapMax rem PS =:= 0) orelse bad({bad_header, heap_max}),
    lists:all(fun(C) -> C >= 32 andalso C < 127 end, binary_to_list(Glibc))
        orelse bad({bad_header, glibc_version}),
    #hdr{page_size = PS, shift = log2(PS), tracker = Flags band ?FLAG_TRACKER =/= 0,
         flags = Flags, pid = Pid, time_ms = Time, heap_max = HeapMax, glibc = Glibc};
header(_) ->
    bad({bad_length, header}).

log2(1) -> 0;
log2(N) -> 1 + log2(N bsr 1).

arena(<<Index:32/little, Flags:32/little, Addr:64/little, System:64/little,
        TopAddr:64/little, TopSize:64/little>>, Expected) ->
    Index =:= Expected orelse bad({bad_arena, Index}),
    Flags =:= (case Index of 0 -> ?FLAG_MAIN; _ -> 0 end) orelse bad({bad_arena, Index}),
    #arena{index = Index, flags = Flags, address = Addr, system = System,
           top_address = TopAddr, top_size = TopSize}.

segment(<<AIdx:32/little, Flags:32/little, Base:64/little, Size:64/little, First:64/little>>,
        #arena{index = Index}, #hdr{heap_max = HeapMax}) ->
    Ok = AIdx =:= Index
        andalso (Flags =:= 0 orelse (Flags =:= ?FLAG_MAIN andalso Index =:= 0))
        andalso Size > 0 andalso Size =< ?MAX_SEGMENT
        andalso (Flags =:= ?FLAG_MAIN orelse Size =< HeapMax)
        andalso Base + Size =< 1 bsl 64
        andalso First >= Base andalso First =< Base + Size
        andalso First rem ?ALIGNMENT =:= 0,
    Ok orelse bad({bad_segment, Base}),
    #seg{arena = Index, flags = Flags, base = Base, size = Size, first = First}.

%% First page number and page count of the PAGES bitmap of a segment:
%% [floor(base), ceil(base + size)).
page_span(#seg{base = Base, size = Size}, #hdr{page_size = PS, shift = Sh}) ->
    First = Base bsr Sh,
    {First, ((Base + Size + PS - 1) bsr Sh) - First}.

chunks(Payload, #scan{seg = #seg{base = Base, size = Size} = Seg, addr = Addr, hdr = H,
                      arena = #arena{acc = Acc} = A, used = Used} = S) ->
    Ctx = {H#hdr.shift, H#hdr.page_size, H#hdr.tracker, Base bsr H#hdr.shift, Used,
           Seg#seg.flags band ?FLAG_MAIN =/= 0},
    {Next, Acc1} = words(Payload, Addr, Base + Size, Ctx, Acc),
    N = byte_size(Payload) div 8,
    S#scan{addr = Next, arena = A#arena{acc = Acc1},
           seg = Seg#seg{chunks = Seg#seg.chunks + N},
           chunk_count = S#scan.chunk_count + N}.

words(<<W:64/little, Rest/binary>>, Addr, End, Ctx, Acc) ->
    Size = W band ?SIZE_MASK,
    Next = Addr + Size,
    if
        Size =:= 0 -> bad({bad_chunk, Addr});
        Next > End -> bad({chunk_overrun, Addr});
        true -> words(Rest, Next, End, Ctx, chunk(W band 15, W bsr ?SITE_SHIFT, Addr, Size, Ctx, Acc))
    end;
words(<<>>, Addr, _, _, Acc) ->
    {Addr, Acc}.

chunk(?K_IN_USE, 0, _, Size, {_, _, true, _, _, _}, A) ->
    A#acc{in_use = A#acc.in_use + Size, unrec = A#acc.unrec + Size};
chunk(?K_IN_USE, 0, _, Size, _, A) ->
    A#acc{in_use = A#acc.in_use + Size};
chunk(?K_IN_USE, Site, _, Size, {_, _, true, _, Used, _}, A) ->
    atomics:put(Used, Site, 1),
    A#acc{in_use = A#acc.in_use + Size, live = A#acc.live + Size, live_n = A#acc.live_n + 1};
chunk(_, Site, Addr, _, _, _) when Site =/= 0 ->
    %% Sites only on live blocks, and only with tracker data.
    bad({bad_chunk, Addr});
chunk(?K_FREE, _, Addr, Size, Ctx, A) ->
    free_pages(Addr, Size, Ctx, A#acc{free = A#acc.free + Size, free_chunks = A#acc.free_chunks + 1,
                                      largest = max(A#acc.largest, Size)});
chunk(?K_FAST, _, Addr, Size, Ctx, A) ->
    free_pages(Addr, Size, Ctx, A#acc{fast = A#acc.fast + Size, free_chunks = A#acc.free_chunks + 1,
                                      largest = max(A#acc.largest, Size)});
chunk(?K_TCACHE, _, _, Size, _, A) ->
    A#acc{tcache = A#acc.tcache + Size, free_chunks = A#acc.free_chunks + 1,
          largest = max(A#acc.largest, Size)};
chunk(?K_TOP, _, Addr, Size, Ctx, A) ->
    top_pages(Addr, Size, Ctx, A#acc{top = A#acc.top + Size, largest = max(A#acc.largest, Size),
                                     tops = [{Addr, Size} | A#acc.tops]});
chunk(?K_META, _, _, Size, _, A) ->
    A#acc{meta = A#acc.meta + Size};
chunk(_, _, Addr, _, _, _) ->
    bad({bad_chunk, Addr}).

%% The whole pages in [Addr + 48, Addr + Size): remembered for the resident
%% count once PAGES arrives, and (free and fast chunks) subtracted from the
%% pinned bytes.
free_pages(Addr, Size, {Sh, PS, _, FirstPage, _, _}, A) ->
    P0 = (Addr + ?CHUNK_KEEP + PS - 1) bsr Sh,
    P1 = (Addr + Size) bsr Sh,
    if
        P1 > P0 ->
            A#acc{whole = A#acc.whole + ((P1 - P0) bsl Sh),
                  ranges = <<(A#acc.ranges)/binary, (P0 - FirstPage):32, (P1 - P0):32>>};
        true ->
            A
    end.

%% malloc_trim gives back only the main arena's top (systrim: its whole
%% pages beyond MINSIZE + 1 = 33 bytes, from the end); the other arenas'
%% tops shrink only in free().
top_pages(Addr, Size, {Sh, _, _, FirstPage, _, true}, A) when Size > ?TOP_KEEP ->
    P1 = (Addr + Size) bsr Sh,
    P0 = P1 - ((Size - ?TOP_KEEP) bsr Sh),
    case P1 > P0 of
        true -> A#acc{ranges = <<(A#acc.ranges)/binary, (P0 - FirstPage):32, (P1 - P0):32>>};
        false -> A
    end;
top_pages(_, _, _, A) ->
    A.

pages(<<FirstAddr:64/little, N:64/little, Bitmap/binary>>,
      #scan{seg = #seg{base = Base, size = Size} = Seg, addr = Addr, hdr = H,
            arena = #arena{acc = Acc, segs = Segs} = A} = S) ->
    Addr =:= Base + Size orelse bad({chunks_short, Addr}),
    {FirstPage, Pages} = page_span(Seg, H),
    (FirstAddr =:= FirstPage bsl H#hdr.shift andalso N =:= Pages)
        orelse bad({bad_pages, Base}),
    Resident = count_bits(Bitmap, 0, N),
    Trim = lists:sum([count_bits(Bitmap, P, L) || <<P:32, L:32>> <= Acc#acc.ranges]),
    PS = H#hdr.page_size,
    Acc1 = Acc#acc{resident = Acc#acc.resident + Resident * PS,
                   trimmable = Acc#acc.trimmable + Trim * PS, ranges = <<>>},
    S#scan{phase = arenas, seg = undefined, seg_count = S#scan.seg_count + 1,
           arena = A#arena{acc = Acc1, segs = [Seg#seg{pages = Bitmap} | Segs]}}.

close_arena(#scan{arena = undefined} = S) ->
    S;
close_arena(#scan{arena = #arena{index = I, system = System, acc = Acc, segs = Segs} = A,
                  arenas = Done} = S) ->
    case {Acc#acc.tops, A#arena.top_size} of
        {[], 0} -> ok;
        {[{Addr, Size}], Size} when Addr =:= A#arena.top_address -> ok;
        _ -> bad({bad_top, I})
    end,
    Acc#acc.free + Acc#acc.fast + Acc#acc.top =< System orelse bad({bad_system_bytes, I}),
    S#scan{arena = undefined, arenas = [A#arena{segs = lists:reverse(Segs)} | Done]}.

tracker_record(#scan{hdr = #hdr{tracker = true}}) -> ok;
tracker_record(_) -> bad(tracker_record_without_flag).

mmaps(<<Addr:64/little, W:64/little, Rest/binary>>, N, Bytes, Used) ->
    Size = W band ?SIZE_MASK,
    (W band 15 =:= ?K_MMAP andalso Size > 0) orelse bad({bad_mmap, Addr}),
    case W bsr ?SITE_SHIFT of
        0 -> ok;
        Site -> atomics:put(Used, Site, 1)
    end,
    mmaps(Rest, N + 1, Bytes + Size, Used);
mmaps(<<>>, N, Bytes, _) ->
    {N, Bytes}.

site(<<Id:32/little, Reserved:32/little, Bytes:64/little, Blocks:64/little, Label/binary>>) ->
    (Id >= 1 andalso Id =< ?SITE_OTHER andalso Reserved =:= 0) orelse bad({bad_site, Id}),
    %% Symbols are bytes: kept as they are; the page shows them escaped
    %% where they are not UTF-8 (mallocinfo_text).
    {Id, {Bytes, Blocks, Label}}.

%% Every site id on a chunk names a SITE record, except "other".
check_sites(#scan{used = Used, sites = Sites}) ->
    lists:foreach(fun(Id) ->
                          atomics:get(Used, Id) =:= 1 andalso not maps:is_key(Id, Sites)
                              andalso bad({unknown_site, Id})
                  end, lists:seq(1, ?SITE_OTHER - 1)).

check_overlap(Arenas) ->
    Spans = lists:sort([{B, B + Sz} || #arena{segs = Segs} <- Arenas,
                                       #seg{base = B, size = Sz} <- Segs]),
    lists:foldl(fun({B, E}, PrevEnd) ->
                        B >= PrevEnd orelse bad({overlapping_segments, B}),
                        E
                end, 0, Spans),
    ok.

%%% ---------------------------------------------------------------------------
%%% What the scan found, as the rest of the heap map takes it

dump(#scan{hdr = H, arenas = Arenas, sites = Sites, mmap_offsets = Offsets} = S) ->
    #{header => header_map(H),
      summary => summary(S),
      segments => [segment_map(N, Seg, H)
                   || #arena{segs = Segs} <- Arenas,
                      {N, Seg} <- lists:zip(lists:seq(0, length(Segs) - 1), Segs)],
      mmap_offsets => Offsets,
      sites => Sites}.

header_map(#hdr{pid = Pid, time_ms = T, glibc = G, page_size = PS, heap_max = HM,
                tracker = Tr}) ->
    #{pid => Pid, time_ms => T, glibc => G, page_size => PS, heap_max => HM, tracker => Tr}.

segment_map(N, #seg{arena = A, base = B, size = Sz, first = F, offset = O, chunks = C,
                    pages = Pages} = Seg, H) ->
    {_, NPages} = page_span(Seg, H),
    #{arena => A, index => N, base => B, size => Sz, first => F, offset => O, chunks => C,
      pages => Pages, n_pages => NPages}.

%% Per arena the same figures as the live summary (mallocinfo_heap), and
%% their totals summed by the same function (mallocinfo_heapmap_summary),
%% so the two cannot drift.
summary(#scan{arenas = Arenas, hdr = #hdr{tracker = Tracker}} = S) ->
    Per = [arena_summary(A, Tracker) || A <- Arenas],
    %% totals/1 takes the tracker's keys from the arenas; a dump with
    %% tracker data and no arena still has them.
    NoLive = case Tracker of
                 true -> #{live_bytes => 0, live_chunks => 0, unrecorded_bytes => 0};
                 false -> #{}
             end,
    Total = maps:merge(NoLive, mallocinfo_heapmap_summary:totals(Per)),
    #{arenas => Per,
      total => Total#{tracked_mmap_bytes => S#scan.mmap_bytes,
                      tracked_mmap_chunks => S#scan.mmap_chunks}}.

arena_summary(#arena{index = I, address = Address, system = System, acc = A, segs = Segs},
              Tracker) ->
    Free = A#acc.free + A#acc.fast + A#acc.top,
    M = #{arena => I,
          address => Address,
          system_bytes => System,
          in_use_bytes => System - Free,
          free_bytes => Free,
          by_kind => #{in_use => A#acc.in_use, free => A#acc.free, fast => A#acc.fast,
                       tcache => A#acc.tcache, top => A#acc.top, meta => A#acc.meta},
          chunks => lists:sum([C || #seg{chunks = C} <- Segs]),
          free_chunks => A#acc.free_chunks,
          largest_free => A#acc.largest,
          resident_bytes => A#acc.resident,
          trimmable_bytes => A#acc.trimmable,
          pinned_bytes => A#acc.free + A#acc.fast - A#acc.whole,
          segments => length(Segs)},
    case Tracker of
        true -> M#{live_bytes => A#acc.live, live_chunks => A#acc.live_n,
                   unrecorded_bytes => A#acc.unrec};
        false -> M
    end.
