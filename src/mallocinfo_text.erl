%% @private Names mallocinfo did not write (symbols, object and file paths,
%% process, node and dump fields) made safe for text read on a terminal.
%% Symbols and paths are bytes: any byte sequence comes out as printable
%% Unicode, with what could not be shown, or could act on a terminal,
%% escaped:
%%
%% <ul>
%% <li>a byte that is not part of valid UTF-8: `\xFF';</li>
%% <li>C0 controls (ESC, BEL, tab, newline...) and DEL: `\x1B';</li>
%% <li>C1 controls (U+0080 to U+009F: CSI, OSC...), the bidirectional
%%   controls (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to
%%   U+2069) and the line and paragraph separators (U+2028, U+2029):
%%   `\u009B';</li>
%% <li>the backslash itself: `\\', so every escape reads one way.</li>
%% </ul>
%%
%% Every writer of text (the report and its verdicts,
%% `mallocinfo_process:print/1', the heap map's command) passes names
%% through name/1. Pure; a leaf: calls nothing of mallocinfo.
-module(mallocinfo_text).

-export([name/1]).

%% @doc `Name' as a string of printable characters (a flat list of code
%% points): a binary is bytes (UTF-8 where valid); an atom its text; a
%% list is characters (code points) and binaries (bytes) nested
%% (unicode:chardata(), or a file name as file:list_dir/1 returns it).
%% Anything else raises `badarg'.
-spec name(binary() | atom() | maybe_improper_list()) -> string().
name(Name) when is_binary(Name) ->
    bytes(Name);
name(Name) when is_atom(Name) ->
    bytes(atom_to_binary(Name, utf8));
name(Name) when is_list(Name) ->
    try chars(Name)
    catch error:function_clause -> erlang:error(badarg, [Name])
    end;
name(Name) ->
    erlang:error(badarg, [Name]).

bytes(<<C/utf8, Rest/binary>>) -> char(C) ++ bytes(Rest);
bytes(<<B, Rest/binary>>) -> hex("\\x", B, 2) ++ bytes(Rest);
bytes(<<>>) -> [].

chars([C | Rest]) when is_integer(C), C >= 0 -> code_point(C) ++ chars(Rest);
chars([B | Rest]) when is_binary(B) -> bytes(B) ++ chars(Rest);
chars([L | Rest]) when is_list(L) -> chars(L) ++ chars(Rest);
chars([]) -> [].

%% An integer in a list is a code point; one that is not (a surrogate,
%% past U+10FFFF) is shown by its number.
code_point(C) when C >= 16#D800, C =< 16#DFFF; C > 16#10FFFF -> hex("\\u", C, 4);
code_point(C) -> char(C).

char($\\) -> "\\\\";
char(C) when C < 16#20; C =:= 16#7F -> hex("\\x", C, 2);
char(C) when C >= 16#80, C =< 16#9F -> hex("\\u", C, 4);
char(C) when C =:= 16#61C; C =:= 16#200E; C =:= 16#200F; C =:= 16#2028; C =:= 16#2029;
              C >= 16#202A, C =< 16#202E; C >= 16#2066, C =< 16#2069 ->
    hex("\\u", C, 4);
char(C) -> [C].

hex(Prefix, N, Digits) ->
    H = integer_to_list(N, 16),
    Prefix ++ lists:duplicate(max(0, Digits - length(H)), $0) ++ H.
