%% @private The sampler of `mallocinfo_watch': a gen_server under
%% mallocinfo's application (`mallocinfo_app'), registered as
%% `mallocinfo_watch_server'. Every period it samples every layer
%% (`mallocinfo_layers') into its ring (`mallocinfo_watch_ring'), and
%% searches a layer's culprits when that layer grew (see due/2); its
%% history is what `mallocinfo_watch:history/0' returns.
-module(mallocinfo_watch_server).

-behaviour(gen_server).

-export([start_link/1]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-define(SERVER, ?MODULE).
-define(DEFAULT_PERIOD, 10000).
%% A layer's culprits are searched again at most this often.
-define(CULPRIT_MS, 60000).
%% The window of the current verdicts and of the "per minute" rates.
-define(VERDICT_MS, 60000).
%% /proc/self/smaps is read at most this often: its kernel walk and its
%% parsing are most of a sample's cost (BENCHMARKS.md); statm's RSS is read
%% every time.
-define(SMAPS_MS, 60000).
%% Culprit figures kept between two searches, per layer (the largest).
-define(KEEP_FIGURES, 300).
%% The sampler's budget: a sample that searched culprits (a walk of every
%% process, seconds on a node with 100k of them) is followed by no other
%% search for 1/?BUDGET of its duration, so searching takes at most 0.3% of
%% a core over time, however often layers grow: with the samples
%% themselves (0.17% on a node of 100k processes, BENCHMARKS.md), the
%% sampler stays within 0.5% of a core.
-define(BUDGET, 0.003).

-spec start_link(map()) -> {ok, pid()} | {error, term()}.
start_link(Opts) ->
    gen_server:start_link({local, ?SERVER}, ?MODULE, Opts, []).

%% @private
init(Opts) ->
    Period = maps:get(period, Opts, ?DEFAULT_PERIOD),
    self() ! tick,
    {ok, #{period => Period, ring => mallocinfo_watch_ring:new(mallocinfo_layers:keys(), Period),
           started => erlang:system_time(millisecond), next => erlang:monotonic_time(millisecond),
           culprits => #{}, searched => #{}, since => #{}, smaps_t => undefined, smaps => #{},
           search_after => undefined,
           cost => #{last_us => 0, max_us => 0, total_us => 0, count => 0}}}.

%% @private
handle_call(period, _From, #{period := P} = S) ->
    {reply, {ok, P}, S};
handle_call(history, _From, S) ->
    {reply, {ok, history(S)}, S};
handle_call(latest, _From, #{ring := Ring} = S) ->
    case mallocinfo_watch_ring:latest(Ring) of
        none -> {reply, {error, not_watching}, S};
        Sample -> {reply, {ok, Sample}, S}
    end;
handle_call(layers, _From, #{ring := Ring, smaps := Smaps} = S) ->
    case mallocinfo_watch_ring:latest(Ring) of
        none ->
            {reply, {error, not_watching}, S};
        #{layers := L} = Sample ->
            %% The mappings are read once a minute: a sample without them
            %% takes the last ones read.
            Filled = maps:merge(L, maps:filter(fun(K, _) -> maps:get(K, L) =:= undefined end,
                                               Smaps)),
            {reply, {ok, Sample#{layers => Filled}}, S}
    end;
handle_call(_, _From, S) ->
    {reply, {error, unknown_request}, S}.

%% @private
handle_cast(_, S) ->
    {noreply, S}.

%% @private
handle_info(tick, #{period := Period, next := Next} = S) ->
    S1 = sample(S),
    %% On a fixed grid: a slow sample does not shift the next ones.
    Now = erlang:monotonic_time(millisecond),
    Next1 = max(Next + Period, Now + Period div 10),
    erlang:send_after(Next1, self(), tick, [{abs, true}]),
    {noreply, S1#{next => Next1}};
handle_info(_, S) ->
    {noreply, S}.

%% @private
terminate(_, _) ->
    ok.

sample(#{ring := Ring, culprits := Culprits, searched := Searched, since := Since,
          cost := Cost, smaps_t := SmapsT, smaps := SmapsLast, search_after := After} = S) ->
    Budget = After =:= undefined orelse erlang:monotonic_time(millisecond) >= After,
    Due = due(Ring, Searched, Budget),
    %% A search made because its layer grew (any but the first).
    Growing = map_size(Searched) > 0,
    Now = erlang:monotonic_time(millisecond),
    Smaps = SmapsT =:= undefined orelse Now - SmapsT >= ?SMAPS_MS,
    Sample = in_helper(#{culprits => Due, exclude => [self()], since => Since,
                         figures => true, smaps => Smaps}),
    #{layers := L, t := T, time := Time, culprits := Found, cost_us := Us,
      figures := Figures} = Sample,
    Values = maps:from_list([{P, mallocinfo_layers_growth:part_value(P, L)} || P <- Due]),
    S#{ring => mallocinfo_watch_ring:push(Ring, Sample),
       smaps_t => case Smaps of
                      true -> T;
                      false -> SmapsT
                  end,
       smaps => case Smaps of
                    true -> maps:filter(fun({smaps, _}, _) -> true;
                                           (mappings, _) -> true;
                                           (_, _) -> false
                                        end, L);
                    false -> SmapsLast
                end,
       culprits => maps:merge(Culprits,
                              maps:map(fun(Layer, Cs) ->
                                               #{time => Time,
                                                 culprits => part_delta(Layer, Cs, Values,
                                                                        Searched)}
                                       end, Found)),
       searched => maps:merge(Searched, maps:map(fun(_, V) -> {T, V, Growing} end, Values)),
       since => maps:merge(Since, maps:map(fun(_, M) -> largest(M) end, Figures)),
       search_after => case Due of
                           [] -> After;
                           _ -> erlang:monotonic_time(millisecond) + round(Us / 1000 / ?BUDGET)
                       end,
       cost => #{last_us => Us, max_us => max(Us, maps:get(max_us, Cost)),
                 total_us => maps:get(total_us, Cost) + Us, count => maps:get(count, Cost) + 1}}.

%% A sample is taken in a process of its own: a culprit search's figures
%% (a map entry per process) live and die on its heap, so the sampler's
%% heap does not swell, and with it the `processes' layer it measures.
in_helper(Opts) ->
    {Pid, Ref} = spawn_monitor(fun() -> exit({sample, mallocinfo_layers:sample(Opts)}) end),
    receive
        {'DOWN', Ref, process, Pid, {sample, Sample}} -> Sample;
        {'DOWN', Ref, process, Pid, Why} -> exit({sample_failed, Why})
    end.

