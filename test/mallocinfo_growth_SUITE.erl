%% Growth over time and culprits, end to end: a peer node with the
%% interposer preloaded and a test NIF that leaks, caches and allocates
%% through wrappers from named functions; snapshots, diffs, growth,
%% roll-ups and the report's interval checked exactly.
-module(mallocinfo_growth_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2,
         end_per_testcase/2]).
-export([not_preloaded/1, diff_puts_the_leak_first/1, growth_leak_not_cache/1,
         rollups_exact/1, erts_is_labelled/1, report_interval_calls_leak/1,
         report_remembers_previous/1, erts_never_a_native_verdict/1, cluster_interval/1,
         sample_diff_is_estimated/1]).

all() ->
    [not_preloaded, diff_puts_the_leak_first, growth_leak_not_cache, rollups_exact,
     erts_is_labelled, report_interval_calls_leak, report_remembers_previous,
     erts_never_a_native_verdict, cluster_interval, sample_diff_is_estimated].

init_per_suite(Config) ->
    ok = mi_ct:compile_module(Config, "mallocinfo_growth_SUITE_helper.erl"),
    mi_ct:init_tracker_suite(Config, "mi_growth_nif").

end_per_suite(_Config) ->
    ok.

init_per_testcase(not_preloaded, Config) ->
    Config;
init_per_testcase(cluster_interval, Config) ->
    ok = mi_ct:ensure_distributed(),
    Ebin = filename:dirname(code:which(mallocinfo)),
    {ok, Peer, Node} = peer:start(#{name => peer:random_name(),
                                    env => mallocinfo_trace:preload_env(),
                                    args => ["-pa", Ebin, "-pa", ?config(priv_dir, Config)]}),
    [{peer, Peer}, {node, Node} | Config];
init_per_testcase(erts_never_a_native_verdict, Config) ->
    %% +Mea min: every ERTS allocator but the required ones is off, so the
    %% VM's memory (process heaps included) comes from malloc through
    %% erts_sys_alloc: a large "native" figure that belongs to ERTS.
    start_peer(Config, ["+Mea", "min"]);
