%% A strict JSON decoder (RFC 8259), for the tests only: it checks what
%% mallocinfo_json and the HTTP endpoint produce, so it refuses anything the
%% grammar does not allow (leading zeros, raw control characters in strings,
%% invalid UTF-8, lone surrogates, trailing commas, duplicate keys, trailing
%% text) instead of guessing.
%%
%% Objects become maps with binary keys, arrays lists, strings binaries,
%% numbers integers (no fraction, no exponent) or floats, and the literals
%% `true', `false', `null'. Errors raise `{json, Why, Offset}'.
%%
%% decode/2 with `#{duplicate_keys => last}' accepts an object that repeats
%% a name (RFC 8259 says names SHOULD be unique, so such a text is still
%% JSON; jemalloc 5.3's stats repeat a few) and keeps the last value, as
%% most parsers do.
-module(mi_json_decode).

-export([decode/1, decode/2]).

decode(Text) ->
    decode(Text, #{duplicate_keys => reject}).

%% `Doc' below is {Text, DuplicateKeys}: the whole text for error offsets,
%% and the option.
decode(Bin, #{duplicate_keys := Dup}) when is_binary(Bin), (Dup =:= reject orelse Dup =:= last) ->
    Doc = {Bin, Dup},
    {Value, Rest} = value(ws(Bin), Doc),
    case ws(Rest) of
        <<>> -> Value;
        Tail -> fail(trailing_text, Tail, Doc)
    end;
decode(IoData, Opts) ->
    decode(iolist_to_binary(IoData), Opts).

ws(<<C, Rest/binary>>) when C =:= $\s; C =:= $\t; C =:= $\n; C =:= $\r -> ws(Rest);
ws(Bin) -> Bin.

value(<<"true", R/binary>>, _) -> {true, R};
value(<<"false", R/binary>>, _) -> {false, R};
value(<<"null", R/binary>>, _) -> {null, R};
value(<<$", R/binary>>, Doc) -> string(R, [], Doc);
value(<<${, R/binary>>, Doc) -> object(ws(R), #{}, Doc);
value(<<$[, R/binary>>, Doc) -> array(ws(R), Doc);
value(<<C, _/binary>> = R, Doc) when C =:= $-; C >= $0, C =< $9 -> number(R, Doc);
value(R, Doc) -> fail(unexpected, R, Doc).

object(<<$}, R/binary>>, Acc, _) when map_size(Acc) =:= 0 ->
    {Acc, R};
object(<<$", R/binary>>, Acc, Doc) ->
    {Key, R1} = string(R, [], Doc),
    case maps:is_key(Key, Acc) andalso element(2, Doc) =:= reject of
        true -> fail({duplicate_key, Key}, R1, Doc);
        false -> ok
    end,
    case ws(R1) of
        <<$:, R2/binary>> ->
            {V, R3} = value(ws(R2), Doc),
            case ws(R3) of
                <<$,, R4/binary>> -> object(ws(R4), Acc#{Key => V}, Doc);
                <<$}, R4/binary>> -> {Acc#{Key => V}, R4};
                R4 -> fail(expected_comma_or_brace, R4, Doc)
            end;
        R2 ->
            fail(expected_colon, R2, Doc)
    end;
object(R, _, Doc) ->
    fail(expected_key, R, Doc).

array(<<$], R/binary>>, _) ->
    {[], R};
array(R, Doc) ->
    elements(R, [], Doc).

elements(R, Acc, Doc) ->
    {V, R1} = value(R, Doc),
    case ws(R1) of
        <<$,, R2/binary>> -> elements(ws(R2), [V | Acc], Doc);
        <<$], R2/binary>> -> {lists:reverse([V | Acc]), R2};
        R2 -> fail(expected_comma_or_bracket, R2, Doc)
    end.

string(<<$", R/binary>>, Acc, _) ->
    {unicode:characters_to_binary(lists:reverse(Acc)), R};
string(<<$\\, R/binary>>, Acc, Doc) ->
    escape(R, Acc, Doc);
string(<<C, _/binary>> = R, _, Doc) when C < 16#20 ->
    fail(control_character_in_string, R, Doc);
string(<<C/utf8, R/binary>>, Acc, Doc) ->
    string(R, [C | Acc], Doc);
string(R, _, Doc) ->
    fail(bad_string, R, Doc).

escape(<<C, R/binary>>, Acc, Doc) when C =:= $"; C =:= $\\; C =:= $/ -> string(R, [C | Acc], Doc);
escape(<<$b, R/binary>>, Acc, Doc) -> string(R, [$\b | Acc], Doc);
escape(<<$f, R/binary>>, Acc, Doc) -> string(R, [$\f | Acc], Doc);
escape(<<$n, R/binary>>, Acc, Doc) -> string(R, [$\n | Acc], Doc);
escape(<<$r, R/binary>>, Acc, Doc) -> string(R, [$\r | Acc], Doc);
escape(<<$t, R/binary>>, Acc, Doc) -> string(R, [$\t | Acc], Doc);
escape(<<$u, H:4/binary, R/binary>> = Here, Acc, Doc) ->
    case hex(H) of
        Hi when Hi >= 16#D800, Hi =< 16#DBFF ->
            case R of
                <<"\\u", L:4/binary, R2/binary>> ->
                    case hex(L) of
                        Lo when Lo >= 16#DC00, Lo =< 16#DFFF ->
                            C = 16#10000 + ((Hi - 16#D800) bsl 10) + (Lo - 16#DC00),
                            string(R2, [C | Acc], Doc);
                        _ ->
                            fail(lone_surrogate, Here, Doc)
                    end;
                _ ->
                    fail(lone_surrogate, Here, Doc)
            end;
        Lo when Lo >= 16#DC00, Lo =< 16#DFFF ->
            fail(lone_surrogate, Here, Doc);
        C when is_integer(C) ->
            string(R, [C | Acc], Doc);
        error ->
            fail(bad_unicode_escape, Here, Doc)
    end;
escape(R, _, Doc) ->
    fail(bad_escape, R, Doc).

hex(<<_:4/binary>> = H) ->
    case lists:all(fun(C) -> lists:member(C, "0123456789abcdefABCDEF") end, binary_to_list(H)) of
        true -> binary_to_integer(H, 16);
        false -> error
    end.

%% number = [ minus ] int [ frac ] [ exp ]; int = zero / ( digit1-9 *DIGIT )
number(Bin, Doc) ->
    {Sign, R0} = case Bin of
                     <<$-, Unsigned/binary>> -> {"-", Unsigned};
                     _ -> {"", Bin}
                 end,
    {Int, R1} = case R0 of
                    <<$0, AfterZero/binary>> -> {"0", AfterZero};
                    <<C, _/binary>> when C >= $1, C =< $9 -> digits(R0, []);
                    _ -> fail(bad_number, R0, Doc)
                end,
    {Frac, R2} = case R1 of
                     <<$., AfterDot/binary>> ->
                         case digits(AfterDot, []) of
                             {"", _} -> fail(bad_fraction, AfterDot, Doc);
                             Fraction -> Fraction
                         end;
                     _ -> {none, R1}
                 end,
    {Exp, R3} = case R2 of
                    <<E, AfterE/binary>> when E =:= $e; E =:= $E ->
                        {ESign, R4} = case AfterE of
                                          <<$+, R5/binary>> -> {"", R5};
                                          <<$-, R5/binary>> -> {"-", R5};
                                          _ -> {"", AfterE}
                                      end,
                        case digits(R4, []) of
                            {"", _} -> fail(bad_exponent, R4, Doc);
                            {Ds, R6} -> {ESign ++ Ds, R6}
                        end;
                    _ -> {none, R2}
                end,
    case {Frac, Exp} of
        {none, none} ->
            {list_to_integer(Sign ++ Int), R3};
        _ ->
            F = case Frac of none -> "0"; _ -> Frac end,
            E2 = case Exp of none -> "0"; _ -> Exp end,
            {list_to_float(Sign ++ Int ++ "." ++ F ++ "e" ++ E2), R3}
    end.

digits(<<C, R/binary>>, Acc) when C >= $0, C =< $9 -> digits(R, [C | Acc]);
digits(R, Acc) -> {lists:reverse(Acc), R}.

fail(Why, Rest, {Text, _}) ->
    error({json, Why, byte_size(Text) - byte_size(Rest)}).
