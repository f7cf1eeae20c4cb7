%% The Erlang context of native allocations (issue 25), on peer nodes: one
%% NIF (mi_ctx_nif) leaks from one native function, called by two Erlang
%% modules (mi_ctx_alpha, mi_ctx_beta: one source, mi_ctx_caller.erl),
%% each from its function normal/2 on a normal scheduler and dirty/2 on a
%% dirty one, inside a registered process of its own. Every view must say which process and which Erlang
%% function drove each block: sites by process and by Erlang function (exact
%% counts and bytes), the mixed stacks of sites/1 and of a snapshot's rows,
%% mallocinfo_process:top/2 by native bytes, pprof (its samples labelled
%% with the process) and the folded stacks.
%% Preloaded (full, and sample with every block sampled) and attached.
-module(mallocinfo_context_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2,
         end_per_testcase/2]).
-export([preloaded_full/1, preloaded_sample/1, attached/1, no_context_refused_cleanly/1]).

%% What each caller leaks: {Module, Function, Kind, Count, Size}.
-define(LEAKS, [{mi_ctx_alpha, normal, normal, 100, 256},
                {mi_ctx_alpha, dirty, dirty, 50, 512},
                {mi_ctx_beta, normal, normal, 30, 1000},
                {mi_ctx_beta, dirty, dirty, 20, 2000}]).

all() ->
    [preloaded_full, preloaded_sample, attached, no_context_refused_cleanly].

init_per_suite(Config) ->
    ok = mi_ct:build_nif(Config, "mi_ctx_nif"),
    [ok = mi_ct:compile_module(Config, "mi_ctx_caller.erl", [{d, 'MI_MODULE', M}])
     || M <- [mi_ctx_alpha, mi_ctx_beta]],
    Config.

end_per_suite(_Config) ->
    ok.

