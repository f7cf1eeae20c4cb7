%% A small reader of protobuf's wire format and of pprof's profile.proto,
%% for the tests: independent of mallocinfo_protobuf (it reads what that
%% one writes, field by field), and strict (an unknown wire type, a
%% truncated field or a dangling id raises).
-module(mi_pprof_decode).

-export([fields/1, varint/1, varints/1, profile/1]).

%% Every field of a message, in order: {Number, integer()} for varints,
%% {Number, binary()} for length-delimited ones.
fields(<<>>) ->
    [];
fields(Bin) ->
    {Key, Rest} = varint(Bin),
    Field = Key bsr 3,
    case Key band 7 of
        0 ->
            {V, Rest1} = varint(Rest),
            [{Field, V} | fields(Rest1)];
        2 ->
            {Len, Rest1} = varint(Rest),
            <<V:Len/binary, Rest2/binary>> = Rest1,
            [{Field, V} | fields(Rest2)]
    end.

varint(Bin) ->
    varint(Bin, 0, 0).

varint(<<1:1, B:7, Rest/binary>>, Shift, Acc) when Shift < 64 ->
    varint(Rest, Shift + 7, Acc bor (B bsl Shift));
varint(<<0:1, B:7, Rest/binary>>, Shift, Acc) ->
    {Acc bor (B bsl Shift), Rest}.

%% A packed repeated varint field's values.
varints(<<>>) ->
    [];
varints(Bin) ->
    {V, Rest} = varint(Bin),
    [V | varints(Rest)].

all(Field, Fields) -> [V || {F, V} <- Fields, F =:= Field].
one(Field, Fields, Default) ->
    case all(Field, Fields) of
        [] -> Default;
        [V] -> V
    end.

%% The profile as a map: sample_types [{Type, Unit}], default_sample_type,
%% period_type, period, time_nanos, duration_nanos, comments, mappings
%% (maps), samples (#{values, frames (function names, leaf first), leaf,
%% locations}, and labels [{Key, Value}] when the sample has string
%% labels), and the raw string table.
profile(Bin) ->
    F = fields(Bin),
    Strings = list_to_tuple(all(6, F)),
    <<>> = element(1, Strings),
    S = fun(I) -> element(I + 1, Strings) end,
    VT = fun(B) -> Vf = fields(B), {S(one(1, Vf, 0)), S(one(2, Vf, 0))} end,
    Functions = maps:from_list([begin
                                    Ff = fields(B),
                                    {one(1, Ff, 0), #{name => S(one(2, Ff, 0)),
                                                      system_name => S(one(3, Ff, 0)),
                                                      filename => S(one(4, Ff, 0))}}
                                end || B <- all(5, F)]),
    Mappings = [begin
                    Mf = fields(B),
                    #{id => one(1, Mf, 0), start => one(2, Mf, 0), limit => one(3, Mf, 0),
                      offset => one(4, Mf, 0), filename => S(one(5, Mf, 0)),
                      has_functions => one(7, Mf, 0) =:= 1}
                end || B <- all(3, F)],
    MappingIds = [0 | [Id || #{id := Id} <- Mappings]],
    Locations = maps:from_list(
                  [begin
                       Lf = fields(B),
                       Mid = one(2, Lf, 0),
                       true = lists:member(Mid, MappingIds),
                       Names = [maps:get(one(1, fields(L), 0), Functions) || L <- all(4, Lf)],
                       {one(1, Lf, 0), #{address => one(3, Lf, 0), mapping => Mid,
                                         functions => Names}}
                   end || B <- all(4, F)]),
    Samples = [begin
                   Sf = fields(B),
                   Ids = lists:append([varints(P) || P <- all(1, Sf)]),
                   Values = lists:append([varints(P) || P <- all(2, Sf)]),
                   Frames = [Name || Id <- Ids,
                                     #{name := Name} <- maps:get(functions, maps:get(Id, Locations))],
                   Labels = [begin
                                 Lf = fields(L),
                                 {S(one(1, Lf, 0)), S(one(2, Lf, 0))}
                             end || L <- all(3, Sf)],
                   Sample = #{values => Values, locations => Ids, frames => Frames,
                              leaf => case Frames of [] -> undefined; [Leaf | _] -> Leaf end},
                   case Labels of
                       [] -> Sample;
                       _ -> Sample#{labels => Labels}
                   end
               end || B <- all(2, F)],
    #{sample_types => [VT(B) || B <- all(1, F)],
      default_sample_type => S(one(14, F, 0)),
      period_type => case all(11, F) of [] -> undefined; [B] -> VT(B) end,
      period => one(12, F, 0),
      time_nanos => one(9, F, 0),
      duration_nanos => one(10, F, 0),
      comments => [S(I) || P <- all(13, F), I <- varints(P)],
      mappings => Mappings,
      locations => Locations,
      samples => Samples,
      strings => tuple_to_list(Strings)}.
