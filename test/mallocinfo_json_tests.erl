%% mallocinfo_json: exact output for each kind of term, refusals, and
%% round trips through a strict decoder (mi_json_decode) over canned and
%% generated terms.
-module(mallocinfo_json_tests).
-include_lib("eunit/include/eunit.hrl").

enc(T) -> iolist_to_binary(mallocinfo_json:encode(T)).

literals_test() ->
    ?assertEqual(<<"true">>, enc(true)),
    ?assertEqual(<<"false">>, enc(false)),
    ?assertEqual(<<"null">>, enc(null)),
    ?assertEqual(<<"null">>, enc(undefined)),
    ?assertEqual(<<"\"glibc\"">>, enc(glibc)).

numbers_test() ->
    ?assertEqual(<<"0">>, enc(0)),
    ?assertEqual(<<"-42">>, enc(-42)),
    %% Beyond 64 bits: JSON numbers have no size limit.
    ?assertEqual(<<"340282366920938463463374607431768211456">>, enc(1 bsl 128)),
    ?assertEqual(<<"1.5">>, enc(1.5)),
    ?assertEqual(<<"-0.0">>, enc(-0.0)),
    ?assertEqual(<<"1.0e300">>, enc(1.0e300)),
    ?assertEqual(<<"1.0e-300">>, enc(1.0e-300)),
    ?assertEqual(0.1, mi_json_decode:decode(enc(0.1))).

