%% @private The heap map's pictures: one PNG per heap segment of a dump
%% (and one of the mmapped blocks the tracker saw), drawn from the chunk
%% words {@link mallocinfo_heapmap_read} reads a second time, and the
%% colours the page's legend shows. `mallocinfo_png' encodes; this module
%% decides what each pixel is.
%%
%% Drawing is streamed: each record's chunk words become pixel runs, rows
%% are deflated about a megabyte at a time, and nothing proportional to the
%% number of chunks is kept.
-module(mallocinfo_heapmap_draw).

-include("mallocinfo_heapdump.hrl").

-export([plan/1, draw/4, kinds/1, sites/1, other_site/0]).

-export_type([image/0, colour/0, colours/0]).

%% One picture: its file name and caption, the first address its first
%% pixel stands for (`start', page-aligned), bytes per pixel and per row,
%% its size in pixels, and the bytes it shows ([base, base + size); for
%% `mmap', the blocks end to end from 0).
-type image() :: #{file := string(), title := iolist(), kind := segment | mmap,
                   arena := non_neg_integer() | undefined, start := non_neg_integer(),
                   pixel_bytes := pos_integer(), row_bytes := pos_integer(),
                   width := pos_integer(), height := pos_integer(),
                   base := non_neg_integer(), size := non_neg_integer(),
                   segment := mallocinfo_heapmap_read:segment() | undefined}.
-type colour() :: {byte(), byte(), byte()}.
%% A class's palette: resident, resident chunk start (darker), not
%% resident (faded), not resident stroke.
-type colours() :: [colour()].

%% Image geometry: a row is one page (more when the segment is tall), a
%% pixel 16 bytes (more when it is taller still).
-define(MAX_WIDTH, 1024).
-define(WIDEN_ROWS, 1024).
-define(MAX_ROWS, 2048).
%% Scanlines are deflated in batches of about this many bytes.
-define(FLUSH_BYTES, 1 bsl 20).
-define(TOP_SITES, 12).
%% What malloc_trim keeps of a free chunk (mallocinfo_heapmap_read counts
%% the same bytes as pinned).
-define(CHUNK_KEEP, 48).

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

%% The pictures of a dump, in the order the page shows them: each
%% segment's (`arena<A>-seg<S>.png'), then `mmap.png' when the tracker saw
%% mmapped blocks.
-spec plan(mallocinfo_heapmap_read:dump()) -> [image()].
plan(#{header := #{page_size := PS}, segments := Segs,
       summary := #{total := #{tracked_mmap_bytes := MB}}}) ->
    Sh = shift(PS),
    SegImgs = [begin
                   Start = (Base bsr Sh) bsl Sh,
                   {PB, R, W, Rows} = layout(Base + Size - Start, PS),
                   #{file => lists:flatten(io_lib:format("arena~b-seg~b.png", [A, N])),
                     title => io_lib:format("arena ~b, segment ~b", [A, N]),
                     kind => segment, arena => A, start => Start, pixel_bytes => PB,
                     row_bytes => R, width => W, height => Rows, base => Base, size => Size,
                     segment => Seg}
               end || #{arena := A, index := N, base := Base, size := Size} = Seg <- Segs],
    MmapImgs = case MB of
                   0 -> [];
                   _ ->
                       {PB, R, W, Rows} = layout(MB, PS),
                       [#{file => "mmap.png", title => "mmapped blocks", kind => mmap,
                          arena => undefined, start => 0, pixel_bytes => PB, row_bytes => R,
                          width => W, height => Rows, base => 0, size => MB,
                          segment => undefined}]
               end,
    SegImgs ++ MmapImgs.

%% Draws `Images' (from plan/1) of the dump at `DumpPath', each into
%% `TempOf(File)' (a fresh name: see mallocinfo_file:write_all/3). Throws
%% `{posix, Posix}' when a file fails, `{bad_dump, changed_while_reading}'
%% when the dump is not what mallocinfo_heapmap_read:read/1 saw.
-spec draw(file:filename_all(), mallocinfo_heapmap_read:dump(), [image()],
           fun((string()) -> file:filename_all())) -> ok.
draw(DumpPath, Dump, Images, TempOf) ->
    Fd = case mallocinfo_heapmap_read:open(DumpPath) of
             {ok, F} -> F;
             {error, Posix} -> throw({posix, Posix})
         end,
    try
        Classes = site_classes(maps:get(sites, Dump)),
        [draw_image(Fd, Dump, Classes, I, TempOf(File)) || #{file := File} = I <- Images],
        ok
    after
        file:close(Fd)
    end.

%% The legend: every chunk kind's key (as `data-kind' on the page), label
%% and palette, in the order shown. With tracker data, in-use pixels are
%% the blocks the tracker does not know.
-spec kinds(boolean()) -> [{atom(), string(), colours()}].
kinds(Tracker) ->
    [{Key, case {C, Tracker} of
               {?C_IN_USE, true} -> "in use, not in the tracker's table";
               _ -> Label
           end, variants(C, base_colour(C))}
     || {C, Key, Label, _} <- class_colours()].

%% The sites that get a colour of their own (the 12 with the most live
%% bytes; id 65535, "other", never), largest first, with their palettes.
-spec sites(mallocinfo_heapmap_read:sites()) ->
          [{pos_integer(), {non_neg_integer(), non_neg_integer(), binary()}, colours()}].
sites(Sites) ->
    Top = top_sites(Sites),
    [{Id, Site, variants(C, base_colour(C))}
     || {C, {Id, Site}} <- lists:zip(lists:seq(?C_SITE0, ?C_SITE0 + length(Top) - 1), Top)].

