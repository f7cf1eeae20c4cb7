%% @private Profiles in the formats other tools read, from the tracker's
%% live sites: pprof's `profile.proto' (Go's `pprof', Pyroscope, Parca,
%% speedscope) and collapsed stacks (`flamegraph.pl', speedscope, the
%% page of {@link mallocinfo_http_flamegraph}). Pure: {@link mallocinfo_trace}
%% feeds it the NIF's snapshot and `/proc/self/maps'.
%%
%% Input (`data()'): `sites', `[{Count, Bytes, [LocationId]}]' (live
%% blocks only: alloc_* = inuse_*), `[{Count, Bytes, AllocCount,
%% AllocBytes, [LocationId]}]' (with the tracker's churn: what the site
%% allocated since start or reset beside what it holds), or the same with
%% a sixth element, Labels `[{Key, Value}]' of binaries: the sample's pprof
%% labels, the process holding the blocks (the folded stacks add up a
%% stack's samples); stacks innermost frame first, ids 1-based positions
%% in `locations',
%% `[{Address, Object, Symbol | undefined, ObjectOffset}]' (each distinct
%% return address once); `mode' and `sample_bytes' of the tracker;
%% `maps', `/proc/self/maps' as read; `exe', the emulator's path (its
%% mapping goes first: pprof takes the first mapping as the main binary);
%% `time_nanos', `duration_nanos' (0 unless a delta), `comments';
%% optionally `default_sample' (`inuse_space', the default, as Go's
%% `/debug/pprof/heap'; `alloc_space' as its `/debug/pprof/allocs').
-module(mallocinfo_trace_profile).

-export([pprof/1, encode/1, folded/1, folded_total/1, frame_names/1, mappings/1, delta/2]).

-export_type([data/0]).

-type location() :: {non_neg_integer(), binary(), binary() | undefined, non_neg_integer()}.
-type site() :: {non_neg_integer(), non_neg_integer(), [pos_integer()]}
              | {integer(), integer(), integer(), integer(), [pos_integer()]}
              | {integer(), integer(), integer(), integer(), [pos_integer()],
                 [{binary(), binary()}]}.
-type data() :: #{sites := [site()],
                  locations := [location()],
                  default_sample => inuse_space | alloc_space,
                  mode := atom(),
                  sample_bytes := non_neg_integer(),
                  maps := binary(),
                  exe := binary(),
                  time_nanos := non_neg_integer(),
                  duration_nanos := non_neg_integer(),
                  comments := [binary()]}.

-import(mallocinfo_protobuf, [uint/2, int/2, bool/2, bytes/2, message/2, packed/2]).

%% The name given to the blocks the tracker holds without a stack (its
%% stack table was full, or the stack was never stored): they are live
%% memory, so they stay in every profile and the totals add up.
-define(NO_STACK, <<"[no stack recorded]">>).