%% Each culprit's growth is since the layer's previous search: the part's
%% growth over the same span goes with it (`part_delta'), so that its
%% share is of the growth it saw.
part_delta(Layer, Culprits, Values, Searched) ->
    case {maps:get(Layer, Values, undefined), maps:get(Layer, Searched, undefined)} of
        {Now, {_, Then, _}} when is_integer(Now), is_integer(Then) ->
            [C#{part_delta => Now - Then} || C <- Culprits];
        _ ->
            Culprits
    end.

%% What the next search ranks growth against: the largest holders of the
%% last one, so the sampler's memory does not grow with the node's
%% processes and tables.
largest(Values) when map_size(Values) =< ?KEEP_FIGURES ->
    Values;
largest(Values) ->
    maps:from_list(lists:sublist(lists:reverse(lists:keysort(2, maps:to_list(Values))),
                                 ?KEEP_FIGURES)).

%% The culprit layers to search in this sample: never searched yet, or
%% grown by the noise threshold since their last search, and then at once
%% if that search found the layer idle (the growth has just begun: its
%% culprits are wanted now), else a minute after it and once the budget
%% allows (Budget: the time ?BUDGET set after the last search has passed).
%% The search made at once is one per layer per watch (only the first
%% sample's searches find a layer idle), so the budget bounds the rest.
%% binary and processes share a walk.
due(Ring, Searched, Budget) ->
    case mallocinfo_watch_ring:latest(Ring) of
        none ->
            [binary, processes, ets, native];
        #{t := Now, layers := L} ->
            Due = fun(Layer) ->
                          case maps:get(Layer, Searched, undefined) of
                              undefined ->
                                  true;
                              {T, V, WasGrowing} ->
                                  grown(mallocinfo_layers_growth:part_value(Layer, L), V)
                                      andalso (not WasGrowing
                                               orelse Now - T >= ?CULPRIT_MS andalso Budget)
                          end
                  end,
            [Layer || Layer <- [binary, processes, ets, native], Due(Layer)]
    end.

grown(Now, Then) when is_integer(Now), is_integer(Then) ->
    Now - Then >= mallocinfo_layers_growth:noise_bytes();
grown(_, _) ->
    false.

history(#{period := Period, ring := Ring, started := Started, culprits := Culprits,
          cost := #{count := N, total_us := Total} = Cost}) ->
    Window = with_culprits(mallocinfo_watch_ring:window(Ring, ?VERDICT_MS), Culprits),
    Growth = mallocinfo_layers_growth:growth(Window),
    Hour = mallocinfo_watch_ring:window(Ring, 3600000),
    HourRates = case Hour of
                    [_, _ | _] -> maps:from_list([{P, R} || #{part := P, rate := R}
                                                               <- maps:get(parts, mallocinfo_layers_growth:growth(Hour))]);
                    _ -> #{}
                end,
    {Fine, Coarse} = mallocinfo_watch_ring:capacity(Ring),
    #{period_ms => Period, started => Started,
      samples => mallocinfo_watch_ring:samples(Ring),
      verdicts => mallocinfo_layers_growth:sentences(Growth),
      growth => Growth,
      rates => [#{part => P, minute => R, hour => maps:get(P, HourRates, undefined)}
                || #{part := P, rate := R} <- maps:get(parts, Growth, [])],
      culprits => Culprits,
      ring => #{fine_slots => Fine, coarse_slots => Coarse,
                memory_bytes => mallocinfo_watch_ring:memory_bytes(Ring)},
      cost => (maps:with([last_us, max_us], Cost))#{count => N,
                                                     mean_us => Total div max(1, N)}}.

%% The latest culprits of every layer on the newest sample of a window,
%% for the growth's sentences.
with_culprits([], _) ->
    [];
with_culprits(Window, Culprits) ->
    #{time := Now} = Last = lists:last(Window),
    Found = maps:map(fun(_, #{culprits := Cs, time := T}) ->
                             [C#{searched_ago_ms => Now - T} || C <- Cs]
                     end, Culprits),
    lists:droplast(Window) ++ [Last#{culprits => Found}].
