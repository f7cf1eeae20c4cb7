%% EUnit: the pure parts of the report (mallocinfo_report_build,
%% mallocinfo_report_text, mallocinfo_units) on canned input: erts_alloc
%% figures, build/1 on canned raw data (mi_report_data's /proc text), the
%% verdicts of built reports, units and the 80-column text. The /proc
%% parsing itself: mallocinfo_report_smaps_tests; each verdict rule on crafted
%% reports: mallocinfo_report_verdicts_tests.
-module(mallocinfo_report_tests).
-include_lib("eunit/include/eunit.hrl").

-include("mi_report_data.hrl").

-define(R, mallocinfo_report_build).
-define(V, mallocinfo_report_verdicts).
-define(TEXT, mallocinfo_report_text).

-import(mi_report_data, [vma/6, vma/7, smaps/0, quiet/0, frame/2, site/4, with_site/1]).

%%% erts_alloc figures ------------------------------------------------------------

%% The shape of erlang:system_info({allocator, A}) in OTP 25 (a subset).
instance(N, MbcsCarriers, MbcsBlocks, SbcsCarriers, SbcsBlocks, SysAlloc) ->
    {instance, N,
     [{versions, "0.9", "3.0"},
      {options, [{e, true}]},
      {mbcs, [{blocks, [{binary_alloc, [{count, 7, 53, 53}, {size, MbcsBlocks, 0, 0}]},
                        {eheap_alloc, [{count, 1, 1, 1}, {size, 100, 0, 0}]}]},
              {carriers, 2, 3, 3},
              {mseg_alloc_carriers, 1},
              {sys_alloc_carriers, 1},
              {carriers_size, MbcsCarriers, 0, 0},
              {mseg_alloc_carriers_size, MbcsCarriers - SysAlloc},
              {sys_alloc_carriers_size, SysAlloc}]},
      {mbcs_pool, [{blocks, [{binary_alloc, [{count, 1}, {size, 1000}]}]},
                   {carriers, 1}, {carriers_size, 65536}]},
      {sbcs, [{blocks, [{binary_alloc, [{count, 1, 1, 1}, {size, SbcsBlocks, 0, 0}]}]},
              {carriers, 1, 1, 1},
              {mseg_alloc_carriers, 1},
              {sys_alloc_carriers, 0},
              {carriers_size, SbcsCarriers, 0, 0},
              {mseg_alloc_carriers_size, SbcsCarriers},
              {sys_alloc_carriers_size, 0}]},
      {calls, [{binary_alloc, 0, 192}]}]}.

allocator_types_test() ->
    Allocs = [{binary_alloc, [instance(0, 589824, 272040, 659456, 657104, 65536),
                              instance(1, 65536, 0, 0, 0, 65536)]},
              {ets_alloc, [instance(0, 1048576, 524288, 0, 0, 0)]},
              {disabled_alloc, false}],
    %% Largest allocated first.
    [Bin, Ets] = ?R:allocator_types(Allocs),
    %% Carriers: mbcs + mbcs_pool + sbcs; blocks: every type in them.
    ?assertEqual(#{name => binary_alloc,
                   allocated => 589824 + 65536 + 659456 + 65536 + 65536,
                   used => (272040 + 100 + 1000 + 657104) + (0 + 100 + 1000 + 0),
                   sys_alloc => 65536 + 65536,
                   mseg => (589824 - 65536 + 659456) + 0,
                   %% No mmbcs in these options: each instance's headroom is
                   %% its newest carrier, here one of its two.
                   headroom => (589824 - 272140) + (65536 - 100)},
                 Bin),
    ?assertMatch(#{name := ets_alloc, allocated := 1048576 + 65536,
                   used := 524288 + 100 + 1000}, Ets).

%% OTP before 23 reported {blocks_size, Cur, ...}.
allocator_types_old_format_test() ->
    Old = {instance, 0, [{mbcs, [{blocks_size, 300, 0, 0}, {carriers_size, 1000, 0, 0}]}]},
    ?assertMatch([#{allocated := 1000, used := 300, sys_alloc := 0}],
                 ?R:allocator_types([{eheap_alloc, [Old]}])).

erts_mmap_bytes_test() ->
    Info = [{default_mmap, [{options, [{scs, 0}]}, {os, [{sizes, [{used, 14815232}]}]}]},
            {literal_mmap,
             [{options, [{scs, 1073676288}]},
              {supercarrier, [{sizes, [{total, 1073741824}, {total_sa, 2097152}, {used, 2162688}]},
                              {free_segs, [{used, 0}, {max, 0}]}]}]}],
    ?assertEqual(14815232 + 2162688, ?R:erts_mmap_bytes(Info)),
    ?assertEqual(undefined, ?R:erts_mmap_bytes(false)).

carriers_summary_test() ->
    Carriers = {ok, {512,
                     [{binary_alloc, false, 65536, 0, [{binary_alloc, 15, 5504}],
                       {1, 1, 0, 0}},
                      {eheap_alloc, true, 524288, 0, [{eheap_alloc, 48, 427048}],
                       {4, 3, 3, 1}},
                      {binary_alloc, false, 65536, 0, [], {0, 0, 0, 1}}]}},
    S = ?R:carriers_summary(Carriers),
    ?assertMatch(#{count := 3, bytes := 655360, allocated := 432552, in_pool := 1,
                   hist_start := 512, free_histogram := [5, 4, 3, 2]}, S),
    ?assertEqual([{eheap_alloc, 524288, 1, 427048}, {binary_alloc, 131072, 2, 5504}],
                 maps:get(by_type, S)),
    ?assertMatch({unavailable, {missing_application, tools},
                  <<"instrument is in the tools application: add tools to the release">>},
                 ?R:carriers_summary({error, {missing_application, tools}})),
    ?assertMatch({unavailable, {missing_application, runtime_tools},
                  <<"instrument is in the runtime_tools application: "
                    "add runtime_tools to the release">>},
                 ?R:allocations_summary({error, {missing_application, runtime_tools}})).