%% @doc The gzipped `profile.proto', as `go tool pprof' and the
%% `/debug/pprof/heap' scrapers expect it.
-spec pprof(data()) -> binary().
pprof(Data) ->
    zlib:gzip(iolist_to_binary(encode(Data))).

%% @doc The `Profile' message, not compressed. Sample types
%% `alloc_objects', `alloc_space', `inuse_objects', `inuse_space' (Go's
%% heap profile; the default `default_sample'). Sites given as
%% `{Count, Bytes, Stack}' have their live figures as alloc_* too.
-spec encode(data()) -> iodata().
encode(#{sites := Sites0, locations := Locs, mode := Mode, sample_bytes := SampleBytes,
         maps := Maps, exe := Exe, time_nanos := Time, duration_nanos := Duration,
         comments := Comments} = Data) ->
    Sites = [full_site(S) || S <- Sites0],
    Locations = list_to_tuple(Locs),
    NoStack = tuple_size(Locations) + 1,
    %% Strings: index 0 is "" (the format requires it).
    S0 = {#{<<>> => 0}, [<<>>], 1},
    {Types, S1} = lists:mapfoldl(fun value_type/2, S0,
                                 [{<<"alloc_objects">>, <<"count">>},
                                  {<<"alloc_space">>, <<"bytes">>},
                                  {<<"inuse_objects">>, <<"count">>},
                                  {<<"inuse_space">>, <<"bytes">>}]),
    {Default, S2} = intern(atom_to_binary(maps:get(default_sample, Data, inuse_space)), S1),
    {PeriodType, S3} = value_type({<<"space">>, <<"bytes">>}, S2),
    Mapped = mappings(Maps),
    Ordered = main_first(Mapped, Exe),
    {MappingMsgs, S4} =
        lists:mapfoldl(fun({Id, {Start, End, Off, Path}}, S) ->
                               {Pi, SPath} = intern(Path, S),
                               {[uint(1, Id), uint(2, Start), uint(3, End), uint(4, Off),
                                 int(5, Pi), bool(7, true)], SPath}
                       end, S3, lists:zip(lists:seq(1, length(Ordered)), Ordered)),
    Lookup = mapping_lookup(Ordered),
    %% Functions: one per distinct name and object.
    {LocMsgs, {_, Funcs, _, S5}} =
        lists:mapfoldl(
          fun({Id, {Address, Object, Symbol, Offset}}, {FunIds, FunAcc, NextFun, S}) ->
                  Name = function_name(Object, Symbol, Offset),
                  {FunId, FunIds1, FunAcc1, NextFun1, S1b} =
                      case FunIds of
                          #{{Name, Object} := F} ->
                              {F, FunIds, FunAcc, NextFun, S};
                          #{} ->
                              {NameI, SName} = intern(Name, S),
                              {ObjI, SObj} = intern(Object, SName),
                              Msg = [uint(1, NextFun), int(2, NameI), int(3, NameI),
                                     int(4, ObjI)],
                              {NextFun, FunIds#{{Name, Object} => NextFun}, [Msg | FunAcc],
                               NextFun + 1, SObj}
                      end,
                  Loc = [uint(1, Id), uint(2, find_mapping(Lookup, Address)), uint(3, Address),
                         message(4, uint(1, FunId))],
                  {Loc, {FunIds1, FunAcc1, NextFun1, S1b}}
          end, {#{}, [], 1, S4}, lists:zip(lists:seq(1, tuple_size(Locations)), Locs)),
    HasEmpty = lists:any(fun({_, _, _, _, Stack, _}) -> Stack =:= [] end, Sites),
    {NoStackMsgs, S6} =
        case HasEmpty of
            true ->
                {NoName, SNo} = intern(?NO_STACK, S5),
                NoFun = length(Funcs) + 1,
                {{[uint(1, NoFun), int(2, NoName), int(3, NoName)],
                  [uint(1, NoStack), message(4, uint(1, NoFun))]}, SNo};
            false ->
                {none, S5}
        end,
    {CommentIds, S6b} = lists:mapfoldl(fun intern/2, S6, Comments),
    %% Labels: each site's [{KeyIndex, ValueIndex}].
    {SiteLabels, S7} = lists:mapfoldl(fun site_labels/2, S6b, Sites),
    %% Every location id's varint, made once: 30K stacks of 32 frames
    %% reuse a few thousand ids, and copying a ready binary into the
    %% output costs less than encoding the integer again.
    Ids = list_to_tuple([mallocinfo_protobuf:varint(I) || I <- lists:seq(1, NoStack)]),
    SampleMsgs = [[stack_field(case Stack of [] -> [NoStack]; _ -> Stack end, Ids),
                   packed(2, [AllocCount, AllocBytes, Count, Bytes]),
                   [message(3, [int(1, K), int(2, V)]) || {K, V} <- Labels]]
                  || {{Count, Bytes, AllocCount, AllocBytes, Stack, _}, Labels}
                         <- lists:zip(Sites, SiteLabels)],
    {_, Strings, _} = S7,
    Period = case Mode of sample -> SampleBytes; _ -> 1 end,
    [[message(1, T) || T <- Types],
     [message(2, M) || M <- SampleMsgs],
     [message(3, M) || M <- MappingMsgs],
     [message(4, M) || M <- LocMsgs],
     case NoStackMsgs of none -> []; {_, NoLoc} -> message(4, NoLoc) end,
     [message(5, M) || M <- lists:reverse(Funcs)],
     case NoStackMsgs of none -> []; {NoFunMsg, _} -> message(5, NoFunMsg) end,
     [bytes(6, S) || S <- lists:reverse(Strings)],
     int(9, Time),
     int(10, Duration),
     message(11, PeriodType),
     int(12, Period),
     packed(13, CommentIds),
     int(14, Default)].

site_labels({_, _, _, _, _, Labels}, S) ->
    lists:mapfoldl(fun({K, V}, Acc) ->
                           {Ki, Acc1} = intern(K, Acc),
                           {Vi, Acc2} = intern(V, Acc1),
                           {{Ki, Vi}, Acc2}
                   end, S, Labels).

%% Every form of a site as {Count, Bytes, AllocCount, AllocBytes, Stack,
%% Labels}.
full_site({Count, Bytes, Stack}) -> {Count, Bytes, Count, Bytes, Stack, []};
full_site({C, B, AC, AB, Stack}) -> {C, B, AC, AB, Stack, []};
full_site({_, _, _, _, _, _} = Site) -> Site.

%% @doc The difference `New - Old' of two profiles' data, site by site, as
%% Go's `?seconds=N' computes it (its old profile scaled by -1 and merged
%% into the new one): sites are matched by their stacks' frames (address,
%% object, symbol), values may be negative (a site holding less than
%% before), sites whose four values are all 0 are left out; rows split
%% by process are matched by pid, and their alloc_* (live blocks, not
%% cumulative) go to the stack's unlabelled row. The result
%% has `New''s metadata and locations (the old profile's frames that only
%% it had are added).
-spec delta(data(), data()) -> data().
delta(#{sites := OldSites, locations := OldLocs}, #{sites := NewSites, locations := NewLocs} = New) ->
    OldT = list_to_tuple(OldLocs),
    NewT = list_to_tuple(NewLocs),
    %% A labelled row's alloc_* are its live blocks (not cumulative: they
    %% fall when the process frees), so only a stack's unlabelled row takes
    %% alloc_* differences, the stack's allocations summed over its rows;
    %% labelled rows take their inuse_* difference, matched by pid (a name
    %% may come or go in the window), named as the new profile names them.
    Keyed = fun(T, Sites, Sign) ->
                    lists:append(
                      [begin
                           Frames = [element(I, T) || I <- Stack],
                           case pid_label(Labels) of
                               none ->
                                   [{{Frames, none}, [Sign * V || V <- [C, B, AC, AB]]}];
                               Pid ->
                                   [{{Frames, Pid}, [Sign * C, Sign * B, 0, 0]},
                                    {{Frames, none}, [0, 0, Sign * AC, Sign * AB]}]
                           end
                       end || {C, B, AC, AB, Stack, Labels} <- [full_site(S) || S <- Sites]])
            end,
    Sums = lists:foldl(fun({K, Vs}, Acc) ->
                               maps:update_with(K, fun(Ws) -> lists:zipwith(fun erlang:'+'/2, Vs, Ws)
                                                   end, Vs, Acc)
                       end, #{}, Keyed(OldT, OldSites, -1) ++ Keyed(NewT, NewSites, 1)),
    Names = maps:from_list([{{[element(I, T) || I <- Stack], pid_label(Labels)}, Labels}
                            || {T, Sites} <- [{OldT, OldSites}, {NewT, NewSites}],
                               {_, _, _, _, Stack, Labels} <- [full_site(S) || S <- Sites],
                               Labels =/= []]),
    %% Locations: the new profile's, then the frames only the old one had.
    Index0 = maps:from_list(lists:zip(NewLocs, lists:seq(1, length(NewLocs)))),
    {Index, Extra} = lists:foldl(fun(L, {Ix, Ex}) ->
                                         case Ix of
                                             #{L := _} -> {Ix, Ex};
                                             #{} -> {Ix#{L => map_size(Ix) + 1}, [L | Ex]}
                                         end
                                 end, {Index0, []}, OldLocs),
    Sites = lists:sort(fun({_, B1, _, A1, _, _} = X, {_, B2, _, A2, _, _} = Y) ->
                               {A1, B1} > {A2, B2} orelse ({A1, B1} =:= {A2, B2} andalso X =< Y)
                       end,
                       [{C, B, AC, AB, [maps:get(L, Index) || L <- Frames],
                         maps:get({Frames, Pid}, Names, [])}
                        || {{Frames, Pid}, [C, B, AC, AB]} <- maps:to_list(Sums),
                           [C, B, AC, AB] =/= [0, 0, 0, 0]]),
    New#{sites => Sites, locations => NewLocs ++ lists:reverse(Extra)}.

%% The `pid' label's value, or none.
pid_label(Labels) ->
    case lists:keyfind(<<"pid">>, 1, Labels) of
        {_, Pid} -> Pid;
        false -> none
    end.

