%% mallocinfo_trace:attach/0 on peer nodes started WITHOUT LD_PRELOAD: two
%% copies of a test NIF that leak from named functions, one loaded before
%% attach and one after; detach; attach/detach cycles while NIF threads
%% allocate; a failed attach; a preloaded node refusing; an attached node
%% whose own NIFs allocate nothing, where no view may show a block of
%% mallocinfo's (the RabbitMQ case of issue 22).
-module(mallocinfo_attach_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2,
         end_per_testcase/2]).
-export([before_and_after/1, detach_stops_recording/1, cycles_under_load/1,
         failed_attach_restores/1, preloaded_refuses/1, bad_arguments/1,
         report_attaches_nodes/1, downstream_after_attach/1, never_shows_itself/1]).

all() ->
    [before_and_after, detach_stops_recording, cycles_under_load, failed_attach_restores,
     preloaded_refuses, bad_arguments, report_attaches_nodes, downstream_after_attach,
     never_shows_itself].

init_per_suite(Config) ->
    %% One source, two NIFs: mi_attach_a and mi_attach_b, each leaking from
    %% a function of its own name.
    [ok = mi_ct:build_nif(Config, "mi_attach_nif", "mi_attach_" ++ M,
                          io_lib:format("-DMI_MODULE=mi_attach_~s -DMI_LEAK_FN=mi_~s_leak_here",
                                        [M, M]))
     || M <- ["a", "b"]],
    Config.

end_per_suite(_Config) ->
    ok.

init_per_testcase(failed_attach_restores, Config) ->
    start_peer(Config, [{"MALLOCINFO_ATTACH_FAIL_AFTER", "3"}]);
init_per_testcase(report_attaches_nodes, Config) ->
    Config;
init_per_testcase(preloaded_refuses, Config) ->
    start_peer(Config, mallocinfo_trace:preload_env());
init_per_testcase(_, Config) ->
    start_peer(Config, []).

end_per_testcase(_, Config) ->
    mi_ct:stop_peer(Config).

%% Without LD_PRELOAD unless Env sets it: these peers are to be attached.
start_peer(Config, Env) ->
    Env1 = case lists:keymember("LD_PRELOAD", 1, Env) of
               true -> Env;
               false -> [{"LD_PRELOAD", false} | Env]
           end,
    mi_ct:start_peer(Config, Env1).

call(Config, M, F, A) ->
    mi_ct:call(Config, M, F, A).

ok_call(Config, M, F, A) ->
    mi_ct:ok_call(Config, M, F, A).

sites(Config, Symbol) ->
    [S || #{stack := [#{symbol := Sym} | _]} = S
              <- ok_call(Config, mallocinfo_trace, sites, [50]),
          Sym =:= Symbol].

%%% Cases --------------------------------------------------------------------

