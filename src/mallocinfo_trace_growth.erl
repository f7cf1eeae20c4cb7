%% @private The pure parts of growth and culprits, apart from any NIF so
%% EUnit tests them on canned data: snapshots as terms, their difference,
%% which sites grew in every interval, the allocator family (which frames
%% are allocation wrappers, not culprits), the labels (`native', `erts',
%% `self') and the roll-ups of `mallocinfo_trace:sites/2'. Not an API:
%% arguments are not checked (mallocinfo_trace does).
%%
%% A raw site, as the NIF gives it: `{Count, Bytes, Estimated, Frames}',
%% `Frames' the return addresses packed as native 64-bit words (`<<>>' for
%% blocks recorded without a stack). The packed frames are the site's
%% identity from one snapshot to the next: the same call site has the same
%% return addresses for as long as its objects stay loaded.
-module(mallocinfo_trace_growth).

-export([snapshot/3, diff/2, growth/1, addresses/1, native/1, rollup/4, row_key/1]).

%% The top 16 bits of the header of a stack's Erlang context
%% (c_src/common/mi_context.h: MI_CONTEXT_MARKER).
-define(CONTEXT_TAG, 16#E7C0).
-export([allocator_frame/1, culprit/1, label/2, emulator_object/1, self_object/1,
         rollup/3, rollup_key/2, objects_of/1]).

-export_type([snapshot/0]).

-type snapshot() :: #{mallocinfo_snapshot := 1,
                      mode := mallocinfo_trace:mode(),
                      node := node(),
                      os_pid := string(),
                      time_ms := integer(),
                      monotonic_ms := integer(),
                      tracker_ns := non_neg_integer(),
                      live_bytes := non_neg_integer(),
                      live_blocks := non_neg_integer(),
                      estimated := boolean(),
                      sites := #{binary() => {non_neg_integer(), non_neg_integer(), boolean()}},
                      %% mallocinfo_trace:snapshot(#{olds => N}): the oldest
                      %% blocks, {Address, Size, AgeMs, Estimated, Frames}
                      olds => [{non_neg_integer(), non_neg_integer(), non_neg_integer(),
                                boolean(), binary()}]}.

%% @doc A snapshot from the NIF's answer. `Meta' holds `node', `os_pid',
%% `time_ms' (system time) and `monotonic_ms' (when it was taken). Two
%% raw sites with the same frames (only the no-stack one, in practice) add.
-spec snapshot(atom(), {non_neg_integer(), [tuple()]}, map()) -> snapshot().
snapshot(Mode, {TrackerNs, Raw}, Meta) ->
    Sites = lists:foldl(fun({C, B, E, F}, Acc) ->
                                case Acc of
                                    #{F := {C0, B0, E0}} -> Acc#{F := {C0 + C, B0 + B, E0 or E}};
                                    #{} -> Acc#{F => {C, B, E}}
                                end
                        end, #{}, Raw),
    maps:merge(Meta,
               #{mallocinfo_snapshot => 1, mode => Mode, tracker_ns => TrackerNs,
                 live_bytes => lists:sum([B || {_, B, _} <- maps:values(Sites)]),
                 live_blocks => lists:sum([C || {C, _, _} <- maps:values(Sites)]),
                 estimated => lists:any(fun({_, _, E}) -> E end, maps:values(Sites)),
                 sites => Sites}).

%% @doc Every site whose count or bytes changed from `Old' to `New', with
%% `frames' (packed), `count' and `bytes' now, the deltas and `change'
%% (`appeared': not in `Old'; `vanished': not in `New'; `changed'), largest
%% `bytes_delta' first (then the largest loss last), ties by frames.
%% `estimated' when either side's figure was.
-spec diff(snapshot(), snapshot()) -> [map()].
diff(#{sites := Old}, #{sites := New}) ->
    Keys = lists:usort(maps:keys(Old) ++ maps:keys(New)),
    Rows = [row(K, maps:get(K, Old, absent), maps:get(K, New, absent)) || K <- Keys],
    lists:sort(fun by_delta/2, [R || R <- Rows, R =/= same]).

row(_, {C, B, _}, {C, B, _}) ->
    same;
row(K, Old, New) ->
    {C0, B0, E0} = figures(Old),
    {C1, B1, E1} = figures(New),
    Change = case {Old, New} of
                 {absent, _} -> appeared;
                 {_, absent} -> vanished;
                 _ -> changed
             end,
    #{frames => K, count => C1, bytes => B1, count_delta => C1 - C0, bytes_delta => B1 - B0,
      change => Change, estimated => E0 or E1}.