strings_test() ->
    ?assertEqual(<<"\"\"">>, enc(<<>>)),
    ?assertEqual(<<"\"a\\\"b\\\\c\"">>, enc(<<"a\"b\\c">>)),
    ?assertEqual(<<"\"\\n\\r\\t\\b\\f\"">>, enc(<<"\n\r\t\b\f">>)),
    ?assertEqual(<<"\"\\u0000\\u0001\\u001F\"">>, enc(<<0, 1, 31>>)),
    %% DEL and '/' need no escape.
    ?assertEqual(<<"\"\x7f/\"">>, enc(<<127, $/>>)),
    %% UTF-8 passes through unchanged, except the two JavaScript line ends.
    ?assertEqual(<<"\"h", 16#e9/utf8, "llo ", 16#1F600/utf8, "\"">>,
                 enc(<<"h", 16#e9/utf8, "llo ", 16#1F600/utf8>>)),
    ?assertEqual(<<"\"a\\u2028b\\u2029\"">>, enc(<<"a", 16#2028/utf8, "b", 16#2029/utf8>>)),
    %% Escapes and plain runs interleaved.
    ?assertEqual(<<"\"x\\ny\\\"z\"">>, enc(<<"x\ny\"z">>)).

invalid_utf8_test_() ->
    Bad = [<<255>>, <<"ok", 16#c3>>, <<16#c0, 16#80>>,      % truncated, overlong NUL
           <<16#ed, 16#a0, 16#80>>,                         % surrogate U+D800
           <<16#f4, 16#90, 16#80, 16#80>>,                  % above U+10FFFF
           <<16#80>>],                                      % lone continuation
    [?_assertError(badarg, mallocinfo_json:encode(B)) || B <- Bad]
        ++ [?_assertError(badarg, mallocinfo_json:encode(#{B => 1})) || B <- Bad]
        ++ [?_assertError(badarg, mallocinfo_json:encode([1, #{k => [B]}])) || B <- Bad].

unsupported_terms_test_() ->
    Bad = [{1, 2}, self(), make_ref(), fun() -> ok end, [1 | 2], #{1 => 2},
           #{"charlist" => 1}, #{a => 1, <<"a">> => 2}, [ok, {x}]],
    [?_assertError(badarg, mallocinfo_json:encode(T)) || T <- Bad].

containers_test() ->
    ?assertEqual(<<"[]">>, enc([])),
    ?assertEqual(<<"{}">>, enc(#{})),
    ?assertEqual(<<"[1,\"a\",[true,null]]">>, enc([1, <<"a">>, [true, null]])),
    %% Keys sorted, atom and binary keys alike.
    ?assertEqual(<<"{\"a\":1,\"b\":{\"c\":[]},\"d\":\"x\"}">>,
                 enc(#{<<"d">> => x, a => 1, b => #{c => []}})).

%% What /memory.json is made of: mallinfo, tracker status, parsed heaps.
realistic_round_trip_test() ->
    T = #{allocator => glibc,
          mallinfo2 => #{arena => 10825728, ordblks => 362, usmblks => 0},
          tracker => #{preloaded => true, mode => full, calls => #{malloc => 12}},
          malloc_info => #{heaps => [#{nr => 0, sizes => [#{from => 17, to => 32}],
                                       system => #{current => 1, max => undefined}}],
                           total => #{<<"future">> => 3}}},
    ?assertEqual(#{<<"allocator">> => <<"glibc">>,
                   <<"mallinfo2">> => #{<<"arena">> => 10825728, <<"ordblks">> => 362,
                                        <<"usmblks">> => 0},
                   <<"tracker">> => #{<<"preloaded">> => true, <<"mode">> => <<"full">>,
                                      <<"calls">> => #{<<"malloc">> => 12}},
                   <<"malloc_info">> =>
                       #{<<"heaps">> => [#{<<"nr">> => 0,
                                           <<"sizes">> => [#{<<"from">> => 17, <<"to">> => 32}],
                                           <<"system">> => #{<<"current">> => 1,
                                                             <<"max">> => null}}],
                         <<"total">> => #{<<"future">> => 3}}},
                 mi_json_decode:decode(enc(T))).

%% Generated terms (fixed seed, so a failure reproduces): every code point
%% class, every escape, deep nesting; decode(encode(T)) must equal T with
%% atoms as binaries.
generated_round_trip_test() ->
    rand:seed(exsss, {17, 42, 4711}),
    lists:foreach(
      fun(_) ->
              T = gen(4),
              ?assertEqual(normal(T), mi_json_decode:decode(enc(T)))
      end, lists:seq(1, 2000)).

gen(0) -> scalar();
gen(D) ->
    case rand:uniform(4) of
        1 -> [gen(D - 1) || _ <- lists:seq(1, rand:uniform(4) - 1)];
        2 -> maps:from_list([{gen_key(), gen(D - 1)} || _ <- lists:seq(1, rand:uniform(4) - 1)]);
        _ -> scalar()
    end.

gen_key() ->
    case rand:uniform(2) of
        1 -> gen_string();
        2 -> list_to_atom("k" ++ integer_to_list(rand:uniform(50)))
    end.

scalar() ->
    case rand:uniform(7) of
        1 -> rand:uniform(1 bsl 70) - (1 bsl 69);
        2 -> (rand:uniform() - 0.5) * math:pow(10, rand:uniform(600) - 300);
        3 -> lists:nth(rand:uniform(3), [true, false, null]);
        _ -> gen_string()
    end.

gen_string() ->
    unicode:characters_to_binary([code_point() || _ <- lists:seq(1, rand:uniform(12) - 1)]).

code_point() ->
    case rand:uniform(6) of
        1 -> rand:uniform(16#20) - 1;                 % controls
        2 -> lists:nth(rand:uniform(4), [$", $\\, $/, 16#7f]);
        3 -> 16#20 + rand:uniform(16#5f) - 1;         % printable ASCII
        4 -> 16#80 + rand:uniform(16#D800 - 16#80) - 1;
        5 -> 16#E000 + rand:uniform(16#10000 - 16#E000) - 1;
        6 -> 16#10000 + rand:uniform(16#100000) - 1   % astral planes
    end.

normal(A) when A =:= true; A =:= false; A =:= null -> A;
normal(A) when is_atom(A) -> atom_to_binary(A, utf8);
normal(L) when is_list(L) -> [normal(E) || E <- L];
normal(M) when is_map(M) -> maps:from_list([{normal(K), normal(V)} || {K, V} <- maps:to_list(M)]);
normal(X) -> X.

%% The decoder is strict: it would catch an encoder that wrote these.
decoder_is_strict_test_() ->
    Bad = [<<"01">>, <<"1.">>, <<".5">>, <<"1e">>, <<"+1">>, <<"[1,]">>, <<"{\"a\":1,}">>,
           <<"\"a\nb\"">>, <<"\"\\x\"">>, <<"\"\\ud800\"">>, <<"\"", 255, "\"">>,
           <<"{\"a\":1,\"a\":2}">>, <<"[1] x">>, <<"nul">>, <<"'a'">>, <<"{a:1}">>],
    [?_assertError({json, _, _}, mi_json_decode:decode(B)) || B <- Bad].
