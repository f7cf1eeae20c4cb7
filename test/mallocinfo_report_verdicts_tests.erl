%% EUnit: mallocinfo_report_verdicts on crafted reports (mi_report_data:quiet/0
%% with one layer changed at a time): every rule, when it fires and when it
%% stays silent, its exact sentence, the ranking, and the frame that names
%% who allocated. Verdicts on reports built from canned raw data, and their
%% text: mallocinfo_report_tests.
-module(mallocinfo_report_verdicts_tests).
-include_lib("eunit/include/eunit.hrl").

-include("mi_report_data.hrl").

-define(V, mallocinfo_report_verdicts).

-import(mi_report_data, [quiet/0, frame/2, site/4, with_site/1]).

quiet_report_has_no_rule_test() ->
    [?assertEqual({Name, none}, {Name, ?V:rule(Name, quiet())}) || Name <- ?V:rules()],
    ?assertEqual([<<"nothing stands out: RSS 1.0 GiB, the largest parts: other anonymous "
                    "500.0 MiB; glibc arenas (64 MiB heaps) 300.0 MiB">>], ?V:verdicts(quiet())).

%% Missing sections are no evidence either.
empty_report_has_no_rule_test() ->
    Empty = #{resident => {unavailable, x, <<>>}, erts => #{}, libc => {unavailable, x, <<>>},
              native => {unavailable, not_preloaded, <<>>}, other_allocator => none,
              unaccounted_bytes => undefined, unaccounted_percent => undefined, attributed => []},
    [?assertEqual({Name, none}, {Name, ?V:rule(Name, Empty)}) || Name <- ?V:rules()].

native_holder_leak_test() ->
    %% 900 MiB in 3.2 M blocks, the oldest 5 h old: a leak.
    Stack = [frame(<<"/usr/lib/x86_64-linux-gnu/libstdc++.so.6">>,
                   <<"operator new(unsigned long)">>),
             frame(<<"/opt/app/lib/foo-1.0/priv/foo_nif.so">>, <<"foo_cache_insert">>),
             frame(<<"/usr/lib/erlang/erts-13.1.5/bin/beam.smp">>, <<"erts_call_dirty_nif">>)],
    R = with_site(site(900 * ?MiB, 3200000, 5 * 3600000, Stack)),
    ?assertEqual({900 * ?MiB,
                  <<"the NIF foo_nif.so holds 900.0 MiB in 3.2 M live blocks allocated from "
                    "foo_cache_insert, the oldest 5.0 h old: a leak">>},
                 ?V:rule(native_holder, R)).

