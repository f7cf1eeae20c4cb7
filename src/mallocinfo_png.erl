%% @private A small PNG writer and reader on OTP's `zlib' and `erlang:crc32/1'.
%%
%% Writing is streamed, so an image is never held whole: {@link open/1}
%% returns the signature and header chunks, {@link write/2} deflates
%% scanlines into IDAT chunks as they come, {@link close/1} ends the stream.
%% {@link encode/2} does the same in one call for small images and lets the
%% caller pick the filter (the renderer uses none: PNG's own advice for
%% palette images).
%%
%% {@link decode/1} reads 8-bit non-interlaced greyscale, RGB, palette,
%% grey+alpha and RGBA images with any of the five filter types: enough for
%% the heap maps and for browser screenshots, which the tests compare.
-module(mallocinfo_png).

-export([open/1, write/2, close/1, encode/2, decode/1, pixel/3]).

-export_type([format/0, header/0, image/0, rgb/0, writer/0]).

-type rgb() :: {byte(), byte(), byte()}.
%% `{palette, Colours}': one byte per pixel indexing `Colours' (1 to 256);
%% `rgb': three bytes per pixel.
-type format() :: {palette, [rgb(), ...]} | rgb.
-type header() :: #{width := pos_integer(), height := pos_integer(), format := format()}.
-type filter() :: none | sub | up | average | paeth.
%% A decoded image: `pixels' holds the unfiltered scanlines back to back
%% (no filter bytes), `bpp' bytes per pixel.
-type image() :: #{width := pos_integer(), height := pos_integer(),
                   color_type := 0 | 2 | 3 | 4 | 6, bpp := 1..4,
                   palette := tuple(), pixels := binary()}.
-opaque writer() :: {png_writer, zlib:zstream()}.

-define(SIGNATURE, <<137, "PNG", 13, 10, 26, 10>>).
%% Above this the spec's 31-bit limits and any sane heap map are exceeded.
-define(MAX_SIDE, 1 bsl 24).

%%% ---------------------------------------------------------------------------
%%% Writing

%% @doc Starts a streamed image: returns the writer and the bytes to write
%% first (signature, IHDR and, for palette images, PLTE). The writer owns a
%% zlib port linked to the calling process: call {@link close/1} from the
%% same process, also on failure paths.
-spec open(header()) -> {writer(), iodata()}.
open(#{width := W, height := H, format := Format} = Header)
  when is_integer(W), W > 0, W < ?MAX_SIDE, is_integer(H), H > 0, H < ?MAX_SIDE ->
    {ColorType, Plte} =
        case Format of
            rgb -> {2, []};
            {palette, Cs} when is_list(Cs), Cs =/= [] ->
                palette(Cs) orelse erlang:error(badarg, [Header]),
                {3, chunk(<<"PLTE">>, << <<R, G, B>> || {R, G, B} <- Cs >>)};
            _ -> erlang:error(badarg, [Header])
        end,
    Z = zlib:open(),
    ok = zlib:deflateInit(Z, default),
    Ihdr = chunk(<<"IHDR">>, <<W:32, H:32, 8, ColorType, 0, 0, 0>>),
    {{png_writer, Z}, [?SIGNATURE, Ihdr, Plte]};
open(Header) ->
    erlang:error(badarg, [Header]).

%% @doc Deflates scanlines, each one the filter type byte followed by the
%% row's bytes, and returns the IDAT chunks ready so far (maybe none: zlib
%% buffers). Rows may be split across calls at any byte.
-spec write(writer(), iodata()) -> iodata().
write({png_writer, Z} = Writer, Scanlines) ->
    try zlib:deflate(Z, Scanlines) of
        Deflated -> idat(Deflated)
    catch
        error:_ -> erlang:error(badarg, [Writer, Scanlines])
    end;
write(Writer, Scanlines) ->
    erlang:error(badarg, [Writer, Scanlines]).

%% @doc Ends the stream: the last IDAT and IEND. Closes the zlib port.
-spec close(writer()) -> iodata().
close({png_writer, Z}) ->
    try
        Last = zlib:deflate(Z, [], finish),
        ok = zlib:deflateEnd(Z),
        [idat(Last), chunk(<<"IEND">>, <<>>)]
    after
        zlib:close(Z)
    end;
close(Writer) ->
    erlang:error(badarg, [Writer]).

%% @doc A whole image in one call: `Pixels' are the rows back to back with
%% no filter bytes, every row filtered with `Filter'.
-spec encode(header(), #{pixels := binary(), filter => filter()}) -> iodata().
encode(#{width := W, height := H, format := Format} = Header,
       #{pixels := Pixels} = Opts) when is_binary(Pixels), is_integer(W), is_integer(H) ->
    Bpp = case Format of rgb -> 3; {palette, _} -> 1; _ -> erlang:error(badarg, [Header, Opts]) end,
    Stride = W * Bpp,
    byte_size(Pixels) =:= Stride * H orelse erlang:error(badarg, [Header, Opts]),
    Type = maps:get(filter, Opts, none),
    (lists:member(Type, [none, sub, up, average, paeth])
     andalso maps:keys(Opts) -- [pixels, filter] =:= [])
        orelse erlang:error(badarg, [Header, Opts]),
    {Writer, Head} = open(Header),
    Rows = [filter_row(Type, binary:part(Pixels, Y * Stride, Stride),
                       prior_row(Pixels, Y, Stride), Bpp)
            || Y <- lists:seq(0, H - 1)],
    Body = write(Writer, Rows),
    [Head, Body, close(Writer)];
encode(Header, Opts) ->
    erlang:error(badarg, [Header, Opts]).

prior_row(_, 0, Stride) -> binary:copy(<<0>>, Stride);
prior_row(Pixels, Y, Stride) -> binary:part(Pixels, (Y - 1) * Stride, Stride).

filter_row(none, Row, _, _) ->
    [0, Row];
filter_row(Type, Row, Prior, Bpp) ->
    Cur = binary_to_list(Row),
    Up = binary_to_list(Prior),
    Left = lists:duplicate(Bpp, 0) ++ Cur,
    UpLeft = lists:duplicate(Bpp, 0) ++ Up,
    [filter_type(Type) | filter_bytes(Type, Cur, Left, Up, UpLeft)].

filter_bytes(sub, Cur, Left, _, _) ->
    zip2(fun(X, A) -> (X - A) band 255 end, Cur, Left);
filter_bytes(up, Cur, _, Up, _) ->
    zip2(fun(X, B) -> (X - B) band 255 end, Cur, Up);
filter_bytes(average, Cur, Left, Up, _) ->
    zip3(fun(X, A, B) -> (X - (A + B) div 2) band 255 end, Cur, Left, Up);
filter_bytes(paeth, Cur, Left, Up, UpLeft) ->
    zip4(fun(X, A, B, C) -> (X - paeth(A, B, C)) band 255 end, Cur, Left, Up, UpLeft).

filter_type(none) -> 0;
filter_type(sub) -> 1;
filter_type(up) -> 2;
filter_type(average) -> 3;
filter_type(paeth) -> 4.

%% The lists after the first may be longer (the shifted rows): stop with it.
zip2(F, [X | Xs], [A | As]) -> [F(X, A) | zip2(F, Xs, As)];
zip2(_, [], _) -> [].
zip3(F, [X | Xs], [A | As], [B | Bs]) -> [F(X, A, B) | zip3(F, Xs, As, Bs)];
zip3(_, [], _, _) -> [].
zip4(F, [X | Xs], [A | As], [B | Bs], [C | Cs]) -> [F(X, A, B, C) | zip4(F, Xs, As, Bs, Cs)];
zip4(_, [], _, _, _) -> [].

idat([]) -> [];
idat(Data) ->
    case iolist_size(Data) of
        0 -> [];
        _ -> chunk(<<"IDAT">>, Data)
    end.

chunk(Type, Data) ->
    Body = [Type, Data],
    [<<(iolist_size(Data)):32>>, Body, <<(erlang:crc32(Body)):32>>].

%%% ---------------------------------------------------------------------------
%%% Reading

%% @doc Parses and unfilters a PNG: every chunk's CRC is checked, IDAT data
%% inflated, each row unfiltered (none, sub, up, average, paeth). Returns
%% `{error, Why}' for anything it cannot read (interlaced, 16-bit, corrupt).
-spec decode(binary()) -> {ok, image()} | {error, term()}.
decode(<<137, "PNG", 13, 10, 26, 10, Rest/binary>>) ->
    try chunks(Rest, #{idat => []}) of
        #{ihdr := {W, H, 8, CT, 0}, idat := Idat} = Cs
          when CT =:= 0; CT =:= 2; CT =:= 3; CT =:= 4; CT =:= 6 ->
            Bpp = bpp(CT),
            Raw = inflate(lists:reverse(Idat)),
            Stride = W * Bpp,
            byte_size(Raw) =:= (Stride + 1) * H orelse throw({bad_png, data_size}),
            Pixels = unfilter(Raw, Stride, Bpp, binary:copy(<<0>>, Stride), []),
            Palette = list_to_tuple(maps:get(plte, Cs, [])),
            {ok, #{width => W, height => H, color_type => CT, bpp => Bpp,
                   palette => Palette, pixels => Pixels}};
        #{ihdr := Ihdr} ->
            {error, {unsupported, Ihdr}};
        #{} ->
            {error, {bad_png, no_ihdr}}
    catch
        throw:{bad_png, _} = Why -> {error, Why}
    end;
