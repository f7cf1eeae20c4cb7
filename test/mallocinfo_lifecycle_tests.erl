%% NIF lifecycle: load, purge, reload, purge, many times, without a crash
%% and without a leak that grows with the number of cycles.
%%
%% A leak in the NIF (priv data never freed, a table made again on every
%% upgrade) is native memory: erlang:memory() does not see it, and RSS
%% hardly does (untouched malloc blocks are not resident: 64 KiB leaked per
%% cycle over 50 cycles moved RSS by less than 1 MB here, and by a negative
%% amount in another run). What the NIF takes from malloc is in mallinfo2's
%% `uordblks' (in use in the arenas) plus `hblkhd' (in use in mmapped
%% chunks), summed over every arena: that is the measure.
%%
%% The BEAM itself keeps memory per module load: the JIT registers metadata
%% for debuggers and profilers (beamasm_metadata_update) and never releases
%% it, about 6 KB per load of mallocinfo_nif, so 12 KB per cycle (two
%% loads), the same in every cycle (617,600 bytes every 50 cycles on
%% OTP 25.2). The bound, 32 KiB per cycle, is above that and below the
%% 64 KiB-per-cycle leak this test must catch; `leak_is_seen' proves it
%% does, by leaking exactly that through the demo NIF.
-module(mallocinfo_lifecycle_tests).
-include_lib("eunit/include/eunit.hrl").

-define(CYCLES, 100).
-define(BOUND_PER_CYCLE, 32 * 1024).
-define(LEAK_PER_CYCLE, 64 * 1024).

lifecycle_test_() ->
    {timeout, 120, fun cycles/0}.

%% The measurement sees a leak of the size it must catch: the same cycles
%% plus 64 KiB malloc'ed and kept per cycle exceed the bound.
leak_is_seen_test_() ->
    {timeout, 120, fun leak_is_seen/0}.

cycles() ->
    {module, mallocinfo_nif} = code:ensure_loaded(mallocinfo_nif),
    Maps0 = so_mappings(),
    ?assert(Maps0 > 0),
    %% The first half warms up whatever is made once (atoms, code server
    %% tables); the second half is measured.
    cycle(?CYCLES div 2, fun() -> ok end),
    Maps1 = so_mappings(),
    Mem1 = erlang:memory(total),
    {Native, ok} = native_growth(fun() -> cycle(?CYCLES div 2, fun() -> ok end) end),
    Mem2 = erlang:memory(total),
    Maps2 = so_mappings(),
    %% The shared object stays mapped once, however often it is reloaded.
    ?assertEqual(Maps0, Maps1),
    ?assertEqual(Maps1, Maps2),
    %% Native memory in use: what the second half of the cycles added.
    ?assert(Native < ?BOUND_PER_CYCLE * (?CYCLES div 2),
            {native_growth, Native, per_cycle, Native div (?CYCLES div 2)}),
    %% Terms (binaries, atoms, ETS) are the VM's, and must not grow either.
    ?assert(Mem2 - Mem1 < 4 * 1024 * 1024),
    ?assertMatch({ok, #{arena := _}}, mallocinfo:mallinfo()),
    ?assertMatch({ok, _}, mallocinfo:info()).

leak_is_seen() ->
    {module, mallocinfo_nif} = code:ensure_loaded(mallocinfo_nif),
    %% The demo is outside the application: make demo's directory.
    true = code:add_patha(mi_ct:demo_dir()),
    ok = mallocinfo_demo_nif:load(),
    try
        Leak = fun() -> ok = mallocinfo_demo_nif:cache_insert(1, ?LEAK_PER_CYCLE) end,
        cycle(?CYCLES div 2, fun() -> ok end),
        {Native, ok} = native_growth(fun() -> cycle(?CYCLES div 2, Leak) end),
        ?assert(Native >= ?BOUND_PER_CYCLE * (?CYCLES div 2),
                {native_growth, Native, per_cycle, Native div (?CYCLES div 2)})
    after
        mallocinfo_demo_nif:release()
    end.

%% Bytes malloc'ed and still in use after Fun, minus before: uordblks +
%% hblkhd of mallinfo2, which sums every arena.
native_growth(Fun) ->
    Before = in_use(),
    Result = Fun(),
    {in_use() - Before, Result}.

in_use() ->
    {ok, #{uordblks := InArenas, hblkhd := InMmapped}} = mallocinfo:mallinfo(),
    InArenas + InMmapped.

cycle(0, _Each) ->
    ok;
cycle(N, Each) ->
    %% Upgrade path: load over the current code (old + new instances), purge.
    {module, mallocinfo_nif} = code:load_file(mallocinfo_nif),
    true = is_map(mallocinfo_nif:mallinfo()),
    _ = code:purge(mallocinfo_nif),
    %% Fresh-load path: delete, purge, load again.
    true = code:delete(mallocinfo_nif),
    _ = code:purge(mallocinfo_nif),
    {module, mallocinfo_nif} = code:load_file(mallocinfo_nif),
    true = is_binary(mallocinfo_nif:version()),
    Each(),
    cycle(N - 1, Each).

so_mappings() ->
    {ok, Maps} = file:read_file("/proc/self/maps"),
    length(binary:matches(Maps, <<"mallocinfo_nif.so\n">>)).
