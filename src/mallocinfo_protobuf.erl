%% @private The part of protobuf's wire format a `profile.proto' needs:
%% varints, length-delimited fields and packed repeated varints. Pure; every
%% function returns iodata, so a message is built without copying its
%% fields, and one `iolist_to_binary/1' at the end flattens it.
%%
%% Fields are proto3 scalars: a zero (or `false', or empty) value is the
%% default and is not written, as protoc-generated encoders do, so a
%% reader sees the same message either way and the output stays small.
-module(mallocinfo_protobuf).

-export([varint/1, uint/2, int/2, bool/2, bytes/2, message/2, packed/2, submessages/2]).

-define(VARINT, 0).
-define(LEN, 2).

%% @doc A base-128 varint. Negative integers are written as their 64-bit
%% two's complement (protobuf's int64), ten bytes.
-spec varint(integer()) -> binary().
varint(N) when is_integer(N), N >= 0, N < 1 bsl 64 ->
    append_varint(N, <<>>);
varint(N) when is_integer(N), N < 0, N >= -(1 bsl 63) ->
    append_varint(N + (1 bsl 64), <<>>);
varint(N) ->
    erlang:error(badarg, [N]).

%% Acc with N's varint after it. A profile has a million of them (30K
%% stacks of 32 frames): the common sizes get a clause each, and Acc is
%% appended to in place (the runtime grows a binary being appended to
%% without copying it).
append_varint(N, Acc) when N < 16#80 ->
    <<Acc/binary, N>>;
append_varint(N, Acc) when N < 16#4000 ->
    <<Acc/binary, (N band 16#7f bor 16#80), (N bsr 7)>>;
append_varint(N, Acc) when N < 16#200000 ->
    <<Acc/binary, (N band 16#7f bor 16#80), ((N bsr 7) band 16#7f bor 16#80), (N bsr 14)>>;
append_varint(N, Acc) ->
    append_varint(N bsr 7, <<Acc/binary, (N band 16#7f bor 16#80)>>).

key(Field, Wire) ->
    varint(Field bsl 3 bor Wire).

%% @doc A `uint64' field; nothing for 0.
-spec uint(pos_integer(), non_neg_integer()) -> iodata().
uint(_Field, 0) -> [];
uint(Field, N) -> [key(Field, ?VARINT), varint(N)].

%% @doc An `int64' field; nothing for 0.
-spec int(pos_integer(), integer()) -> iodata().
int(Field, N) -> uint(Field, N).

%% @doc A `bool' field; nothing for false.
-spec bool(pos_integer(), boolean()) -> iodata().
bool(_Field, false) -> [];
bool(Field, true) -> [key(Field, ?VARINT), 1].

%% @doc A `string' or `bytes' field, written even when empty: a repeated
%% string (the string table) keeps its empty entries, and a singular empty
%% one costs two bytes.
-spec bytes(pos_integer(), iodata()) -> iodata().
bytes(Field, Data) ->
    [key(Field, ?LEN), varint(iolist_size(Data)), Data].

%% @doc An embedded message field, its body already encoded.
-spec message(pos_integer(), iodata()) -> iodata().
message(Field, Body) ->
    bytes(Field, Body).

%% @doc One embedded message field per body (a repeated message).
-spec submessages(pos_integer(), [iodata()]) -> iodata().
submessages(Field, Bodies) ->
    [message(Field, B) || B <- Bodies].

%% @doc A packed repeated varint field (`repeated uint64' / `int64');
%% nothing for an empty list.
-spec packed(pos_integer(), [integer()]) -> iodata().
packed(_Field, []) ->
    [];
packed(Field, Values) ->
    Body = packed_body(Values, <<>>),
    [key(Field, ?LEN), varint(byte_size(Body)), Body].

packed_body([], Acc) ->
    Acc;
packed_body([V | Rest], Acc) when is_integer(V), V >= 0, V < 1 bsl 64 ->
    packed_body(Rest, append_varint(V, Acc));
packed_body([V | Rest], Acc) ->
    packed_body(Rest, <<Acc/binary, (varint(V))/binary>>).
