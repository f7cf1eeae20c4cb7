%% The allocation tracker, end to end: a peer node started with the
%% interposer preloaded, a test NIF that leaks from a named function, and
%% the tracker's answers checked exactly.
-module(mallocinfo_trace_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2,
         end_per_testcase/2]).
-export([not_preloaded/1, not_recording/1, status_when_preloaded/1, sites_name_the_leak/1, olds_age/1,
         reset_clears/1, set_mode_live/1, sample_mode_estimates/1, bad_arguments/1,
         million_entries/1, stack_table_cycles/1, racing_threads_one_site/1,
         sites_full_stack_table/1, reclaim_and_status/1]).

all() ->
    [not_preloaded, not_recording, status_when_preloaded, sites_name_the_leak, olds_age, reset_clears,
     set_mode_live, sample_mode_estimates, bad_arguments, million_entries, stack_table_cycles,
     racing_threads_one_site, sites_full_stack_table, reclaim_and_status].

init_per_suite(Config) ->
    mi_ct:init_tracker_suite(Config, "mi_leaky_nif").

end_per_suite(_Config) ->
    ok.

init_per_testcase(not_preloaded, Config) ->
    Config;
init_per_testcase(not_recording, Config) ->
    start_peer(Config, #{exe => "no-such-executable"});
init_per_testcase(sample_mode_estimates, Config) ->
    start_peer(Config, #{mode => sample, sample_bytes => 65536});
init_per_testcase(million_entries, Config) ->
    start_peer(Config, #{table_size => 4 * 1024 * 1024});
init_per_testcase(_, Config) ->
    start_peer(Config, #{}).

end_per_testcase(_, Config) ->
    mi_ct:stop_peer(Config).

start_peer(Config, Opts) ->
    mi_ct:start_peer(Config, mallocinfo_trace:preload_env(Opts)).

call(Config, M, F, A) ->
    mi_ct:call(Config, M, F, A).

ok_call(Config, M, F, A) ->
    mi_ct:ok_call(Config, M, F, A).

%% The frame a leak site starts with.
leak_sites(Sites) ->
    [S || #{stack := [#{symbol := <<"mi_test_leak_here">>} | _]} = S <- Sites].

%% Sites of mi_leaky_nif:paths/4 and race_paths/4 (malloc's caller is one
%% of the two path functions).
path_sites(Sites) ->
    [S || #{stack := [#{symbol := <<"mi_test_path_", _/binary>>} | _]} = S <- Sites].

%%% Cases --------------------------------------------------------------------

%% This CT node runs without LD_PRELOAD.
not_preloaded(_Config) ->
    ?assertMatch(#{preloaded := false, recording := false, mode := off},
                 mallocinfo_trace:status()),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:sites(10)),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:olds(10)),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:reset()),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:set_mode(full)),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:stats()),
    ?assertEqual({error, not_preloaded}, mallocinfo_trace:reclaim()),
    %% Bad arguments are still badarg, preloaded or not.
    ?assertError(badarg, mallocinfo_trace:set_mode(loud)).

%% Preloaded, but the emulator did not match MALLOCINFO_TRACE_EXE: it passes
%% everything through and says so.
not_recording(Config) ->
    ?assertMatch(#{preloaded := true, recording := false, mode := off},
                 call(Config, mallocinfo_trace, status, [])),
    ?assertEqual({error, not_recording}, call(Config, mallocinfo_trace, set_mode, [full])),
    ?assertEqual({error, not_recording}, call(Config, mallocinfo_trace, sites, [5])),
    ?assertEqual({error, not_recording}, call(Config, mallocinfo_trace, olds, [5])),
    ?assertEqual({error, not_recording}, call(Config, mallocinfo_trace, reset, [])),
    ?assertEqual({error, not_recording}, call(Config, mallocinfo_trace, reclaim, [])).

status_when_preloaded(Config) ->
    S = call(Config, mallocinfo_trace, status, []),
    ct:pal("status: ~p", [S]),
    ?assertMatch(#{preloaded := true, recording := true, mode := full, unwinder := cached,
                   stack_depth := 32}, S),
    #{table_capacity := Cap, table_bytes := TB, live_entries := Live, calls := Calls} = S,
    ?assert(Cap >= 1 bsl 21),
    %% 32 bytes per slot (address and size packed, time, stack id and
    %% flags, the process), slots for twice the capacity in big chunks (a
    %% chain keeps its chunks), a small chunk of 4 slots and a directory
    %% word per 64 entries, 24 bytes of header per chunk: 69.5 bytes per
    %% entry of capacity.
    ?assert(TB >= 64 * Cap andalso TB < 70 * Cap),
    ?assert(Live > 0),
    ?assert(maps:get(malloc, Calls) > 0),
    %% What each table keeps resident (its own pages, pagemap), within what
    %% it reserved (the unwind caches are mapped per thread, apart from
    %% tables_bytes).
    #{tables_resident := #{live := RL, stacks := RS, churn := RC, threads := RT},
      stack_bytes := SB} = S,
    ?assert(RL > 0 andalso RL =< TB),
    ?assert(RS > 0 andalso RS =< SB),
    ?assert(RC > 0 andalso RT > 0),
    %% 200,000 more live blocks take at least a 32-byte slot each (the
    %% chunks the boot gave back hold far fewer).
    ok = call(Config, mi_leaky_nif, leak, [200000, 64]),
    #{tables_resident := #{live := RL2}} = call(Config, mallocinfo_trace, status, []),
    ok = call(Config, mi_leaky_nif, release, []),
    ?assert(RL2 >= RL + 200000 * 16),
    %% The region block's two views (one read of it): the mmap family's
    %% regions and counters, and what mallocinfo's own work mapped.
    #{mappings := #{regions := Regions, bytes := RBytes, table_capacity := RCap,
                    table_bytes := RTB, dropped := 0,
                    calls := #{mmap := Mmaps, munmap := _, mremap := _},
                    bytes_mapped := Mapped, bytes_unmapped := Unmapped},
      self := #{calls := _, bytes := _, mmaps := SelfMmaps, bytes_mapped := SelfMapped}} = S,
    ?assert(Regions > 0 andalso RBytes > 0 andalso RCap >= Regions andalso RTB > 0),
    ?assert(Mmaps > 0 andalso Mapped >= RBytes andalso is_integer(Unmapped)),
    ?assert(is_integer(SelfMmaps) andalso is_integer(SelfMapped)),
    Stats = ok_call(Config, mallocinfo_trace, stats, []),
    ?assertMatch(#{mallinfo := #{arena := _}, calls := #{free := _}, live_bytes := _}, Stats).

sites_name_the_leak(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    ok = call(Config, mi_leaky_nif, leak, [1000, 100]),
    Sites = ok_call(Config, mallocinfo_trace, sites, [10]),
    [Site] = leak_sites(Sites),
    ct:pal("leak site: ~p", [Site]),
    ?assertMatch(#{count := 1000, bytes := 100000, estimated := false}, Site),
    #{stack := [Top | _]} = Site,
    ?assertMatch(#{object := <<_/binary>>, address := A} when A > 0, Top),
    ?assertNotEqual(nomatch, binary:match(maps:get(object, Top), <<"mi_leaky_nif.so">>)),
    %% Largest first.
    Bytes = [B || #{bytes := B} <- Sites],
    ?assertEqual(lists:reverse(lists:sort(Bytes)), Bytes),
    ok = call(Config, mi_leaky_nif, release, []),
    ?assertEqual([], leak_sites(ok_call(Config, mallocinfo_trace, sites, [10]))).

olds_age(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    ok = call(Config, mi_leaky_nif, leak, [10, 77777]),
    Olds1 = ok_call(Config, mallocinfo_trace, olds, [5, #{min_size => 77777}]),
    ?assertEqual(5, length(Olds1)),
    [#{size := 77777, age_ms := Age1, stack := [#{symbol := <<"mi_test_leak_here">>} | _]} | _] = Olds1,
    timer:sleep(300),
    [#{age_ms := Age2} | _] = ok_call(Config, mallocinfo_trace, olds, [5, [{min_size, 77777}]]),
    ?assert(Age2 >= Age1 + 250),
    %% Oldest first.
    Ages = [A || #{age_ms := A} <- ok_call(Config, mallocinfo_trace, olds, [50])],
    ?assertEqual(lists:reverse(lists:sort(Ages)), Ages),
    ?assertEqual([], ok_call(Config, mallocinfo_trace, olds, [5, #{min_age_ms => 3600000}])),
    ok = call(Config, mi_leaky_nif, release, []).

reset_clears(Config) ->
    ok = call(Config, mi_leaky_nif, leak, [500, 64]),
    N = ok_call(Config, mallocinfo_trace, reset, []),
    ?assert(N >= 500),
    ?assertEqual([], leak_sites(ok_call(Config, mallocinfo_trace, sites, [100]))),
    #{live_entries := Live} = call(Config, mallocinfo_trace, status, []),
    ?assert(Live < 500),
    ok = call(Config, mi_leaky_nif, release, []).

set_mode_live(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    ok = call(Config, mallocinfo_trace, set_mode, [counters]),
    ?assertMatch(#{mode := counters}, call(Config, mallocinfo_trace, status, [])),
    #{calls := #{malloc := M0}} = call(Config, mallocinfo_trace, status, []),
    ok = call(Config, mi_leaky_nif, leak, [300, 32]),
    #{calls := #{malloc := M1}} = call(Config, mallocinfo_trace, status, []),
    ?assert(M1 - M0 >= 300),
    ?assertEqual([], leak_sites(ok_call(Config, mallocinfo_trace, sites, [100]))),
    ok = call(Config, mallocinfo_trace, set_mode, [full]),
    ok = call(Config, mi_leaky_nif, leak, [200, 32]),
    [#{count := 200, bytes := 6400}] = leak_sites(ok_call(Config, mallocinfo_trace, sites, [100])),
    ok = call(Config, mallocinfo_trace, set_mode, [off]),
    ?assertMatch(#{mode := off, live_entries := 0}, call(Config, mallocinfo_trace, status, [])),
    ok = call(Config, mallocinfo_trace, set_mode, [full]),
    ok = call(Config, mi_leaky_nif, release, []).

%% 20,000 blocks of 1000 bytes sampled at a mean of 64 KiB: about 300
%% samples; the estimate must be within 25% of the truth and say so.
sample_mode_estimates(Config) ->
    ?assertMatch(#{mode := sample, sample_bytes := 65536},
                 call(Config, mallocinfo_trace, status, [])),
    ok = call(Config, mi_leaky_nif, leak, [20000, 1000]),
    [Site] = leak_sites(ok_call(Config, mallocinfo_trace, sites, [100])),
    ct:pal("sampled site: ~p", [maps:without([stack], Site)]),
    #{count := C, bytes := B, estimated := true} = Site,
    ?assert(abs(C - 20000) < 5000),
    ?assert(abs(B - 20000000) < 5000000),
    ok = call(Config, mi_leaky_nif, release, []).

bad_arguments(Config) ->
    Bad = [{set_mode, [loud]}, {set_mode, ["full"]}, {olds, [-1]}, {olds, [a]},
           {olds, [1, #{bogus => 1}]}, {olds, [1, #{min_size => -1}]},
           {olds, [1, [bogus]]}, {olds, [1, not_opts]}, {sites, [1.0]},
           {sites, [1, #{demangle => yes}]}, {preload_env, [#{bogus => 1}]}],
    [?assertMatch({'EXIT', {badarg, _}},
                  mi_ct:caught(fun() -> call(Config, mallocinfo_trace, F, A) end))
     || {F, A} <- Bad],
    ?assertMatch([_ | _], ok_call(Config, mallocinfo_trace, sites, [1, [demangle]])).

%% sites(20) and olds(20) over a table holding a million live entries: the
%% answers are exact; the time is reported (BENCHMARKS.md), not asserted.
million_entries(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    ok = call(Config, mi_leaky_nif, leak, [1000000, 16]),
    #{live_entries := Live, dropped := Dropped} = call(Config, mallocinfo_trace, status, []),
    ?assertEqual(0, Dropped),
    ?assert(Live >= 1000000),
    {TSites, Sites} = timer:tc(fun() -> ok_call(Config, mallocinfo_trace, sites, [20]) end),
    {TOlds, Olds} = timer:tc(fun() -> ok_call(Config, mallocinfo_trace, olds, [20]) end),
    [#{count := 1000000, bytes := 16000000}] = leak_sites(Sites),
    ?assertEqual(20, length(Olds)),
    ct:pal("million_entries: live ~p, sites(20) ~p ms, olds(20) ~p ms",
           [Live, TSites div 1000, TOlds div 1000]),
    ok = file:write_file(filename:join(?config(priv_dir, Config), "million.txt"),
                         io_lib:format("~p ~p ~p~n", [Live, TSites div 1000, TOlds div 1000])),
    ok = call(Config, mi_leaky_nif, release, []).

%% Ten times the stack table's capacity of distinct call stacks, each block
%% freed at once: the tracker frees the stacks as it goes (its hooks sweep
%% in small steps), drops none, and names a leak that starts afterwards
%% exactly.
stack_table_cycles(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    #{stack_capacity := Cap, stacks_dropped := 0} = call(Config, mallocinfo_trace, status, []),
    ?assertEqual(65536, Cap),
    {T, ok} = timer:tc(fun() -> call(Config, mi_leaky_nif, paths, [0, 10 * Cap, 0, 16]) end),
    S = call(Config, mallocinfo_trace, status, []),
    ct:pal("~p stacks in ~p ms: ~p", [10 * Cap, T div 1000,
                                      maps:with([stacks, stacks_dropped, stacks_reclaimed,
                                                 stack_sweeps, dropped], S)]),
    #{stacks := Stacks, stacks_reclaimed := Reclaimed, stack_sweeps := Sweeps} = S,
    ?assertMatch(#{stacks_dropped := 0, dropped := 0}, S),
    ?assert(Reclaimed >= 9 * Cap),
    ?assert(Sweeps >= 9 * 4),
    ?assert(Stacks < Cap div 2),
    ok = call(Config, mi_leaky_nif, leak, [1000, 100]),
    [Site] = leak_sites(ok_call(Config, mallocinfo_trace, sites, [10])),
    ?assertMatch(#{count := 1000, bytes := 100000, estimated := false}, Site),
    ?assertMatch(#{stacks_dropped := 0}, call(Config, mallocinfo_trace, status, [])),
    ok = call(Config, mi_leaky_nif, release, []).

%% Four threads released together allocate from the same 2000 new call
%% stacks in the same order, meeting on each: whether or not the stack
%% table stored some stack twice, sites/1 shows each call site once, with
%% all its blocks.
racing_threads_one_site(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    #{stacks := Before} = call(Config, mallocinfo_trace, status, []),
    ok = call(Config, mi_leaky_nif, race_paths, [4, 2000, 2, 16]),
    #{stacks := After} = call(Config, mallocinfo_trace, status, []),
    Paths = path_sites(ok_call(Config, mallocinfo_trace, sites, [100000])),
    ct:pal("stacks stored: ~p more for 2000 call sites", [After - Before]),
    ?assertEqual(2000, length(Paths)),
    ?assertEqual([{8, 128}], lists:usort([{C, B} || #{count := C, bytes := B} <- Paths])),
    %% One row per distinct stack: no two rows with the same frames.
    Stacks = [[A || #{address := A} <- St] || #{stack := St} <- Paths],
    ?assertEqual(2000, length(lists:usort(Stacks))),
    ok = call(Config, mi_leaky_nif, release, []).

%% sites(20) over a full stack table (64K stacks of depth 32, half a
%% million live blocks), the ten biggest sites allocated from a NIF called
%% from Erlang, so their stacks end in JIT code (no symbol file: looked up
%% in /proc/self/maps, uncached). Only the 20 stacks shown are symbolized,
%% in one batch that reads /proc/self/maps once. Times are reported (doc/tracking.md,
%% BENCHMARKS.md), not asserted.
sites_full_stack_table(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    %% The ten first: a table this full drops some new stacks.
    ok = call(Config, mi_leaky_nif, paths_jit, [100000, 10, 100, 40000]),
    ok = call(Config, mi_leaky_nif, paths, [0, 64000, 8, 16]),
    #{stacks := Stacks, stack_capacity := Cap, live_entries := Live} =
        call(Config, mallocinfo_trace, status, []),
    ?assert(Stacks >= Cap * 9 div 10),
    ?assert(Live >= 512000),
    Stats = fun() -> call(Config, mallocinfo_nif, trace_symbolizer_stats, []) end,
    Before = Stats(),
    {T1, Sites} = timer:tc(fun() -> ok_call(Config, mallocinfo_trace, sites, [20]) end),
    After = Stats(),
    {T2, _} = timer:tc(fun() -> ok_call(Config, mallocinfo_trace, sites, [20]) end),
    Delta = maps:map(fun(K, V) -> V - maps:get(K, Before) end, After),
    Frames = lists:sum([length(St) || #{stack := St} <- Sites]),
    ct:pal("sites(20) over ~p stacks, ~p live blocks: ~p ms (cold symbolizer), ~p ms (warm); "
           "~p frames; symbolizer ~p", [Stacks, Live, T1 div 1000, T2 div 1000, Frames, Delta]),
    ok = file:write_file(filename:join(?config(priv_dir, Config), "sites_full.txt"),
                         io_lib:format("~p ~p ~p ~p~n", [Stacks, Live, T1 div 1000, T2 div 1000])),
    ?assertEqual(20, length(Sites)),
    %% Among them the ten 4 MB ones (the query's own buffers are live
    %% blocks too, and may rank above them).
    Jit = [S || #{bytes := 4000000} = S <- path_sites(Sites)],
    ?assertEqual(10, length(Jit)),
    [?assertMatch(#{count := 100}, S) || S <- Jit],
    %% Each of them ends in a frame outside any ELF object (the JIT's).
    [?assertEqual(nomatch, binary:match(O, <<".so">>)) || #{stack := St} <- Jit,
                                                          #{object := O} <- [lists:last(St)]],
    %% One batch, each distinct address looked up once (the stacks share
    %% their outer frames); the Erlang frames with no address (the running
    %% function) are named without a lookup.
    Distinct = length(lists:usort([A || #{stack := St} <- Sites, #{address := A} <- St, A =/= 0])),
    ?assert(maps:get(lookups, Delta) >= Distinct andalso maps:get(lookups, Delta) < Frames),
    ?assert(maps:get(maps_reads, Delta) =< 1),
    ok = call(Config, mi_leaky_nif, release, []).

%% reclaim/0 and the status keys that count reclamation.
reclaim_and_status(Config) ->
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    #{stacks_reclaimed := R0, stack_sweeps := W0} = call(Config, mallocinfo_trace, status, []),
    ok = call(Config, mi_leaky_nif, paths, [0, 500, 1, 16]),
    ok = call(Config, mi_leaky_nif, release, []),
    N = ok_call(Config, mallocinfo_trace, reclaim, []),
    ?assert(N >= 500),
    #{stacks_reclaimed := R1, stack_sweeps := W1} = call(Config, mallocinfo_trace, status, []),
    ?assert(R1 - R0 >= N),
    ?assert(W1 > W0),
    %% Nothing new is unreferenced: a second reclaim frees only what the
    %% node itself allocated and freed meanwhile.
    ?assert(ok_call(Config, mallocinfo_trace, reclaim, []) < 500).
