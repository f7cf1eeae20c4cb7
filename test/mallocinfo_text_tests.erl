%% mallocinfo_text:name/1: any bytes in, printable Unicode out, with what
%% could act on a terminal or is not UTF-8 escaped, one way only.
-module(mallocinfo_text_tests).
-include_lib("eunit/include/eunit.hrl").

-define(N(X), mallocinfo_text:name(X)).

plain_names_are_kept_test() ->
    ?assertEqual("malloc", ?N(<<"malloc">>)),
    ?assertEqual("std::vector<int>::push_back(int&&)", ?N(<<"std::vector<int>::push_back(int&&)">>)),
    ?assertEqual("ünïcödé ☃", ?N(<<"ünïcödé ☃"/utf8>>)),
    ?assertEqual("ünïcödé ☃", ?N("ünïcödé ☃")),
    ?assertEqual("beam.smp", ?N('beam.smp')),
    ?assertEqual("/usr/lib/x86_64-linux-gnu/libc.so.6",
                 ?N(["/usr/lib/", <<"x86_64-linux-gnu">>, [$/, "libc.so.6"]])),
    ?assertEqual("", ?N(<<>>)),
    ?assertEqual("", ?N([])).

%% The issue's symbol: invalid UTF-8 shown byte by byte.
invalid_utf8_test() ->
    ?assertEqual("bad\\xFF\\xFEutf8", ?N(<<"bad", 8#377, 8#376, "utf8">>)),
    %% A truncated sequence, a lone continuation byte, an overlong NUL, a
    %% surrogate encoded in UTF-8, and a code point past U+10FFFF.
    ?assertEqual("a\\xE2\\x98", ?N(<<"a", 16#E2, 16#98>>)),
    ?assertEqual("\\x80b", ?N(<<16#80, "b">>)),
    ?assertEqual("\\xC0\\x80", ?N(<<16#C0, 16#80>>)),
    ?assertEqual("\\xED\\xA0\\x80", ?N(<<16#ED, 16#A0, 16#80>>)),
    ?assertEqual("\\xF4\\x90\\x80\\x80", ?N(<<16#F4, 16#90, 16#80, 16#80>>)),
    %% Valid sequences around invalid bytes are kept.
    ?assertEqual("☃\\xFF☃", ?N(<<"☃"/utf8, 16#FF, "☃"/utf8>>)).

%% The issue's terminal payload: nothing a terminal acts on survives.
terminal_escapes_test() ->
    Payload = <<"ansi\e[31mRED\e]0;pwned-title", 7, "\e[2Jend">>,  % 7: BEL
    ?assertEqual("ansi\\x1B[31mRED\\x1B]0;pwned-title\\x07\\x1B[2Jend", ?N(Payload)),
    %% Every C0 control and DEL; C1 controls as code points (CSI, OSC, NEL);
    %% bidirectional controls and the line separators.
    [?assertEqual(lists:flatten(io_lib:format("\\x~2.16.0B", [C])), ?N(<<C>>))
     || C <- lists:seq(0, 31) ++ [127]],
    ?assertEqual("\\u009B31m\\u009D0;t\\u0085", ?N(<<"\x{9B}31m\x{9D}0;t\x{85}"/utf8>>)),
    ?assertEqual("\\u202Eevil\\u202C \\u2066x\\u2069 \\u200F\\u061C\\u2028\\u2029",
                 ?N(<<"\x{202E}evil\x{202C} \x{2066}x\x{2069} \x{200F}\x{61C}\x{2028}\x{2029}"/utf8>>)),
    %% In an atom (a registered name) and in a list (a file name) too.
    ?assertEqual("\\x1B[2J", ?N(list_to_atom("\e[2J"))),
    ?assertEqual("\\x1B[2J\\xFF", ?N(["\e[2J", <<255>>])).

%% A backslash is escaped too, so "\xFF" written in a name is not read as
%% an invalid byte.
backslash_is_unambiguous_test() ->
    ?assertEqual("a\\\\xFF", ?N(<<"a\\xFF">>)),
    ?assertNotEqual(?N(<<"a\\xFF">>), ?N(<<"a", 255>>)).

%% Every output is printable text: valid Unicode, no control character,
%% whatever the input, over all two-byte inputs and random longer ones.
any_bytes_test() ->
    Inputs = [<<A, B>> || A <- lists:seq(0, 255), B <- lists:seq(0, 255, 5)]
        ++ [rand:bytes(N) || N <- lists:seq(1, 64), _ <- lists:seq(1, 20)],
    [begin
         Out = ?N(In),
         ?assert(is_binary(unicode:characters_to_binary(Out))),
         ?assertEqual([], [C || C <- Out, C < 32 orelse (C >= 127 andalso C =< 16#9F)])
     end || In <- Inputs].

not_a_name_test() ->
    [?assertError(badarg, ?N(X)) || X <- [1, 1.5, {a}, self(), [a], [-1], [<<1:1>>], #{}]].