native_holder_young_test() ->
    Site = site(64 * ?MiB, 160000, 12000, [frame(<<"/x/demo.so">>, <<"demo_cache_insert">>)]),
    R = with_site(Site#{estimated => true}),
    {_, S} = ?V:rule(native_holder, R),
    ?assertEqual(<<"the NIF demo.so holds about 64.0 MiB in about 160 k live blocks allocated from "
                   "demo_cache_insert, the oldest 12 s old: a leak if it keeps growing (compare "
                   "with a later report)">>, S).

native_holder_names_vm_and_unknowns_test() ->
    Beam = frame(<<"/usr/lib/erlang/erts-13.1.5/bin/beam.smp">>, <<"erts_sys_aligned_alloc">>),
    Vm = with_site(site(100 * ?MiB, 3, 1000, [Beam])),
    {_, S1} = ?V:rule(native_holder, Vm),
    ?assertMatch(<<"the VM itself (beam.smp) holds 100.0 MiB in 3 live blocks allocated from "
                   "erts_sys_aligned_alloc", _/binary>>, S1),
    Anon = with_site(site(100 * ?MiB, 3, 1000, [frame(<<"/usr/lib/libfoo.so.1">>, undefined)])),
    {_, S2} = ?V:rule(native_holder, Anon),
    ?assertMatch(<<"the NIF libfoo.so.1 holds 100.0 MiB in 3 live blocks allocated from "
                   "libfoo.so.1+0x10", _/binary>>, S2).

%% With the Erlang context: the Erlang caller, and the processes holding
%% the blocks, by what they run (a proc_lib gen_server by its module).
native_holder_names_processes_test() ->
    F = frame(<<"/usr/lib/ejabberd/priv/lib/fast_tls.so">>, <<"SSL_new">>),
    Row = #{bytes => 300 * ?MiB, count => 16, stacks => 1, frame => F, label => native,
            object => <<"/usr/lib/ejabberd/priv/lib/fast_tls.so">>, function => <<"SSL_new">>,
            erlang => [{#{module => fast_tls, function => open_nif, arity => 9}, 300 * ?MiB}]},
    Native = #{mode => full, live_bytes => 300 * ?MiB, live_entries => 16,
               functions => [Row#{processes => [{{xmpp_stream_in, init, 1}, 16}]}],
               objects => [], olds => []},
    {_, S} = ?V:rule(native_holder, (quiet())#{native := Native}),
    ?assertEqual(<<"the NIF fast_tls.so holds 300.0 MiB in 16 live blocks allocated from SSL_new, "
                   "called from fast_tls:open_nif/9 (100%) in 16 xmpp_stream_in processes: a leak "
                   "if it keeps growing: mallocinfo:report(#{interval => 60000}) measures that">>,
                 S),
    %% Several kinds, a registered one, one that exited: at most three named.
    ?assertEqual(" in 1 mi_ctx_alpha process", ?V:processes_text([{mi_ctx_alpha, 1}])),
    ?assertEqual(" in 21 processes (16 xmpp_stream_in, 2 mi_ctx_alpha, 2 exited and 1 more kinds)",
                 ?V:processes_text([{{xmpp_stream_in, init, 1}, 16}, {mi_ctx_alpha, 2},
                                    {undefined, 2}, {{m, f, 0}, 1}])),
    ?assertEqual(" in 2 processes (1 m:f/0, 1 {queue,<<\"q1\">>})",
                 ?V:processes_text([{{m, f, 0}, 1}, {{queue, <<"q1">>}, 1}])),
    ?assertEqual("", ?V:processes_text([])),
    %% Processes holding part of the row's bytes: their share.
    {_, S1} = ?V:rule(native_holder,
                      (quiet())#{native := Native#{functions := [Row#{processes => [{{ssl_gen_statem, init, 1}, 1}],
                                                                     processes_bytes => 30 * ?MiB}]}}),
    ?assertMatch({_, _}, binary:match(S1, <<"(100%) in 1 ssl_gen_statem process (10% of the "
                                            "bytes): ">>)),
    %% Without processes: the sentence as before.
    {_, S0} = ?V:rule(native_holder, (quiet())#{native := Native#{functions := [Row]}}),
    ?assertEqual(nomatch, binary:match(S0, <<" processes">>)).

native_holder_small_site_test() ->
    %% 40 MiB is 3.9% of 1 GiB: below the 5% a verdict needs.
    Small = with_site(site(40 * ?MiB, 10, 1000, [frame(<<"/x.so">>, <<"f">>)])),
    ?assertEqual(none, ?V:rule(native_holder, Small)),
    ?assertEqual(none, ?V:rule(native_holder, with_site(site(0, 0, 0, [])))).

culprit_test() ->
    Own = frame(<<"/opt/x/priv/x_nif.so">>, <<"x_alloc">>),
    Libc = frame(<<"/usr/lib/x86_64-linux-gnu/libc.so.6">>, <<"__strdup">>),
    Cxx = frame(<<"/usr/lib/x86_64-linux-gnu/libstdc++.so.6">>, <<"operator new(unsigned long)">>),
    ?assertEqual(Own, ?V:culprit([Libc, Cxx, Own])),
    ?assertEqual(Libc, ?V:culprit([Libc, Cxx])),
    ?assertEqual(undefined, ?V:culprit([])).

with_arenas(Arenas) ->
    R = quiet(),
    R#{libc := (maps:get(libc, R))#{arenas := Arenas}}.

arena(N, System, InUse) ->
    #{arena => N, system_bytes => System, in_use_bytes => InUse, free_bytes => System - InUse}.

libc_fragmentation_test() ->
    Arenas = [arena(0, 200 * ?MiB, 150 * ?MiB)
              | [arena(N, 150 * ?MiB, 30 * ?MiB) || N <- lists:seq(1, 11)]],
    R = with_arenas(Arenas),
    Free = 50 * ?MiB + 11 * 120 * ?MiB,
    ?assertEqual({Free, <<"libc arenas hold 1.8 GiB of which 1.3 GiB (74%) is free: fragmentation "
                          "in libc (12 arenas of 16 allowed); 1.3 GiB of the free memory is in "
                          "per-thread arenas: consider MALLOC_ARENA_MAX=2">>},
                 ?V:rule(libc_fragmentation, R)),
    %% With the heap map, what trim would return and what is pinned.
    L = maps:get(libc, R),
    WithMap = R#{libc := L#{heap_map := #{total => #{trimmable_bytes => 600 * ?MiB,
                                                     pinned_bytes => 700 * ?MiB}}}},
    {_, S} = ?V:rule(libc_fragmentation, WithMap),
    ?assertMatch(<<_/binary>>, S),
    ?assertNotEqual(nomatch, binary:match(S, <<"; mallocinfo:trim() would return about 600.0 MiB "
                                               "now, 700.0 MiB is pinned between live blocks;">>)).

