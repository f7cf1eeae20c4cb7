%% @private The sampler's memory: a ring of samples of fixed size, pure.
%% Two tiers: the last hour at the sampling period (`fine': 3,600,000 /
%% period slots, between 6 and 3600), then one sample a minute (or every
%% six periods, when that is longer) for a day (`coarse': 1440 slots).
%% A sample is kept as its time and one binary of 8 bytes per layer, in
%% the order of the ring's schema (the layers' keys, fixed when the ring is
%% made: `mallocinfo_layers:keys/0'), so a slot's size does not depend on
%% what the node does: the ring's memory is fixed once it is full
%% ({@link memory_bytes/1} says how much; about 0.9 MB for 40 layers at
%% the default 10 s period). Culprits are not kept per sample: the
%% sampler keeps the latest search of each layer beside the ring.
-module(mallocinfo_watch_ring).

-export([new/2, push/2, samples/1, latest/1, window/2, schema/1, period/1, memory_bytes/1,
         capacity/1]).

-export_type([ring/0]).

-record(tier, {step :: pos_integer(), cap :: pos_integer(), next = 1 :: pos_integer(),
               count = 0 :: non_neg_integer(), slots :: tuple(),
               last_t :: integer() | undefined}).
-record(ring, {schema :: tuple(), period :: pos_integer(), fine :: #tier{},
               coarse :: #tier{}}).
-opaque ring() :: #ring{}.

%% One hour at the period, then a day at a minute.
-define(FINE_MS, 3600000).
-define(COARSE_MS, 86400000).
-define(MINUTE, 60000).
%% A value the layers could not read.
-define(UNDEFINED, -1).

%% @doc An empty ring for the layer keys `Schema' sampled every `PeriodMs'.
-spec new([term()], pos_integer()) -> ring().
new(Schema, PeriodMs) ->
    FineCap = min(3600, max(6, ?FINE_MS div PeriodMs)),
    Step = max(?MINUTE, 6 * PeriodMs),
    CoarseCap = max(1, ?COARSE_MS div Step),
    #ring{schema = list_to_tuple(Schema), period = PeriodMs,
          fine = tier(PeriodMs, FineCap), coarse = tier(Step, CoarseCap)}.

tier(Step, Cap) ->
    #tier{step = Step, cap = Cap, slots = erlang:make_tuple(Cap, empty)}.

%% @doc Slots of each tier: `{Fine, Coarse}'.
-spec capacity(ring()) -> {pos_integer(), pos_integer()}.
capacity(#ring{fine = F, coarse = C}) ->
    {F#tier.cap, C#tier.cap}.

-spec schema(ring()) -> [term()].
schema(#ring{schema = S}) -> tuple_to_list(S).

-spec period(ring()) -> pos_integer().
period(#ring{period = P}) -> P.

%% @doc The ring with `Sample' (`mallocinfo_layers:sample/1''s map: its
%% `t', `time' and `layers'; layers outside the schema are not kept) in
%% the fine tier, and in the coarse tier when its step has passed since
%% the coarse tier's last sample.
-spec push(ring(), map()) -> ring().
push(#ring{schema = Schema, fine = F, coarse = C} = R, #{t := T, time := Time, layers := L}) ->
    Entry = {T, Time, encode(Schema, L)},
    C1 = case C#tier.last_t of
             Last when is_integer(Last), T - Last < C#tier.step -> C;
             _ -> put_slot(C, Entry)
         end,
    R#ring{fine = put_slot(F, Entry), coarse = C1}.

put_slot(#tier{cap = Cap, next = N, count = Count, slots = S} = Tier, {T, _, _} = Entry) ->
    Tier#tier{slots = setelement(N, S, Entry), next = N rem Cap + 1, count = min(Cap, Count + 1),
              last_t = T}.

encode(Schema, L) ->
    << <<(case maps:get(K, L, undefined) of
              V when is_integer(V), V >= 0 -> V;
              _ -> ?UNDEFINED
          end):64/signed>> || K <- tuple_to_list(Schema) >>.

decode(Schema, {T, Time, Bin}) ->
    Values = [case V of ?UNDEFINED -> undefined; _ -> V end || <<V:64/signed>> <= Bin],
    #{t => T, time => Time, layers => maps:from_list(lists:zip(tuple_to_list(Schema), Values))}.

%% @doc Every sample kept, oldest first: the coarse tier's older than the
%% fine tier's oldest, then the fine tier's.
-spec samples(ring()) -> [map()].
samples(#ring{schema = Schema, fine = F, coarse = C}) ->
    Fine = entries(F),
    Oldest = case Fine of
                 [{T0, _, _} | _] -> T0;
                 [] -> undefined
             end,
    Coarse = [E || {T, _, _} = E <- entries(C), Oldest =:= undefined orelse T < Oldest],
    [decode(Schema, E) || E <- Coarse ++ Fine].

%% @doc The newest sample, or `none'.
-spec latest(ring()) -> map() | none.
latest(#ring{fine = #tier{count = 0}}) ->
    none;
latest(#ring{schema = Schema, fine = #tier{cap = Cap, next = N, slots = S}}) ->
    decode(Schema, element((N - 2 + Cap) rem Cap + 1, S)).

%% @doc The fine tier's samples of the last `Ms' (at least the last three
%% there are), oldest first.
-spec window(ring(), pos_integer()) -> [map()].
window(#ring{schema = Schema, fine = F}, Ms) ->
    Entries = entries(F),
    case lists:reverse(Entries) of
        [] -> [];
        [{Tn, _, _} | _] = Rev ->
            {In, Out} = lists:splitwith(fun({T, _, _}) -> Tn - T =< Ms end, Rev),
            Need = max(0, 3 - length(In)),
            [decode(Schema, E) || E <- lists:reverse(In ++ lists:sublist(Out, Need))]
    end.

%% A tier's entries, oldest first.
entries(#tier{cap = Cap, next = N, count = Count, slots = S}) ->
    First = (N - 1 - Count + 2 * Cap) rem Cap,
    [element((First + I) rem Cap + 1, S) || I <- lists:seq(0, Count - 1)].

%% @doc The bytes the ring holds: its terms (the slots' tuples, the
%% schema) and the binaries of its samples.
-spec memory_bytes(ring()) -> non_neg_integer().
memory_bytes(#ring{fine = F, coarse = C} = R) ->
    W = erlang:system_info(wordsize),
    Bins = [Bin || #tier{slots = S} <- [F, C], {_, _, Bin} <- tuple_to_list(S)],
    erts_debug:flat_size(R) * W + lists:sum([byte_size(B) || B <- Bins]).