decode(Bin) when is_binary(Bin) ->
    {error, {bad_png, signature}};
decode(Other) ->
    erlang:error(badarg, [Other]).

%% @doc The colour at `(X, Y)' of a decoded image as `{R, G, B}' (alpha is
%% dropped, grey is expanded, palette indices looked up).
-spec pixel(image(), non_neg_integer(), non_neg_integer()) -> rgb().
pixel(#{width := W, height := H, bpp := Bpp, color_type := CT, palette := Pal,
        pixels := Px} = Image, X, Y)
  when is_integer(X), is_integer(Y), X >= 0, X < W, Y >= 0, Y < H ->
    Off = (Y * W + X) * Bpp,
    %% An image decode/1 made always has the pixel; a hand-made map may not.
    try
        case CT of
            3 -> element(binary:at(Px, Off) + 1, Pal);
            0 -> G = binary:at(Px, Off), {G, G, G};
            4 -> G = binary:at(Px, Off), {G, G, G};
            C when C =:= 2; C =:= 6 -> <<R, G, B>> = binary:part(Px, Off, 3), {R, G, B}
        end
    catch
        error:_ -> erlang:error(badarg, [Image, X, Y])
    end;
pixel(Image, X, Y) ->
    erlang:error(badarg, [Image, X, Y]).