libc_fragmentation_main_arena_only_test() ->
    %% All of it in the main arena: no MALLOC_ARENA_MAX advice.
    {_, S} = ?V:rule(libc_fragmentation, with_arenas([arena(0, 400 * ?MiB, 100 * ?MiB)])),
    ?assertEqual(<<"libc arenas hold 400.0 MiB of which 300.0 MiB (75%) is free: fragmentation "
                   "in libc (1 arena of 16 allowed)">>, S).

libc_fragmentation_names_churners_test() ->
    %% With the tracker's churn: the three native functions that allocate
    %% most, each with its rate, temporary share and typical lifetime.
    Row = fun(Sym, Rate, T, M) ->
                  #{frame => frame(<<"/opt/x/priv/x_nif.so">>, Sym), allocated_per_s => Rate,
                    temporary_percent => T, median_ms => M, label => native}
          end,
    R0 = with_arenas([arena(0, 400 * ?MiB, 100 * ?MiB)]),
    R = R0#{native => #{churn => [Row(<<"grow">>, 2500000, 99, 1), Row(<<"parse">>, 1200, 10, 8),
                                  Row(<<"cache">>, 30, 0, infinity), Row(<<"more">>, 1, 0, 1)]}},
    {_, S} = ?V:rule(libc_fragmentation, R),
    ?assertEqual(<<"libc arenas hold 400.0 MiB of which 300.0 MiB (75%) is free: fragmentation "
                   "in libc (1 arena of 16 allowed); the call sites that churn most: grow "
                   "(2.5 M allocations/s, 99% temporary, typically freed within 1 ms), parse "
                   "(1200 allocations/s, 10% temporary, typically freed within 8 ms), cache "
                   "(30 allocations/s, 0% temporary, typically over 70 min)">>, S),
    %% No churn (none, or no row): the verdict as before.
    {_, S0} = ?V:rule(libc_fragmentation, R0#{native => #{churn => none}}),
    ?assertEqual(nomatch, binary:match(S0, <<"churn">>)).

libc_fragmentation_needs_evidence_test() ->
    %% Much free, but a small share of the arenas (25% < 30%).
    ?assertEqual(none, ?V:rule(libc_fragmentation,
                               with_arenas([arena(0, 400 * ?MiB, 300 * ?MiB)]))),
    %% A high share of something small.
    ?assertEqual(none, ?V:rule(libc_fragmentation, with_arenas([arena(0, 20 * ?MiB, ?MiB)]))),
    ?assertEqual(none, ?V:rule(libc_fragmentation, with_arenas([]))).

with_erts(Fun) ->
    R = quiet(),
    R#{erts := Fun(maps:get(erts, R))}.

erts_fragmentation_test() ->
    R = with_erts(fun(E) ->
                          E#{allocated := 600 * ?MiB, used := 200 * ?MiB,
                             allocators := [#{name => eheap_alloc, allocated => 100 * ?MiB,
                                              used => 90 * ?MiB},
                                            #{name => binary_alloc, allocated => 500 * ?MiB,
                                              used => 110 * ?MiB}]}
                  end),
    ?assertEqual({400 * ?MiB, <<"ERTS allocators hold 600.0 MiB in carriers but use 200.0 MiB "
                                "(33%), 400.0 MiB free beyond the main and newest carrier of each "
                                "allocator instance: fragmentation inside erts_alloc, most in "
                                "binary_alloc (500.0 MiB allocated, 22% used)">>},
                 ?V:rule(erts_fragmentation, R)),
    %% 61% used is not fragmentation.
    Used61 = with_erts(fun(E) -> E#{allocated := 600 * ?MiB, used := 366 * ?MiB} end),
    ?assertEqual(none, ?V:rule(erts_fragmentation, Used61)).

erts_mseg_cache_test() ->
    R = with_erts(fun(E) -> E#{mseg_cache_bytes := 114 * ?MiB, mmap_bytes := 186 * ?MiB} end),
    ?assertEqual({114 * ?MiB, <<"ERTS keeps 114.0 MiB of freed carriers mapped in mseg_alloc's "
                                "cache (186.0 MiB mapped in all): they are reused for new carriers "
                                "or released over time">>},
                 ?V:rule(erts_mseg_cache, R)),
    ?assertEqual(none, ?V:rule(erts_mseg_cache,
                               with_erts(fun(E) -> E#{mseg_cache_bytes := undefined} end))).

process_heap_test() ->
    Pid = list_to_pid("<0.123.0>"),
    R = with_erts(fun(E) ->
                          E#{processes := [#{pid => Pid, name => mallocinfo_demo_hoarder,
                                             value => 300 * ?MiB, by => memory}]}
                  end),
    ?assertEqual({300 * ?MiB, <<"process <0.123.0> (mallocinfo_demo_hoarder) holds 300.0 MiB "
                                "(29% of RSS): mallocinfo_process:print(<0.123.0>) shows what is on "
                                "its heap">>},
                 ?V:rule(process_heap, R)),
    Mfa = with_erts(fun(E) -> E#{processes := [#{pid => Pid, name => {foo, init, 1},
                                                 value => 300 * ?MiB}]} end),
    {_, S} = ?V:rule(process_heap, Mfa),
    ?assertMatch(<<"process <0.123.0> (foo:init/1) holds", _/binary>>, S),
    ?assertEqual(none, ?V:rule(process_heap, with_erts(fun(E) -> E#{processes := []} end))).

erts_binary_and_ets_test() ->
    Bin = with_erts(fun(E) -> E#{memory := #{binary => 400 * ?MiB, ets => 0}} end),
    ?assertEqual({400 * ?MiB, <<"refc binaries take 400.0 MiB (39% of RSS): "
                                "mallocinfo_process:top(10, binary) names the processes that keep "
                                "them">>},
                 ?V:rule(erts_binary, Bin)),
    Sessions = #{table => sessions, bytes => 250 * ?MiB, objects => 9},
    Ets = with_erts(fun(E) -> E#{memory := #{binary => 0, ets => 300 * ?MiB},
                                 ets := [Sessions]} end),
    ?assertEqual({300 * ?MiB, <<"ETS tables take 300.0 MiB (29% of RSS), the largest sessions "
                                "with 250.0 MiB">>},
                 ?V:rule(erts_ets, Ets)),
    %% 20% of RSS is below the quarter these rules need.
    ?assertEqual(none, ?V:rule(erts_ets,
                               with_erts(fun(E) -> E#{memory := #{ets => 200 * ?MiB}} end))).

other_allocator_test() ->
    Summary = #{allocated => 400 * ?MiB, resident => 900 * ?MiB},
    Je = (quiet())#{other_allocator := #{allocator => jemalloc, resident => 900 * ?MiB,
                                         summary => Summary}},
    ?assertEqual({500 * ?MiB, <<"jemalloc keeps 900.0 MiB resident for 400.0 MiB allocated: "
                                "500.0 MiB it has not returned to the system">>},
                 ?V:rule(other_allocator, Je)),
    Tc = (quiet())#{other_allocator := #{allocator => tcmalloc, resident => 900 * ?MiB,
                                         allocated => 890 * ?MiB}},
    ?assertEqual(none, ?V:rule(other_allocator, Tc)).

tracker_tables_test() ->
    R = (quiet())#{attributed := [{tracker_tables, 70 * ?MiB}]},
    ?assertEqual({70 * ?MiB, <<"the mallocinfo tracker's own tables keep 70.0 MiB resident (6% of "
                               "RSS, 80.0 MiB reserved) in full mode, 71.7 KiB per live block for "
                               "1000 blocks: MALLOCINFO_TRACE=sample (or "
                               "mallocinfo_trace:set_mode(sample)) keeps an unbiased sample in a "
                               "few MiB, mallocinfo_trace:reset() gives the live table's pages "
                               "back, and a smaller MALLOCINFO_TABLE_SIZE caps the table">>},
                 ?V:rule(tracker_tables, R)).

%% An interposer that says what all its tables reserved (tables_bytes) is
%% believed; an older one's live and stack tables are all there is to say
%% (a preloaded RabbitMQ's report said 87.6 MiB reserved of the 110.3).
tracker_tables_reserved_test() ->
    Q = quiet(),
    R = Q#{attributed := [{tracker_tables, 70 * ?MiB}],
           native := (maps:get(native, Q))#{tables_bytes => 110 * ?MiB}},
    {_, Text} = ?V:rule(tracker_tables, R),
    ?assertMatch({_, _}, binary:match(Text, <<"(6% of RSS, 110.0 MiB reserved)">>)),
    ?assertEqual(110 * ?MiB, ?V:tracker_reserved(maps:get(native, R))),
    ?assertEqual(80 * ?MiB, ?V:tracker_reserved(maps:get(native, Q))),
    ?assertEqual(80 * ?MiB, ?V:tracker_reserved((maps:get(native, Q))#{tables_bytes => 0})),
    ?assertEqual(0, ?V:tracker_reserved(#{})).

%% An interposer that says what each table keeps resident: the verdict
%% names them (a preloaded RabbitMQ's 9 MiB are mostly stacks and churn
%% counters, not the live table an operator would shrink first).
tracker_tables_by_table_test() ->
    Q = quiet(),
    R = Q#{attributed := [{tracker_tables, 70 * ?MiB}],
           native := (maps:get(native, Q))#{tables_resident => #{live => 20 * ?MiB,
                                                                  stacks => 30 * ?MiB,
                                                                  churn => 15 * ?MiB,
                                                                  threads => 5 * ?MiB}}},
    {_, Text} = ?V:rule(tracker_tables, R),
    ?assertMatch({_, _}, binary:match(Text, <<"(6% of RSS, 80.0 MiB reserved; live table 20.0 MiB, "
                                              "stacks 30.0 MiB, churn counters 15.0 MiB, threads' "
                                              "states and unwind caches 5.0 MiB) in full mode">>)),
    %% An older interposer's status says nothing of it: nor does the verdict.
    Older = (maps:get(native, Q))#{tables_resident => undefined},
    {_, Old} = ?V:rule(tracker_tables, R#{native := Older}),
    ?assertEqual(nomatch, binary:match(Old, <<"; live table">>)).

%% No live block: no "per live block for 0 blocks" (an attached RabbitMQ
%% whose queues live in ERTS got "64.8 MiB per live block for 0 blocks").
tracker_tables_no_block_test() ->
    Q = quiet(),
    R = Q#{attributed := [{tracker_tables, 64 * ?MiB}],
           native := (maps:get(native, Q))#{live_entries := 0}},
    {_, Text} = ?V:rule(tracker_tables, R),
    ?assertEqual(nomatch, binary:match(Text, <<"per live block">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"in full mode, with no live block recorded:">>)).

%% A node already in sample mode is never told to switch to sample.
tracker_tables_sample_mode_test() ->
    Q = quiet(),
    R = Q#{attributed := [{tracker_tables, 67 * ?MiB}],
           native := (maps:get(native, Q))#{mode := sample, live_entries := 66}},
    {_, Text} = ?V:rule(tracker_tables, R),
    ?assertEqual(nomatch, binary:match(Text, <<"TRACE=sample">>)),
    ?assertEqual(nomatch, binary:match(Text, <<"set_mode(sample)">>)),
    ?assertEqual(<<"the mallocinfo tracker's own tables keep 67.0 MiB resident (6% of RSS, 80.0 "
                   "MiB reserved) in sample mode, for 66 sampled blocks: mostly the stack table "
                   "and the per-thread unwind caches; mallocinfo_trace:reset() gives the live "
                   "table's pages back, a larger MALLOCINFO_SAMPLE_BYTES samples fewer blocks, "
                   "and MALLOCINFO_TRACE=counters keeps no table at all">>, Text).

unexplained_test() ->
    R = (quiet())#{unaccounted_bytes := 300 * ?MiB, unaccounted_percent := 29.3},
    R1 = R#{resident := (maps:get(resident, R))#{anon_top := [#{start => 16#7f0000000000,
                                                                stop => 16#7f0010000000,
                                                                rss => 256 * ?MiB}]}},
    ?assertEqual({300 * ?MiB, <<"300.0 MiB (29.3% of RSS) is memory no layer accounts for: most "
                                "likely mapped directly (mmap) by a NIF or a library; the largest "
                                "anonymous mappings: 7f0000000000 256.0 MiB">>},
                 ?V:rule(unexplained, R1)),
    %% 14% is under the 15% the rule needs.
    ?assertEqual(none, ?V:rule(unexplained, R#{unaccounted_percent := 14.0})).

verdicts_ranked_by_bytes_test() ->
    R0 = with_site(site(200 * ?MiB, 10, 1000, [frame(<<"/x/a.so">>, <<"f">>)])),
    R = R0#{unaccounted_bytes := 300 * ?MiB, unaccounted_percent := 29.3},
    ?assertMatch([<<"300.0 MiB (29.3% of RSS)", _/binary>>,
                  <<"the NIF a.so holds 200.0 MiB", _/binary>>], ?V:verdicts(R)).
