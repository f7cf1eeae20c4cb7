%% @private Humanised units for reports read at 80 columns: bytes with binary
%% units, large counts with k/M/G, ages from milliseconds to days, times of
%% day in UTC. Pure.
-module(mallocinfo_units).

-export([bytes/1, count/1, age/1, utc/1]).

%% @doc Bytes with a binary unit and one decimal: `512 B', `1.5 KiB',
%% `64.0 MiB', `1.8 GiB'; `undefined' is `-'. Anything but an integer or
%% `undefined' raises `badarg' (so do non-integers and negatives for
%% count/1 and age/1).
-spec bytes(integer() | undefined) -> io_lib:chars().
bytes(undefined) -> "-";
bytes(B) when not is_integer(B) -> erlang:error(badarg, [B]);
bytes(B) when B < 0 -> "-" ++ bytes(-B);
bytes(B) when B < 1024 -> integer_to_list(B) ++ " B";
bytes(B) -> scaled(B, 1024, ["KiB", "MiB", "GiB", "TiB", "PiB"]).

%% @doc A count: as is below 10,000, else `12.3 k', `160 k', `3.2 M'.
-spec count(non_neg_integer()) -> io_lib:chars().
count(N) when not is_integer(N); N < 0 -> erlang:error(badarg, [N]);
count(N) when N < 10000 -> integer_to_list(N);
count(N) -> scaled(N, 1000, ["k", "M", "G", "T"]).

scaled(V, Base, [Unit | Rest]) ->
    X = V / Base,
    if
        X >= Base, Rest =/= [] -> scaled(X, Base, Rest);
        X >= 100, Base =:= 1000 -> io_lib:format("~b ~s", [round(X), Unit]);
        true -> io_lib:format("~.1f ~s", [X, Unit])
    end.

%% @doc An age: `850 ms', `42 s', `5.2 min', `5.0 h', `3.1 d'.
-spec age(non_neg_integer()) -> io_lib:chars().
age(Ms) when not is_integer(Ms); Ms < 0 -> erlang:error(badarg, [Ms]);
age(Ms) when Ms < 1000 -> io_lib:format("~b ms", [Ms]);
age(Ms) when Ms < 60000 -> io_lib:format("~b s", [Ms div 1000]);
age(Ms) when Ms < 3600000 -> io_lib:format("~.1f min", [Ms / 60000]);
age(Ms) when Ms < 2 * 86400000 -> io_lib:format("~.1f h", [Ms / 3600000]);
age(Ms) -> io_lib:format("~.1f d", [Ms / 86400000]).

%% @doc A Unix time in milliseconds as RFC 3339 in UTC:
%% `2025-11-24T16:00:00.000Z'. One past year 9999 (a corrupt heap dump's
%% time, which nothing checks) reads `at unix time N ms'. Anything but a
%% non-negative integer raises `badarg'.
-spec utc(non_neg_integer()) -> io_lib:chars().
utc(Ms) when not is_integer(Ms); Ms < 0 -> erlang:error(badarg, [Ms]);
utc(Ms) when Ms < 253402300800000 ->
    calendar:system_time_to_rfc3339(Ms, [{unit, millisecond}, {offset, "Z"}]);
utc(Ms) -> io_lib:format("at unix time ~b ms", [Ms]).