%% Sample.location_id, packed, from the ids' ready varints.
stack_field(Stack, Ids) ->
    {Body, Size} = stack_body(Stack, Ids, [], 0),
    [<<10>>, mallocinfo_protobuf:varint(Size), Body].

stack_body([], _, Acc, Size) ->
    {Acc, Size};
stack_body([I | Rest], Ids, Acc, Size) ->
    V = element(I, Ids),
    stack_body(Rest, Ids, [Acc, V], Size + byte_size(V)).

%% A ValueType message, its strings interned.
value_type({Type, Unit}, S) ->
    {Ti, Sa} = intern(Type, S),
    {Ui, Sb} = intern(Unit, Sa),
    {[int(1, Ti), int(2, Ui)], Sb}.

intern(String, {Index, List, Next} = S) ->
    case Index of
        #{String := I} -> {I, S};
        #{} -> {Next, {Index#{String => Next}, [String | List], Next + 1}}
    end.

%% A frame's function: its symbol, or where it is when no symbol covers
%% it ("beam.smp+0x1a2b"), so pprof never needs the binaries to name it.
function_name(_Object, Symbol, _Offset) when is_binary(Symbol) ->
    Symbol;
function_name(Object, undefined, Offset) ->
    <<(basename(Object))/binary, "+0x", (integer_to_binary(Offset, 16))/binary>>.

