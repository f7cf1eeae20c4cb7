%% NIF lifecycle: load, purge, reload, purge, many times, without a crash
%% and without a leak that grows with the number of cycles.
-module(mallocinfo_lifecycle_tests).
-include_lib("eunit/include/eunit.hrl").

-define(CYCLES, 100).

lifecycle_test_() ->
    {timeout, 120, fun cycles/0}.

cycles() ->
    {module, mallocinfo_nif} = code:ensure_loaded(mallocinfo_nif),
    Maps0 = so_mappings(),
    ?assert(Maps0 > 0),
    cycle(?CYCLES div 2),
    Mem1 = erlang:memory(total),
    Maps1 = so_mappings(),
    cycle(?CYCLES div 2),
    Maps2 = so_mappings(),
    Mem2 = erlang:memory(total),
    %% The shared object stays mapped once, however often it is reloaded.
    ?assertEqual(Maps0, Maps1),
    ?assertEqual(Maps1, Maps2),
    %% The second half of the cycles must not add memory the first half did not.
    ?assert(Mem2 - Mem1 < 4 * 1024 * 1024),
    ?assertMatch(#{arena := _}, mallocinfo:mallinfo()),
    ?assertMatch({ok, _}, mallocinfo:info()).

cycle(0) ->
    ok;
cycle(N) ->
    %% Upgrade path: load over the current code (old + new instances), purge.
    {module, mallocinfo_nif} = code:load_file(mallocinfo_nif),
    true = is_map(mallocinfo_nif:mallinfo()),
    _ = code:purge(mallocinfo_nif),
    %% Fresh-load path: delete, purge, load again.
    true = code:delete(mallocinfo_nif),
    _ = code:purge(mallocinfo_nif),
    {module, mallocinfo_nif} = code:load_file(mallocinfo_nif),
    true = is_binary(mallocinfo_nif:version()),
    cycle(N - 1).

so_mappings() ->
    {ok, Maps} = file:read_file("/proc/self/maps"),
    length(binary:matches(Maps, <<"mallocinfo_nif.so\n">>)).