%% The palette every other site shares.
-spec other_site() -> colours().
other_site() ->
    variants(?C_SITE_OTHER, base_colour(?C_SITE_OTHER)).

%%% ---------------------------------------------------------------------------
%%% Geometry

%% Page sizes are powers of two (the reader checked).
shift(PS) -> shift(PS, 0).
shift(1, N) -> N;
shift(PS, N) -> shift(PS bsr 1, N + 1).

%% Bytes per pixel, bytes per row, width and height for Bytes starting at
%% a page boundary: a row is a page, as long as that gives at most 1024
%% rows; then rows widen to at most 1024 pixels (several pages each); then
%% each pixel covers more 16-byte blocks until at most 2048 rows remain.
%% Rows always start on a page, so a non-resident page is a run of a row.
layout(Bytes, PS) ->
    PB0 = first_pb(?ALIGNMENT, PS),
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

%%% ---------------------------------------------------------------------------
%%% One image

draw_image(Fd, #{header := #{page_size := PS, tracker := Tracker}, mmap_offsets := Offsets},
           Classes, #{width := W, height := Rows, pixel_bytes := PB, start := Start,
                      row_bytes := R, base := Base, size := Size, segment := Seg}, Path) ->
    Out = mallocinfo_file:open_temp(Path),
    {Png, Head} = mallocinfo_png:open(#{width => W, height => Rows,
                                        format => {palette, palette()}}),
    try
        mallocinfo_file:write(Out, Head),
        {Bitmap, NPages} = case Seg of
                               #{pages := Bm, n_pages := NP} -> {Bm, NP};
                               undefined -> {none, 0}
                           end,
        Px0 = #px{pb = PB, w = W,
                  cfg = #pxc{ps = PS, shift = shift(PS), bitmap = Bitmap, n_pages = NPages,
                             png = Png, fd = Out}},
        Px1 = case Seg of
                  undefined -> draw_mmaps(Fd, Offsets, Px0);
                  _ -> draw_segment(Fd, Tracker, Classes, Start, Seg, Px0)
              end,
        %% The last row: outside the segment up to the image's end.
        Px2 = span(?C_OUTSIDE, false, Start + Rows * R - (Base + Size), Px1),
        Px2#px.filled =:= 0 orelse error(partial_pixel),
        {Px2#px.x, Px2#px.y} =:= {0, Rows} orelse error(pixel_count),
        flush(Px2),
        mallocinfo_file:write(Out, mallocinfo_png:close(Png)),
        mallocinfo_file:sync(Out)
    catch
        Class:Reason:Stack ->
            try mallocinfo_png:close(Png) catch _:_ -> ok end,
            erlang:raise(Class, Reason, Stack)
    after
        file:close(Out)
    end.

%% The second pass over one segment's chunk words. The first pass checked
%% them; checking again costs nothing and catches a file changed since.
draw_segment(Fd, Tracker, Classes, Start, #{base := Base, size := Size, first := First} = Seg,
             Px0) ->
    #px{cfg = #pxc{ps = PS, shift = Sh}} = Px0,
    Ctx = {Tracker, Classes, PS, Sh},
    Px1 = span(?C_OUTSIDE, false, Base - Start, Px0),
    Px2 = span(?C_META, true, First - Base, Px1),
    {End, Px3} = mallocinfo_heapmap_read:fold_chunks(
                   Fd, Seg, fun(Words, {Addr, Px}) -> draw_words(Words, Addr, Ctx, Px) end,
                   {First, Px2}),
    End =:= Base + Size orelse changed(),
    Px3.

changed() -> throw({bad_dump, changed_while_reading}).

draw_words(<<W:64/little, Rest/binary>>, Addr, Ctx, Px) ->
    Size = W band ?SIZE_MASK,
    Size > 0 orelse changed(),
    Px1 = case W band 15 of
              K when K =:= ?K_FREE; K =:= ?K_FAST -> free_chunk(class(K, 0, Ctx), Addr, Size, Ctx, Px);
              K -> span(class(K, W bsr ?SITE_SHIFT, Ctx), true, Size, Px)
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
class(_, _, _) -> changed().

%% mmapped blocks are not in any segment: drawn end to end, in dump order.
draw_mmaps(Fd, Offsets, Px) ->
    mallocinfo_heapmap_read:fold_mmaps(Fd, Offsets, fun draw_mmap_words/2, Px).

draw_mmap_words(<<_:64, W:64/little, Rest/binary>>, Px) ->
    draw_mmap_words(Rest, span(?C_MMAP, true, W band ?SIZE_MASK, Px));
draw_mmap_words(<<>>, Px) ->
    Px.

%% Site id -> class: the ?TOP_SITES sites with the most live bytes get
%% their own colour, the rest (and id 65535) share "other".
site_classes(Sites) ->
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
    mallocinfo_file:write(Fd, mallocinfo_png:write(Png, lists:reverse(Out))),
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
                                      mallocinfo_heapmap_read:count_bits(Bm, P, 1) =:= 0];
nonresident(Y, #px{pb = PB, w = W, cfg = #pxc{shift = Sh, bitmap = Bm, n_pages = NP}}) ->
    Per = PB bsr Sh,
    [{X, 1} || X <- lists:seq(0, W - 1),
               P0 <- [min((Y * W + X) * Per, NP)],
               P1 <- [min(P0 + Per, NP)],
               P1 > P0, 2 * mallocinfo_heapmap_read:count_bits(Bm, P0, P1 - P0) < P1 - P0].

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

%%% ---------------------------------------------------------------------------
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
