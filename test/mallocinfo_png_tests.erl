%% EUnit: the PNG writer and reader, round trip through every filter type,
%% and the reader's refusals.
-module(mallocinfo_png_tests).
-include_lib("eunit/include/eunit.hrl").

random_pixels(N) ->
    rand:seed(exsss, {1, 2, 3}),
    << <<(rand:uniform(256) - 1)>> || _ <- lists:seq(1, N) >>.

round_trip(Header, Pixels, Filter) ->
    Png = iolist_to_binary(mallocinfo_png:encode(Header, #{pixels => Pixels, filter => Filter})),
    {ok, Img} = mallocinfo_png:decode(Png),
    Img.

%% Random data defeats any filter's guesswork: every byte must come back.
rgb_every_filter_test_() ->
    [{atom_to_list(F) ++ " " ++ integer_to_list(W) ++ "x" ++ integer_to_list(H),
      fun() ->
              Px = random_pixels(W * H * 3),
              Img = round_trip(#{width => W, height => H, format => rgb}, Px, F),
              ?assertMatch(#{width := W, height := H, color_type := 2, bpp := 3}, Img),
              ?assertEqual(Px, maps:get(pixels, Img))
      end}
     || F <- [none, sub, up, average, paeth], {W, H} <- [{1, 1}, {7, 5}, {64, 33}]].

palette_every_filter_test_() ->
    Palette = [{I, 255 - I, I div 2} || I <- lists:seq(0, 15)],
    [{atom_to_list(F),
      fun() ->
              Px = << <<(B rem 16)>> || <<B>> <= random_pixels(13 * 9) >>,
              Img = round_trip(#{width => 13, height => 9, format => {palette, Palette}}, Px, F),
              ?assertEqual(Px, maps:get(pixels, Img)),
              <<I0, _/binary>> = Px,
              ?assertEqual(lists:nth(I0 + 1, Palette), mallocinfo_png:pixel(Img, 0, 0)),
              I5 = binary:at(Px, 3 * 13 + 5),
              ?assertEqual(lists:nth(I5 + 1, Palette), mallocinfo_png:pixel(Img, 5, 3))
      end}
     || F <- [none, sub, up, average, paeth]].

%% The streamed writer: rows in pieces split anywhere give the same image.
streamed_test() ->
    W = 10, H = 4,
    Px = random_pixels(W * H * 3),
    {Writer, Head} = mallocinfo_png:open(#{width => W, height => H, format => rgb}),
    Lines = iolist_to_binary([[0, binary:part(Px, Y * W * 3, W * 3)] || Y <- lists:seq(0, H - 1)]),
    <<A:17/binary, B:40/binary, C/binary>> = Lines,
    Png = iolist_to_binary([Head, mallocinfo_png:write(Writer, A), mallocinfo_png:write(Writer, B),
                            mallocinfo_png:write(Writer, C), mallocinfo_png:close(Writer)]),
    {ok, Img} = mallocinfo_png:decode(Png),
    ?assertEqual(Px, maps:get(pixels, Img)),
    <<R, G, Bl, _/binary>> = Px,
    ?assertEqual({R, G, Bl}, mallocinfo_png:pixel(Img, 0, 0)).

refusals_test() ->
    Good = iolist_to_binary(mallocinfo_png:encode(#{width => 3, height => 3, format => rgb},
                                                  #{pixels => random_pixels(27)})),
    ?assertEqual({error, {bad_png, signature}}, mallocinfo_png:decode(<<"GIF89a">>)),
    ?assertEqual({error, {bad_png, truncated}},
                 mallocinfo_png:decode(binary:part(Good, 0, byte_size(Good) - 20))),
    %% A flipped byte inside IHDR's data fails its CRC.
    <<Pre:20/binary, X, Post/binary>> = Good,
    ?assertEqual({error, {bad_png, {crc, <<"IHDR">>}}},
                 mallocinfo_png:decode(<<Pre/binary, (X bxor 1), Post/binary>>)),
    ?assertError(badarg, mallocinfo_png:encode(#{width => 3, height => 3, format => rgb},
                                               #{pixels => <<1, 2, 3>>})),
    ?assertError(badarg, mallocinfo_png:open(#{width => 0, height => 3, format => rgb})).
