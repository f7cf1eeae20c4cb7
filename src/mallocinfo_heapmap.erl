%% @doc Reads heap dumps (`c_src/heapwalk/dump_format.h') and draws them.
%%
%% {@link read_summary/1} computes the per-arena figures of a dump in one
%% streaming pass; {@link render/2} writes PNG heap maps and an `index.html'
%% beside them. Pure Erlang (OTP's `zlib' and `erlang:crc32/1' for PNG), so
%% the `mallocinfo-heapmap' escript does the same offline on any machine
%% with Erlang.
%%
%% A dump can hold tens of millions of chunks: it is read record by record
%% (`raw', `read_ahead'), chunk words are matched straight out of each
%% record's payload, and nothing proportional to the number of chunks is
%% kept. What is kept per segment is its page bitmap (32 KiB per GiB of
%% heap) and the page ranges of free chunks that span whole pages.
%%
%% Everything in the file is checked before anything is drawn: magic,
%% version, record order and lengths, chunks covering each segment exactly,
%% the top chunk, PAGES geometry, site ids, END counts, nothing after END.
%% A bad file gives `{error, {bad_dump, Why}}' and leaves no output.
-module(mallocinfo_heapmap).

-include_lib("kernel/include/file.hrl").

-export([read_summary/1, render/2, format_summary/1, format_header/1]).
%% For the escript: render/2 plus what it read.
-export([render_report/2]).

-export_type([summary/0, arena_summary/0, totals/0, bad_dump/0, header/0]).

-type kind_bytes() :: #{in_use := non_neg_integer(), free := non_neg_integer(),
                        fast := non_neg_integer(), tcache := non_neg_integer(),
                        top := non_neg_integer(), meta := non_neg_integer()}.
%% `live_bytes', `live_chunks' and `unrecorded_bytes' are present only when
%% the dump carries tracker data (HEADER flag bit 0).
-type arena_summary() :: #{arena := non_neg_integer(),
                           system_bytes := non_neg_integer(),
                           in_use_bytes := non_neg_integer(),
                           free_bytes := non_neg_integer(),
                           by_kind := kind_bytes(),
                           free_chunks := non_neg_integer(),
                           largest_free := non_neg_integer(),
                           resident_bytes := non_neg_integer(),
                           trimmable_bytes := non_neg_integer(),
                           pinned_bytes := non_neg_integer(),
                           live_bytes => non_neg_integer(),
                           live_chunks => non_neg_integer(),
                           unrecorded_bytes => non_neg_integer()}.
-type totals() :: #{system_bytes := non_neg_integer(),
                    in_use_bytes := non_neg_integer(),
                    free_bytes := non_neg_integer(),
                    by_kind := kind_bytes(),
                    free_chunks := non_neg_integer(),
                    largest_free := non_neg_integer(),
                    resident_bytes := non_neg_integer(),
                    trimmable_bytes := non_neg_integer(),
                    pinned_bytes := non_neg_integer(),
                    tracked_mmap_bytes := non_neg_integer(),
                    tracked_mmap_chunks := non_neg_integer(),
                    arena_count := non_neg_integer(),
                    chunk_count := non_neg_integer(),
                    live_bytes => non_neg_integer(),
                    live_chunks => non_neg_integer(),
                    unrecorded_bytes => non_neg_integer()}.
-type summary() :: #{arenas := [arena_summary()], total := totals()}.
%% What HEADER says, for reports.
-type header() :: #{pid := non_neg_integer(), time_ms := non_neg_integer(),
                    glibc := binary(), page_size := pos_integer(),
                    heap_max := pos_integer(), tracker := boolean()}.
%% Why a dump was refused: a short atom, or an atom and where.
-type bad_dump() :: atom() | {atom(), term()}.

-define(MAGIC, "MIHEAPD\n").
-define(VERSION, 1).
-define(T_HEADER, 1).
-define(T_ARENA, 2).
-define(T_SEGMENT, 3).
-define(T_CHUNKS, 4).
-define(T_PAGES, 5).
-define(T_MMAP, 6).
-define(T_SITE, 7).
-define(T_END, 8).

-define(K_IN_USE, 0).
-define(K_FREE, 1).
-define(K_FAST, 2).
-define(K_TCACHE, 3).
-define(K_TOP, 4).
-define(K_MMAP, 5).
-define(K_META, 6).

-define(SIZE_MASK, 16#0000fffffffffff0).
-define(SITE_OTHER, 65535).
%% sizeof(struct malloc_chunk): malloc_trim keeps a chunk's header and its
%% free-list pointers, so only whole pages beyond them can be released.
-define(CHUNK_KEEP, 48).
%% What glibc's systrim keeps of the main arena's top: MINSIZE + 1.
-define(TOP_KEEP, 33).
-define(MAX_CHUNKS_LEN, 65536 * 8).
-define(MAX_MMAP_LEN, 1 bsl 24).
-define(MAX_SITE_LEN, 24 + 65536).
-define(MAX_HEADER_LEN, 40 + 256).
%% No real heap segment is this big; the cap bounds the PAGES bitmap a
%% corrupt size could make us read (32 MiB at 4 KiB pages).
-define(MAX_SEGMENT, 1 bsl 40).

%% Image geometry: a row is one page (more when the segment is tall), a
%% pixel 16 bytes (more when it is taller still).
-define(BLOCK, 16).
-define(MAX_WIDTH, 1024).
-define(WIDEN_ROWS, 1024).
-define(MAX_ROWS, 2048).
%% Scanlines are deflated in batches of about this many bytes.
-define(FLUSH_BYTES, 1 bsl 20).
-define(TOP_SITES, 12).

%% Pixel classes; the palette has four entries per class (below).
-define(C_IN_USE, 0).
-define(C_FREE, 1).
-define(C_FAST, 2).
-define(C_TCACHE, 3).
-define(C_TOP, 4).
-define(C_MMAP, 5).
-define(C_META, 6).
-define(C_OUTSIDE, 7).
%% Whole pages inside a free or fastbin chunk: what is not pinned.
-define(C_FREE_PAGES, 8).
-define(C_SITE0, 9).
-define(C_SITE_OTHER, (?C_SITE0 + ?TOP_SITES)).
-define(N_CLASSES, (?C_SITE_OTHER + 1)).

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
-record(arena, {index, flags, system, top_address, top_size, segs = [], acc = #acc{}}).

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

%% The pixel writer of one image: what changes per pixel run in #px (it
%% is copied on every update, so it stays small), the rest in #pxc.
-record(px, {pb,                  % bytes per pixel
             w,                   % pixels per row
             x = 0, y = 0,        % the next pixel
             row = <<>>,          % the open row
             partial = [], filled = 0,  % the open pixel's [{Class, Bytes, Start}]
             out = [], out_size = 0,    % finished rows not yet deflated
             cfg}).
-record(pxc, {ps, shift,          % page size
              bitmap,             % residency, LSB first; none = all resident
              n_pages,
              png, fd}).

%%% ---------------------------------------------------------------------------
%%% API

%% @doc The summary of a heap dump, computed exactly as `mallocinfo_heap'
%% documents it: per arena (`arenas', in dump order) and in total. Runtime
%% conditions: `{error, Posix}' when the file cannot be read (`enoent',
%% `eacces', `eisdir', ...), `{error, {bad_dump, Why}}' when it is not a
%% complete, self-consistent version 1 dump. A path that is not a file name
%% raises `badarg'.
-spec read_summary(file:name_all()) ->
          {ok, summary()} | {error, file:posix() | {bad_dump, bad_dump()}}.
read_summary(DumpPath) ->
    case scan(path(DumpPath, [DumpPath])) of
        {ok, Scan} -> {ok, summary(Scan)};
        {error, _} = E -> E
    end.

%% @doc Draws a heap dump into `OutDir' (created with its parents when
%% missing): `index.html' (header, per-arena table, legend, call sites, one
%% heap map per segment) and the PNGs it shows, `arena<A>-seg<S>.png' and,
%% when the tracker saw mmapped blocks, `mmap.png'. Returns the files
%% written, `index.html' first. The dump is validated completely before
%% anything is written; files are written under temporary names, synced and
%% renamed at the end, so a failure leaves nothing new behind. A file of the
%% same name already in `OutDir' is replaced only when it is a regular
%% file: when one of the names is a directory the answer is
%% `{error, eisdir}', when it is anything else (a symbolic link, which is
%% never followed, a device, a FIFO, a socket) `{error, eexist}', and
%% nothing is drawn or touched. Errors as {@link read_summary/1}, plus
%% `{error, Posix}' for `OutDir' (`enotdir' when it is a file, `eacces',
%% `enoent', `enospc', ...).
-spec render(file:name_all(), file:name_all()) ->
          {ok, [file:filename_all()]} | {error, file:posix() | {bad_dump, bad_dump()}}.
render(DumpPath, OutDir) ->
    case render_report(DumpPath, OutDir) of
        {ok, Files, _Summary, _Header} -> {ok, Files};
        {error, _} = E -> E
    end.

%% @private render/2, also returning what the dump said (for the escript).
-spec render_report(file:name_all(), file:name_all()) ->
          {ok, [file:filename_all()], summary(), header()}
        | {error, file:posix() | {bad_dump, bad_dump()}}.
render_report(DumpPath0, OutDir0) ->
    DumpPath = path(DumpPath0, [DumpPath0, OutDir0]),
    OutDir = path(OutDir0, [DumpPath0, OutDir0]),
    case scan(DumpPath) of
        {ok, Scan} ->
            Summary = summary(Scan),
            case draw(DumpPath, OutDir, Scan, Summary) of
                {ok, Files} -> {ok, Files, Summary, header_map(Scan#scan.hdr)};
                {error, _} = E -> E
            end;
        {error, _} = E ->
            E
    end.

%% @doc A summary as a few lines of text (what the escript prints): one line
%% per arena, the largest 16 by system bytes, then the totals.
-spec format_summary(summary()) -> iodata().
format_summary(S) ->
    valid_summary(S) orelse erlang:error(badarg, [S]),
    summary_text(S).

summary_text(#{arenas := Arenas, total := T}) ->
    Cols = "~-7s ~10s ~10s ~10s ~10s ~10s ~10s ~10s ~9s~n",
    Head = io_lib:format(Cols, ["arena", "system", "in use", "free", "resident",
                                "trimmable", "pinned", "largest", "free#"]),
    Line = fun(Name, M) ->
                   io_lib:format(Cols, [Name | [mallocinfo_units:bytes(maps:get(K, M))
                                                || K <- [system_bytes, in_use_bytes, free_bytes,
                                                         resident_bytes, trimmable_bytes,
                                                         pinned_bytes, largest_free]]]
                                 ++ [integer_to_list(maps:get(free_chunks, M))])
           end,
    Sorted = lists:sublist(lists:reverse(lists:keysort(1, [{maps:get(system_bytes, A), A}
                                                            || A <- Arenas])), 16),
    More = case length(Arenas) - length(Sorted) of
               0 -> [];
               N -> io_lib:format("... ~b smaller arenas~n", [N])
           end,
    Mmap = case T of
               #{tracked_mmap_chunks := 0} -> [];
               #{tracked_mmap_chunks := MC, tracked_mmap_bytes := MB} ->
                   io_lib:format("mmapped blocks seen by the tracker: ~b, ~s~n", [MC, mallocinfo_units:bytes(MB)]);
               #{} -> []
           end,
    Live = case T of
               #{live_bytes := LB, live_chunks := LC, unrecorded_bytes := UB} ->
                   io_lib:format("live (tracked) ~s in ~b chunks, in use but not tracked ~s~n",
                                 [mallocinfo_units:bytes(LB), LC, mallocinfo_units:bytes(UB)]);
               #{} -> []
           end,
    [Head, [Line(integer_to_list(maps:get(arena, A)), A) || {_, A} <- Sorted], More,
     Line("total", T),
     io_lib:format("~b arenas, ~b chunks~n", [maps:get(arena_count, T), maps:get(chunk_count, T)]),
     Mmap, Live].

%% What summary_text/1 reads, checked first so that anything else is a
%% badarg rather than a crash halfway through the text.
valid_summary(#{arenas := Arenas, total := T}) ->
    Counters = [system_bytes, in_use_bytes, free_bytes, resident_bytes, trimmable_bytes,
                pinned_bytes, largest_free, free_chunks],
    proper_list(Arenas)
        andalso lists:all(fun(A) -> counters(A, [arena | Counters]) end, Arenas)
        andalso counters(T, [arena_count, chunk_count | Counters])
        andalso all_or_none(T, [tracked_mmap_chunks, tracked_mmap_bytes])
        andalso all_or_none(T, [live_bytes, live_chunks, unrecorded_bytes]);
valid_summary(_) ->
    false.

counters(M, Keys) ->
    is_map(M) andalso
        lists:all(fun(K) -> case M of
                                #{K := V} -> is_integer(V) andalso V >= 0;
                                #{} -> false
                            end
                  end, Keys).

all_or_none(M, Keys) ->
    case [K || K <- Keys, maps:is_key(K, M)] of
        [] -> true;
        Keys -> counters(M, Keys);
        _ -> false
    end.

proper_list([]) -> true;
proper_list([_ | T]) -> proper_list(T);
proper_list(_) -> false.

%% @doc What a dump's HEADER says, as one line of text. Anything but a
%% header map (as {@link render_report/2} returns it) raises `badarg'.
-spec format_header(header()) -> iodata().
format_header(#{pid := Pid, time_ms := T, glibc := G, page_size := PS, tracker := Tr} = H)
  when is_integer(Pid), Pid >= 0, is_integer(T), T >= 0, is_integer(PS), PS > 0,
       is_boolean(Tr), is_binary(G) orelse is_list(G) ->
    is_binary(G) orelse io_lib:char_list(G) orelse erlang:error(badarg, [H]),
    io_lib:format("heap of pid ~b dumped ~s, glibc ~s, page ~s~s~n",
                  [Pid, time_text(T), G, mallocinfo_units:bytes(PS),
                   case Tr of true -> ", with tracker data"; false -> "" end]);
format_header(H) ->
    erlang:error(badarg, [H]).

%% The dump time in UTC. The field is not checked (any value reads), so one
%% past year 9999 is shown as a number.
time_text(Ms) when Ms < 253402300800000 ->
    calendar:system_time_to_rfc3339(Ms, [{unit, millisecond}, {offset, "Z"}]);
time_text(Ms) ->
    io_lib:format("at unix time ~b ms", [Ms]).

%%% ---------------------------------------------------------------------------
%%% Reading: one pass, everything checked

scan(Path) ->
    case file:open(Path, [read, raw, binary, {read_ahead, 1 bsl 20}]) of
        {ok, Fd} ->
            try
                {ok, scan_file(Fd)}
            catch
                throw:{bad_dump, _} = Why -> {error, Why};
                throw:{posix, Posix} -> {error, Posix}
            after
                file:close(Fd)
            end;
        {error, _} = E ->
            E
    end.

bad(Why) -> throw({bad_dump, Why}).

scan_file(Fd) ->
    case read_exact(Fd, 8) of
        <<?MAGIC>> -> ok;
        _ -> bad(bad_magic)
    end,
    records(#scan{fd = Fd, used = atomics:new(65536, [{signed, false}])}).

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
    Align =:= ?BLOCK orelse bad({bad_header, alignment}),
    Flags band (bnot 1) =:= 0 orelse bad({bad_header, flags}),
    (HeapMax > 0 andalso HeapMax rem PS =:= 0) orelse bad({bad_header, heap_max}),
    lists:all(fun(C) -> C >= 32 andalso C < 127 end, binary_to_list(Glibc))
        orelse bad({bad_header, glibc_version}),
    #hdr{page_size = PS, shift = log2(PS), tracker = Flags band 1 =:= 1, flags = Flags,
         pid = Pid, time_ms = Time, heap_max = HeapMax, glibc = Glibc};
header(_) ->
    bad({bad_length, header}).

log2(1) -> 0;
log2(N) -> 1 + log2(N bsr 1).

arena(<<Index:32/little, Flags:32/little, _Addr:64/little, System:64/little,
        TopAddr:64/little, TopSize:64/little>>, Expected) ->
    Index =:= Expected orelse bad({bad_arena, Index}),
    Flags =:= (case Index of 0 -> 1; _ -> 0 end) orelse bad({bad_arena, Index}),
    #arena{index = Index, flags = Flags, system = System, top_address = TopAddr,
           top_size = TopSize}.

segment(<<AIdx:32/little, Flags:32/little, Base:64/little, Size:64/little, First:64/little>>,
        #arena{index = Index}, #hdr{heap_max = HeapMax}) ->
    Ok = AIdx =:= Index
        andalso (Flags =:= 0 orelse (Flags =:= 1 andalso Index =:= 0))
        andalso Size > 0 andalso Size =< ?MAX_SEGMENT
        andalso (Flags =:= 1 orelse Size =< HeapMax)
        andalso Base + Size =< 1 bsl 64
        andalso First >= Base andalso First =< Base + Size
        andalso First rem ?BLOCK =:= 0,
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
           Seg#seg.flags band 1 =:= 1},
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
        true -> words(Rest, Next, End, Ctx, chunk(W band 15, W bsr 48, Addr, Size, Ctx, Acc))
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
    case W bsr 48 of
        0 -> ok;
        Site -> atomics:put(Used, Site, 1)
    end,
    mmaps(Rest, N + 1, Bytes + Size, Used);
mmaps(<<>>, N, Bytes, _) ->
    {N, Bytes}.

site(<<Id:32/little, Reserved:32/little, Bytes:64/little, Blocks:64/little, Label/binary>>) ->
    (Id >= 1 andalso Id =< ?SITE_OTHER andalso Reserved =:= 0) orelse bad({bad_site, Id}),
    Text = case unicode:characters_to_binary(Label) of
               B when is_binary(B) -> B;
               _ -> unicode:characters_to_binary(Label, latin1)
           end,
    {Id, {Bytes, Blocks, Text}}.

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

%% Set bits among bits [P, P + N) of an LSB-first bitmap.
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
%%% Summary

summary(#scan{arenas = Arenas, hdr = #hdr{tracker = Tracker}} = S) ->
    Per = [arena_summary(A, Tracker) || A <- Arenas],
    Zero = maps:map(fun(by_kind, K) -> maps:map(fun(_, _) -> 0 end, K);
                       (_, _) -> 0
                    end, maps:remove(arena, arena_summary(#arena{index = 0, system = 0}, Tracker))),
    Sum = lists:foldl(fun(A, T) -> add_arena(maps:remove(arena, A), T) end, Zero, Per),
    #{arenas => Per,
      total => Sum#{tracked_mmap_bytes => S#scan.mmap_bytes,
                    tracked_mmap_chunks => S#scan.mmap_chunks,
                    arena_count => length(Arenas), chunk_count => S#scan.chunk_count}}.

arena_summary(#arena{index = I, system = System, acc = A}, Tracker) ->
    Free = A#acc.free + A#acc.fast + A#acc.top,
    M = #{arena => I,
          system_bytes => System,
          in_use_bytes => System - Free,
          free_bytes => Free,
          by_kind => #{in_use => A#acc.in_use, free => A#acc.free, fast => A#acc.fast,
                       tcache => A#acc.tcache, top => A#acc.top, meta => A#acc.meta},
          free_chunks => A#acc.free_chunks,
          largest_free => A#acc.largest,
          resident_bytes => A#acc.resident,
          trimmable_bytes => A#acc.trimmable,
          pinned_bytes => A#acc.free + A#acc.fast - A#acc.whole},
    case Tracker of
        true -> M#{live_bytes => A#acc.live, live_chunks => A#acc.live_n,
                   unrecorded_bytes => A#acc.unrec};
        false -> M
    end.

add_arena(A, T) ->
    maps:map(fun(by_kind, K) -> maps:merge_with(fun(_, X, Y) -> X + Y end, K, maps:get(by_kind, A));
                (largest_free, V) -> max(V, maps:get(largest_free, A));
                (Key, V) -> V + maps:get(Key, A)
             end, T).

header_map(#hdr{pid = Pid, time_ms = T, glibc = G, page_size = PS, heap_max = HM,
                tracker = Tr}) ->
    #{pid => Pid, time_ms => T, glibc => G, page_size => PS, heap_max => HM, tracker => Tr}.

%%% ---------------------------------------------------------------------------
%%% Drawing

%% One image: where its pixels start, how many bytes each covers.
-record(img, {file, title, arena, start, pb, row_bytes, w, rows, base, size,
              first, seg, kind = segment}).

draw(DumpPath, OutDir, Scan, Summary) ->
    Imgs = plan(Scan),
    Names = ["index.html" | [I#img.file || I <- Imgs]],
    %% Every name is checked before anything is made: a target that will
    %% not be replaced costs no drawing and leaves nothing behind.
    case first_error([check_target(filename:join(OutDir, N)) || N <- Names]) of
        ok -> draw(DumpPath, OutDir, Scan, Summary, Imgs, Names);
        {error, _} = E -> E
    end.

draw(DumpPath, OutDir, Scan, Summary, Imgs, Names) ->
    case ensure_dir(OutDir) of
        {ok, Created} ->
            %% Unique across nodes rendering into the same directory too.
            Tag = os:getpid() ++ "-" ++ integer_to_list(erlang:unique_integer([positive])),
            Temp = fun(Name) -> filename:join(OutDir, "." ++ Name ++ "." ++ Tag ++ ".tmp") end,
            try
                draw_images(DumpPath, Scan, Imgs, Temp),
                write_file(Temp("index.html"), html(Scan, Summary, Imgs)),
                %% index.html last: when it is there, so are its images.
                [commit(Temp(N), filename:join(OutDir, N)) || N <- lists:reverse(Names)],
                {ok, [filename:join(OutDir, N) || N <- Names]}
            catch
                Class:Why:Stack ->
                    _ = [file:delete(Temp(N)) || N <- Names],
                    _ = [file:del_dir(D) || D <- Created],
                    case {Class, Why} of
                        {throw, {posix, Posix}} -> {error, Posix};
                        {throw, {bad_dump, _}} -> {error, Why};
                        _ -> erlang:raise(Class, Why, Stack)
                    end
            end;
        {error, _} = E ->
            E
    end.

first_error(Results) ->
    case [E || {error, _} = E <- Results] of
        [] -> ok;
        [E | _] -> E
    end.

%% What a name may be for render/2 to write it: missing, or a regular file
%% (replaced whole). A directory is `eisdir'; anything else, a symbolic
%% link (never followed), a device, a FIFO or a socket, is `eexist' and
%% left as it is: the same rule as the NIF's writers (c_src/glibc/
%% atomic_file.h). `{ok, Exists}' when it may be written.
check_target(Path) ->
    case file:read_link_info(Path, [raw]) of
        {ok, #file_info{type = regular}} -> {ok, true};
        {ok, #file_info{type = directory}} -> {error, eisdir};
        {ok, #file_info{}} -> {error, eexist};
        {error, enoent} -> {ok, false};
        {error, _} = E -> E
    end.

%% Creates OutDir and its missing parents; returns those it created,
%% deepest first, to remove them on failure.
ensure_dir(Dir) ->
    case file:read_file_info(Dir) of
        {ok, #file_info{type = directory}} -> {ok, []};
        {ok, _} -> {error, enotdir};
        {error, enoent} ->
            Parent = filename:dirname(Dir),
            case Parent =:= Dir of
                true -> {error, enoent};
                false ->
                    case ensure_dir(Parent) of
                        {ok, Made} ->
                            case file:make_dir(Dir) of
                                ok -> {ok, [Dir | Made]};
                                {error, eexist} -> {ok, Made};
                                {error, _} = E -> _ = [file:del_dir(D) || D <- Made], E
                            end;
                        {error, _} = E -> E
                    end
            end;
        {error, _} = E -> E
    end.

%% A temporary file: `exclusive' (O_CREAT|O_EXCL) never opens an existing
%% name, links included.
open_temp(Path) ->
    case file:open(Path, [write, raw, binary, delayed_write, exclusive]) of
        {ok, Fd} -> Fd;
        {error, Posix} -> throw({posix, Posix})
    end.

%% On disk before it is renamed into place: a crash never leaves an empty
%% file under a final name. (sync/1 writes out delayed_write's buffer
%% first, and reports a failed delayed write.)
sync(Fd) ->
    case file:sync(Fd) of
        ok -> ok;
        {error, Posix} -> throw({posix, Posix})
    end.

write_file(Path, Data) ->
    Fd = open_temp(Path),
    try
        put_data(Fd, Data),
        sync(Fd)
    after
        file:close(Fd)
    end.

%% Renames a finished temporary over Target after a second look at what
%% Target is now (it was checked before drawing; this narrows the window
%% to the moment between the look and the rename). A name that was free is
%% taken with a hard link, which, unlike rename, fails when something took
%% the name meanwhile; that something is then checked like any target. A
%% filesystem without hard links falls back to rename.
commit(Temp, Target) ->
    commit(Temp, Target, 4).

commit(_Temp, _Target, 0) ->
    throw({posix, eexist});
commit(Temp, Target, Rounds) ->
    case check_target(Target) of
        {ok, true} ->
            rename(Temp, Target);
        {ok, false} ->
            case file:make_link(Temp, Target) of
                ok -> _ = file:delete(Temp), ok;
                {error, eexist} -> commit(Temp, Target, Rounds - 1);
                {error, _} -> rename(Temp, Target)
            end;
        {error, Posix} ->
            throw({posix, Posix})
    end.

rename(From, To) ->
    case file:rename(From, To) of
        ok -> ok;
        {error, Posix} -> throw({posix, Posix})
    end.

plan(#scan{arenas = Arenas, hdr = #hdr{page_size = PS, shift = Sh}, mmap_bytes = MB}) ->
    Segs = [{A, N, Seg} || #arena{index = A, segs = Segs} <- Arenas,
                           {N, Seg} <- lists:zip(lists:seq(0, length(Segs) - 1), Segs)],
    SegImgs = [begin
                   Start = (Base bsr Sh) bsl Sh,
                   {PB, R, W, Rows} = layout(Base + Size - Start, PS),
                   #img{file = lists:flatten(io_lib:format("arena~b-seg~b.png", [A, N])),
                        arena = A, start = Start, pb = PB, row_bytes = R, w = W, rows = Rows,
                        base = Base, size = Size, first = First, seg = Seg,
                        title = io_lib:format("arena ~b, segment ~b", [A, N])}
               end || {A, N, #seg{base = Base, size = Size, first = First} = Seg} <- Segs],
    MmapImgs = case MB of
                   0 -> [];
                   _ ->
                       {PB, R, W, Rows} = layout(MB, PS),
                       [#img{file = "mmap.png", kind = mmap, start = 0, pb = PB, row_bytes = R,
                             w = W, rows = Rows, base = 0, size = MB, first = 0,
                             title = "mmapped blocks"}]
               end,
    SegImgs ++ MmapImgs.

%% Bytes per pixel, bytes per row, width and height for Bytes starting at
%% a page boundary: a row is a page, as long as that gives at most 1024
%% rows; then rows widen to at most 1024 pixels (several pages each); then
%% each pixel covers more 16-byte blocks until at most 2048 rows remain.
%% Rows always start on a page, so a non-resident page is a run of a row.
layout(Bytes, PS) ->
    PB0 = first_pb(?BLOCK, PS),
    R1 = widen(Bytes, PB0, PS),
    {PB, R} = coarsen(Bytes, PB0, R1),
    {PB, R, R div PB, (Bytes + R - 1) div R}.

first_pb(PB, PS) when PS div PB > ?MAX_WIDTH -> first_pb(PB * 2, PS);
first_pb(PB, _) -> PB.

widen(Bytes, PB, R) when (Bytes + R - 1) div R > ?WIDEN_ROWS, (2 * R) div PB =< ?MAX_WIDTH ->
    widen(Bytes, PB, 2 * R);
widen(_, _, R) -> R.

coarsen(Bytes, PB, R) when (Bytes + R - 1) div R > ?MAX_ROWS -> coarsen(Bytes, 2 * PB, 2 * R);
coarsen(_, PB, R) -> {PB, R}.

draw_images(DumpPath, Scan, Imgs, Temp) ->
    Fd = case file:open(DumpPath, [read, raw, binary, {read_ahead, 1 bsl 20}]) of
             {ok, F} -> F;
             {error, Posix} -> throw({posix, Posix})
         end,
    try
        Classes = site_classes(Scan),
        [draw_image(Fd, Scan, Classes, I, Temp(I#img.file)) || I <- Imgs],
        ok
    after
        file:close(Fd)
    end.

draw_image(Fd, #scan{hdr = H} = Scan, Classes, #img{} = I, Path) ->
    Out = open_temp(Path),
    {Png, Head} = mallocinfo_png:open(#{width => I#img.w, height => I#img.rows,
                                        format => {palette, palette()}}),
    try
        put_data(Out, Head),
        {Bitmap, NPages} = case I#img.seg of
                               #seg{pages = Bm} = Seg -> {Bm, element(2, page_span(Seg, H))};
                               undefined -> {none, 0}
                           end,
        Px0 = #px{pb = I#img.pb, w = I#img.w,
                  cfg = #pxc{ps = H#hdr.page_size, shift = H#hdr.shift, bitmap = Bitmap,
                             n_pages = NPages, png = Png, fd = Out}},
        Px1 = case I#img.kind of
                  segment -> draw_segment(Fd, Scan, Classes, I, Px0);
                  mmap -> draw_mmaps(Fd, Scan#scan.mmap_offsets, Px0)
              end,
        %% The last row: outside the segment up to the image's end.
        Px2 = span(?C_OUTSIDE, false, I#img.start + I#img.rows * I#img.row_bytes
                   - (I#img.base + I#img.size), Px1),
        Px2#px.filled =:= 0 orelse error(partial_pixel),
        {Px2#px.x, Px2#px.y} =:= {0, I#img.rows} orelse error(pixel_count),
        flush(Px2),
        put_data(Out, mallocinfo_png:close(Png)),
        sync(Out)
    catch
        Class:Reason:Stack ->
            _ = (catch mallocinfo_png:close(Png)),
            erlang:raise(Class, Reason, Stack)
    after
        file:close(Out)
    end.

put_data(Fd, Data) ->
    case file:write(Fd, Data) of
        ok -> ok;
        {error, Posix} -> throw({posix, Posix})
    end.

%% Second pass over one segment's CHUNKS records. The first pass checked
%% them; checking again costs nothing and catches a file changed since.
draw_segment(Fd, #scan{hdr = #hdr{tracker = Tracker, page_size = PS, shift = Sh}}, Classes,
             #img{start = Start, base = Base, size = Size, first = First,
                  seg = #seg{offset = Offset, chunks = N}}, Px0) ->
    {ok, _} = file:position(Fd, Offset),
    Px1 = span(?C_OUTSIDE, false, Base - Start, Px0),
    Px2 = span(?C_META, true, First - Base, Px1),
    {End, Count, Px3} = draw_records(Fd, First, 0, {Tracker, Classes, PS, Sh}, Px2),
    (End =:= Base + Size andalso Count =:= N) orelse bad(changed_while_reading),
    Px3.

draw_records(Fd, Addr, Count, Ctx, Px) ->
    case read_exact(Fd, 8) of
        <<?T_CHUNKS:32/little, Len:32/little>> when Len > 0, Len =< ?MAX_CHUNKS_LEN,
                                                    Len rem 8 =:= 0 ->
            {Addr1, Px1} = draw_words(read_exact(Fd, Len), Addr, Ctx, Px),
            draw_records(Fd, Addr1, Count + Len div 8, Ctx, Px1);
        <<?T_PAGES:32/little, _:32>> ->
            {Addr, Count, Px};
        _ ->
            bad(changed_while_reading)
    end.

draw_words(<<W:64/little, Rest/binary>>, Addr, Ctx, Px) ->
    Size = W band ?SIZE_MASK,
    Size > 0 orelse bad(changed_while_reading),
    Px1 = case W band 15 of
              K when K =:= ?K_FREE; K =:= ?K_FAST -> free_chunk(class(K, 0, Ctx), Addr, Size, Ctx, Px);
              K -> span(class(K, W bsr 48, Ctx), true, Size, Px)
          end,
    draw_words(Rest, Addr + Size, Ctx, Px1);
draw_words(<<>>, Addr, _, Px) ->
    {Addr, Px}.

%% A free chunk's whole pages past its first 48 bytes are drawn apart from
%% the rest, which is exactly what pinned_bytes counts.
free_chunk(Class, Addr, Size, {_, _, PS, Sh}, Px) ->
    P0 = ((Addr + ?CHUNK_KEEP + PS - 1) bsr Sh) bsl Sh,
    P1 = ((Addr + Size) bsr Sh) bsl Sh,
    case P1 > P0 of
        true ->
            span(Class, false, Addr + Size - P1,
                 span(?C_FREE_PAGES, false, P1 - P0, span(Class, true, P0 - Addr, Px)));
        false ->
            span(Class, true, Size, Px)
    end.

class(?K_IN_USE, 0, _) -> ?C_IN_USE;
class(?K_IN_USE, Site, {true, Classes, _, _}) -> element(Site + 1, Classes);
class(?K_FREE, _, _) -> ?C_FREE;
class(?K_FAST, _, _) -> ?C_FAST;
class(?K_TCACHE, _, _) -> ?C_TCACHE;
class(?K_TOP, _, _) -> ?C_TOP;
class(?K_META, _, _) -> ?C_META;
class(_, _, _) -> bad(changed_while_reading).

%% mmapped blocks are not in any segment: drawn end to end, in dump order.
draw_mmaps(Fd, Offsets, Px) ->
    lists:foldl(
      fun(Offset, PxA) ->
              {ok, _} = file:position(Fd, Offset),
              case read_exact(Fd, 8) of
                  <<?T_MMAP:32/little, Len:32/little>> when Len > 0, Len =< ?MAX_MMAP_LEN ->
                      draw_mmap_words(read_exact(Fd, Len), PxA);
                  _ ->
                      bad(changed_while_reading)
              end
      end, Px, Offsets).

draw_mmap_words(<<_:64, W:64/little, Rest/binary>>, Px) ->
    draw_mmap_words(Rest, span(?C_MMAP, true, W band ?SIZE_MASK, Px));
draw_mmap_words(<<>>, Px) ->
    Px;
draw_mmap_words(_, _) ->
    bad(changed_while_reading).

%% Site id -> class: the ?TOP_SITES sites with the most live bytes get
%% their own colour, the rest (and id 65535) share "other".
site_classes(#scan{sites = Sites}) ->
    Ranked = top_sites(Sites),
    T0 = erlang:make_tuple(?SITE_OTHER + 1, ?C_SITE_OTHER),
    {T, _} = lists:foldl(fun({Id, _}, {Tup, C}) -> {setelement(Id + 1, Tup, C), C + 1} end,
                         {T0, ?C_SITE0}, Ranked),
    T.

top_sites(Sites) ->
    Sorted = lists:sort(fun({IdA, {BA, _, _}}, {IdB, {BB, _, _}}) -> {BA, -IdA} >= {BB, -IdB} end,
                        maps:to_list(Sites)),
    lists:sublist([S || {Id, _} = S <- Sorted, Id =/= ?SITE_OTHER], ?TOP_SITES).

%%% Pixels. A span is Len bytes of one class, `Start' when a chunk begins
%%% there. Each pixel takes the class holding most of its bytes (ties: the
%%% lower address), in the darker shade when a chunk of that class starts
%%% in it; at 16 bytes per pixel that is exactly the chunk's header block.
%%% Pixels are drawn as if resident; when a row is complete its
%%% non-resident pages are faded (rows start on page boundaries).

span(_, _, 0, Px) ->
    Px;
span(Class, Start, Len, #px{filled = F, pb = PB, partial = Part} = Px) when F > 0 ->
    T = min(Len, PB - F),
    Part1 = add_part(Class, T, Start, Part),
    case F + T of
        PB ->
            {C, S} = majority(Part1),
            span(Class, false, Len - T,
                 emit(C * 4 + shade(S), 1, Px#px{partial = [], filled = 0}));
        F1 ->
            Px#px{partial = Part1, filled = F1}
    end;
span(Class, Start, Len, #px{pb = PB} = Px) ->
    N = Len div PB,
    Rem = Len - N * PB,
    Px1 = if
              N =:= 0 -> Px;
              Start -> emit(Class * 4, N - 1, emit(Class * 4 + 1, 1, Px));
              true -> emit(Class * 4, N, Px)
          end,
    case Rem of
        0 -> Px1;
        _ -> Px1#px{partial = [{Class, Rem, Start andalso N =:= 0}], filled = Rem}
    end.

add_part(C, T, S, [{C, B, S0} | Rest]) -> [{C, B + T, S0 orelse S} | Rest];
add_part(C, T, S, Part) -> [{C, T, S} | Part].

majority([{C, _, S}]) ->
    {C, S};
majority([{C1, B1, S1}, {C2, B2, S2}]) when C1 =/= C2 ->
    %% The common case: two neighbours share the pixel; the older (lower
    %% address) wins a tie.
    case B2 >= B1 of
        true -> {C2, S2};
        false -> {C1, S1}
    end;
majority(Part) ->
    Merged = lists:foldl(fun({C, B, S}, Acc) ->
                                 case lists:keyfind(C, 1, Acc) of
                                     false -> Acc ++ [{C, B, S}];
                                     {C, B0, S0} -> lists:keyreplace(C, 1, Acc, {C, B0 + B, S0 orelse S})
                                 end
                         end, [], lists:reverse(Part)),
    [{C0, B0, S0} | Rest] = Merged,
    {C, _, S} = lists:foldl(fun({_, B, _} = X, {_, Best, _}) when B > Best -> X;
                               (_, Acc) -> Acc
                            end, {C0, B0, S0}, Rest),
    {C, S}.

shade(true) -> 1;
shade(false) -> 0.

%% N pixels of palette index Idx.
emit(_, 0, Px) ->
    Px;
emit(Idx, 1, #px{x = X, w = W, row = Row} = Px) when X + 1 < W ->
    Px#px{x = X + 1, row = <<Row/binary, Idx>>};
emit(Idx, N, #px{x = X, w = W, row = Row} = Px) when X + N < W ->
    Px#px{x = X + N, row = <<Row/binary, (binary:copy(<<Idx>>, N))/binary>>};
emit(Idx, N, #px{x = X, w = W, row = Row} = Px) ->
    M = W - X,
    emit(Idx, N - M, end_row(<<Row/binary, (binary:copy(<<Idx>>, M))/binary>>, Px)).

end_row(Row, #px{out = Out, out_size = Size, y = Y} = Px) ->
    Line = [0 | fade(Row, nonresident(Y, Px), 0, Y)],
    Px1 = Px#px{x = 0, y = Y + 1, row = <<>>, out = [Line | Out],
                out_size = Size + byte_size(Row) + 1},
    case Px1#px.out_size >= ?FLUSH_BYTES of
        true -> flush(Px1);
        false -> Px1
    end.

flush(#px{out = Out, cfg = #pxc{png = Png, fd = Fd}} = Px) ->
    put_data(Fd, mallocinfo_png:write(Png, lists:reverse(Out))),
    Px#px{out = [], out_size = 0}.

%% The non-resident runs of row Y as [{FirstPixel, Pixels}], in order. A
%% pixel wider than a page is non-resident when most of its pages are.
nonresident(_, #px{cfg = #pxc{bitmap = none}}) ->
    [];
nonresident(Y, #px{pb = PB, w = W, cfg = #pxc{ps = PS, bitmap = Bm, n_pages = NP}}) when PB =< PS ->
    PerPage = PS div PB,
    PagesPerRow = W div PerPage,
    P0 = Y * PagesPerRow,
    [{(P - P0) * PerPage, PerPage} || P <- lists:seq(P0, min(P0 + PagesPerRow, NP) - 1),
                                      bit(Bm, P) =:= 0];
nonresident(Y, #px{pb = PB, w = W, cfg = #pxc{shift = Sh, bitmap = Bm, n_pages = NP}}) ->
    Per = PB bsr Sh,
    [{X, 1} || X <- lists:seq(0, W - 1),
               P0 <- [min((Y * W + X) * Per, NP)],
               P1 <- [min(P0 + Per, NP)],
               P1 > P0, 2 * count_bits(Bm, P0, P1 - P0) < P1 - P0].

%% Non-resident pixels take the faded variant of their class (index + 2),
%% crossed by diagonal strokes (index + 3) where (x + y) mod 4 = 0.
fade(Row, [], _, _) ->
    [Row];
fade(Row, [{X0, N} | Rest], X, Y) ->
    Skip = X0 - X,
    <<Keep:Skip/binary, Page:N/binary, Tail/binary>> = Row,
    [Keep, fade_run(Page, (X0 + Y) band 3) | fade(Tail, Rest, X0 + N, Y)].

%% Pixel j of the run is a stroke when (Phase + j) mod 4 = 0: four at a
%% time, then the rest one by one.
fade_run(Run, Phase) ->
    [S0, S1, S2, S3] = Strokes = [stroke(Phase + J) || J <- [0, 1, 2, 3]],
    Whole = byte_size(Run) - byte_size(Run) rem 4,
    <<Body:Whole/binary, Tail/binary>> = Run,
    [<< <<((A band 16#fc) + S0), ((B band 16#fc) + S1), ((C band 16#fc) + S2),
          ((D band 16#fc) + S3)>> || <<A, B, C, D>> <= Body >>,
     list_to_binary([(I band 16#fc) + S || {I, S} <- lists:zip(binary_to_list(Tail),
                                                              lists:sublist(Strokes, byte_size(Tail)))])].

stroke(J) when J band 3 =:= 0 -> 3;
stroke(_) -> 2.

%%% Colours. Per class: resident, resident chunk start (darker),
%%% non-resident (faded), non-resident stroke.

class_colours() ->
    [{?C_IN_USE, in_use, "in use", {70, 110, 170}},
     {?C_FREE, free, "free in a bin: the pinned part (on pages shared with other chunks)",
      {230, 60, 40}},
     {?C_FREE_PAGES, free_pages, "free: whole pages (trimmable while resident)", {250, 175, 160}},
     {?C_FAST, fast, "fastbin", {250, 160, 30}},
     {?C_TCACHE, tcache, "tcache", {225, 110, 200}},
     {?C_TOP, top, "top", {60, 175, 80}},
     {?C_MMAP, mmap, "mmapped block", {140, 90, 200}},
     {?C_META, meta, "heap/arena header, fencepost", {90, 90, 90}},
     {?C_OUTSIDE, outside, "not part of the segment", {255, 255, 255}}].

%% Call sites: twelve colours kept away from the kinds' (no mid blue, red,
%% orange, pink, green, purple or grey).
site_colours() ->
    [{23, 190, 207}, {188, 189, 34}, {140, 86, 75}, {40, 45, 110}, {0, 120, 120},
     {158, 202, 225}, {210, 190, 140}, {99, 121, 57}, {110, 30, 50}, {140, 109, 49},
     {120, 200, 160}, {200, 160, 220}].

site_other_colour() -> {170, 170, 170}.

base_colour(C) when C >= ?C_SITE0, C < ?C_SITE_OTHER -> lists:nth(C - ?C_SITE0 + 1, site_colours());
base_colour(?C_SITE_OTHER) -> site_other_colour();
base_colour(C) -> element(4, lists:keyfind(C, 1, class_colours())).

palette() ->
    lists:append([variants(C, base_colour(C)) || C <- lists:seq(0, ?N_CLASSES - 1)]).

variants(?C_OUTSIDE, White) ->
    [White, White, White, White];
variants(_, Colour) ->
    [Colour, scale(Colour, 0.62), mix(Colour, {255, 255, 255}, 0.72), mix(Colour, {255, 255, 255}, 0.35)].

scale({R, G, B}, F) -> {round(R * F), round(G * F), round(B * F)}.

mix({R, G, B}, {R2, G2, B2}, F) ->
    {round(R + (R2 - R) * F), round(G + (G2 - G) * F), round(B + (B2 - B) * F)}.

%%% ---------------------------------------------------------------------------
%%% index.html

html(#scan{hdr = H, sites = Sites} = Scan, #{arenas := Arenas, total := T}, Imgs) ->
    Tracker = H#hdr.tracker,
    Title = io_lib:format("Heap map of pid ~b", [H#hdr.pid]),
    Page = [<<"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n">>,
            "<title>", Title, "</title>\n<style>\n", css(), "</style>\n</head>\n<body>\n",
            "<h1>", Title, "</h1>\n",
            header_html(Scan, T),
            "<h2>Summary</h2>\n", table_html(Arenas, T, Tracker),
            reading_html(),
            "<h2>Legend</h2>\n", legend_html(Tracker),
            sites_html(Tracker, Sites),
            [[arena_html(A), [segment_html(I) || #img{kind = segment, arena = N} = I <- Imgs,
                                                  N =:= maps:get(arena, A)]]
             || A <- Arenas],
            case [I || #img{kind = mmap} = I <- Imgs] of
                [] -> [];
                Mmap -> ["<h2 id=\"mmap\">mmapped blocks</h2>\n", [segment_html(I) || I <- Mmap]]
            end,
            "<div id=\"cursor\" class=\"cursor\"></div>\n",
            "<script>\n", script(), "</script>\n</body>\n</html>\n"],
    unicode:characters_to_binary(Page).

css() ->
    <<"body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }\n"
      "table { border-collapse: collapse; }\n"
      "th, td { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: right;"
      " white-space: nowrap; }\n"
      "th:first-child, td:first-child { text-align: left; }\n"
      "tr.total td { font-weight: bold; border-top: 2px solid #888; }\n"
      "td.label { text-align: left; font-family: monospace; }\n"
      "th.label { text-align: left; }\n"
      "td.label span { display: inline-block; max-width: 70em; overflow: hidden;"
      " text-overflow: ellipsis; vertical-align: bottom; }\n"
      "div.wide { overflow-x: auto; font-size: 13px; }\n"
      ".sw { display: inline-block; width: 28px; height: 14px; vertical-align: middle;"
      " border: 1px solid #888; margin-right: 6px; }\n"
      ".legend span.item { display: inline-block; margin: 2px 14px 2px 0; }\n"
      "figure { margin: 1em 0 2em 0; }\n"
      "figcaption { margin-bottom: 4px; color: #444; }\n"
      "img.map { image-rendering: pixelated; border: 1px solid #888; display: block; }\n"
      ".meta { color: #555; }\n"
      ".cursor { position: fixed; right: 8px; bottom: 8px; background: #fff;"
      " border: 1px solid #888; padding: 2px 6px; font-family: monospace; display: none; }\n">>.

header_html(#scan{hdr = H, seg_count = Segs, mmap_chunks = MC}, T) ->
    Time = time_text(H#hdr.time_ms),
    io_lib:format("<p class=\"meta\">Dumped ~s &middot; glibc ~s &middot; page ~s &middot; "
                  "non-main heap size ~s &middot; ~b arenas, ~b segments, ~b chunks"
                  "~s &middot; tracker data: ~s</p>\n",
                  [Time, esc(H#hdr.glibc), mallocinfo_units:bytes(H#hdr.page_size), mallocinfo_units:bytes(H#hdr.heap_max),
                   maps:get(arena_count, T), Segs, maps:get(chunk_count, T),
                   case MC of
                       0 -> "";
                       _ -> io_lib:format(", ~b mmapped blocks seen by the tracker (~s)", [MC, mallocinfo_units:bytes(maps:get(tracked_mmap_bytes, T))])
                   end,
                   case H#hdr.tracker of true -> "yes"; false -> "no" end]).

columns(Tracker) ->
    [{"arena", arena, "arena index (0 = main)"},
     {"system", system_bytes, "bytes the arena got from the kernel"},
     {"in use", in_use_bytes, "system - free (glibc's uordblks: tcache chunks and headers count as in use)"},
     {"free", free_bytes, "free + fastbin + top (glibc's fordblks)"},
     {"in bins", {by_kind, free}, "free chunks in regular bins"},
     {"fastbins", {by_kind, fast}, "free chunks in fastbins"},
     {"tcache", {by_kind, tcache}, "free chunks in thread caches"},
     {"top", {by_kind, top}, "the top chunk"},
     {"free chunks", free_chunks, "number of bin, fastbin and tcache chunks"},
     {"largest free", largest_free, "largest bin, fastbin, tcache or top chunk"},
     {"resident", resident_bytes, "resident pages of the arena's segments"},
     {"trimmable", trimmable_bytes, "resident whole pages inside free and fastbin chunks, and of the main arena's top: what malloc_trim(0) could return now"},
     {"pinned", pinned_bytes, "free and fastbin bytes not in whole pages: held by the live blocks around them"}]
        ++ case Tracker of
               true -> [{"live", live_bytes, "in use blocks in the tracker's live table"},
                        {"untracked", unrecorded_bytes, "in use blocks the tracker does not know"}];
               false -> []
           end.

%% One line of figures above an arena's maps.
arena_html(#{arena := N} = A) ->
    io_lib:format("<h2 id=\"arena~b\">Arena ~b~s</h2>\n<p class=\"meta\">system ~s, in use ~s, free ~s"
                  " in ~b chunks (pinned ~s, trimmable ~s, largest ~s), resident ~s</p>\n",
                  [N, N, case N of 0 -> " (main)"; _ -> "" end,
                   mallocinfo_units:bytes(maps:get(system_bytes, A)), mallocinfo_units:bytes(maps:get(in_use_bytes, A)),
                   mallocinfo_units:bytes(maps:get(free_bytes, A)), maps:get(free_chunks, A),
                   mallocinfo_units:bytes(maps:get(pinned_bytes, A)), mallocinfo_units:bytes(maps:get(trimmable_bytes, A)),
                   mallocinfo_units:bytes(maps:get(largest_free, A)), mallocinfo_units:bytes(maps:get(resident_bytes, A))]).

table_html(Arenas, T, Tracker) ->
    Cols = columns(Tracker),
    Head = ["<tr>", [io_lib:format("<th title=\"~s\">~s</th>", [Tip, Name]) || {Name, _, Tip} <- Cols],
            "</tr>\n"],
    Row = fun(Class, First, M) ->
                  [io_lib:format("<tr~s>", [Class]),
                   [case K of
                        arena -> ["<td>", First, "</td>"];
                        free_chunks -> ["<td>", integer_to_list(maps:get(K, M)), "</td>"];
                        _ -> cell(value(K, M))
                    end || {_, K, _} <- Cols],
                   "</tr>\n"]
          end,
    ["<div class=\"wide\"><table>\n", Head,
     [Row("", io_lib:format("<a href=\"#arena~b\">~b</a>", [maps:get(arena, A), maps:get(arena, A)]), A)
      || A <- Arenas],
     Row(" class=\"total\"", "total", T), "</table></div>\n"].

value({by_kind, K}, M) -> maps:get(K, maps:get(by_kind, M));
value(K, M) -> maps:get(K, M).

cell(Bytes) ->
    io_lib:format("<td title=\"~b bytes\">~s</td>", [Bytes, mallocinfo_units:bytes(Bytes)]).

reading_html() ->
    <<"<p>Free memory comes in two sorts. <b>Trimmable</b>: resident whole pages"
      " inside free chunks (and the top chunk) that <code>mallocinfo:trim()</code>"
      " would give back to the kernel now. <b>Pinned</b>: free bytes that share"
      " their pages with live blocks, so no trim can return them: that is"
      " fragmentation. Faded, hatched pages are not resident (never touched, or"
      " already given back): they cost address space, not RAM.</p>\n">>.

legend_html(Tracker) ->
    Items = [{C, Key, case {C, Tracker} of
                          {?C_IN_USE, true} -> "in use, not in the tracker's table";
                          _ -> Label
                      end} || {C, Key, Label, _} <- class_colours()],
    [_, _, Faded, Stroke] = variants(?C_FREE_PAGES, base_colour(?C_FREE_PAGES)),
    ["<div class=\"legend\">",
     [legend_item(C, ["data-kind=\"", atom_to_list(Key), "\""], Label) || {C, Key, Label} <- Items],
     "<span class=\"item\"><span class=\"sw\" style=\"background: repeating-linear-gradient(135deg, ",
     hex(Stroke), " 0 2px, ", hex(Faded), " 2px 6px)\"></span>",
     "non-resident page (here: whole free pages, already returned)</span>",
     "</div>\n<p class=\"meta\">Each chunk begins with a darker pixel, so neighbours of the same"
     " kind stay apart; when a pixel covers several chunks it takes the colour of the kind"
     " holding most of its bytes, darker when a chunk of that kind starts in it.",
     case Tracker of
         true -> " Live blocks are coloured by call site (below).";
         false -> ""
     end, "</p>\n"].

%% data-colours lists the class's palette: resident, resident chunk start,
%% non-resident, non-resident stroke.
legend_item(C, Attr, Label) ->
    Vs = variants(C, base_colour(C)),
    ["<span class=\"item\" ", Attr, " data-colours=\"", lists:join(" ", [hex(V) || V <- Vs]),
     "\"><span class=\"sw\" style=\"background: ", hex(base_colour(C)),
     "; border-left: 4px solid ", hex(lists:nth(2, Vs)), "\"></span>", esc(Label), "</span>"].

sites_html(false, _) ->
    [];
sites_html(true, Sites) ->
    case top_sites(Sites) of
        [] ->
            [];
        Top ->
            Rows = [["<tr><td>", legend_item(C, ["data-site=\"", integer_to_list(Id), "\""], ""),
                     "</td><td>", mallocinfo_units:bytes(B), "</td><td>", integer_to_list(N),
                     "</td><td class=\"label\"><span title=\"", esc(L), "\">", esc(L),
                     "</span></td></tr>\n"]
                    || {C, {Id, {B, N, L}}} <- lists:zip(lists:seq(?C_SITE0, ?C_SITE0 + length(Top) - 1),
                                                         Top)],
            Other = ["<tr><td>", legend_item(?C_SITE_OTHER, "data-site=\"other\"", ""),
                     "</td><td></td><td></td><td class=\"label\">every other site</td></tr>\n"],
            ["<h2 id=\"sites\">Call sites of live blocks</h2>\n"
             "<table>\n<tr><th></th><th>live bytes</th><th>blocks</th><th class=\"label\">site (innermost frames)</th></tr>\n",
             Rows, Other, "</table>\n"]
    end.

segment_html(#img{file = File, title = Title, kind = Kind, start = Start, pb = PB,
                  row_bytes = R, w = W, rows = Rows, base = Base, size = Size}) ->
    %% Narrow maps are enlarged (pixelated, not smoothed) to about 1024
    %% pixels across.
    Zoom = max(1, ?MAX_WIDTH div W),
    Where = case Kind of
                segment -> io_lib:format("0x~.16b&ndash;0x~.16b, ~s", [Base, Base + Size, mallocinfo_units:bytes(Size)]);
                mmap -> io_lib:format("~s, laid end to end in dump order (not at their addresses)",
                                      [mallocinfo_units:bytes(Size)])
            end,
    io_lib:format("<figure>\n<figcaption><b>~s</b>: ~s. One pixel = ~s, one row = ~s"
                  " (~b&times;~b px).</figcaption>\n"
                  "<img class=\"map\" src=\"~s\" alt=\"~s\" width=\"~b\" height=\"~b\""
                  " data-start=\"~b\" data-px=\"~b\" data-row=\"~b\" data-addr=\"~s\">\n</figure>\n",
                  [Title, Where, mallocinfo_units:bytes(PB), mallocinfo_units:bytes(R), W, Rows, File, Title, W * Zoom, Rows * Zoom,
                   Start, PB, R, case Kind of segment -> "1"; mmap -> "0" end]).

%% Shows the address under the pointer: start + row * row_bytes + column *
%% pixel_bytes. Addresses fit in a double (below 2^53).
script() ->
    <<"(function () {\n"
      "  var box = document.getElementById('cursor');\n"
      "  document.querySelectorAll('img.map').forEach(function (img) {\n"
      "    img.addEventListener('mousemove', function (e) {\n"
      "      var x = Math.floor(e.offsetX * img.naturalWidth / img.clientWidth);\n"
      "      var y = Math.floor(e.offsetY * img.naturalHeight / img.clientHeight);\n"
      "      var off = y * Number(img.dataset.row) + x * Number(img.dataset.px);\n"
      "      var text = img.dataset.addr === '1'\n"
      "        ? '0x' + (Number(img.dataset.start) + off).toString(16)\n"
      "        : '+' + off + ' bytes';\n"
      "      box.textContent = img.alt + ': ' + text;\n"
      "      box.style.display = 'block';\n"
      "    });\n"
      "    img.addEventListener('mouseleave', function () { box.style.display = 'none'; });\n"
      "  });\n"
      "})();\n">>.

hex({R, G, B}) -> io_lib:format("#~2.16.0b~2.16.0b~2.16.0b", [R, G, B]).

esc(Text) ->
    lists:map(fun($<) -> "&lt;";
                 ($>) -> "&gt;";
                 ($&) -> "&amp;";
                 ($") -> "&quot;";
                 (C) -> C
              end, unicode:characters_to_list(Text)).


%%% ---------------------------------------------------------------------------
%%% Arguments

%% A file name as file:open/2 takes it: binaries as they are (raw names
%% allowed), atoms and deep lists of characters, atoms and binaries
%% flattened to one string. Anything else, or a NUL, is badarg.
path(P, Args) when is_binary(P) ->
    binary:match(P, <<0>>) =:= nomatch orelse erlang:error(badarg, Args),
    P;
path(P, Args) when is_list(P); is_atom(P) ->
    Flat = try unicode:characters_to_list(flat(P)) of
               L when is_list(L) -> L;
               _ -> erlang:error(badarg, Args)
           catch
               error:_ -> erlang:error(badarg, Args)
           end,
    lists:member(0, Flat) andalso erlang:error(badarg, Args),
    Flat;
path(_, Args) ->
    erlang:error(badarg, Args).

flat(A) when is_atom(A) -> atom_to_list(A);
flat(B) when is_binary(B) -> B;
flat(L) when is_list(L) -> [flat_elem(E) || E <- L].

flat_elem(C) when is_integer(C) -> C;
flat_elem(E) -> flat(E).