%% 1 to 256 colours, each three bytes.
palette(Cs) ->
    length(Cs) =< 256 andalso
        lists:all(fun({R, G, B}) -> lists:all(fun is_byte/1, [R, G, B]);
                     (_) -> false
                  end, Cs).

is_byte(V) -> is_integer(V) andalso V >= 0 andalso V =< 255.

bpp(0) -> 1;
bpp(2) -> 3;
bpp(3) -> 1;
bpp(4) -> 2;
bpp(6) -> 4.

chunks(<<Len:32, Type:4/binary, Data:Len/binary, Crc:32, Rest/binary>>, Acc) ->
    erlang:crc32([Type, Data]) =:= Crc orelse throw({bad_png, {crc, Type}}),
    case Type of
        <<"IHDR">> ->
            <<W:32, H:32, Depth, CT, 0, 0, Interlace>> = Data,
            chunks(Rest, Acc#{ihdr => {W, H, Depth, CT, Interlace}});
        <<"PLTE">> ->
            chunks(Rest, Acc#{plte => [{R, G, B} || <<R, G, B>> <= Data]});
        <<"IDAT">> ->
            chunks(Rest, Acc#{idat => [Data | maps:get(idat, Acc)]});
        <<"IEND">> ->
            Acc;
        _ ->
            chunks(Rest, Acc)
    end;
chunks(_, _) ->
    throw({bad_png, truncated}).

inflate(Data) ->
    Z = zlib:open(),
    try
        ok = zlib:inflateInit(Z),
        Out = iolist_to_binary(zlib:inflate(Z, Data)),
        ok = zlib:inflateEnd(Z),
        Out
    catch
        error:_ -> throw({bad_png, zlib})
    after
        zlib:close(Z)
    end.

unfilter(<<>>, _, _, _, Acc) ->
    iolist_to_binary(lists:reverse(Acc));
unfilter(Raw, Stride, Bpp, Prior, Acc) ->
    <<Type, Line:Stride/binary, Rest/binary>> = Raw,
    Row = unfilter_row(Type, Line, Prior, Bpp),
    unfilter(Rest, Stride, Bpp, Row, [Row | Acc]).

unfilter_row(0, Line, _, _) ->
    Line;
unfilter_row(Type, Line, Prior, Bpp) when Type >= 1, Type =< 4 ->
    Up = binary_to_list(Prior),
    UpLeft = lists:duplicate(Bpp, 0) ++ Up,
    %% The reconstructed bytes Bpp to the left are kept in a short queue.
    list_to_binary(recon(Type, binary_to_list(Line), Up, UpLeft, lists:duplicate(Bpp, 0)));
unfilter_row(Type, _, _, _) ->
    throw({bad_png, {filter, Type}}).

recon(_, [], _, _, _) ->
    [];
recon(T, [X | Xs], [B | Bs], [C | Cs], [A | As]) ->
    V = case T of
            1 -> X + A;
            2 -> X + B;
            3 -> X + (A + B) div 2;
            4 -> X + paeth(A, B, C)
        end band 255,
    [V | recon(T, Xs, Bs, Cs, As ++ [V])].

paeth(A, B, C) ->
    P = A + B - C,
    Pa = abs(P - A),
    Pb = abs(P - B),
    Pc = abs(P - C),
    if
        Pa =< Pb, Pa =< Pc -> A;
        Pb =< Pc -> B;
        true -> C
    end.
