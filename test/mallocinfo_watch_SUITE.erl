%% The timeline (issue 24): mallocinfo:watch/0,1 on a node where mallocinfo
%% was only loaded (as from the tarball) or sent over distribution (no .app
%% file), the supervised sampler and its ring, history/0 naming what grows
%% and who holds it, unwatch/0, and /timeline.json and /timeline.html, the
%% page drawn by headless Chromium without a script error; /metrics's layer
%% gauges scraped by a real Prometheus and read back with PromQL.
-module(mallocinfo_watch_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2, end_per_testcase/2]).
-export([watch_names_growth/1, watch_options/1, sampler_restarts/1, watch_over_distribution/1,
         timeline_endpoints/1, timeline_chromium/1, timeline_harness_sees_errors/1,
         prometheus_scrapes_layers/1]).

-define(HTTPC, mallocinfo_watch_suite).
%% How long wait_for/3 waits for samples and verdicts.
-define(WAIT_MS, 300000).

all() ->
    [watch_names_growth, watch_options, sampler_restarts, watch_over_distribution,
     timeline_endpoints, timeline_chromium, timeline_harness_sees_errors,
     prometheus_scrapes_layers].

init_per_suite(Config) ->
    {ok, _} = application:ensure_all_started(inets),
    {ok, _} = inets:start(httpc, [{profile, ?HTTPC}]),
    Config.

end_per_suite(_Config) ->
    inets:stop(httpc, ?HTTPC).

init_per_testcase(_, Config) ->
    %% A peer where mallocinfo is on the code path and loaded, not started:
    %% as in a release the tarball was injected into.
    {ok, Peer, _} = peer:start_link(#{connection => standard_io,
                                      args => ["-pa", ebin(), "-pa", test_dir()]}),
    [{peer, Peer} | Config].

end_per_testcase(_, Config) ->
    mi_ct:caught(fun() -> peer:stop(?config(peer, Config)) end),
    ok.

ebin() ->
    filename:dirname(code:which(mallocinfo)).

test_dir() ->
    filename:dirname(code:which(mi_grower)).

call(Config, M, F, A) ->
    peer:call(?config(peer, Config), M, F, A, 120000).

%% Waits until the sampler has N samples and a verdict for each of
%% Prefixes, for at most ?WAIT_MS; then fails with what it saw. A deadline
%% of its own, not CT's timetrap: the growers add about 4 MB/s to the peer,
%% and a verdict that never comes (a trixie full matrix run at a load
%% average of 9) grew it to 3.2 GB before the 30-minute timetrap, and said
%% nothing of why.
wait_for(Config, N, Prefixes) ->
    wait_for(Config, N, Prefixes, erlang:monotonic_time(millisecond) + ?WAIT_MS).

wait_for(Config, N, Prefixes, Deadline) ->
    {ok, H} = call(Config, mallocinfo, history, []),
    #{samples := S, verdicts := Vs} = H,
    Seen = [P || P <- Prefixes, lists:any(fun(V) -> string:prefix(V, P) =/= nomatch end, Vs)],
    case length(S) >= N andalso Seen =:= Prefixes of
        true ->
            H;
        false ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true ->
                    ct:log("history after ~b ms: ~p", [?WAIT_MS, maps:without([samples], H)]),
                    ct:fail({verdicts_not_seen, #{samples => length(S), wanted => N,
                                                  missing => Prefixes -- Seen, verdicts => Vs,
                                                  rates => maps:get(rates, H, none),
                                                  cost => maps:get(cost, H, none)}});
                false ->
                    timer:sleep(500),
                    wait_for(Config, N, Prefixes, Deadline)
            end
    end.

%%% Cases --------------------------------------------------------------------

