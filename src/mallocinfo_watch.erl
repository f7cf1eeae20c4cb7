%% @doc The node's memory over time: a supervised sampler that reads every
%% layer (`mallocinfo_layers', as the report's interval reads them) at a
%% period, keeps a ring of fixed size and says what grows and who holds
%% it.
%%
%% ```
%% 1> mallocinfo:watch().                 % every 10 s; watch(#{period => Ms})
%% ok
%% 2> {ok, H} = mallocinfo:history(), maps:get(verdicts, H).
%% [<<"refc binaries grew 2.0 MiB/s (+120.3 MiB over 1 min); the largest holder is ...">>]
%% 3> mallocinfo:unwatch().
%% ok
%% '''
%%
%% <b>What a sample costs.</b> Every sample reads the layers' totals:
%% `/proc/self/statm' and `/proc/self/smaps' (grouped by kind),
%% `erlang:memory()', `erlang:system_info({allocator_sizes, A})' per
%% allocator type, `mallinfo2()', the tracker's status (and its mapped
%% regions when it records them). None of them walks a process or a
%% table. Culprits are searched only for a layer that grew by the noise
%% threshold since its last search, at most once a minute per layer: one
%% walk of every process (`process_info/2' of `memory',
%% `message_queue_len' and, for refc binaries, `binary': never a heap)
%% for binaries and process memory together, one `ets:info/2' per table
%% for ETS, the tracker's sites for native memory. `make bench' measures
%% it (BENCHMARKS.md).
%%
%% <b>Memory.</b> The ring (`mallocinfo_watch_ring') keeps an hour at the
%% period and a day at one sample a minute: fixed once full, about 0.9 MB
%% at the default period; `history/0''s `ring' says how much exactly. The
%% latest culprit search of each layer is kept beside it (5 culprits a
%% layer, names cut to 160 bytes).
%%
%% <b>Supervision.</b> The sampler runs under mallocinfo's application
%% (`mallocinfo_app'): started on demand by {@link watch/1} (which starts
%% the application if needed: a release that depends on mallocinfo, or a
%% node where the tarball was injected), restarted if it crashes, never
%% able to stop the node. See doc/report.md, "The timeline".
-module(mallocinfo_watch).

-export([watch/0, watch/1, unwatch/0, history/0, latest/0, latest_layers/0]).
-define(SERVER, mallocinfo_watch_server).
-define(SUP, mallocinfo_sup).
-define(DEFAULT_PERIOD, 10000).

%%% ---------------------------------------------------------------------------
%%% API

%% @equiv watch(#{})
-spec watch() -> ok | {error, term()}.
watch() ->
    watch(#{}).

%% @doc Starts the sampler: every `period' ms (1000 to 3600000, default
%% 10000) it samples every layer into its ring. `ok' when it runs (or ran
%% already with the same period); `{error, {already_watching, #{period =>
%% P}}}' when it runs with another period (unwatch/0 first);
%% `{error, {start_failed, Reason}}' when mallocinfo's application could
%% not be started. A wrong option raises `badarg'.
-spec watch(#{period => pos_integer()}) -> ok | {error, term()}.
watch(Opts) when is_map(Opts) ->
    Period = maps:get(period, Opts, ?DEFAULT_PERIOD),
    maps:keys(Opts) -- [period] =:= [] andalso is_integer(Period) andalso Period >= 1000
        andalso Period =< 3600000 orelse erlang:error(badarg, [Opts]),
    case mallocinfo_app:ensure_started() of
        ok -> start_sampler(#{period => Period});
        {error, _} = E -> E
    end;
watch(Opts) ->
    erlang:error(badarg, [Opts]).

start_sampler(#{period := Period} = Opts) ->
    case supervisor:start_child(?SUP, mallocinfo_app:watch_child(Opts)) of
        {ok, _} -> ok;
        {error, {already_started, _}} -> same_period(Period);
        {error, already_present} ->
            %% A watch supervisor that gave up (its sampler crashed too
            %% often) leaves its id behind: replaced.
            _ = supervisor:delete_child(?SUP, watch),
            start_sampler(Opts);
        {error, Reason} -> {error, {start_failed, Reason}}
    end.

same_period(Period) ->
    case call(period) of
        {ok, Period} -> ok;
        {ok, Other} -> {error, {already_watching, #{period => Other}}};
        {error, _} = E -> E
    end.

%% @doc Stops the sampler: its history is gone. Always
%% `ok'.
-spec unwatch() -> ok.
unwatch() ->
    case whereis(?SUP) of
        undefined -> ok;
        _ ->
            _ = supervisor:terminate_child(?SUP, watch),
            _ = supervisor:delete_child(?SUP, watch),
            ok
    end.

%% @doc `{ok, History}': the samples kept, oldest first (each `#{t =>
%% MonotonicMs, time => SystemMs, layers => #{Key => Bytes | undefined}}',
%% the keys of `mallocinfo_layers:keys/0'), `verdicts' (what grew over the
%% last minute, fastest first, each with its rate and culprit: none on an
%% idle node), `growth' (that minute's growth of every part, see
%% `mallocinfo_layers_growth:growth/2'), `rates' (each part's rate over
%% the last minute and the last hour, bytes per second), `culprits' (the
%% latest search of each layer: `#{Layer => #{time, culprits}}'),
%% `period_ms', `started' (system time, ms), `ring' (its slots and
%% `memory_bytes'), `cost' (what the samples took: `last_us', `max_us',
%% `mean_us', `count'). `{error, not_watching}' when the sampler does not
%% run.
-spec history() -> {ok, map()} | {error, not_watching}.
history() ->
    call(history).

%% @doc `{ok, Sample}': the sampler's newest sample (as in history/0),
%% `{error, not_watching}' when it does not run or has no sample yet.
-spec latest() -> {ok, map()} | {error, not_watching}.
latest() ->
    call(latest).

%% @doc `{ok, Sample}': the sampler's newest sample as latest/0 returns
%% it, but with the mappings' layers (`mappings', `{smaps, Kind}', read
%% once a minute) taken from the last sample that read them when the
%% newest did not: the gauges of `/metrics'. `{error, not_watching}' as
%% latest/0.
-spec latest_layers() -> {ok, map()} | {error, not_watching}.
latest_layers() ->
    call(layers).

call(Request) ->
    try gen_server:call(?SERVER, Request, 60000)
    catch exit:{noproc, _} -> {error, not_watching};
          exit:{normal, _} -> {error, not_watching};
          exit:{shutdown, _} -> {error, not_watching}
    end.