figures(absent) -> {0, 0, false};
figures(T) -> T.

by_delta(#{bytes_delta := A, frames := FA}, #{bytes_delta := B, frames := FB}) ->
    A > B orelse (A =:= B andalso FA =< FB).

%% @doc The sites whose live bytes grew in every interval between
%% consecutive snapshots (at least two, oldest first): `frames', `bytes'
%% and `count' in the last one, `growth_bytes' (last minus first),
%% `rate' (bytes per second over the whole span), `samples', `estimated';
%% most growth first. A site absent from a snapshot holds 0 bytes there,
%% so one that appears and keeps growing counts; one that goes down once
%% (a cache that fills and drains) does not.
-spec growth([snapshot()]) -> [map()].
growth([#{monotonic_ms := T0} | _] = Snaps) when length(Snaps) >= 2 ->
    #{monotonic_ms := T1} = Last = lists:last(Snaps),
    Keys = lists:usort(lists:append([maps:keys(S) || #{sites := S} <- Snaps])),
    Seconds = max(1, T1 - T0) / 1000,
    Rows = [begin
                Series = [element(2, figures(maps:get(K, S, absent))) || #{sites := S} <- Snaps],
                {C, B, E} = figures(maps:get(K, maps:get(sites, Last), absent)),
                Grew = B - hd(Series),
                {strictly_up(Series), #{frames => K, bytes => B, count => C,
                                         growth_bytes => Grew, rate => round(Grew / Seconds),
                                         samples => length(Snaps), estimated => E}}
            end || K <- Keys],
    lists:sort(fun(#{growth_bytes := A, frames := FA}, #{growth_bytes := B, frames := FB}) ->
                       A > B orelse (A =:= B andalso FA =< FB)
               end, [R || {true, R} <- Rows]).

strictly_up([A, B | Rest]) when B > A -> strictly_up([B | Rest]);
strictly_up([_]) -> true;
strictly_up(_) -> false.

%% @doc The native return addresses packed in a site's frames (the words
%% of its Erlang context, after them, left out).
-spec addresses(binary()) -> [non_neg_integer()].
addresses(Frames) ->
    [A || <<A:64/native>> <= native(Frames)].

%% @doc The native part of packed frames: the words before the header of
%% their Erlang context (c_src/common/mi_context.h), all of them when they
%% have none.
-spec native(binary()) -> binary().
native(Frames) ->
    native(Frames, 0).

native(Frames, At) when At + 8 =< byte_size(Frames) ->
    case Frames of
        <<_:At/binary, W:64/native, _/binary>> when W bsr 48 =:= ?CONTEXT_TAG ->
            binary:part(Frames, 0, At);
        _ -> native(Frames, At + 8)
    end;
native(Frames, _) ->
    Frames.

%%% Culprits ------------------------------------------------------------------

%% The allocator family: functions that allocate on behalf of their caller.
%% A frame is in it when its symbol (mangled or demangled) is one of
%% these, or starts with one of the prefixes, or its object is the C++
%% runtime or mallocinfo's interposer.
-define(ALLOC_SYMBOLS,
        [<<"malloc">>, <<"calloc">>, <<"realloc">>, <<"reallocarray">>, <<"free">>,
         <<"posix_memalign">>, <<"aligned_alloc">>, <<"memalign">>, <<"valloc">>,
         <<"pvalloc">>, <<"strdup">>, <<"strndup">>, <<"__strdup">>, <<"__strndup">>,
         <<"wcsdup">>, <<"asprintf">>, <<"vasprintf">>, <<"__asprintf">>, <<"__vasprintf">>,
         <<"CRYPTO_malloc">>, <<"CRYPTO_zalloc">>, <<"CRYPTO_realloc">>,
         <<"CRYPTO_clear_realloc">>, <<"CRYPTO_strdup">>, <<"CRYPTO_strndup">>,
         <<"CRYPTO_memdup">>, <<"CRYPTO_secure_malloc">>, <<"CRYPTO_secure_zalloc">>]).
-define(ALLOC_PREFIXES,
        [<<"__libc_">>, <<"_Znw">>, <<"_Zna">>, <<"operator new">>,
         <<"_ZN9__gnu_cxx13new_allocator">>, <<"__gnu_cxx::new_allocator<">>,
         <<"_ZNSt15__new_allocator">>, <<"std::__new_allocator<">>,
         <<"_ZNSt16allocator_traits">>, <<"std::allocator_traits<">>]).
-define(ALLOC_OBJECTS, [<<"libstdc++.so">>, <<"libmallocinfo_preload.so">>]).

%% @doc True when a symbolized frame is in the allocator family.
-spec allocator_frame(map()) -> boolean().
allocator_frame(#{object := Object} = F) ->
    Base = filename:basename(Object),
    lists:any(fun(P) -> prefix(P, Base) end, ?ALLOC_OBJECTS)
        orelse case maps:get(symbol, F, undefined) of
                   S when is_binary(S) ->
                       lists:member(S, ?ALLOC_SYMBOLS)
                           orelse lists:any(fun(P) -> prefix(P, S) end, ?ALLOC_PREFIXES);
                   _ -> false
               end;
allocator_frame(_) ->
    false.

prefix(P, S) ->
    binary:longest_common_prefix([P, S]) =:= byte_size(P).

%% @doc The first frame outside the allocator family, else the first
%% frame; `undefined' for an empty stack.
-spec culprit([map()]) -> map() | undefined.
culprit([]) -> undefined;
culprit([First | _] = Stack) ->
    case lists:dropwhile(fun allocator_frame/1, Stack) of
        [F | _] -> F;
        [] -> First
    end.

%% @doc True for the emulator's executable (`beam.smp' and its debug,
%% asan... variants).
-spec emulator_object(binary() | undefined) -> boolean().
emulator_object(Object) when is_binary(Object) ->
    prefix(<<"beam.">>, filename:basename(Object));
emulator_object(_) ->
    false.

%% @doc True for mallocinfo's own objects (its NIF, its interposer).
-spec self_object(binary() | undefined) -> boolean().
self_object(Object) when is_binary(Object) ->
    lists:member(filename:basename(Object),
                 [<<"mallocinfo_nif.so">>, <<"libmallocinfo_preload.so">>]);
self_object(_) ->
    false.

%% @doc Who a site's memory belongs to, from its culprit frame and whether
%% any frame of its stack is in mallocinfo's own objects (`IsSelf'):
%% `self' (mallocinfo's own allocations), `erts' (the culprit is in the
%% emulator: the VM's own malloc, mostly `erts_sys_alloc' called by
%% erts_alloc for carriers; ERTS memory, counted in the ERTS layer) or
%% `native' (a NIF, a driver, a library).
-spec label(map() | undefined, boolean()) -> native | erts | self.
label(_, true) -> self;
label(#{object := O}, false) ->
    case emulator_object(O) of
        true -> erts;
        false -> native
    end;
label(_, false) -> native.

%% @doc The key a site is rolled up under: `{Label, function, Object,
%% Symbol}' (an unnamed function is keyed by its address, `{Label,
%% address, Object, Address}'), `{Label, object, Object}', or `{Label,
%% none}' for blocks without a stack.
-spec rollup_key(function | object, {native | erts | self, map() | undefined}) -> tuple().
rollup_key(_, {L, undefined}) -> {L, none};
rollup_key(object, {L, #{object := O}}) -> {L, object, O};
rollup_key(function, {L, #{object := O, symbol := S}}) when is_binary(S) -> {L, function, O, S};
rollup_key(function, {L, #{object := O, address := A}}) -> {L, address, O, A}.

%% @doc The key of a roll-up by function's row (rollup/4): the same for
%% every site rolled into it (a site's key is rollup_key(function,
%% Culprit)).
-spec row_key(map()) -> tuple().
row_key(#{label := L} = Row) ->
    rollup_key(function, {L, maps:get(frame, Row, undefined)}).

%% @doc Rolls raw sites up by culprit: `Culprits' maps each site's frames
%% to `{Label, CulpritFrame | undefined}'. One row per key: `label',
%% `object', `function' (symbol, `undefined' when unnamed or by object),
%% `frame' (the culprit frame, by function), `count', `bytes', `stacks'
%% (sites rolled into it), `estimated'; largest first. The rows' bytes
%% and counts add up to the sites'.
-spec rollup(function | object, [tuple()], #{binary() => tuple()}) -> [map()].
rollup(By, Sites, Culprits) ->
    rollup(By, Sites, Culprits, #{}).

%% @doc rollup/3, each row also with `erlang': the Erlang functions that
%% drove its blocks, `[{#{module, function, arity}, Bytes}]', most bytes
%% first, at most three; `Callers' maps a site's frames to its Erlang
%% function (`none', or no entry, for a site without one).
-spec rollup(function | object, [tuple()], #{binary() => tuple()},
             #{binary() => map() | none}) -> [map()].
rollup(By, Sites, Culprits, Callers) ->
    Rows = lists:foldl(
             fun({C, B, E, Frames}, Acc) ->
                     Cul = maps:get(Frames, Culprits),
                     Key = rollup_key(By, Cul),
                     Erl = case maps:get(Frames, Callers, none) of
                               none -> #{};
                               Fn -> #{Fn => B}
                           end,
                     case Acc of
                         #{Key := {C0, B0, E0, N, F, Erl0}} ->
                             Acc#{Key := {C0 + C, B0 + B, E0 or E, N + 1, F,
                                          maps:merge_with(fun(_, X, Y) -> X + Y end, Erl0, Erl)}};
                         #{} -> Acc#{Key => {C, B, E, 1, element(2, Cul), Erl}}
                     end
             end, #{}, Sites),
    Out = [with_erlang(row_map(By, K, V), element(6, V), Callers) || {K, V} <- maps:to_list(Rows)],
    lists:sort(fun(#{bytes := A} = X, #{bytes := B} = Y) ->
                       A > B orelse (A =:= B andalso X =< Y)
               end, Out).

with_erlang(Row, _, Callers) when map_size(Callers) =:= 0 ->
    Row;
with_erlang(Row, Erl, _) ->
    Sorted = lists:sort(fun({A, X}, {B, Y}) -> X > Y orelse (X =:= Y andalso A =< B) end,
                        maps:to_list(Erl)),
    Row#{erlang => lists:sublist(Sorted, 3)}.

row_map(By, Key, {C, B, E, N, Frame, _}) ->
    Base = #{label => element(1, Key), count => C, bytes => B, estimated => E, stacks => N},
    case {By, Frame} of
        {function, undefined} ->
            Base#{object => undefined, function => undefined};
        {object, undefined} ->
            Base#{object => undefined};
        {object, #{object := O}} ->
            Base#{object => O};
        {function, #{object := O} = F} ->
            Base#{object => O, function => maps:get(symbol, F, undefined), frame => F}
    end.

%% @doc The roll-up by object from the roll-up by function of the same
%% sites (each function row is in one object): what rollup(object, ...)
%% gives, without finding the culprits again.
-spec objects_of([map()]) -> [map()].
objects_of(FunctionRows) ->
    Rows = lists:foldl(
             fun(#{label := L, object := O, count := C, bytes := B, estimated := E, stacks := N},
                 Acc) ->
                     Key = {L, O},
                     case Acc of
                         #{Key := {C0, B0, E0, N0}} -> Acc#{Key := {C0 + C, B0 + B, E0 or E, N0 + N}};
                         #{} -> Acc#{Key => {C, B, E, N}}
                     end
             end, #{}, FunctionRows),
    Out = [#{label => L, object => O, count => C, bytes => B, estimated => E, stacks => N}
           || {{L, O}, {C, B, E, N}} <- maps:to_list(Rows)],
    lists:sort(fun(#{bytes := A} = X, #{bytes := B} = Y) ->
                       A > B orelse (A =:= B andalso X =< Y)
               end, Out).