%% instrument moved from tools to runtime_tools in OTP 26: the report's
%% hint names the application that holds it on the running release.
instrument_app_test() ->
    ?assertEqual(tools, ?R:instrument_app("25")),
    ?assertEqual(runtime_tools, ?R:instrument_app("26")),
    ?assertEqual(runtime_tools, ?R:instrument_app("29")),
    App = ?R:instrument_app(erlang:system_info(otp_release)),
    %% .../lib/<app>-<vsn>/ebin/instrument.beam
    LibDir = filename:basename(filename:dirname(filename:dirname(code:which(instrument)))),
    ?assertEqual(atom_to_list(App), hd(string:split(LibDir, "-"))).

allocations_summary_test() ->
    %% 64 blocks in bucket 10, i.e. above 128 * 2^9 and up to 128 * 2^10
    %% bytes; 2 in the open last bucket (index 3 of 4).
    Allocs = {ok, {128, 0, #{mallocinfo_demo_nif =>
                                 #{nif_internal => {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0}},
                             system => #{binary => {3, 9, 0, 2}}}}},
    [Demo, Sys] = ?R:allocations_summary(Allocs),
    ?assertEqual(#{origin => mallocinfo_demo_nif, type => nif_internal, count => 64,
                   min_bytes => 64 * 65536, max_bytes => 64 * 131072, open => false}, Demo),
    ?assertEqual(#{origin => system, type => binary, count => 14,
                   min_bytes => 9 * 128 + 2 * 512, max_bytes => 3 * 128 + 9 * 256 + 2 * 512,
                   open => true}, Sys).

arena_max_test() ->
    None = #{"MALLOC_ARENA_MAX" => false, "GLIBC_TUNABLES" => false},
    ?assertEqual(#{value => 16, source => default}, ?R:arena_max(None, 2)),
    ?assertEqual(#{value => 2, source => env}, ?R:arena_max(None#{"MALLOC_ARENA_MAX" => "2"}, 2)),
    Tunables = "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=4",
    ?assertEqual(#{value => 4, source => tunable},
                 ?R:arena_max(None#{"GLIBC_TUNABLES" => Tunables}, 2)),
    %% Nonsense is what glibc ignores too.
    ?assertEqual(#{value => 64, source => default},
                 ?R:arena_max(None#{"MALLOC_ARENA_MAX" => "lots"}, 8)).

%%% build/1 on canned raw data ---------------------------------------------------

%% What mallocinfo_report gathers, canned: smaps as the report has it,
%% parsed once (gather/1 parses it, build/1 never sees the text).
raw() ->
    #{node => 'canned@host', os_pid => 42, otp_release => <<"25">>, time => <<"now">>,
      cores => 2, libc_version => <<"2.36">>, allocator => glibc,
      smaps => mallocinfo_report_smaps:parse_smaps(smaps()),
      smaps_rollup => <<"Rss:  210000 kB\nPss:  200000 kB\n">>,
      status => <<"VmRSS:\t210000 kB\nRssAnon:\t 190000 kB\n">>,
      memory => #{total => 40 * ?MiB, processes => 10 * ?MiB, system => 30 * ?MiB,
                  binary => ?MiB, ets => ?MiB, code => 8 * ?MiB, atom => ?MiB},
      allocators => [{eheap_alloc, [instance(0, 20 * ?MiB, 10 * ?MiB, 0, 0, 0)]}],
      erts_mmap => [{default_mmap, [{os, [{sizes, [{used, 10 * ?MiB}]}]}]}],
      carriers => {error, {missing_application, tools}},
      allocations => {error, {missing_application, tools}},
      processes => [], ets => [],
      mallinfo => #{arena => 110 * ?MiB, uordblks => 40 * ?MiB, fordblks => 70 * ?MiB,
                    hblkhd => 2 * ?MiB, hblks => 1, fsmblks => 0, keepcost => 0,
                    ordblks => 1, smblks => 0, usmblks => 0},
      libc_summary => #{arenas => [#{arena => 0, system_bytes => 3 * ?MiB,
                                     in_use_bytes => 2 * ?MiB},
                                   #{arena => 1, system_bytes => 107 * ?MiB,
                                     in_use_bytes => 38 * ?MiB}]},
      heap_map => {error, timeout},
      env => #{"MALLOC_ARENA_MAX" => false, "GLIBC_TUNABLES" => false},
      trace_status => #{preloaded => false, recording => false, mode => off},
      sites => {error, not_preloaded}, olds => {error, not_preloaded},
      jemalloc => {error, {wrong_allocator, glibc}},
      tcmalloc => {error, {wrong_allocator, glibc}}}.