init_per_testcase(sample_diff_is_estimated, Config) ->
    start_peer(Config, [], #{mode => sample, sample_bytes => 65536});
init_per_testcase(_, Config) ->
    start_peer(Config, []).

end_per_testcase(_, Config) ->
    mi_ct:stop_peer(Config).

start_peer(Config, Args) ->
    start_peer(Config, Args, #{}).

start_peer(Config, Args, Env) ->
    Config1 = mi_ct:start_peer(Config, mallocinfo_trace:preload_env(Env), Args),
    {module, mi_growth_nif} = mi_ct:call(Config1, code, ensure_loaded, [mi_growth_nif]),
    Config1.

call(Config, M, F, A) ->
    mi_ct:call(Config, M, F, A).

ok_call(Config, M, F, A) ->
    mi_ct:ok_call(Config, M, F, A).

top_symbol(#{stack := [#{symbol := S} | _]}) -> S;
top_symbol(_) -> undefined.

rows_for(Symbol, Rows) ->
    [R || R <- Rows, top_symbol(R) =:= Symbol].

%%% Cases --------------------------------------------------------------------

not_preloaded(_Config) ->
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:snapshot()),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:growth(1, 2)),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:sites(3, #{by => function})),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:sites(3, #{by => object})).

%% A leak between two snapshots is the first row of diff/2, exact; freed,
%% it is the last row of the next diff, as vanished.
diff_puts_the_leak_first(Config) ->
    S0 = ok_call(Config, mallocinfo_trace, snapshot, []),
    ?assertMatch(#{mode := full, live_bytes := L, live_blocks := N} when L > 0 andalso N > 0, S0),
    ok = call(Config, mi_growth_nif, leak, [1000, 1000]),
    S1 = ok_call(Config, mallocinfo_trace, snapshot, []),
    [First | _] = Diff = call(Config, mallocinfo_trace, diff, [S0, S1]),
    ct:pal("first row: ~p", [First]),
    ?assertMatch(#{count := 1000, bytes := 1000000, count_delta := 1000,
                   bytes_delta := 1000000, change := appeared, estimated := false,
                   label := native, culprit := #{symbol := <<"mi_growth_leak_here">>}}, First),
    ?assertEqual(<<"mi_growth_leak_here">>, top_symbol(First)),
    Deltas = [D || #{bytes_delta := D} <- Diff],
    ?assertEqual(lists:reverse(lists:sort(Deltas)), Deltas),
    ok = call(Config, mi_growth_nif, release, []),
    S2 = ok_call(Config, mallocinfo_trace, snapshot, []),
    Diff2 = call(Config, mallocinfo_trace, diff, [S1, S2, #{demangle => true}]),
    ?assertMatch(#{count := 0, bytes := 0, count_delta := -1000, bytes_delta := -1000000,
                   change := vanished}, lists:last(Diff2)),
    ?assertEqual([lists:last(Diff2)], rows_for(<<"mi_growth_leak_here">>, Diff2)),
    %% limit: only the first rows (and only they are symbolized).
    ?assertEqual(lists:sublist(Diff, 2), call(Config, mallocinfo_trace, diff, [S0, S1, #{limit => 2}])).

%% A leak that grows at every tick and a cache that is either full (50
%% blocks) or empty: growth/2 names the leak and not the cache, whose
%% series can never rise three times in a row.
growth_leak_not_cache(Config) ->
    Ticker = call(Config, erlang, spawn, [mallocinfo_growth_SUITE_helper, tick, [0]]),
    try
        Growers = ok_call(Config, mallocinfo_trace, growth, [300, 4]),
        ct:pal("growers: ~p", [[maps:without([stack], G) || G <- Growers]]),
        [Leak] = rows_for(<<"mi_growth_leak_here">>, Growers),
        ?assertMatch(#{samples := 4, label := native, estimated := false}, Leak),
        #{growth_bytes := G, rate := Rate, bytes := B} = Leak,
        ?assert(G > 0 andalso Rate > 0 andalso B >= G),
        %% 100 bytes a block: whole blocks.
        ?assertEqual(0, G rem 100),
        ?assertEqual([], rows_for(<<"mi_growth_cache_here">>, Growers))
    after
        call(Config, erlang, exit, [Ticker, kill])
    end,
    ok = call(Config, mi_growth_nif, release, []).

%% Roll-ups of one snapshot add up to its totals exactly; the culprit of
%% two call paths into one function is that function (one row, two
%% stacks); strdup's caller is the culprit, not strdup.
rollups_exact(Config) ->
    ok = call(Config, mi_growth_nif, via, [0, 100, 64]),
    ok = call(Config, mi_growth_nif, via, [1, 50, 64]),
    ok = call(Config, mi_growth_nif, dup, [30, 32]),
    S = ok_call(Config, mallocinfo_trace, snapshot, []),
    #{live_bytes := Live, live_blocks := Blocks} = S,
    ByFun = ok_call(Config, mallocinfo_trace, sites, [infinity, #{by => function, snapshot => S}]),
    ByObj = ok_call(Config, mallocinfo_trace, sites, [infinity, #{by => object, snapshot => S}]),
    [?assertEqual({Live, Blocks}, {lists:sum([B || #{bytes := B} <- Rows]),
                                   lists:sum([C || #{count := C} <- Rows])})
     || Rows <- [ByFun, ByObj]],
    Fun = fun(Name) -> [R || #{function := F} = R <- ByFun, F =:= Name] end,
    ?assertMatch([#{count := 150, bytes := 9600, stacks := 2, label := native}],
                 Fun(<<"mi_growth_culprit">>)),
    ?assertMatch([#{count := 30, bytes := 960, stacks := 1}], Fun(<<"mi_growth_dup_here">>)),
    ?assertEqual([], Fun(<<"strdup">>) ++ Fun(<<"calloc">>) ++ Fun(<<"__strdup">>)),
    [Obj] = [R || #{object := O} = R <- ByObj, is_binary(O),
                  filename:basename(O) =:= <<"mi_growth_nif.so">>],
    ?assertMatch(#{count := 180, bytes := 10560, stacks := 3}, Obj),
    %% Largest first.
    Bytes = [B || #{bytes := B} <- ByFun],
    ?assertEqual(lists:reverse(lists:sort(Bytes)), Bytes),
    %% Live, without a snapshot: the same rows for the NIF (nothing else
    %% allocates from it).
    Live2 = ok_call(Config, mallocinfo_trace, sites, [infinity, [{by, function}]]),
    ?assertEqual(Fun(<<"mi_growth_culprit">>),
                 [R || #{function := <<"mi_growth_culprit">>} = R <- Live2]),
    ok = call(Config, mi_growth_nif, release, []).

%% The VM's own malloc (erts_sys_alloc and friends in beam.smp) is labelled
%% erts in every view; mallocinfo's own allocations are labelled self.
erts_is_labelled(Config) ->
    ByFun = ok_call(Config, mallocinfo_trace, sites, [infinity, #{by => function}]),
    Beam = [R || #{object := O} = R <- ByFun, mallocinfo_trace_growth:emulator_object(O)],
    ct:pal("beam rows: ~p", [lists:sublist(Beam, 5)]),
    ?assertNotEqual([], Beam),
    ?assertEqual([], [R || #{label := L} = R <- Beam, L =/= erts]),
    %% The symbolizer's caches and the queries' tables are mallocinfo's own:
    %% never recorded (they were the `self' rows before issue 22), though
    %% this node has just symbolized hundreds of frames.
    ?assertEqual([], [R || #{label := self} = R <- ByFun]),
    ?assertMatch(#{self := #{calls := C}} when C > 0, call(Config, mallocinfo_trace, status, [])),
    ?assertEqual([], [R || #{label := native, object := O} = R <- ByFun,
                           mallocinfo_trace_growth:self_object(O)]),
    Stacks = ok_call(Config, mallocinfo_trace, sites, [200]),
    ?assertEqual([], [S || #{label := erts, stack := St} = S <- Stacks,
                           not mallocinfo_trace_growth:emulator_object(
                                 maps:get(object, mallocinfo_trace_growth:culprit(St)))]).

report_interval_calls_leak(Config) ->
    Ticker = call(Config, erlang, spawn, [mallocinfo_growth_SUITE_helper, leak_mib, []]),
    try
        R = call(Config, mallocinfo_report, collect, [#{interval => 1000}]),
        #{native := #{growth := Growth}} = R,
        ct:pal("growth: ~p~nverdicts: ~p", [maps:without([growers], Growth),
                                            maps:get(verdicts, R)]),
        ?assertMatch(#{interval_ms := 1000, leak := true}, Growth),
        Leak = [V || V <- maps:get(verdicts, R),
                     binary:match(V, <<"mi_growth_leak_here">>) =/= nomatch,
                     binary:match(V, <<"in every sample: a leak">>) =/= nomatch],
        ?assertMatch([_], Leak),
        Text = iolist_to_binary(mallocinfo_report:format(R)),
        ?assertNotEqual(nomatch, binary:match(Text, <<"in every sample: a leak">>))
    after
        call(Config, erlang, exit, [Ticker, kill])
    end,
    ok = call(Config, mi_growth_nif, release, []).

report_remembers_previous(Config) ->
    R1 = call(Config, mallocinfo_report, collect, []),
    ?assertMatch(#{native := #{previous := none}}, R1),
    ok = call(Config, mi_growth_nif, leak, [20, 1048576]),
    R2 = call(Config, mallocinfo_report, collect, []),
    #{native := #{previous := #{age_ms := Age, native_delta := D, grew := Grew} = P}} = R2,
    ct:pal("previous: ~p", [P]),
    ?assert(Age >= 0),
    ?assert(D >= 20 * 1048576),
    ?assertMatch([#{function := <<"mi_growth_leak_here">>, bytes_delta := 20971520} | _], Grew),
    Text = iolist_to_binary(mallocinfo_report:format(R2)),
    ?assertNotEqual(nomatch, binary:match(Text, <<"since the previous report">>)),
    %% Start-up (the node's first 30 s) is left out of the oldest blocks
    %% unless asked for: this node is younger than that, or every block
    %% shown was allocated after it.
    #{native := #{olds := Olds}} = R2,
    Uptime = call(Config, erlang, monotonic_time, [millisecond]) -
        erlang:convert_time_unit(call(Config, erlang, system_info, [start_time]), native,
                                 millisecond),
    ?assertEqual([], [O || #{age_ms := A} = O <- Olds, A > Uptime - 30000]),
    #{native := #{olds := WithStartup}} =
        call(Config, mallocinfo_report, collect, [#{startup_blocks => true}]),
    ?assertEqual(3, length(WithStartup)),
    ?assert(lists:any(fun(#{age_ms := A}) -> A > Uptime - 30000 end, WithStartup)),
    ok = call(Config, mi_growth_nif, release, []).

%% With +Mea min the VM mallocs its process heaps: a process holding
%% 128 MiB makes the largest malloc caller beam.smp. No verdict may name it
%% as a native caller or a leak; the ERTS layer counts it.
erts_never_a_native_verdict(Config) ->
    Holder = call(Config, mallocinfo_growth_SUITE_helper, start_hold, [8000000]),
    try
        R = call(Config, mallocinfo_report, collect, [#{interval => 500}]),
        ct:pal("verdicts: ~p~nnative: ~p",
               [maps:get(verdicts, R), maps:with([erts_bytes, functions], maps:get(native, R))]),
        #{native := #{erts_bytes := ErtsBytes}} = R,
        ?assert(ErtsBytes >= 32 * 1048576),
        [?assertEqual(nomatch, binary:match(V, [<<"beam.smp">>, <<"the VM itself">>,
                                                <<"erts_sys_alloc">>]))
         || V <- maps:get(verdicts, R)],
        %% The ERTS layer names who holds it: the process.
        ?assertMatch([_], [V || V <- maps:get(verdicts, R),
                                binary:match(V, <<"(mallocinfo_growth_SUITE_helper:hold/2) holds">>)
                                    =/= nomatch])
    after
        call(Config, erlang, exit, [Holder, kill])
    end.

%% The cluster form passes the interval to each node, which measures its
%% own growth; the default timeout grows by the interval.
cluster_interval(Config) ->
    Node = ?config(node, Config),
    Ticker = erpc:call(Node, erlang, spawn, [mallocinfo_growth_SUITE_helper, leak_mib, []]),
    try
        [{Node, {ok, R}}] = mallocinfo_report:collect([Node], #{interval => 1000}),
        ?assertMatch(#{native := #{growth := #{interval_ms := 1000, leak := true,
                                               growers := [#{culprit := #{symbol :=
                                                   <<"mi_growth_leak_here">>}} | _]}}}, R),
        Text = iolist_to_binary(mallocinfo_report:format_cluster([{Node, {ok, R}}])),
        ?assertNotEqual(nomatch, binary:match(Text, <<"in every sample: a leak">>))
    after
        erpc:call(Node, erlang, exit, [Ticker, kill])
    end,
    ok = erpc:call(Node, mi_growth_nif, release, []).

%% In sample mode a diff's figures are differences of estimates, and say
%% so: 20,000 blocks of 1000 bytes sampled at a mean of 64 KiB.
sample_diff_is_estimated(Config) ->
    S0 = ok_call(Config, mallocinfo_trace, snapshot, []),
    ?assertMatch(#{mode := sample}, S0),
    ok = call(Config, mi_growth_nif, leak, [20000, 1000]),
    S1 = ok_call(Config, mallocinfo_trace, snapshot, []),
    [Leak] = rows_for(<<"mi_growth_leak_here">>, call(Config, mallocinfo_trace, diff, [S0, S1])),
    ct:pal("sampled leak: ~p", [maps:without([stack], Leak)]),
    #{estimated := true, change := appeared, bytes_delta := B, count_delta := C} = Leak,
    ?assert(abs(B - 20000000) < 5000000),
    ?assert(abs(C - 20000) < 5000),
    ok = call(Config, mi_growth_nif, release, []).
