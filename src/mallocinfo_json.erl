%% @private A JSON encoder (RFC 8259) for the terms mallocinfo produces. OTP 25
%% has no `json' module and mallocinfo takes no dependencies.
%%
%% Pure: no NIF calls, no state. What maps to what:
%%
%% <ul>
%% <li>`true', `false', `null' -> the JSON literals; `undefined' -> `null'</li>
%% <li>other atoms -> strings</li>
%% <li>integers (any size) -> numbers; floats -> numbers, shortest form
%%     that reads back to the same float</li>
%% <li>binaries -> strings; they must be valid UTF-8</li>
%% <li>lists -> arrays (a charlist is an array of numbers: strings are
%%     binaries)</li>
%% <li>maps with atom or binary keys -> objects, keys sorted</li>
%% </ul>
%%
%% Anything else (tuples, pids, invalid UTF-8, a map with other keys or with
%% two keys that are the same string, such as `a' and `<<"a">>') raises
%% `badarg': a document that cannot be represented is never half written.
-module(mallocinfo_json).

-export([encode/1]).

-export_type([json/0]).

-type json() :: null | boolean() | atom() | number() | binary() | [json()]
              | #{atom() | binary() => json()}.

%% @doc The JSON text of `Term', as iodata (no trailing newline).
-spec encode(json()) -> iodata().
encode(Term) ->
    try
        value(Term)
    catch
        throw:{?MODULE, bad_term} -> erlang:error(badarg, [Term])
    end.

%%% ---------------------------------------------------------------------------

value(true) -> <<"true">>;
value(false) -> <<"false">>;
value(null) -> <<"null">>;
value(undefined) -> <<"null">>;
value(A) when is_atom(A) -> string(atom_to_binary(A, utf8));
value(I) when is_integer(I) -> integer_to_binary(I);
value(F) when is_float(F) -> float_to_binary(F, [short]);
value(B) when is_binary(B) -> string(B);
value(L) when is_list(L) -> array(L);
value(M) when is_map(M) -> object(M);
value(_) -> bad().

array([]) ->
    <<"[]">>;
array([H | T]) ->
    [$[, value(H) | elements(T)].

elements([]) -> [$]];
elements([H | T]) -> [$,, value(H) | elements(T)];
elements(_Improper) -> bad().

object(M) ->
    Pairs = lists:keysort(1, [{key(K), V} || {K, V} <- maps:to_list(M)]),
    case Pairs of
        [] -> <<"{}">>;
        [{K, V} | Rest] -> [${, string(K), $:, value(V) | members(K, Rest)]
    end.

%% `Prev' is the key before: sorted, so a duplicate is its neighbour.
members(_Prev, []) -> [$}];
members(Prev, [{Prev, _} | _]) -> bad();
members(_Prev, [{K, V} | Rest]) -> [$,, string(K), $:, value(V) | members(K, Rest)].

key(K) when is_atom(K) -> atom_to_binary(K, utf8);
key(K) when is_binary(K) -> K;
key(_) -> bad().

string(B) ->
    [$", escape(B, B, 0, 0, []), $"].

%% Copies runs of bytes that need no escaping as sub-binaries of the
%% original (`Start', `Len'), and validates UTF-8 as it goes: the `/utf8'
%% match refuses overlong forms, surrogates and code points above U+10FFFF.
escape(Orig, <<C, Rest/binary>>, Start, Len, Acc)
  when C >= 16#20, C < 16#80, C =/= $", C =/= $\\ ->
    escape(Orig, Rest, Start, Len + 1, Acc);
escape(Orig, <<C, Rest/binary>>, Start, Len, Acc) when C < 16#80 ->
    escape(Orig, Rest, Start + Len + 1, 0, [escaped(C), run(Orig, Start, Len) | Acc]);
%% U+2028 and U+2029 are valid in JSON but end a line in JavaScript: escaped
%% so the document can be pasted anywhere.
escape(Orig, <<C/utf8, Rest/binary>>, Start, Len, Acc) when C =:= 16#2028; C =:= 16#2029 ->
    escape(Orig, Rest, Start + Len + 3, 0, [hex4(C), run(Orig, Start, Len) | Acc]);
escape(Orig, <<C/utf8, Rest/binary>>, Start, Len, Acc) ->
    escape(Orig, Rest, Start, Len + utf8_length(C), Acc);
escape(Orig, <<>>, Start, Len, Acc) ->
    lists:reverse(Acc, [run(Orig, Start, Len)]);
escape(_, _, _, _, _) ->
    bad().

run(Orig, Start, Len) -> binary:part(Orig, Start, Len).

escaped($") -> <<"\\\"">>;
escaped($\\) -> <<"\\\\">>;
escaped($\n) -> <<"\\n">>;
escaped($\r) -> <<"\\r">>;
escaped($\t) -> <<"\\t">>;
escaped($\b) -> <<"\\b">>;
escaped($\f) -> <<"\\f">>;
escaped(C) -> hex4(C).

hex4(C) ->
    Hex = integer_to_binary(C, 16),
    Pad = binary:copy(<<"0">>, 4 - byte_size(Hex)),
    <<"\\u", Pad/binary, Hex/binary>>.

utf8_length(C) when C < 16#800 -> 2;
utf8_length(C) when C < 16#10000 -> 3;
utf8_length(_) -> 4.

bad() -> throw({?MODULE, bad_term}).