build_accounting_test() ->
    R = ?R:build(raw()),
    ?assertMatch(#{node := 'canned@host',
                   resident := #{rss := 210000 * ?KiB, pss := 200000 * ?KiB}}, R),
    ?assertMatch({unavailable, not_preloaded, _}, maps:get(native, R)),
    ?assertEqual(none, maps:get(other_allocator, R)),
    A = maps:from_list(maps:get(attributed, R)),
    %% Heaps resident: 3000 + 116000 KiB, of which libc explains its 110 MiB.
    ?assertEqual(110 * ?MiB, maps:get(libc_heaps, A)),
    %% No tracker: nothing explains the NORESERVE mappings.
    ?assertEqual(0, maps:get(tracker_tables, A)),
    %% Anonymous 17640 KiB: libc's 2 MiB of mmapped blocks, then ERTS's 10 MiB.
    ?assertEqual(2 * ?MiB, maps:get(libc_mmap, A)),
    ?assertEqual(10 * ?MiB, maps:get(erts_carriers, A)),
    %% What is mapped, each page once: the kernel's sum counts the JIT's
    %% 4000 KiB mapped in both views twice.
    Mapped = lists:sum([Rss || #{rss := Rss} <- mallocinfo_report_smaps:parse_smaps(smaps())])
        - 4000 * ?KiB,
    ?assertEqual(Mapped, maps:get(rss_for_accounting, R)),
    ?assertEqual(4100 * ?KiB, maps:get(jit, A)),
    Unaccounted = Mapped - lists:sum(maps:values(A)),
    ?assertEqual(Unaccounted, maps:get(unaccounted_bytes, R)),
    ?assertEqual(round(Unaccounted * 1000 / Mapped) / 10, maps:get(unaccounted_percent, R)),
    %% 52048 KiB of NORESERVE memory nothing explains (no tracker), 6360
    %% KiB of heap beyond libc's figure, 5352 KiB of anonymous memory:
    %% 63760 KiB of 194524 KiB mapped, and the rule says so.
    ?assertEqual(63760 * ?KiB, Unaccounted),
    ?assertMatch([<<"libc arenas hold 110.0 MiB of which 70.0 MiB (63%) is free: fragmentation "
                    "in libc (2 arenas of 16 allowed)">>,
                  <<"62.3 MiB (32.8% of RSS) is memory no layer accounts for", _/binary>>],
                 maps:get(verdicts, R)),
    %% And the report renders, in 80 columns.
    assert_80_columns(?TEXT:format(R)).

%% Issue 14: with the tracker's regions (a preloaded node recording), the
%% anonymous mapping at window 16 is split by address: 8 MiB that
%% beam.smp's erts_mmap mapped is ERTS's (exact, no estimate), 8 MiB that a
%% library function mapped is that function's; a region inside a file
%% mapping is the file's. The rest of the anonymous memory goes to libc's
%% mmapped blocks as before, and the unaccounted figure loses the 5352 KiB
%% of anonymous memory the estimate left over.
build_mapped_regions_test() ->
    Frame = fun(Obj, Sym) -> #{address => 1, object => Obj, symbol => Sym, offset => 0} end,
    Beam = <<"/usr/lib/erlang/erts-13.1.5/bin/beam.smp">>,
    Region = fun(Start, Len, Stack) ->
                     #{start => Start, length => Len, resident => Len, flags => [anonymous],
                       age_ms => 1, stack => Stack}
             end,
    Regions = [Region(?H + 16 * ?W, 8 * ?MiB, [Frame(Beam, <<"erts_mmap">>)]),
               Region(?H + 16 * ?W + 8 * ?MiB, 8 * ?MiB,
                      [Frame(<<"/opt/lib/librocks.so">>, <<"rocks_cache">>),
                       Frame(Beam, <<"process_main">>)]),
               Region(16#55d000100000, 16#1000, [Frame(<<"/opt/lib/librocks.so">>, <<"x">>)])],
    Raw = (raw())#{trace_status => #{preloaded => true, recording => true, mode => full},
                   regions => {ok, Regions}},
    R = ?R:build(Raw),
    ?assertMatch(#{exact := true, erts_slack_bytes := 0}, R),
    ?assertMatch(#{mappings := #{erts := 8388608, anon := 16777216, noreserve := 0,
                                 sites := [{<<"rocks_cache (librocks.so)">>, 1, 8388608,
                                            8388608}]}},
                 R),
    A = maps:from_list(maps:get(attributed, R)),
    ?assertEqual(8 * ?MiB, maps:get(erts_carriers, A)),
    ?assertEqual(8 * ?MiB, maps:get(mapped_sites, A)),
    ?assertEqual((17640 - 16384) * ?KiB, maps:get(libc_mmap, A)),
    ?assertEqual(0, maps:get(anon_unclaimed, R)),
    ?assertEqual((63760 - 5352) * ?KiB, maps:get(unaccounted_bytes, R)),
    Parts = ?V:resident_parts(R),
    ?assertEqual(8 * ?MiB, proplists:get_value(erts_mapped, Parts)),
    ?assertEqual(undefined, proplists:get_value(erts_carriers, Parts)),
    ?assertEqual(maps:get(rss_for_accounting, R), lists:sum([B || {_, B} <- Parts])),
    Text = lists:flatten(io_lib:format("~ts", [?TEXT:format(R)])),
    ?assertNotEqual(nomatch, string:find(Text, "rocks_cache (librocks.so)")),
    ?assertNotEqual(nomatch, string:find(Text, "ERTS carriers (by address)")),
    ?assertNotEqual(nomatch, string:find(Text, "(exact: ")),
    ?assertEqual(nomatch, string:find(Text, "a lower bound")),
    assert_80_columns(?TEXT:format(R)),
    %% Not preloaded (attached, or counters mode): the estimate, as before.
    Attached = ?R:build(Raw#{trace_status => #{preloaded => false, mode => full}}),
    ?assertEqual(63760 * ?KiB, maps:get(unaccounted_bytes, Attached)),
    ?assertMatch({unavailable, no_regions, _}, maps:get(mappings, Attached)),
    Counters = ?R:build(Raw#{trace_status => #{preloaded => true, mode => counters}}),
    ?assertEqual(63760 * ?KiB, maps:get(unaccounted_bytes, Counters)).

%% jemalloc maps NORESERVE where the kernel overcommits: its resident bytes
%% explain NORESERVE memory the tracker does not own.
build_jemalloc_test() ->
    Je = #{allocated => 30 * ?MiB, active => 32 * ?MiB, resident => 40 * ?MiB,
           mapped => 64 * ?MiB, retained => 8 * ?MiB, metadata => ?MiB},
    R = ?R:build((raw())#{allocator := jemalloc, jemalloc := {ok, Je}}),
    ?assertMatch(#{other_allocator := #{allocator := jemalloc, resident := 40 * ?MiB},
                   libc := #{note := <<"malloc is served by jemalloc">>}}, R),
    A = maps:from_list(maps:get(attributed, R)),
    ?assertEqual(40 * ?MiB, maps:get(other_allocator, A)),
    %% 52048 KiB NORESERVE, 40 MiB of it jemalloc's: 63760 - 40960 KiB left.
    ?assertEqual((63760 - 40960) * ?KiB, maps:get(unaccounted_bytes, R)),
    Text = lists:flatten(io_lib:format("~ts", [?TEXT:format(R)])),
    ?assertNotEqual(nomatch, string:find(Text, "== 5. Other allocator: jemalloc")),
    assert_80_columns(Text).

%% tcmalloc's stats text: resident and allocated read from its MALLOC: lines.
build_tcmalloc_test() ->
    Stats = <<"------------------------------------------------\n"
              "MALLOC:       31457280 (   30.0 MiB) Bytes in use by application\n"
              "MALLOC: +     20971520 (   20.0 MiB) Bytes in page heap freelist\n"
              "MALLOC: =     52428800 (   50.0 MiB) Actual memory used (physical + swap)\n"
              "MALLOC: +      1048576 (    1.0 MiB) Bytes released to OS (aka unmapped)\n">>,
    R = ?R:build((raw())#{allocator := tcmalloc, tcmalloc := {ok, Stats}}),
    ?assertMatch(#{allocator := tcmalloc, resident := 52428800, allocated := 31457280},
                 maps:get(other_allocator, R)),
    Text = lists:flatten(io_lib:format("~ts", [?TEXT:format(R)])),
    ?assertNotEqual(nomatch, string:find(Text, "allocated 30.0 MiB, resident 50.0 MiB")),
    %% When the stats call fails (here: raised undef, as guard/1 turns it):
    %% the section says why and what was called.
    Failed = ?R:build((raw())#{allocator := tcmalloc, tcmalloc := {error, {error, undef}}}),
    ?assertMatch({unavailable, {error, undef}, <<"mallocinfo_tcmalloc:stats() ", _/binary>>},
                 maps:get(other_allocator, Failed)).

%% Input the code does not expect costs its section, not the report.
build_survives_odd_input_test() ->
    Odd = #{arenas => [#{arena => 0, system_bytes => lots, in_use_bytes => 1}]},
    R = ?R:build((raw())#{libc_summary := Odd}),
    ?assertMatch({unavailable, {error, badarith}, _}, maps:get(libc, R)),
    ?assertMatch(#{resident := #{rss := _}, erts := #{allocated := _}}, R),
    [_ | _] = maps:get(verdicts, R),
    assert_80_columns(?TEXT:format(R)).

build_without_smaps_test() ->
    R = ?R:build((raw())#{smaps := {error, enoent}}),
    ?assertMatch({unavailable, {smaps, enoent}, _}, maps:get(resident, R)),
    ?assertEqual(undefined, maps:get(unaccounted_bytes, R)),
    %% The libc figures are still evidence; nothing is said about RSS.
    ?assertMatch([<<"libc arenas hold 110.0 MiB of which 70.0 MiB (63%) is free", _/binary>>],
                 maps:get(verdicts, R)),
    Quiet = (raw())#{smaps := {error, enoent}, libc_summary := {error, enomem}},
    ?assertEqual([<<"nothing stands out (the resident set could not be read)">>],
                 maps:get(verdicts, ?R:build(Quiet))),
    assert_80_columns(?TEXT:format(R)),
    %% Text the parser did not know (mallocinfo_report's gather/1 says so):
    %% the section asks for a report, it does not blame /proc.
    Odd = ?R:build((raw())#{smaps := {error, {unexpected_input, {error, badarg}}}}),
    ?assertMatch({unavailable, {smaps, {unexpected_input, {error, badarg}}},
                  <<"unexpected input", _/binary>>}, maps:get(resident, Odd)).

%% The report parses /proc/self/smaps once: gather/1 parses it, and the
%% heap evidence, the resident set and the tracker's regions (on a node
%% recording them: mallocinfo_report_SUITE) read that one parse. Counted
%% with call_count tracing on this node's real report.
smaps_parsed_once_per_report_test() ->
    MFA = {mallocinfo_report_smaps, parse_smaps, 1},
    {module, _} = code:ensure_loaded(mallocinfo_report_smaps),
    1 = erlang:trace_pattern(MFA, true, [call_count]),
    try
        R = mallocinfo_report:collect(),
        ?assertMatch(#{resident := #{groups := _}}, R),
        ?assertEqual({call_count, 1}, erlang:trace_info(MFA, call_count))
    after
        erlang:trace_pattern(MFA, false, [call_count])
    end.

%%% Verdicts on built reports, and their text ----------------------------------------

%% A small node where no rule fires, built from raw data: 30 MiB of plain
%% anonymous memory of which ERTS explains 20 MiB and libc's mmapped blocks
%% 2 MiB, 10 MiB of files, the JIT's two views.
quiet_raw() ->
    Smaps = iolist_to_binary(
              [vma(16#55d000000000, 16#55d000a00000, "r-xp", "/usr/lib/erlang/erts-13.1.5/bin/beam.smp",
                   10240, "rd ex mr mw me"),
               vma(16#55d100000000, 16#55d100300000, "rw-p", "[heap]", 3000, "rd wr mr mw me ac"),
               vma(?H, ?H + 32 * ?MiB, "rw-p", "", 30 * 1024, "rd wr mr mw me ac"),
               vma(?H + ?W, ?H + ?W + 8 * ?MiB, "rw-s", "/memfd:vmem (deleted)", 6100, 3100,
                   "rd wr sh mr mw me ms"),
               vma(?H + ?W + 8 * ?MiB, ?H + ?W + 16 * ?MiB, "r-xs", "/memfd:vmem (deleted)", 6000,
                   3000, "rd ex sh mr mw me ms"),
               vma(16#7ffc00000000, 16#7ffc00021000, "rw-p", "[stack]", 132, "rd wr mr mw me gd ac")]),
    (raw())#{smaps := mallocinfo_report_smaps:parse_smaps(Smaps),
             smaps_rollup := <<"Rss: 55472 kB\n">>,
             status := <<"VmRSS: 55472 kB\n">>,
             mallinfo := #{arena => 3 * ?MiB, uordblks => 3 * ?MiB, fordblks => 0,
                           hblkhd => 2 * ?MiB, hblks => 1, fsmblks => 0, keepcost => 0,
                           ordblks => 1, smblks => 0, usmblks => 0},
             libc_summary := #{arenas => [#{arena => 0, system_bytes => 3 * ?MiB,
                                            in_use_bytes => 3 * ?MiB}]},
             erts_mmap := [{default_mmap, [{os, [{sizes, [{used, 20 * ?MiB}]}]}]}],
             allocators := [{eheap_alloc, [instance(0, 20 * ?MiB, 18 * ?MiB, 0, 0, 0)]}]}.

%% "Nothing stands out" names the two largest parts of the resident set
%% with the label and the figure section 1 shows for them: one set of
%% figures, not the kernel's anonymous total in one place and the layers'
%% split in the other.
nothing_stands_out_uses_section_1_figures_test() ->
    R = ?R:build(quiet_raw()),
    ?assertEqual([<<"nothing stands out: RSS 54.2 MiB, the largest parts: ERTS carriers, mseg "
                    "cache (est.) 20.0 MiB; files 10.0 MiB">>], maps:get(verdicts, R)),
    Lines = string:split(lists:flatten(io_lib:format("~ts", [?TEXT:format(R)])), "\n", all),
    Parts = lists:sublist(lists:reverse(lists:keysort(2, ?V:resident_parts(R))), 2),
    [?assert(lists:any(fun(L) ->
                               lists:prefix(lists:flatten(io_lib:format(
                                                            "  ~-32ts ~10ts",
                                                            [?V:part_label(K),
                                                             mallocinfo_units:bytes(B)])), L)
                       end, Lines))
     || {K, B} <- Parts],
    %% The parts of section 1 add up to what is mapped, each page once.
    ?assertEqual(maps:get(rss_for_accounting, R),
                 lists:sum([B || {_, B} <- ?V:resident_parts(R)])),
    %% The JIT's 6100 KiB, of which 6000 KiB mapped in both views, once;
    %% section 1 says what the kernel counts twice.
    ?assertEqual(6100 * ?KiB, proplists:get_value(jit, ?V:resident_parts(R))),
    ?assert(lists:member("(the kernel's RSS counts 5.9 MiB of JIT code twice: its executable and",
                         Lines)).


%% A long C++ name is shortened in the sentence, and no line of the text
%% grows past 80 columns, whatever the words.
long_words_test() ->
    Long = iolist_to_binary(["std::vector<std::__cxx11::basic_string<char,std::char_traits<char>,"
                             "std::allocator<char>>,std::allocator<std::__cxx11::basic_string<"
                             "char>>>::_M_realloc_insert" | lists:duplicate(5, "<x>")]),
    R = with_site(site(300 * ?MiB, 10, 1000, [frame(<<"/x/a.so">>, Long)])),
    {_, S} = ?V:rule(native_holder, R),
    %% 57 characters and "...".
    ?assertMatch({match, _}, re:run(S, "allocated from std::vector<std::__cxx11::basic_string<"
                                       "char,std::char_tra\\.\\.\\., the oldest")),
    Odd = R#{verdicts => ?V:verdicts(R),
             other_allocator := {unavailable, {crashed, lists:seq(1, 500)}, <<"no figures">>}},
    assert_80_columns(?TEXT:format(Odd)).

%% A freshly booted node, idle: 16 schedulers (one allocator instance per
%% scheduler and type), crypto, ssl, inets, mnesia, os_mon, runtime_tools,
%% xmerl and sasl started. Captured from `erl +S 16' (the raw
%% erlang:system_info({allocator, A}) of every allocator, erts_mmap,
%% erlang:memory() and /proc/self/status) into
%% mallocinfo_report_tests_data/fresh_node_16_schedulers.term.gz.
fresh_node() ->
    Dir = filename:join(filename:dirname(code:which(?MODULE)), "mallocinfo_report_tests_data"),
    {ok, Gz} = file:read_file(filename:join(Dir, "fresh_node_16_schedulers.term.gz")),
    {ok, Tokens, _} = erl_scan:string(binary_to_list(zlib:gunzip(Gz))),
    {ok, Term} = erl_parse:parse_term(Tokens),
    Term.

%% Its carriers are 42% used, with 23 MiB free: more than the 16 MiB and
%% 5% of RSS a verdict needs. All of it is the free part of the main
%% carrier and of the newest carrier of each instance: no fragmentation,
%% and the rule says nothing.
erts_fragmentation_silent_on_fresh_node_test() ->
    #{allocators := Allocs, erts_mmap := Mmap, memory := Mem, status := Status,
      schedulers := 16} = fresh_node(),
    R = ?R:build((raw())#{allocators := Allocs, erts_mmap := Mmap, memory := Mem,
                          status := Status, smaps_rollup := {error, enoent}}),
    #{erts := #{allocated := A, used := U}} = R,
    ?assertEqual(51628 * ?KiB, ?V:rss(R)),
    %% What made the rule fire before it looked at the headroom.
    ?assert(A - U >= 16 * ?MiB),
    ?assert(U * 100 < 60 * A),
    ?assertEqual(none, ?V:rule(erts_fragmentation, R)),
    ?assertEqual([], [V || V <- maps:get(verdicts, R),
                           binary:match(V, <<"inside erts_alloc">>) =/= nomatch]).

%% Real fragmentation: one binary_alloc instance with 40 carriers of 1 MiB,
%% a fifth used. Its headroom is its 32 KiB main carrier and one 1 MiB
%% carrier; the other 30 MiB free are fragmentation, and said so.
erts_fragmentation_beyond_headroom_test() ->
    Frag = {instance, 1,
            [{options, [{mmbcs, 32768}]},
             {mbcs, [{blocks, [{binary_alloc, [{count, 100000, 0, 0}, {size, 8 * ?MiB, 0, 0}]}]},
                     {carriers, 40, 40, 40},
                     {carriers_size, 32768 + 39 * ?MiB, 0, 0}]}]},
    [T] = ?R:allocator_types([{binary_alloc, [Frag]}]),
    ?assertEqual(32768 + ?MiB, maps:get(headroom, T)),
    R = ?R:build((raw())#{allocators := [{binary_alloc, [Frag]}]}),
    {Waste, Text} = ?V:rule(erts_fragmentation, R),
    ?assertEqual(32768 + 39 * ?MiB - 8 * ?MiB - (32768 + ?MiB), Waste),
    ?assertMatch({match, _}, re:run(Text, "30.0 MiB free beyond the main and newest carrier")).

%%% Units and text -------------------------------------------------------------------

human_test_() ->
    [?_assertEqual("0 B", lists:flatten(mallocinfo_units:bytes(0))),
     ?_assertEqual("1023 B", lists:flatten(mallocinfo_units:bytes(1023))),
     ?_assertEqual("1.5 KiB", lists:flatten(mallocinfo_units:bytes(1536))),
     ?_assertEqual("64.0 MiB", lists:flatten(mallocinfo_units:bytes(64 * ?MiB))),
     ?_assertEqual("1.8 GiB", lists:flatten(mallocinfo_units:bytes(1932735283))),
     ?_assertEqual("2.0 TiB", lists:flatten(mallocinfo_units:bytes(2 bsl 40))),
     ?_assertEqual("-", lists:flatten(mallocinfo_units:bytes(undefined))),
     ?_assertEqual("9999", lists:flatten(mallocinfo_units:count(9999))),
     ?_assertEqual("12.3 k", lists:flatten(mallocinfo_units:count(12345))),
     ?_assertEqual("160 k", lists:flatten(mallocinfo_units:count(160000))),
     ?_assertEqual("3.2 M", lists:flatten(mallocinfo_units:count(3200000))),
     ?_assertEqual("850 ms", lists:flatten(mallocinfo_units:age(850))),
     ?_assertEqual("42 s", lists:flatten(mallocinfo_units:age(42999))),
     ?_assertEqual("5.2 min", lists:flatten(mallocinfo_units:age(312000))),
     ?_assertEqual("5.0 h", lists:flatten(mallocinfo_units:age(5 * 3600000))),
     ?_assertEqual("3.1 d", lists:flatten(mallocinfo_units:age(3 * 86400000 + 9000000))),
     ?_assertEqual("1970-01-01T00:00:00.000Z", lists:flatten(mallocinfo_units:utc(0))),
     ?_assertEqual("2025-11-24T16:00:00.000Z", lists:flatten(mallocinfo_units:utc(1764000000000))),
     ?_assertEqual("9999-12-31T23:59:59.999Z",
                   lists:flatten(mallocinfo_units:utc(253402300799999))),
     ?_assertEqual("at unix time 253402300800000 ms",
                   lists:flatten(mallocinfo_units:utc(253402300800000)))].

format_crafted_test() ->
    R = (quiet())#{verdicts => ?V:verdicts(quiet())},
    Text = lists:flatten(io_lib:format("~ts", [?TEXT:format(R)])),
    assert_80_columns(Text),
    [?assertNotEqual(nomatch, string:find(Text, S))
     || S <- ["== Verdict", "== 1. Resident set", "== 2. ERTS", "== 3. libc", "== 4. Native",
              "== 5. Other allocator", "== 6. Unaccounted", "foo_cache_insert (foo_nif.so)",
              "unaccounted: 10.0 MiB (1.0% of RSS)"]].

%% With mallocinfo_heap's summary (the shared contract's keys), the libc
%% section says what trim could return and what is pinned.
format_heap_map_test() ->
    Totals = #{system_bytes => 400 * ?MiB, in_use_bytes => 385 * ?MiB, free_bytes => 15 * ?MiB,
               by_kind => #{in_use => 385 * ?MiB, free => 10 * ?MiB, fast => ?MiB, tcache => 0,
                            top => 4 * ?MiB, meta => 0},
               free_chunks => 123456, largest_free => 4 * ?MiB, resident_bytes => 390 * ?MiB,
               trimmable_bytes => 6 * ?MiB, pinned_bytes => 8 * ?MiB, mmap_bytes => 0,
               mmap_chunks => 0, arena_count => 2, chunks => 1000000},
    Q = quiet(),
    R = Q#{libc := (maps:get(libc, Q))#{heap_map := #{arenas => [], total => Totals}},
           verdicts => []},
    Text = lists:flatten(io_lib:format("~ts", [?TEXT:format(R)])),
    assert_80_columns(Text),
    %% The paragraph is wrapped: compare it unwrapped.
    Flat = lists:flatten(string:replace(Text, "\n  ", " ", all)),
    ?assertNotEqual(nomatch, string:find(Flat, "heap map: free 15.0 MiB in 123 k chunks (largest "
                                               "4.0 MiB); malloc_trim could return 6.0 MiB now; "
                                               "8.0 MiB pinned between live blocks; resident "
                                               "390.0 MiB")).

format_cluster_test() ->
    R = (quiet())#{verdicts => [<<"a verdict">>], injected => true},
    Text = lists:flatten(io_lib:format("~ts", [?TEXT:format_cluster(
                                                 [{'a@host', {ok, R}},
                                                  {'b@host', {error, unreachable}},
                                                  {'c@host', {error, {inject_failed, x}}}])])),
    assert_80_columns(Text),
    Lines = string:split(Text, "\n", all),
    [A] = [L || L <- Lines, string:prefix(L, "a@host ") =/= nomatch],
    ?assertMatch({match, _}, re:run(A, "^a@host +1\\.0 GiB +500\\.0 MiB +15\\.0 MiB +10\\.0 MiB "
                                       "+1\\.0% +injected$")),
    ?assert(lists:member("b@host                       -         -         -         -      -  "
                         "unreachable", Lines)),
    ?assertNotEqual(nomatch, string:find(Text, "c@host: {inject_failed,x}")),
    ?assertNotEqual(nomatch, string:find(Text, "  - a verdict")).

collect_bad_arguments_test() ->
    ?assertError(badarg, mallocinfo_report:collect(node())),
    ?assertError(badarg, mallocinfo_report:collect(["node"])),
    ?assertError(badarg, mallocinfo_report:collect([node()], #{timeout => 0})),
    ?assertError(badarg, mallocinfo_report:collect([node()], #{bogus => 1})),
    ?assertError(badarg, mallocinfo:report(node())).

assert_80_columns(IoData) ->
    Text = lists:flatten(io_lib:format("~ts", [IoData])),
    Long = [L || L <- string:split(Text, "\n", all), string:length(L) > 80],
    ?assertEqual([], Long).

%% A tracker attached at run time: the native section says since when it
%% looks, and a node never attached is told how to attach.
native_attached_text_test() ->
    %% A report as collect/0 makes it has its verdicts (format/1 checks).
    R0 = with_site(site(64 * ?MiB, 1000, 12000, [frame(<<"/x/demo.so">>, <<"demo_leak">>)])),
    R = R0#{verdicts => ?V:verdicts(R0)},
    At = 1795496600158,
    Attached = R#{native := (maps:get(native, R))#{attached => true, attached_at => At}},
    %% Paragraphs wrap at 80 columns: compare with spaces normalised.
    Flat = fun(Io) -> iolist_to_binary(re:replace(Io, "\\s+", " ", [global])) end,
    Text = Flat(?TEXT:format(Attached)),
    ?assertNotEqual(nomatch, binary:match(Text, <<"attached at 2026-11-24T">>)),
    ?assertNotEqual(nomatch, binary:match(Text, <<"blocks allocated before that are not seen">>)),
    Detached = R#{native := (maps:get(native, R))#{attached => false, attached_at => At}},
    ?assertNotEqual(nomatch, binary:match(Flat(?TEXT:format(Detached)), <<"detached since">>)),
    ?assertEqual(nomatch, binary:match(Flat(?TEXT:format(R)), <<"attached at">>)),
    assert_80_columns(?TEXT:format(Attached)),
    Never = ?R:build((raw())#{trace_status => #{preloaded => false, attached => false,
                                                attached_at => undefined, recording => false,
                                                mode => off}}),
    {unavailable, not_preloaded, How} = maps:get(native, Never),
    ?assertNotEqual(nomatch, binary:match(How, <<"mallocinfo_trace:attach()">>)).

%%% Names that are not text (issue 28) --------------------------------------------

%% Symbols and paths are bytes: the issue's invalid UTF-8 symbol and its
%% terminal payload in every place a name reaches the report (the
%% functions, objects, oldest blocks, growth and previous-report rows, the
%% mapped sites, the files, the processes, the node), in the function form
%% (with growth, so two rules name the culprit) and the stack form. Every
%% verdict is a sentence, the text and the cluster form are made, 80
%% columns, valid UTF-8, with no control character but newlines, and show
%% the names escaped.
odd_names_test() ->
    Bad = <<"bad", 8#377, 8#376, "utf8">>,
    Ansi = <<"ansi\e[31mRED\e]0;pwned-title", 7, "\e[2Jend">>,
    %% A path with an invalid byte, a CSI as its code point, and a lone
    %% 0x9B byte (not UTF-8).
    Obj = <<"/opt/", 255, "\e[2J/\x{9B}[libodd"/utf8, 16#9B, "1m.so">>,
    F1 = frame(Obj, Bad),
    F2 = frame(Obj, Ansi),
    Stack = [F1, F2],
    Q = quiet(),
    Native = #{mode => full, live_bytes => 600 * ?MiB, live_entries => 3000,
               table_bytes => 64 * ?MiB, stack_bytes => 16 * ?MiB,
               functions => [#{bytes => 300 * ?MiB, count => 1000, stacks => 1, frame => F1,
                               object => Obj, function => Bad, label => native},
                             #{bytes => 200 * ?MiB, count => 1000, stacks => 1, frame => F2,
                               object => Obj, function => Ansi, label => native}],
               objects => [#{bytes => 500 * ?MiB, count => 2000, stacks => 2, object => Obj,
                             label => native}],
               olds => [#{size => 4096, age_ms => 90000, stack => Stack}],
               growth => #{leak => true, interval_ms => 60000, samples => 3,
                           live_delta => 100 * ?MiB,
                           growers => [#{growth_bytes => 100 * ?MiB, rate => 2 * ?MiB,
                                         bytes => 300 * ?MiB, count => 1000, culprit => F1}]},
               previous => #{age_ms => 60000, native_delta => 10 * ?MiB,
                             grew => [#{bytes_delta => 10 * ?MiB, object => Obj,
                                        function => Ansi}]}},
    Proc = list_to_atom("srv\e[2J"),
    Erts = (maps:get(erts, Q))#{processes => [#{pid => list_to_pid("<0.90.0>"), name => Proc,
                                                value => 200 * ?MiB, by => memory},
                                              #{pid => list_to_pid("<0.91.0>"),
                                                name => {list_to_atom("m\e]0;x"), f, 1},
                                                value => 100 * ?MiB, by => memory}]},
    Resident = (maps:get(resident, Q))#{files_top => [#{path => Obj, rss => 50 * ?MiB}]},
    R0 = Q#{node => list_to_atom("n\e[2J@host"), native := Native, erts := Erts,
            resident := Resident, mapped_sites => [{<<Ansi/binary, " (libodd.so)">>, 1,
                                                    8 * ?MiB, 8 * ?MiB}]},
    Vs = ?V:verdicts(R0),
    ?assert(lists:all(fun is_binary/1, Vs)),
    ?assert(length(Vs) >= 2),
    R = R0#{verdicts => Vs},
    StackForm = (with_site(site(300 * ?MiB, 100, 120000, Stack)))#{node => 'q@host'},
    S = StackForm#{verdicts => ?V:verdicts(StackForm)},
    BadText = <<"bad\\xFF\\xFEutf8">>,
    AnsiText = <<"ansi\\x1B[31mRED">>,
    Texts = [{?TEXT:format(R), [BadText, AnsiText]},
             {?TEXT:format(S), [BadText]},  % the culprit: the first frame
             {?TEXT:format_cluster([{maps:get(node, R), {ok, R}},
                                    {list_to_atom("down\e[2J@host"), {error, {bad, Ansi}}}]),
              [BadText, <<"down\\x1B[2J@host">>]}],
    [begin
         Bin = unicode:characters_to_binary(T),
         ?assert(is_binary(Bin)),
         assert_80_columns(T),
         ?assertEqual([], [C || <<C/utf8>> <= Bin, C =/= $\n, C < 32 orelse C =:= 127
                                                   orelse (C >= 16#80 andalso C =< 16#9F)]),
         %% Paragraphs wrap: compare with whitespace squeezed.
         Flat = re:replace(Bin, "\\s+", "", [global, {return, binary}, unicode]),
         [?assertNotEqual({T0, nomatch}, {T0, binary:match(Flat, T0)}) || T0 <- Wanted]
     end || {T, Wanted} <- Texts],
    Full = unicode:characters_to_binary(element(1, hd(Texts))),
    Squeezed = re:replace(Full, "\\s+", "", [global, {return, binary}, unicode]),
    [?assertNotEqual({Want, nomatch}, {Want, binary:match(Squeezed, Want)})
     || Want <- [<<"n\\x1B[2J@host">>, <<"srv\\x1B[2J">>, <<"m\\x1B]0;x:f/1">>,
                 <<"\\u009B[libodd">>,
                 <<"libodd\\x9B1m.so">>]].
