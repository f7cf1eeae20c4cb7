%% @private Churn rows (`mallocinfo_trace:churn/2'): the NIF's raw rows
%% (`mallocinfo_nif:trace_churn/0', one per call site since start or
%% reset) sorted, cut, symbolized (by stack) or rolled up by culprit (by
%% function or object), and the lifetime histogram's figures the report
%% uses. Not an API: `mallocinfo_trace' checks every argument first.
-module(mallocinfo_trace_churn).

-export([rows/4, lifetimes/1, short_lived/2, median_lifetime_ms/1]).

%% @doc The churn rows of `Raw' (`[{AllocCount, AllocBytes, FreedCount,
%% FreedBytes, TemporaryCount, LifetimesTuple, Estimated, Frames}]') for
%% `churn(N, #{by => By})': most allocated bytes first, the first `N'.
%% `ShortMs': the bound of `short_lived_count'.
-spec rows(stack | function | object, [tuple()], non_neg_integer() | infinity,
           #{demangle := boolean(), short_lived_ms := pos_integer(),
             elapsed_ms := non_neg_integer()}) -> [map()].
rows(stack, Raw, N, #{demangle := D, short_lived_ms := Short, elapsed_ms := Ms}) ->
    Top = take(N, lists:sort(fun larger/2, [raw_map(R, Short, Ms) || R <- Raw])),
    {NoStack, WithStack} = lists:partition(fun(#{frames := F}) -> F =:= <<>> end, Top),
    Named = mallocinfo_trace_culprits:symbolized(WithStack, D),
    lists:sort(fun larger/2,
               Named ++ [(maps:remove(frames, R))#{stack => [], erlang => [], label => native}
                         || R <- NoStack]);
rows(By, Raw, N, #{demangle := D, short_lived_ms := Short, elapsed_ms := Ms}) ->
    Culprits = mallocinfo_trace_culprits:culprits([{0, 0, false, F} || F <- frames(Raw)], D),
    Groups = lists:foldl(
               fun(R, Acc) ->
                       Frames = element(8, R),
                       Cul = maps:get(Frames, Culprits),
                       Key = mallocinfo_trace_growth:rollup_key(By, Cul),
                       case Acc of
                           #{Key := {Sum, Stacks, Frame}} ->
                               Acc#{Key := {add(Sum, R), Stacks + 1, Frame}};
                           #{} ->
                               Acc#{Key => {R, 1, element(2, Cul)}}
                       end
               end, #{}, Raw),
    Rows = [maps:merge(maps:remove(frames, raw_map(Sum, Short, Ms)),
                       culprit_fields(By, element(1, Key), Frame, Stacks))
            || {Key, {Sum, Stacks, Frame}} <- maps:to_list(Groups)],
    take(N, lists:sort(fun larger/2, Rows)).

frames(Raw) -> lists:usort([element(8, R) || R <- Raw]).

culprit_fields(function, Label, undefined, Stacks) ->
    #{label => Label, object => undefined, function => undefined, stacks => Stacks};
culprit_fields(function, Label, #{object := O} = F, Stacks) ->
    #{label => Label, object => O, function => maps:get(symbol, F, undefined), frame => F,
      stacks => Stacks};
culprit_fields(object, Label, undefined, Stacks) ->
    #{label => Label, object => undefined, stacks => Stacks};
culprit_fields(object, Label, #{object := O}, Stacks) ->
    #{label => Label, object => O, stacks => Stacks}.

%% Two raw rows summed (the frames of the first kept).
add({A1, B1, C1, D1, E1, L1, S1, F}, {A2, B2, C2, D2, E2, L2, S2, _}) ->
    {A1 + A2, B1 + B2, C1 + C2, D1 + D2, E1 + E2,
     list_to_tuple(lists:zipwith(fun erlang:'+'/2, tuple_to_list(L1), tuple_to_list(L2))),
     S1 or S2, F}.

raw_map({AC, AB, FC, FB, TC, L, E, F}, Short, Ms) ->
    #{allocated_count => AC, allocated_bytes => AB, freed_count => FC, freed_bytes => FB,
      temporary_count => TC, short_lived_count => short_lived(L, Short),
      lifetimes => lifetimes(L), estimated => E, frames => F,
      allocated_per_s => per_s(AC, Ms), allocated_bytes_per_s => per_s(AB, Ms), since_ms => Ms}.

per_s(_, 0) -> 0;
per_s(N, Ms) -> N * 1000 div Ms.

larger(#{allocated_bytes := A} = X, #{allocated_bytes := B} = Y) ->
    A > B orelse (A =:= B andalso maps:get(allocated_count, X) >= maps:get(allocated_count, Y)).

take(infinity, L) -> L;
take(N, L) -> lists:sublist(L, N).

%% @doc A lifetime histogram (the NIF's tuple of bucket counts) as
%% `[{BelowMs, Count}]' for its non-empty buckets, shortest first: bucket
%% 0 `{1, C}' (freed within 1 ms), bucket k `{2^k, C}' (lived [2^(k-1),
%% 2^k) ms), the last `{infinity, C}'.
-spec lifetimes(tuple()) -> [{pos_integer() | infinity, non_neg_integer()}].
lifetimes(T) ->
    Last = tuple_size(T) - 1,
    [{bound(K, Last), C} || {K, C} <- lists:zip(lists:seq(0, Last), tuple_to_list(T)), C > 0].

bound(K, Last) when K =:= Last -> infinity;
bound(K, _) -> 1 bsl K.

%% @doc Blocks of a lifetime histogram freed within `Ms' milliseconds: the
%% buckets whose upper bound is at most `Ms' (a bound between two powers
%% of two counts the lower one).
-spec short_lived(tuple(), pos_integer()) -> non_neg_integer().
short_lived(T, Ms) ->
    lists:sum([C || {B, C} <- lifetimes(T), B =/= infinity, B =< Ms]).

%% @doc The typical lifetime of a histogram `[{BelowMs, Count}]': the
%% upper bound of the bucket that holds the median freed block
%% (`undefined' when none was freed).
-spec median_lifetime_ms([{pos_integer() | infinity, non_neg_integer()}]) ->
          pos_integer() | infinity | undefined.
median_lifetime_ms([]) ->
    undefined;
median_lifetime_ms(L) ->
    Total = lists:sum([C || {_, C} <- L]),
    median(L, (Total + 1) div 2).

median([{B, C} | _], Left) when C >= Left -> B;
median([{_, C} | Rest], Left) -> median(Rest, Left - C).