%% mallocinfo is loaded, its application not started; watch/1 starts it
%% and the sampler under it. With the RabbitMQ-like growers running, the
%% history's verdicts name each growing part with its rate and the culprit
%% that grows (the queue by name, the table, the heap), the rates agree
%% with the samples, the ring is bounded; unwatch/0 stops it all.
watch_names_growth(Config) ->
    {module, mallocinfo} = call(Config, code, ensure_loaded, [mallocinfo]),
    ?assertEqual(false, lists:keymember(mallocinfo, 1,
                                        call(Config, application, which_applications, []))),
    ?assertEqual({error, not_watching}, call(Config, mallocinfo, history, [])),
    ok = call(Config, mallocinfo, watch, [#{period => 1000}]),
    ?assert(lists:keymember(mallocinfo, 1, call(Config, application, which_applications, []))),
    %% A few idle samples first: the growth starts after the first search.
    _ = wait_for(Config, 3, []),
    #{queue := Queue, owner := Owner, heap := Heap} = call(Config, mi_grower, start, []),
    Pid = fun(P) -> list_to_binary(call(Config, erlang, pid_to_list, [P])) end,
    H = wait_for(Config, 15, [<<"refc binaries grew ">>, <<"ETS tables grew ">>,
                              <<"process memory (heaps, stacks, queues) grew ">>]),
    #{verdicts := Vs, samples := Samples, ring := Ring, cost := Cost, rates := Rates,
      culprits := Culprits, period_ms := 1000} = H,
    ct:pal("verdicts:~n~ts", [[[V, "\n"] || V <- Vs]]),
    ct:pal("ring ~p, cost ~p", [Ring, Cost]),
    One = fun(Prefix) ->
                  [V] = [V || V <- Vs, string:prefix(V, Prefix) =/= nomatch],
                  V
          end,
    Has = fun(V, Part) -> ?assertNotEqual(nomatch, binary:match(V, Part), {V, Part}) end,
    B = One(<<"refc binaries grew ">>),
    [Has(B, P) || P <- [Pid(Queue), <<"q_grow">>, <<"of that growth is held by">>]],
    E = One(<<"ETS tables grew ">>),
    [Has(E, P) || P <- [<<"table mi_growing_tab">>, Pid(Owner)]],
    P = One(<<"process memory (heaps, stacks, queues) grew ">>),
    Has(P, Pid(Heap)),
    %% Each verdict's rate is its part's rate over the last minute.
    Minute = maps:from_list([{Part, R} || #{part := Part, minute := R} <- Rates]),
    [Has(V, iolist_to_binary([mallocinfo_units:bytes(maps:get(Part, Minute)), "/s"]))
     || {Part, V} <- [{binary, B}, {ets, E}, {processes, P}]],
    %% The latest search of each layer is kept beside the ring.
    #{binary := #{culprits := [#{pid := QueuePid} | _]}} = Culprits,
    ?assertEqual(Pid(Queue), QueuePid),
    %% Samples: every layer, oldest first.
    [#{layers := L0} | _] = Samples,
    Times = [T || #{t := T} <- Samples],
    ?assertEqual(lists:sort(Times), Times),
    ?assertEqual(lists:sort(call(Config, mallocinfo_layers, keys, [])), lists:sort(maps:keys(L0))),
    ?assertMatch(#{fine_slots := 3600, coarse_slots := 1440, memory_bytes := M}
                   when M > 0, Ring),
    ?assertMatch(#{count := C, mean_us := _, max_us := _} when C >= 15, Cost),
    ok = call(Config, mi_grower, stop, [maps:remove(table, #{queue => Queue, owner => Owner,
                                                               heap => Heap})]),
    ok = call(Config, mallocinfo, unwatch, []),
    ?assertEqual({error, not_watching}, call(Config, mallocinfo, history, [])),
    ?assertEqual(undefined, call(Config, erlang, whereis, [mallocinfo_watch_server])),
    ok = call(Config, mallocinfo, unwatch, []).

%% The same period again is ok; another is refused until unwatch/0; a
%% period out of range or an unknown option is badarg.
watch_options(Config) ->
    ok = call(Config, mallocinfo, watch, []),
    ok = call(Config, mallocinfo, watch, [#{period => 10000}]),
    ?assertEqual({error, {already_watching, #{period => 10000}}},
                 call(Config, mallocinfo, watch, [#{period => 2000}])),
    ok = call(Config, mallocinfo, unwatch, []),
    ok = call(Config, mallocinfo, watch, [#{period => 2000}]),
    [?assertError(badarg, mallocinfo:watch(Bad))
     || Bad <- [#{period => 999}, #{period => 3600001}, #{period => 1.5e3}, #{junk => 1},
                junk, [{period, 1000}]]].

%% The sampler is supervised: killed, it is started again (its ring
%% empty) and history/0 answers; killed too often, only its own supervisor
%% gives up: the application and the node stay, and watch/0 starts it
%% afresh.
sampler_restarts(Config) ->
    ok = call(Config, mallocinfo, watch, [#{period => 1000}]),
    First = call(Config, erlang, whereis, [mallocinfo_watch_server]),
    true = call(Config, erlang, exit, [First, kill]),
    Second = wait_registered(Config, First),
    {ok, #{period_ms := 1000}} = call(Config, mallocinfo, history, []),
    %% Killed again and again: the fourth crash in 60 s is one too many.
    ?assertEqual(3, kill_until_given_up(Config, Second, 1)),
    ?assertEqual(undefined, call(Config, erlang, whereis, [mallocinfo_watch_server])),
    ?assert(is_pid(call(Config, erlang, whereis, [mallocinfo_sup]))),
    ?assert(lists:keymember(mallocinfo, 1, call(Config, application, which_applications, []))),
    ok = call(Config, mallocinfo, watch, [#{period => 1000}]),
    ?assert(is_pid(call(Config, erlang, whereis, [mallocinfo_watch_server]))).

wait_registered(Config, Old) ->
    case call(Config, erlang, whereis, [mallocinfo_watch_server]) of
        New when is_pid(New), New =/= Old -> New;
        _ -> timer:sleep(50), wait_registered(Config, Old)
    end.

%% How many crashes the sampler's supervisor took before it gave up.
kill_until_given_up(_Config, undefined, Crashes) ->
    Crashes - 1;
kill_until_given_up(Config, Pid, Crashes) ->
    true = call(Config, erlang, exit, [Pid, kill]),
    kill_until_given_up(Config, wait_gone_or_replaced(Config, Pid), Crashes + 1).

%% The new sampler, or undefined once its supervisor gave up.
wait_gone_or_replaced(Config, Old) ->
    case {call(Config, erlang, whereis, [mallocinfo_watch_server]),
          call(Config, supervisor, which_children, [mallocinfo_sup])} of
        {New, _} when is_pid(New), New =/= Old -> New;
        {_, []} -> undefined;
        _ -> timer:sleep(50), wait_gone_or_replaced(Config, Old)
    end.

%% A node that never had mallocinfo gets it over distribution (a cluster
%% report injects it: modules, no .app file); watch/0 starts the
%% application there from its built-in specification.
watch_over_distribution(_Config) ->
    mi_ct:ensure_distributed(),
    {ok, PB, B} = peer:start(#{name => peer:random_name()}),
    try
        ?assertEqual(non_existing, erpc:call(B, code, which, [mallocinfo])),
        [{B, {ok, #{injected := true}}}] = mallocinfo_report:collect([B]),
        ?assertEqual(non_existing, erpc:call(B, code, where_is_file, ["mallocinfo.app"])),
        ok = erpc:call(B, mallocinfo, watch, [#{period => 1000}]),
        {ok, #{period_ms := 1000}} = erpc:call(B, mallocinfo, history, []),
        ?assert(lists:keymember(mallocinfo, 1, erpc:call(B, application, which_applications, [])))
    after
        mi_ct:caught(fun() -> peer:stop(PB) end)
    end.

%% /timeline.json and /timeline.html: 409 while nothing samples; then the
%% JSON holds every layer's series, one value per sample, the stacked
%% parts, the verdicts and the rates; the page is self-contained.
timeline_endpoints(Config) ->
    {ok, #{port := Port}} = call(Config, mallocinfo_http, start, []),
    Get = fun(Path) -> get(Port, Path) end,
    {409, _, Refusal} = Get("/timeline.json"),
    ?assertNotEqual(nomatch, binary:match(Refusal, <<"mallocinfo:watch()">>)),
    {409, _, _} = Get("/timeline.html"),
    {400, _, _} = Get("/timeline.json?x=1"),
    ok = call(Config, mallocinfo, watch, [#{period => 1000}]),
    _ = wait_for(Config, 3, []),
    {200, Headers, Json} = Get("/timeline.json"),
    ?assertEqual("application/json", proplists:get_value("content-type", Headers)),
    Doc = mi_json_decode:decode(Json),
    #{<<"times_ms">> := Times, <<"layers">> := Layers, <<"stacked">> := Stacked,
      <<"verdicts">> := _, <<"rates">> := [_ | _], <<"period_ms">> := 1000,
      <<"ring">> := #{<<"memory_bytes">> := _}} = Doc,
    N = length(Times),
    ?assert(N >= 3),
    [?assertEqual({K, N}, {K, length(V)}) || {K, V} <- maps:to_list(Layers)],
    [?assert(maps:is_key(K, Layers))
     || K <- [<<"rss">>, <<"erts_binary">>, <<"erts_ets">>, <<"erts_processes">>,
              <<"libc_in_use">>, <<"libc_free">>, <<"libc_mmap">>, <<"mappings">>,
              <<"smaps_anon">>, <<"alloc_binary_alloc_allocated">>,
              <<"alloc_binary_alloc_used">>]],
    ?assertEqual(8, length(Stacked)),
    {200, H2, Page} = Get("/timeline.html"),
    ?assertEqual("text/html; charset=utf-8", proplists:get_value("content-type", H2)),
    %% Self-contained: nothing fetched (the SVG namespace is a name, not a
    %% fetch).
    nomatch = re:run(Page, "src=|fetch\\(|XMLHttpRequest|<link|@import"),
    ?assertEqual([<<"http://www.w3.org/2000/svg">>],
                 lists:usort([U || [U] <- element(2, re:run(Page, "(https?://[^'\"]*)",
                                                            [global, {capture, all_but_first,
                                                                      binary}]))])),
    {200, _, Report} = Get("/report.txt"),
    ?assertNotEqual(nomatch, binary:match(Report, <<"== mallocinfo report: ">>)).

%% The page drawn by Chromium from the server: no script error, every
%% sample and the eight layers drawn, the verdicts shown; a screenshot is
%% kept in the test's log directory (doc/timeline.png is one).
timeline_chromium(Config) ->
    {ok, #{port := Port}} = call(Config, mallocinfo_http, start, []),
    ok = call(Config, mallocinfo, watch, [#{period => 1000}]),
    _ = wait_for(Config, 3, []),
    _ = call(Config, mi_grower, start, []),
    #{samples := Samples} = wait_for(Config, 20, [<<"refc binaries grew ">>]),
    Url = "http://127.0.0.1:" ++ integer_to_list(Port) ++ "/timeline.html",
    Dom = mi_ct:chromium(Config, ["--virtual-time-budget=10000", "--dump-dom", Url]),
    Attrs = mi_ct:body_attrs(Dom),
    ct:log("~p", [Attrs]),
    ?assertMatch(#{<<"data-ok">> := <<"1">>, <<"data-errors">> := <<"0">>,
                   <<"data-layers">> := <<"8">>}, Attrs),
    ?assert(binary_to_integer(maps:get(<<"data-samples">>, Attrs)) >= length(Samples)),
    ?assertNotEqual(nomatch, binary:match(Dom, <<"refc binaries grew ">>)),
    ?assertEqual(8, length(binary:matches(Dom, <<"<polygon ">>))),
    Shot = filename:join(?config(priv_dir, Config), "timeline.png"),
    _ = mi_ct:chromium(Config, ["--window-size=1100,1200", "--virtual-time-budget=10000",
                          "--screenshot=" ++ Shot, Url]),
    {ok, <<137, "PNG", _/binary>>} = file:read_file(Shot),
    ct:log("screenshot: <a href=\"~ts\">~ts</a>", [Shot, Shot]).

%% The harness is not blind: a script error is counted, data-ok never set.
timeline_harness_sees_errors(Config) ->
    {ok, #{port := Port}} = call(Config, mallocinfo_http, start, []),
    ok = call(Config, mallocinfo, watch, [#{period => 1000}]),
    _ = wait_for(Config, 2, []),
    {200, _, Page} = get(Port, "/timeline.html"),
    Broken = binary:replace(Page, <<"  chart(data);\n">>, <<"  chart(data);\n  undefinedFunction();\n">>),
    ?assertNotEqual(Page, Broken),
    File = filename:join(?config(priv_dir, Config), "broken.html"),
    ok = file:write_file(File, Broken),
    Attrs = mi_ct:body_attrs(mi_ct:chromium(Config, ["--virtual-time-budget=10000", "--dump-dom",
                                         "file://" ++ File])),
    ?assertEqual(<<"1">>, maps:get(<<"data-errors">>, Attrs)),
    ?assertNot(maps:is_key(<<"data-ok">>, Attrs)).

%% Debian's Prometheus scrapes the node's /metrics on loopback every
%% second; PromQL through its HTTP API returns the layer series, their
%% values the sampler's (each one an RSS the sampler's history holds), and
%% every layer of /metrics.
prometheus_scrapes_layers(Config) ->
    Prom = case os:find_executable("prometheus") of
               false -> ct:fail("prometheus is not installed: make deps installs it "
                                "(docker/packages.txt)");
               P -> P
           end,
    {ok, #{port := Port}} = call(Config, mallocinfo_http, start, []),
    ok = call(Config, mallocinfo, watch, [#{period => 1000}]),
    _ = wait_for(Config, 2, []),
    Scratch = string:trim(os:cmd("mktemp -d")),
    true = filelib:is_dir(Scratch),
    PromPort = free_port(),
    Yml = filename:join(Scratch, "prometheus.yml"),
    ok = file:write_file(Yml, ["global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                               "scrape_configs:\n  - job_name: mallocinfo\n"
                               "    static_configs:\n      - targets: ['127.0.0.1:",
                               integer_to_list(Port), "']\n"]),
    Log = filename:join(Scratch, "prometheus.log"),
    PromArgs = ["--config.file=" ++ Yml, "--storage.tsdb.path=" ++ filename:join(Scratch, "data"),
                "--web.listen-address=127.0.0.1:" ++ integer_to_list(PromPort)],
    %% Through sh so its output goes to a file; exec keeps the pid ours.
    PortRef = open_port({spawn_executable, "/bin/sh"},
                        [{args, ["-c", "exec \"$0\" \"$@\" >" ++ Log ++ " 2>&1", Prom | PromArgs]},
                         exit_status]),
    {os_pid, OsPid} = erlang:port_info(PortRef, os_pid),
    try
        Query = fun(Q) -> prom_query(PromPort, Q) end,
        %% Until the scrapes have landed (CT's timetrap bounds the wait).
        [#{<<"metric">> := RssLabels, <<"value">> := [_, RssText]}] =
            wait_series(Query, "mallocinfo_layer_bytes{layer=\"rss\"}", 1),
        ct:log("rss series ~p = ~s", [RssLabels, RssText]),
        ?assertMatch(#{<<"__name__">> := <<"mallocinfo_layer_bytes">>, <<"layer">> := <<"rss">>,
                       <<"job">> := <<"mallocinfo">>}, RssLabels),
        ?assertEqual(<<"127.0.0.1:", (integer_to_binary(Port))/binary>>,
                     maps:get(<<"instance">>, RssLabels)),
        {ok, #{samples := Samples}} = call(Config, mallocinfo, history, []),
        Rss = binary_to_integer(RssText),
        ?assert(lists:member(Rss, [R || #{layers := #{rss := R}} <- Samples])),
        %% Every layer of the scrape is a series in Prometheus.
        {200, _, Metrics} = get(Port, "/metrics"),
        Layers = lists:usort([L || #{name := <<"mallocinfo_layer_bytes">>, samples := S}
                                       <- mi_prom_parse:parse(Metrics),
                                   #{labels := #{<<"layer">> := L}} <- S]),
        ?assert(length(Layers) > 20),
        Series = wait_series(Query, "mallocinfo_layer_bytes", length(Layers)),
        ?assertEqual(Layers,
                     lists:usort([L || #{<<"metric">> := #{<<"layer">> := L}} <- Series])),
        [#{<<"value">> := [_, Sum]}] =
            Query("sum(mallocinfo_layer_bytes{layer=~\"erts_(binary|ets)\"})"),
        ?assert(binary_to_integer(Sum) > 0),
        [#{<<"metric">> := #{<<"source">> := <<"watch">>}}] =
            Query("mallocinfo_layer_sample_time_seconds")
    after
        os:cmd("kill " ++ integer_to_list(OsPid)),
        receive {PortRef, {exit_status, St}} -> ct:log("prometheus exited ~p", [St]) end,
        {ok, PromLog} = file:read_file(Log),
        ct:log("~ts", [PromLog]),
        "" = os:cmd("rm -r -- '" ++ Scratch ++ "'")
    end.

free_port() ->
    {ok, L} = gen_tcp:listen(0, [{ip, {127, 0, 0, 1}}]),
    {ok, P} = inet:port(L),
    ok = gen_tcp:close(L),
    P.

%% The query's result; [] while Prometheus is not listening yet, or
%% listens but answers 503 (its storage not ready: it says so until it is).
prom_query(PromPort, Q) ->
    Url = "http://127.0.0.1:" ++ integer_to_list(PromPort) ++ "/api/v1/query?"
        ++ uri_string:compose_query([{"query", Q}]),
    case httpc:request(get, {Url, []}, [{timeout, 120000}], [{body_format, binary}], ?HTTPC) of
        {ok, {{_, 200, _}, _, Body}} ->
            #{<<"status">> := <<"success">>, <<"data">> := #{<<"result">> := Result}} =
                mi_json_decode:decode(Body),
            Result;
        {ok, {{_, 503, _}, _, _}} ->
            [];
        {error, {failed_connect, _}} ->
            []
    end.

wait_series(Query, Q, N) ->
    case Query(Q) of
        Result when length(Result) >= N -> Result;
        _ -> timer:sleep(500), wait_series(Query, Q, N)
    end.

%%% Helpers ------------------------------------------------------------------

get(Port, Path) ->
    Url = "http://127.0.0.1:" ++ integer_to_list(Port) ++ Path,
    {ok, {{_, Code, _}, Headers, Body}} =
        httpc:request(get, {Url, []}, [{timeout, 120000}], [{body_format, binary}], ?HTTPC),
    {Code, Headers, Body}.