basename(<<>>) -> <<"[unmapped]">>;
basename(Path) -> filename:basename(Path).

%% @doc The executable mappings of a `/proc/self/maps' text, in its order:
%% `{Start, Limit, FileOffset, Path}' (Path `<<>>' for anonymous ones, JIT
%% code among them).
-spec mappings(binary()) -> [{non_neg_integer(), non_neg_integer(), non_neg_integer(), binary()}].
mappings(Maps) ->
    lists:filtermap(fun mapping/1, binary:split(Maps, <<"\n">>, [global, trim_all])).

mapping(Line) ->
    case binary:split(Line, <<" ">>, [global, trim_all]) of
        [Range, <<_, _, $x, _>>, Off, _Dev, _Inode | Path] ->
            [Start, End] = binary:split(Range, <<"-">>),
            {true, {binary_to_integer(Start, 16), binary_to_integer(End, 16),
                    binary_to_integer(Off, 16), iolist_to_binary(lists:join(<<" ">>, Path))}};
        _ ->
            false
    end.

main_first(Mappings, Exe) ->
    {Main, Rest} = lists:partition(fun({_, _, _, P}) -> P =:= Exe end, Mappings),
    Main ++ Rest.

%% Mapping ids by address: a tuple sorted by start, searched by bisection.
mapping_lookup(Ordered) ->
    Ids = lists:zip(lists:seq(1, length(Ordered)), Ordered),
    list_to_tuple(lists:keysort(1, [{Start, End, Id} || {Id, {Start, End, _, _}} <- Ids])).

find_mapping(T, Address) ->
    find_mapping(T, Address, 1, tuple_size(T)).

find_mapping(_, _, Lo, Hi) when Lo > Hi ->
    0;
find_mapping(T, Address, Lo, Hi) ->
    Mid = (Lo + Hi) div 2,
    case element(Mid, T) of
        {Start, _, _} when Address < Start -> find_mapping(T, Address, Lo, Mid - 1);
        {_, End, _} when Address >= End -> find_mapping(T, Address, Mid + 1, Hi);
        {_, _, Id} -> Id
    end.

%% @doc Collapsed stacks, one line per site, root first: `frame;frame;leaf
%% bytes'. A frame is `function (object)' (the object's file name), so a
%% reader can group by either; `;' inside a name becomes `:'. Sites holding
%% no bytes are left out; the lines sum to the profile's live bytes.
-spec folded(data()) -> iodata().
folded(#{sites := Sites} = Data) ->
    Names = frame_names(Data),
    [[case Stack of
          [] -> ?NO_STACK;
          _ -> lists:join($;, [element(I, Names) || I <- lists:reverse(Stack)])
      end, $\s, integer_to_binary(Bytes), $\n]
     || {Stack, Bytes} <- by_stack(Sites), Bytes > 0].

%% Bytes by stack, in the order of each stack's first site: the samples of
%% one stack (one a process) are one line.
by_stack(Sites) ->
    {Order, Bytes} = lists:foldl(fun(Site, {O, M}) ->
                                         {_, B, _, _, Stack, _} = full_site(Site),
                                         case M of
                                             #{Stack := Old} -> {O, M#{Stack := Old + B}};
                                             #{} -> {[Stack | O], M#{Stack => B}}
                                         end
                                 end, {[], #{}}, Sites),
    [{Stack, maps:get(Stack, Bytes)} || Stack <- lists:reverse(Order)].

%% @doc The bytes the folded lines of `Data' sum to.
-spec folded_total(data()) -> non_neg_integer().
folded_total(#{sites := Sites}) ->
    lists:sum([element(2, S) || S <- Sites]).

%% @doc Every location's folded frame name, a tuple indexed by location id.
-spec frame_names(data()) -> tuple().
frame_names(#{locations := Locs}) ->
    list_to_tuple([frame_name(L) || L <- Locs]).

frame_name({_, Object, Symbol, Offset}) ->
    %% "function (object)": readers split at the last " (", so the object
    %% keeps none of its own ("x.so (deleted)" reads "x.so [deleted]").
    Obj = binary:replace(binary:replace(basename(Object), <<"(">>, <<"[">>, [global]), <<")">>,
                         <<"]">>, [global]),
    Name = <<(function_name(Object, Symbol, Offset))/binary, " (", Obj/binary, ")">>,
    case binary:match(Name, [<<";">>, <<"\n">>]) of
        nomatch -> Name;
        _ -> binary:replace(binary:replace(Name, <<";">>, <<":">>, [global]), <<"\n">>, <<" ">>,
                            [global])
    end.