%% NIF a loaded before attach, NIF b after (its dlopen goes through the
%% emulator's redirected dlopen): both leaks counted exactly, blocks from
%% before attach neither reported nor harmful when freed.
before_and_after(Config) ->
    ?assertMatch(#{preloaded := false, attached := false, attached_at := undefined},
                 call(Config, mallocinfo_trace, status, [])),
    ?assertEqual({error, not_preloaded}, call(Config, mallocinfo_trace, sites, [5])),
    {module, mi_attach_a} = call(Config, code, ensure_loaded, [mi_attach_a]),
    ok = call(Config, mi_attach_a, leak, [50, 48]),  % before attach: never seen
    T0 = call(Config, erlang, system_time, [millisecond]),
    ok = call(Config, mallocinfo_trace, attach, []),
    T1 = call(Config, erlang, system_time, [millisecond]),
    S = call(Config, mallocinfo_trace, status, []),
    ct:pal("after attach: ~p", [maps:with([attached, attached_at, attach, recording], S)]),
    #{attached := true, preloaded := false, recording := true, attached_at := At,
      attach := #{slots := Slots, objects := Objects, attach_us := Us}} = S,
    ?assert(At >= T0 andalso At =< T1),
    ?assert(Slots > 0 andalso Objects > 0),
    ok = file:write_file(filename:join(?config(priv_dir, Config), "attach_us.txt"),
                         io_lib:format("~p ~p ~p~n", [Us, Objects, Slots])),
    ?assertEqual({error, already_attached}, call(Config, mallocinfo_trace, attach, [])),

    ok = call(Config, mi_attach_a, leak, [1000, 100]),
    ?assertMatch([#{count := 1000, bytes := 100000, estimated := false}],
                 sites(Config, <<"mi_a_leak_here">>)),
    {module, mi_attach_b} = call(Config, code, ensure_loaded, [mi_attach_b]),
    ok = call(Config, mi_attach_b, leak, [700, 200]),
    [#{count := 700, bytes := 140000, stack := [Top | _]}] = sites(Config, <<"mi_b_leak_here">>),
    ?assertNotEqual(nomatch, binary:match(maps:get(object, Top), <<"mi_attach_b.so">>)),

    %% Frees of the 50 blocks from before attach: forwarded and counted as
    %% untracked, never as freed bytes: allocated - freed stays the live
    %% bytes (it went to -10.2 MB on an attached RabbitMQ, issue 28).
    #{frees_untracked := U0} = call(Config, mallocinfo_trace, status, []),
    ok = call(Config, mi_attach_a, release, []),
    #{frees_untracked := U1, bytes_allocated := BA, bytes_freed := BF, live_bytes := LB} =
        call(Config, mallocinfo_trace, status, []),
    ?assert(U1 - U0 >= 50),
    ?assertEqual(LB, BA - BF),
    ?assertEqual([], sites(Config, <<"mi_a_leak_here">>)),
    ok = call(Config, mi_attach_b, release, []),
    ok = call(Config, mallocinfo_trace, detach, []).

%% After detach nothing is recorded and status/0 says so (it said
%% `recording => true, mode => full' on a detached RabbitMQ, issue 22): the
%% table, whose frees no longer arrive, is forgotten rather than left to go
%% stale, the queries answer not_recording, and the next attach starts
%% afresh.
detach_stops_recording(Config) ->
    ok = call(Config, mallocinfo_trace, attach, [#{stack_depth => 16}]),
    {module, mi_attach_a} = call(Config, code, ensure_loaded, [mi_attach_a]),
    ok = call(Config, mi_attach_a, leak, [300, 64]),
    ?assertMatch([#{count := 300, bytes := 19200}], sites(Config, <<"mi_a_leak_here">>)),
    ok = call(Config, mallocinfo_trace, detach, []),
    ?assertEqual({error, not_attached}, call(Config, mallocinfo_trace, detach, [])),
    #{attached := false, attached_at := At, attach := #{slots := 0}, recording := false,
      mode := off, live_entries := 0} = call(Config, mallocinfo_trace, status, []),
    ?assert(is_integer(At)),
    ?assertEqual({error, not_recording}, call(Config, mallocinfo_trace, sites, [5])),
    ?assertEqual({error, not_recording}, call(Config, mallocinfo_trace, olds, [5])),
    ?assertEqual({error, not_recording}, call(Config, mallocinfo_trace, set_mode, [full])),
    ok = call(Config, mi_attach_a, leak, [200, 64]),
    %% What was counted while attached stays readable, mallocinfo's own too
    %% (self read zero after detach on the trial's RabbitMQ).
    ?assertMatch(#{recording := false, live_entries := 0, calls := #{malloc := M},
                   self := #{calls := C}} when M >= 300 andalso C > 0,
                 call(Config, mallocinfo_trace, status, [])),
    %% Every view says why it has nothing: detached, not MALLOCINFO_TRACE_EXE.
    #{native := {unavailable, detached, _}} = call(Config, mallocinfo_report, collect, []),
    {ok, #{port := Port}} = call(Config, mallocinfo_http, start, []),
    ok = call(Config, application, ensure_started, [inets]),
    [begin
         Url = "http://127.0.0.1:" ++ integer_to_list(Port) ++ Path,
         {ok, {{_, Code, _}, _, Body}} = call(Config, httpc, request, [Url]),
         ?assertEqual({Path, Code, nomatch}, {Path, Code, string:find(Body, "MALLOCINFO_TRACE_EXE")}),
         ?assertNotEqual({Path, nomatch}, {Path, string:find(Body, "detached")})
     end || {Path, Code} <- [{"/heap.folded", 409}, {"/debug/pprof/heap", 409},
                             {"/heap_profile", 200}]],
    %% The 500 blocks are freed while detached: harmless.
    ok = call(Config, mi_attach_a, release, []),
    ok = call(Config, mallocinfo_trace, attach, []),
    ?assertEqual([], sites(Config, <<"mi_a_leak_here">>)),
    ok = call(Config, mi_attach_a, leak, [10, 64]),
    ?assertMatch([#{count := 10}], sites(Config, <<"mi_a_leak_here">>)),
    ok = call(Config, mallocinfo_trace, detach, []),
    ok = call(Config, mi_attach_a, release, []).

%% 100 attach/detach cycles while 4 NIF threads malloc/calloc/realloc/free:
%% no crash, the threads' own counts intact, every slot restored each time,
%% exact counters for a leak made afterwards, and the node's RSS does not
%% grow beyond the tracker's tables.
cycles_under_load(Config) ->
    {module, mi_attach_a} = call(Config, code, ensure_loaded, [mi_attach_a]),
    Rss0 = rss_kib(Config),
    4 = call(Config, mi_attach_a, churn_start, [4]),
    Opts = #{table_size => 1 bsl 16, stack_table_size => 1 bsl 12},
    Cycle = fun(_) ->
                    ok = call(Config, mallocinfo_trace, attach, [Opts]),
                    #{attached := true, attach := #{slots := N}} =
                        call(Config, mallocinfo_trace, status, []),
                    ok = call(Config, mallocinfo_trace, detach, []),
                    #{attached := false, attach := #{slots := 0}} =
                        call(Config, mallocinfo_trace, status, []),
                    N
            end,
    SlotCounts = lists:map(Cycle, lists:seq(1, 100)),
    Ops = call(Config, mi_attach_a, churn_stop, []),
    ct:pal("100 cycles, ~p churn operations, slots per attach ~p", [Ops, lists:usort(SlotCounts)]),
    ?assert(Ops > 0),
    %% The same objects are patched each time.
    ?assertEqual(1, length(lists:usort(SlotCounts))),
    ok = call(Config, mallocinfo_trace, attach, [Opts]),
    ok = call(Config, mi_attach_a, leak, [4321, 24]),
    ?assertMatch([#{count := 4321, bytes := 103704}], sites(Config, <<"mi_a_leak_here">>)),
    ok = call(Config, mi_attach_a, release, []),
    ?assertEqual([], sites(Config, <<"mi_a_leak_here">>)),
    #{table_bytes := TB, stack_bytes := SB, tables_bytes := All,
      mappings := #{table_bytes := Regions}} = call(Config, mallocinfo_trace, status, []),
    %% Every table: the live and stack tables, the churn table, the thread
    %% states and the region table.
    ?assert(All > TB + SB + Regions),
    ok = call(Config, mallocinfo_trace, detach, []),
    Rss1 = rss_kib(Config),
    ct:pal("RSS ~p KiB -> ~p KiB; tables ~p KiB", [Rss0, Rss1, All div 1024]),
    %% The tables are the bound; 8 MiB for the churn threads' arenas and stacks.
    ?assert(Rss1 - Rss0 =< All div 1024 + 8192).

%% The fourth slot store fails (injected): every slot is put back, the
%% node says why and keeps working, and loads a NIF normally after.
failed_attach_restores(Config) ->
    ?assertEqual({error, eacces}, call(Config, mallocinfo_trace, attach, [])),
    ?assertMatch(#{attached := false, attached_at := undefined},
                 call(Config, mallocinfo_trace, status, [])),
    ?assertEqual({error, not_preloaded}, call(Config, mallocinfo_trace, sites, [5])),
    ?assertEqual({error, not_attached}, call(Config, mallocinfo_trace, detach, [])),
    {module, mi_attach_b} = call(Config, code, ensure_loaded, [mi_attach_b]),
    ok = call(Config, mi_attach_b, leak, [100, 100]),
    ok = call(Config, mi_attach_b, release, []),
    ?assertEqual({error, eacces}, call(Config, mallocinfo_trace, attach, [])).

preloaded_refuses(Config) ->
    ?assertEqual({error, preloaded}, call(Config, mallocinfo_trace, attach, [])),
    ?assertMatch(#{preloaded := true, attached := false},
                 call(Config, mallocinfo_trace, status, [])),
    ?assertEqual({error, not_attached}, call(Config, mallocinfo_trace, detach, [])).

bad_arguments(Config) ->
    Bad = [[#{mode => off}], [#{mode => loud}], [#{bogus => 1}], [#{table_size => 1}],
           [#{stack_depth => 129}], [#{sample_bytes => 0}], [[{mode, full}]], [full]],
    [?assertMatch({'EXIT', {badarg, _}}, mi_ct:caught(fun() -> call(Config, mallocinfo_trace, attach, A) end))
     || A <- Bad],
    ?assertMatch(#{attached := false}, call(Config, mallocinfo_trace, status, [])).

%% mallocinfo:report(Nodes, #{attach => true}) over distribution: a node
%% that is not tracking attaches and its row says so; a preloaded node is
%% left as it is; asking again finds the first one attached. (This CT node
%% itself is never attached: other suites expect it without a tracker.)
report_attaches_nodes(Config) ->
    ok = mi_ct:ensure_distributed(),
    Ebin = filename:dirname(code:which(mallocinfo)),
    {ok, PA, A} = peer:start(#{name => peer:random_name(), args => ["-pa", Ebin],
                               env => [{"LD_PRELOAD", false}]}),
    {ok, PP, P} = peer:start(#{name => peer:random_name(), args => ["-pa", Ebin],
                               env => mallocinfo_trace:preload_env()}),
    try
        [{A, {ok, RA}}, {P, {ok, RP}}] = mallocinfo_report:collect([A, P], #{attach => true}),
        ?assertMatch(#{attach := ok, injected := false}, RA),
        ?assertMatch(#{attach := {error, preloaded}}, RP),
        ?assertMatch(#{attached := true}, erpc:call(A, mallocinfo_trace, status, [])),
        Text = lists:flatten(io_lib:format("~ts", [mallocinfo_report:format_cluster(
                                                     [{A, {ok, RA}}, {P, {ok, RP}}])])),
        ct:pal("~ts", [Text]),
        ?assertNotEqual(nomatch, string:find(Text, "ok, attached now")),
        ?assertNotEqual(nomatch, string:find(Text, "ok, preloaded")),
        [{A, {ok, RA2}}] = mallocinfo_report:collect([A], #{attach => true}),
        ?assertMatch(#{attach := {error, already_attached},
                       native := #{attached := true, attached_at := _}}, RA2),
        ?assertError(badarg, mallocinfo_report:collect([A], #{attach => yes}))
    after
        peer:stop(PA),
        peer:stop(PP)
    end,
    Config.

%% After attach, what reads the tracker elsewhere sees it: Prometheus
%% metrics, the HTTP endpoint's /heap_profile status text, stats/0.
downstream_after_attach(Config) ->
    ?assertEqual({error, not_preloaded}, call(Config, mallocinfo_trace, stats, [])),
    ok = call(Config, mallocinfo_trace, attach, []),
    {module, mi_attach_a} = call(Config, code, ensure_loaded, [mi_attach_a]),
    ok = call(Config, mi_attach_a, leak, [100, 64]),
    ?assertMatch(#{live_entries := L, calls := #{malloc := M}} when L >= 100 andalso M >= 100,
                 ok_call(Config, mallocinfo_trace, stats, [])),
    Metrics = iolist_to_binary(call(Config, mallocinfo_prom, metrics, [])),
    ?assertNotEqual(nomatch, binary:match(Metrics, <<"mallocinfo_tracker_live_blocks ">>)),
    {ok, #{port := Port}} = call(Config, mallocinfo_http, start, []),
    Url = "http://127.0.0.1:" ++ integer_to_list(Port) ++ "/heap_profile",
    ok = call(Config, application, ensure_started, [inets]),
    {ok, {{_, 200, _}, _, Body}} = call(Config, httpc, request, [Url]),
    ct:pal("~ts", [Body]),
    ?assertNotEqual(nomatch, string:find(Body, "tracker: attached at ")),
    ok = call(Config, mi_attach_a, release, []),
    ok = call(Config, mallocinfo_trace, detach, []).

%% The attached-RabbitMQ case of issue 22: a node whose own NIFs allocate
%% nothing (none is loaded), tracker attached, every view asked, over and
%% over: its profile, flame graph, sites, oldest blocks and report were
%% mallocinfo's own buffers there (SymbolCollector::finish, group_by_site,
%% trace_pprof). No view may show a block whose stack passes through
%% mallocinfo's objects, and status/0 says how much it left out.
never_shows_itself(Config) ->
    ok = call(Config, mallocinfo_trace, attach, []),
    {ok, #{port := Port}} = call(Config, mallocinfo_http, start, []),
    ok = call(Config, application, ensure_started, [inets]),
    Get = fun(Path) ->
                  Url = "http://127.0.0.1:" ++ integer_to_list(Port) ++ Path,
                  {ok, {{_, 200, _}, _, Body}} =
                      call(Config, httpc, request, [get, {Url, []}, [{timeout, 120000}],
                                                     [{body_format, binary}]]),
                  Body
          end,
    Dump = "/heap_profile?trigger_dump=true",
    Paths = [Dump, "/debug/pprof/heap", "/heap.folded", "/flamegraph.html", "/metrics"],
    Ask = fun() ->
                  S0 = ok_call(Config, mallocinfo_trace, snapshot, [#{olds => 20}]),
                  #{sites => ok_call(Config, mallocinfo_trace, sites, [1000]),
                    functions => ok_call(Config, mallocinfo_trace, sites,
                                         [infinity, #{by => function}]),
                    olds => ok_call(Config, mallocinfo_trace, olds, [1000]),
                    snapshot_olds => ok_call(Config, mallocinfo_trace, olds,
                                             [20, #{snapshot => S0}]),
                    diff => call(Config, mallocinfo_trace, diff,
                                 [S0, ok_call(Config, mallocinfo_trace, snapshot, [])]),
                    growth => ok_call(Config, mallocinfo_trace, growth, [20, 3]),
                    mappings => ok_call(Config, mallocinfo_trace, mappings, [1000]),
                    pprof => call(Config, mallocinfo_trace, pprof, []),
                    folded => call(Config, mallocinfo_trace, folded, []),
                    heap_profile => call(Config, mallocinfo_trace, heap_profile, []),
                    heap_map => call(Config, mallocinfo_heap, summary, [#{max_sites => 1000}]),
                    report => call(Config, mallocinfo_report, collect, [#{interval => 200}]),
                    http => [{P, Get(P)} || P <- Paths]}
          end,
    %% Warm up every cache mallocinfo keeps (the symbolizer's, httpd's),
    %% then ask again: what the first round allocated and kept must not
    %% show in the second either.
    _ = Ask(),
    _ = Ask(),
    Views = Ask(),
    Ours = fun(Text) -> binary:match(iolist_to_binary(Text),
                                     [<<"mallocinfo_nif.so">>, <<"libmallocinfo_preload.so">>])
           end,
    OurFrame = fun(#{object := O}) -> Ours(O) =/= nomatch;
                  (_) -> false
               end,
    Stacks = fun(Rows) -> [St || #{stack := St} <- Rows] end,
    #{sites := Sites, functions := Functions, olds := Olds, snapshot_olds := SOlds,
      diff := Diff, growth := Growth, mappings := Mappings, pprof := {ok, Pprof},
      folded := {ok, Folded}, heap_profile := {ok, HeapProfile},
      heap_map := {ok, #{sites := MapSites}}, report := Report, http := Http} = Views,
    ct:pal("~b sites, ~b functions, ~b olds, ~b mappings, ~b heap map sites",
           [length(Sites), length(Functions), length(Olds), length(Mappings),
            length(MapSites)]),
    ?assertNotEqual([], Sites),
    [?assertEqual({View, []}, {View, [St || St <- Stacks(Rows), lists:any(OurFrame, St)]})
     || {View, Rows} <- [{sites, Sites}, {olds, Olds}, {snapshot_olds, SOlds}, {diff, Diff},
                         {growth, Growth}, {mappings, Mappings}]],
    ?assertEqual([], [F || #{label := self} = F <- Functions]),
    ?assertEqual([], [F || #{frame := Fr} = F <- Functions, OurFrame(Fr)]),
    ?assertEqual([], [L || #{label := L} <- MapSites, Ours(L) =/= nomatch]),
    %% pprof: no sample has a location in our objects.
    P = mi_pprof_decode:profile(zlib:gunzip(Pprof)),
    OurMappings = [Id || #{id := Id, filename := F} <- maps:get(mappings, P), Ours(F) =/= nomatch],
    Locs = maps:get(locations, P),
    ?assertEqual([], [S || #{locations := Ids} = S <- maps:get(samples, P),
                           lists:any(fun(Id) -> lists:member(maps:get(mapping, maps:get(Id, Locs)),
                                                             OurMappings)
                                     end, Ids)]),
    ?assertEqual(nomatch, Ours(Folded)),
    [?assertEqual({Path, nomatch}, {Path, Ours(Body)})
     || {Path, Body} <- Http, Path =/= "/debug/pprof/heap", Path =/= Dump],
    %% The legacy heap profile lists raw addresses and, as pprof does, every
    %% mapping: no sample may fall into ours.
    [begin
         {Addresses, Own} = own_addresses(Config, Profile),
         ?assert(Addresses > 0),
         ?assertEqual([], Own)
     end || Profile <- [HeapProfile, proplists:get_value(Dump, Http)]],
    Text = lists:flatten(io_lib:format("~ts", [call(Config, mallocinfo_report, format, [Report])])),
    ?assertEqual(nomatch, Ours(Text)),
    #{native := Native} = Report,
    ?assertMatch(#{self_bytes := 0, self_blocks := 0}, Native),
    %% What was left out, said.
    #{self := #{calls := SelfCalls, bytes := SelfBytes}} =
        call(Config, mallocinfo_trace, status, []),
    ct:pal("left out: ~b allocations, ~b bytes", [SelfCalls, SelfBytes]),
    ?assert(SelfCalls > 1000 andalso SelfBytes > 1000000),
    ct:pal("~ts", [Text]),
    OneLine = re:replace(Text, "\\s+", " ", [global, unicode, {return, list}]),
    ?assertNotEqual(nomatch, string:find(OneLine, "mallocinfo's own work (")),
    ok = call(Config, mallocinfo_trace, detach, []).

%% How many return addresses a legacy heap profile's stack lines hold, and
%% those that fall in an executable mapping of mallocinfo's objects on the
%% peer.
own_addresses(Config, Profile) ->
    {ok, Maps} = call(Config, file, read_file, ["/proc/self/maps"]),
    Own = [{binary_to_integer(Lo, 16), binary_to_integer(Hi, 16)}
           || Line <- binary:split(Maps, <<"\n">>, [global, trim_all]),
              binary:match(Line, [<<"mallocinfo_nif.so">>, <<"libmallocinfo_preload.so">>])
                  =/= nomatch,
              [Range, <<_, _, $x, _>> | _] <- [binary:split(Line, <<" ">>, [global])],
              [Lo, Hi] <- [binary:split(Range, <<"-">>)]],
    All = [binary_to_integer(binary:part(Hex, 2, byte_size(Hex) - 2), 16)
           || Line <- binary:split(iolist_to_binary(Profile), <<"\n">>, [global, trim_all]),
              {match, [Addrs]} <- [re:run(Line, "^\\s*\\d+:\\s*\\d+\\s*\\[\\s*\\d+:\\s*\\d+\\]\\s*@(.*)$",
                                          [{capture, all_but_first, binary}])],
              Hex <- binary:split(Addrs, <<" ">>, [global, trim_all])],
    {length(All), [A || A <- All, lists:any(fun({Lo, Hi}) -> A >= Lo andalso A < Hi end, Own)]}.

rss_kib(Config) ->
    {ok, Status} = call(Config, file, read_file, ["/proc/self/status"]),
    {match, [Kib]} = re:run(Status, "VmRSS:\\s+(\\d+)", [{capture, all_but_first, list}]),
    list_to_integer(Kib).