init_per_testcase(preloaded_full, Config) ->
    mi_ct:start_peer(Config, mallocinfo_trace:preload_env(#{mode => full}));
init_per_testcase(preloaded_sample, Config) ->
    %% A sample point on every byte: every block is sampled and stands for
    %% itself, so the figures are exact and the sampled path is the one
    %% that recorded them.
    %% A depth of 2: every leak stack is cut (it has more native frames on
    %% every release and compiler), and must say so.
    mi_ct:start_peer(Config, mallocinfo_trace:preload_env(#{mode => sample, sample_bytes => 1,
                                                            stack_depth => 2}));
init_per_testcase(_, Config) ->
    mi_ct:start_peer(Config, [{"LD_PRELOAD", false}]).

end_per_testcase(_, Config) ->
    mi_ct:stop_peer(Config).

call(Config, M, F, A) ->
    mi_ct:call(Config, M, F, A).

%%% Cases --------------------------------------------------------------------

preloaded_full(Config) ->
    ?assertMatch(#{preloaded := true, mode := full}, call(Config, mallocinfo_trace, status, [])),
    leak_and_check(Config, false, false).

preloaded_sample(Config) ->
    ?assertMatch(#{preloaded := true, mode := sample},
                 call(Config, mallocinfo_trace, status, [])),
    leak_and_check(Config, true, true).

attached(Config) ->
    ok = call(Config, mallocinfo_trace, attach, []),
    leak_and_check(Config, false, false).

%% Without a tracker the views answer as every other tracker view does; with
%% one, a layout that does not check out is refused and nothing else
%% changes (the context stays off, sites/1 answers).
no_context_refused_cleanly(Config) ->
    ?assertEqual({error, not_preloaded}, call(Config, mallocinfo_trace_context, enable, [])),
    ?assertEqual({error, not_preloaded},
                 call(Config, mallocinfo_trace, sites, [5, #{by => process}])),
    ?assertEqual([], call(Config, mallocinfo_process, top, [5, native])),
    ok = call(Config, mallocinfo_trace, attach, []),
    %% A layout whose words are all wrong: the tracker refuses it.
    Bad = #{key => 1 bsl 20, sd_env => 3, sd_process => 5, sd_shadow => 7, env_proc => 9,
            p_current => 11, p_htop => 13, p_stop => 15, p_heap => 17, p_hend => 19,
            max_cps => 8, scan_words => 256},
    ?assertMatch({error, _}, call(Config, mallocinfo_nif, ectx_enable, [Bad])),
    ?assertMatch({ok, _}, call(Config, mallocinfo_trace, sites, [5])).

%%% Helpers ------------------------------------------------------------------

leak_and_check(Config, Estimated, Cut) ->
    ?assertEqual(ok, call(Config, mallocinfo_trace_context, enable, [])),
    ?assertMatch(#{erlang_context := on}, call(Config, mallocinfo_trace, status, [])),
    {module, _} = call(Config, code, ensure_loaded, [mi_ctx_nif]),
    Alpha = call(Config, mi_ctx_alpha, start, []),
    Beta = call(Config, mi_ctx_beta, start, []),
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    [ok = call(Config, M, leak, [Kind, Count, Size]) || {M, _, Kind, Count, Size} <- ?LEAKS],

    %% By Erlang function: each caller exactly.
    {ok, ByFunction} = call(Config, mallocinfo_trace, sites, [infinity, #{by => erlang_function}]),
    ct:pal("by erlang_function: ~p", [ByFunction]),
    [?assertMatch([#{count := Count, bytes := Bytes, estimated := Estimated}],
                  [R || #{module := Mo, function := Fu, arity := 2} = R <- ByFunction,
                        Mo =:= M, Fu =:= F],
                  {M, F})
     || {M, F, _, Count, Size} <- ?LEAKS, Bytes <- [Count * Size]],

    %% By process: each process's blocks are its two callers' (a process's
    %% own VM allocations, if any, would add to them: none are expected from
    %% a process that only calls the NIF and passes small messages).
    {ok, ByProcess} = call(Config, mallocinfo_trace, sites, [infinity, #{by => process}]),
    ct:pal("by process: ~p", [ByProcess]),
    [?assertMatch([#{name := Name, count := Count, bytes := Bytes}],
                  [R || #{pid := P} = R <- ByProcess, P =:= Pid], Name)
     || {Pid, Name} <- [{Alpha, mi_ctx_alpha}, {Beta, mi_ctx_beta}],
        {Count, Bytes} <- [totals(Name)]],

    %% The mixed stacks of sites/1: the leak's four sites, each ending in
    %% the NIF's function and its caller.
    {ok, Sites} = call(Config, mallocinfo_trace, sites, [50]),
    Leaks = [S || #{stack := Stack} = S <- Sites, has_symbol(Stack, <<"mi_ctx_leak_here">>)],
    ct:pal("leak sites: ~p", [[{C, B, E} || #{count := C, bytes := B, erlang := E} <- Leaks]]),
    [begin
         Nif = case Kind of normal -> leak; dirty -> leak_dirty end,
         Caller = #{module => M, function => F, arity => 2},
         [Site] = [S || #{erlang := E} = S <- Leaks, lists:member(Caller, E)],
         #{erlang := Erlang, stack := Stack, count := C} = Site,
         ?assertEqual(Count, C),
         ?assertMatch([#{module := mi_ctx_nif, function := Nif, arity := 2}, Caller | _], Erlang),
         %% The JIT's stubs are no frames of the node's.
         ?assertEqual([], [E || #{module := erts_beamasm} = E <- Erlang]),
         ?assertEqual(Cut, has_symbol(Stack, <<"[native frames cut at 2]">>)),
         Text = iolist_to_binary(io_lib:format("~s:~s/2", [M, F])),
         ?assert(has_symbol(Stack, Text)),
         ?assert(has_symbol(Stack, <<"mi_ctx_nif:", (atom_to_binary(Nif))/binary, "/2">>))
     end || {M, F, Kind, Count, _} <- ?LEAKS],

    %% A snapshot's rows (growth, diff, olds) carry the same mixed stacks.
    {ok, Snap} = call(Config, mallocinfo_trace, snapshot, [#{olds => 1000}]),
    {ok, Olds} = call(Config, mallocinfo_trace, olds, [1000, #{snapshot => Snap}]),
    OldCallers = lists:usort([{M, F} || #{stack := Stack} <- Olds,
                                        has_symbol(Stack, <<"mi_ctx_leak_here">>),
                                        #{module := M, function := F} <- erlang_frames(Stack)]),
    [?assert(lists:member({M, F}, OldCallers)) || {M, F, _, _, _} <- ?LEAKS],

    %% Processes by native bytes, beside their heap and binaries.
    Top = call(Config, mallocinfo_process, top, [5, native]),
    ct:pal("top native: ~p", [Top]),
    [?assertMatch([#{value := Bytes, by := native, memory := Mem}] when is_integer(Mem),
                  [R || #{pid := P} = R <- Top, P =:= Pid])
     || {Pid, Name} <- [{Alpha, mi_ctx_alpha}, {Beta, mi_ctx_beta}], {_, Bytes} <- [totals(Name)]],

    %% pprof and folded stacks: Erlang functions as functions, the module as
    %% the file.
    {ok, Folded} = call(Config, mallocinfo_trace, folded, []),
    [?assertNotEqual(nomatch, binary:match(Folded, iolist_to_binary(io_lib:format("~s:~s/2", [M, F]))))
     || {M, F, _, _, _} <- ?LEAKS],
    {ok, Pprof} = call(Config, mallocinfo_trace, pprof, []),
    Functions = pprof_functions(Pprof),
    [?assert(lists:member({iolist_to_binary(io_lib:format("~s:~s/2", [M, F])), atom_to_binary(M)},
                          Functions))
     || {M, F, _, _, _} <- ?LEAKS],
    %% Each leak sample is one process's blocks, labelled with its pid and
    %% name: per process, the samples add up to its callers' totals.
    #{samples := Samples} = mi_pprof_decode:profile(zlib:gunzip(Pprof)),
    LeakSamples = [S || #{frames := Fr} = S <- Samples, lists:member(<<"mi_ctx_leak_here">>, Fr)],
    ct:pal("leak samples: ~p", [[{V, maps:get(labels, S, [])} || #{values := V} = S <- LeakSamples]]),
    [?assertMatch([_ | _], maps:get(labels, S, [])) || S <- LeakSamples],
    [begin
         PidText = list_to_binary(call(Config, erlang, pid_to_list, [Pid])),
         Mine2 = [V || #{values := V, labels := L} <- LeakSamples,
                       lists:member({<<"pid">>, PidText}, L)],
         ?assertEqual(length(Mine2),
                      length([V || #{values := V, labels := L} <- LeakSamples,
                                   lists:member({<<"process">>, atom_to_binary(Name)}, L)])),
         ?assertEqual(totals(Name), lists:foldl(fun([C, B, C, B], {AC, AB}) -> {AC + C, AB + B} end,
                                                {0, 0}, Mine2))
     end || {Pid, Name} <- [{Alpha, mi_ctx_alpha}, {Beta, mi_ctx_beta}]],
    %% The report's native section: the leak's function with its Erlang
    %% callers, and the two processes among those holding the most.
    Report = iolist_to_binary(call(Config, mallocinfo_report, format,
                                   [call(Config, mallocinfo_report, collect, [])])),
    ct:pal("~ts", [Report]),
    [?assertNotEqual(nomatch, binary:match(Report, Text), Text)
     || Text <- [<<"called from mi_ctx_beta:dirty/2 (33%), mi_ctx_beta:normal/2 (25%),">>,
                 <<"processes holding the most native memory">>,
                 <<" (mi_ctx_alpha)">>, <<" (mi_ctx_beta)">>]],

    %% Another thread: its name, its pool's number folded, ends the stack,
    %% and its blocks are in no process's row.
    ok = call(Config, mi_ctx_nif, leak_thread, [7, 3000]),
    {ok, Sites2} = call(Config, mallocinfo_trace, sites, [50]),
    ?assertMatch([#{count := 7, bytes := 21000, erlang := []}],
                 [S || #{thread := <<"mictx_pool_*">>} = S <- Sites2]),
    [#{stack := PoolStack}] = [S || #{thread := <<"mictx_pool_*">>} = S <- Sites2],
    ?assertMatch(#{object := <<"[thread]">>, symbol := <<"mictx_pool_*">>}, lists:last(PoolStack)),
    {ok, ByProcess2} = call(Config, mallocinfo_trace, sites, [infinity, #{by => process}]),
    Mine = fun(Rows) -> lists:sort([R || #{pid := P} = R <- Rows, P =:= Alpha orelse P =:= Beta])
           end,
    ?assertEqual(Mine(ByProcess), Mine(ByProcess2)),

    %% The report names the processes holding the leak's function, by what
    %% they run: three unregistered proc_lib processes by their
    %% '$initial_call', the two registered ones by their names.
    Workers = [begin
                   {ok, W} = call(Config, proc_lib, start, [mi_ctx_alpha, proc_leak, [10, 128]]),
                   W
               end || _ <- lists:seq(1, 3)],
    Report2 = call(Config, mallocinfo_report, collect, []),
    #{native := #{functions := Functions2}} = Report2,
    [LeakRow] = [F || #{function := <<"mi_ctx_leak_here">>} = F <- Functions2],
    ?assertEqual([{{mi_ctx_alpha, proc_leak, 2}, 3}, {mi_ctx_alpha, 1}, {mi_ctx_beta, 1}],
                 maps:get(processes, LeakRow)),
    Text2 = iolist_to_binary(call(Config, mallocinfo_report, format, [Report2])),
    Flat = iolist_to_binary(re:replace(Text2, "\n +", " ", [global])),
    ct:pal("~ts", [Text2]),
    ?assertNotEqual(nomatch, binary:match(Flat, <<"in 5 processes (3 mi_ctx_alpha:proc_leak/2, "
                                                  "1 mi_ctx_alpha, 1 mi_ctx_beta)">>)),
    [W ! stop || W <- Workers],
    ok = call(Config, mi_ctx_nif, release, []).

%% A caller module's count and bytes, over both its functions.
totals(M) ->
    lists:foldl(fun({Mo, _, _, C, S}, {AC, AB}) when Mo =:= M -> {AC + C, AB + C * S};
                   (_, Acc) -> Acc
                end, {0, 0}, ?LEAKS).

has_symbol(Stack, Symbol) ->
    lists:any(fun(#{symbol := S}) -> S =:= Symbol end, Stack).

%% The Erlang frames of a mixed stack, read back from their symbols.
erlang_frames(Stack) ->
    [#{module => binary_to_atom(Mo), function => binary_to_atom(Fu)}
     || #{symbol := S, object := O} <- Stack, is_binary(S),
        {match, [Mo, Fu]} <- [re:run(S, "^([a-z_]+):([a-z_]+)/[0-9]+$",
                                     [{capture, all_but_first, binary}])],
        Mo =:= O].

%% {Name, SystemName} of every function of a gzipped profile.proto.
pprof_functions(Gz) ->
    #{locations := Locations} = mi_pprof_decode:profile(zlib:gunzip(Gz)),
    lists:usort([{N, F} || #{functions := Fns} <- maps:values(Locations),
                           #{name := N, filename := F} <- Fns]).
