%% @private The report from raw data, with pure functions only: the
%% resident set (`/proc' text, parsed and grouped by `mallocinfo_report_smaps'),
%% the ERTS, libc, native and other-allocator layers, and what each
%% explains of the resident set; the verdicts on the result come from
%% `mallocinfo_report_verdicts'. `mallocinfo_report:collect/0' gathers the raw
%% data and is the only caller; the pieces are exported for EUnit, which
%% feeds canned `/proc' text (parsed) and crafted maps. Not an API:
%% arguments are not checked.
-module(mallocinfo_report_build).

%% An allocator's figures as erlang:system_info({allocator, A}) gives them.
-import(mallocinfo_layers, [current/2, blocks_size/1]).

-export([build/1]).
%% The pieces, exported for tests.
-export([allocator_types/1, erts_mmap_bytes/1, carriers_summary/1, allocations_summary/1,
         instrument_app/1, arena_max/2, culprit_view/3, growth_view/1, previous_view/2,
         mappings/1]).

-define(MiB, (1 bsl 20)).
%% A native call site that grew in every sample by at least this much over
%% a report's interval is called a leak.
-define(GROWTH_LEAK_BYTES, ?MiB).
-define(FUNCTIONS, 10).
-define(TOP, 5).

%% @doc The report from the raw data `mallocinfo_report:collect/0'
%% gathers (see there for the keys). Its `smaps' is already parsed
%% (`mallocinfo_report_smaps:parse_smaps/1', or `{error, Why}'): the resident set
%% and the tracker's regions read that one parse, the same the heap
%% evidence was found in.
-spec build(map()) -> mallocinfo_report:report().
build(Raw) ->
    Sections = [{resident, fun resident/1}, {erts, fun erts/1}, {libc, fun libc/1},
                {native, fun native/1}, {other_allocator, fun other_allocator/1},
                {mappings, fun mappings/1}, {layer_growth, fun layer_growth/1}],
    Base = maps:merge(maps:with([node, os_pid, otp_release, time, libc_version, allocator], Raw),
                      maps:from_list([{K, section(F, Raw)} || {K, F} <- Sections])),
    R = maps:merge(Base, account(Base)),
    R#{verdicts => mallocinfo_report_verdicts:verdicts(R)}.

%% Input this code did not expect (another OTP, another kernel) costs one
%% section, never the report: the operator still gets the rest.
section(F, Raw) ->
    try F(Raw)
    catch Class:Reason ->
            {unavailable, {Class, Reason}, <<"unexpected input: please report it with this term">>}
    end.

%%% Resident set --------------------------------------------------------------

resident(#{smaps := Vmas} = Raw) when is_list(Vmas) ->
    #{groups := Groups} = Grouped =
        mallocinfo_report_smaps:group_mappings(Vmas,
                                               maps:with([heap_headers, straddle_rss], Raw)),
    Total = lists:sum([Rss || #{rss := Rss} <- maps:values(Groups)]),
    Rollup = fields_or_empty(maps:get(smaps_rollup, Raw, undefined)),
    Status = fields_or_empty(maps:get(status, Raw, undefined)),
    Grouped#{rss => maps:get(<<"Rss">>, Rollup, maps:get(<<"VmRSS">>, Status, Total)),
             mapped_rss => Total,
             pss => maps:get(<<"Pss">>, Rollup, undefined),
             anonymous => maps:get(<<"RssAnon">>, Status,
                                   maps:get(<<"Anonymous">>, Rollup, undefined)),
             file => maps:get(<<"RssFile">>, Status, undefined),
             shmem => maps:get(<<"RssShmem">>, Status, undefined),
             swap => maps:get(<<"VmSwap">>, Status, maps:get(<<"Swap">>, Rollup, undefined)),
             peak => maps:get(<<"VmHWM">>, Status, undefined),
             mappings => length(Vmas)};
resident(#{smaps := {error, {unexpected_input, _} = Why}}) ->
    {unavailable, {smaps, Why}, <<"unexpected input: please report it with this term">>};
resident(#{smaps := {error, Why}}) ->
    {unavailable, {smaps, Why}, <<"/proc/self/smaps is needed (Linux, /proc mounted)">>};
resident(_) ->
    {unavailable, no_smaps, <<"/proc/self/smaps is needed (Linux, /proc mounted)">>}.

fields_or_empty(Bin) when is_binary(Bin) -> mallocinfo_report_smaps:parse_fields(Bin);
fields_or_empty(_) -> #{}.


%%% ERTS --------------------------------------------------------------------

erts(Raw) ->
    Types = allocator_types(maps:get(allocators, Raw, [])),
    Sum = fun(K) -> lists:sum([maps:get(K, T) || T <- Types]) end,
    Mmap = erts_mmap_bytes(maps:get(erts_mmap, Raw, undefined)),
    #{memory => maps:get(memory, Raw, #{}),
      allocators => Types,
      allocated => Sum(allocated),
      used => Sum(used),
      sys_alloc_bytes => Sum(sys_alloc),
      mmap_bytes => Mmap,
      %% What ERTS keeps mapped beyond the carriers in use: mseg_alloc's
      %% cache of freed carriers (kept for reuse, released over time).
      mseg_cache_bytes => case Mmap of
                              undefined -> undefined;
                              _ -> max(0, Mmap - Sum(mseg))
                          end,
      carriers => carriers_summary(maps:get(carriers, Raw, undefined)),
      allocations => allocations_summary(maps:get(allocations, Raw, undefined)),
      processes => ok_list(maps:get(processes, Raw, [])),
      ets => ok_list(maps:get(ets, Raw, []))}.

ok_list(L) when is_list(L) -> L;
ok_list(_) -> [].

%% @doc Per allocator type, summed over its instances, what recon_alloc
%% calls allocated (carriers: mbcs + mbcs_pool + sbcs `carriers_size') and
%% used (blocks: the `size' of every block type in those carriers), plus
%% how many carrier bytes came from `sys_alloc' (malloc: inside libc's
%% heap) and from `mseg_alloc' (mmap), and `headroom': the free
%% multiblock space every instance keeps by design, up to the size of its
%% main carrier (`mmbcs', allocated at start and never released) plus one
%% more carrier (the one being filled; its size is taken as the average of
%% the instance's other carriers). Largest `allocated' first.
%% Input: `[{Name, erlang:system_info({allocator, Name})}]'.
-spec allocator_types([{atom(), term()}]) ->
          [#{name := atom(), allocated := non_neg_integer(), used := non_neg_integer(),
             sys_alloc := non_neg_integer(), mseg := non_neg_integer(),
             headroom := non_neg_integer()}].
allocator_types(Allocs) ->
    Types = [allocator_type(Name, Instances) || {Name, Instances} <- Allocs, is_list(Instances)],
    lists:reverse(lists:sort(fun(#{allocated := A}, #{allocated := B}) -> A =< B end, Types)).

allocator_type(Name, Instances) ->
    Infos = [Info || {instance, _, Info} <- Instances, is_list(Info)],
    Parts = [{Kind, Props} || Info <- Infos, {Kind, Props} <- Info,
                              lists:member(Kind, [mbcs, mbcs_pool, sbcs]), is_list(Props)],
    Sum = fun(F) -> lists:sum([F(P) || {_, P} <- Parts]) end,
    #{name => Name,
      allocated => Sum(fun(P) -> current(carriers_size, P) end),
      used => Sum(fun mallocinfo_layers:blocks_size/1),
      sys_alloc => Sum(fun(P) -> current(sys_alloc_carriers_size, P) end),
      mseg => Sum(fun(P) -> current(mseg_alloc_carriers_size, P) end),
      headroom => lists:sum([headroom(Info) || Info <- Infos])}.

%% An instance's free multiblock bytes, up to its main carrier and one
%% other carrier.
headroom(Info) ->
    case {lists:keyfind(options, 1, Info), lists:keyfind(mbcs, 1, Info)} of
        {{options, Opts}, {mbcs, Props}} when is_list(Opts), is_list(Props) ->
            Main = case lists:keyfind(mmbcs, 1, Opts) of
                       {mmbcs, M} when is_integer(M), M >= 0 -> M;
                       _ -> 0
                   end,
            Size = current(carriers_size, Props),
            Newest = case current(carriers, Props) of
                         N when N >= 2 -> max(0, Size - Main) div (N - 1);
                         _ -> 0
                     end,
            min(Main + Newest, max(0, Size - blocks_size(Props)));
        _ ->
            0
    end.

%% {Key, Current, ...}: the current value is the first.
%% @doc Bytes ERTS has mapped itself (mseg carriers, the literal area):
%% the `used' sizes of `erlang:system_info({allocator, erts_mmap})', over
%% the default and literal mappers, OS and super-carrier parts.
%% `undefined' when the emulator does not report it.
-spec erts_mmap_bytes(term()) -> non_neg_integer() | undefined.
erts_mmap_bytes(Info) when is_list(Info) ->
    lists:sum([proplists:get_value(used, Sizes, 0)
               || {_Mapper, Props} <- Info, is_list(Props),
                  {Part, PartProps} <- Props, Part =:= os orelse Part =:= supercarrier,
                  is_list(PartProps),
                  {sizes, Sizes} <- PartProps]);
erts_mmap_bytes(_) ->
    undefined.

%% @doc `instrument:carriers/0' summed up: carrier count and bytes, bytes
%% allocated in them, how many sit in the migration pool, and the
%% free-block histogram (counts; bucket 0 is blocks up to `hist_start'
%% bytes, each next bucket doubles the upper bound). Per type as well.
-spec carriers_summary(term()) -> map() | mallocinfo_report:unavailable().
carriers_summary({ok, {HistStart, Carriers}}) when is_list(Carriers) ->
    Rows = [{Type, InPool, Total, lists:sum([S || {_, _, S} <- Allocs]), Free}
            || {Type, InPool, Total, _Unscanned, Allocs, Free} <- Carriers],
    Width = lists:max([0 | [tuple_size(F) || {_, _, _, _, F} <- Rows]]),
    Hist = lists:foldl(fun({_, _, _, _, F}, Acc) -> add_hist(tuple_to_list(F), Acc) end,
                       lists:duplicate(Width, 0), Rows),
    ByType = lists:foldl(
               fun({T, _, Total, Alloc, _}, Acc) ->
                       maps:update_with(T, fun({C, S, A}) -> {C + 1, S + Total, A + Alloc} end,
                                        {1, Total, Alloc}, Acc)
               end, #{}, Rows),
    #{count => length(Rows),
      bytes => lists:sum([T || {_, _, T, _, _} <- Rows]),
      allocated => lists:sum([A || {_, _, _, A, _} <- Rows]),
      in_pool => length([x || {_, true, _, _, _} <- Rows]),
      hist_start => HistStart,
      free_histogram => Hist,
      by_type => lists:reverse(lists:keysort(2, [{T, S, C, A}
                                                  || {T, {C, S, A}} <- maps:to_list(ByType)]))};
carriers_summary({error, {missing_application, App}} = E)
  when App =:= tools; App =:= runtime_tools ->
    unavailable(E, add_instrument_app(App));
carriers_summary(Other) ->
    unavailable(Other, <<"instrument:carriers/0 failed">>).

add_hist(Counts, Acc) ->
    lists:zipwith(fun(A, B) -> A + B end, Counts, Acc).

%% @doc `instrument:allocations/0' (tagged allocations: binaries, and what
%% NIFs and drivers allocate with `enif_alloc'/`driver_alloc', by origin
%% module) as `[#{origin, type, count, min_bytes, max_bytes}]', largest
%% first. Sizes are only known to the histogram bucket, hence the bounds:
%% bucket 0 holds blocks up to `HistStart' bytes, bucket `i' those above
%% `HistStart * 2^(i-1)' and up to `HistStart * 2^i'; the last bucket has no
%% upper bound (`max_bytes' counts it at its lower bound and says
%% `open => true').
-spec allocations_summary(term()) -> [map()] | mallocinfo_report:unavailable().
allocations_summary({ok, {HistStart, _Unscanned, ByOrigin}}) when is_map(ByOrigin) ->
    Rows = [begin
                Counts = tuple_to_list(Hist),
                N = length(Counts),
                Idx = lists:zip(lists:seq(0, N - 1), Counts),
                Lower = fun(0) -> 0; (I) -> HistStart bsl (I - 1) end,
                Upper = fun(I) when I =:= N - 1 -> Lower(I); (I) -> HistStart bsl I end,
                #{origin => Origin, type => Type,
                  count => lists:sum(Counts),
                  min_bytes => lists:sum([C * Lower(I) || {I, C} <- Idx]),
                  max_bytes => lists:sum([C * Upper(I) || {I, C} <- Idx]),
                  open => lists:last([0 | Counts]) > 0}
            end || {Origin, Types} <- maps:to_list(ByOrigin), is_map(Types),
                   {Type, Hist} <- maps:to_list(Types), is_tuple(Hist)],
    lists:reverse(lists:sort(fun(#{max_bytes := A}, #{max_bytes := B}) -> A =< B end, Rows));
allocations_summary({error, {missing_application, App}} = E)
  when App =:= tools; App =:= runtime_tools ->
    unavailable(E, add_instrument_app(App));
allocations_summary(Other) ->
    unavailable(Other, <<"instrument:allocations/0 failed">>).

%% @doc The application `instrument' belongs to on an OTP release (as
%% `erlang:system_info(otp_release)' gives it): tools up to OTP 25,
%% runtime_tools from OTP 26 on, where it moved.
-spec instrument_app(string()) -> tools | runtime_tools.
instrument_app(OtpRelease) ->
    case string:to_integer(OtpRelease) of
        {N, _} when is_integer(N), N >= 26 -> runtime_tools;
        _ -> tools
    end.

add_instrument_app(App) ->
    A = atom_to_binary(App, utf8),
    <<"instrument is in the ", A/binary, " application: add ", A/binary, " to the release">>.

unavailable({error, Why}, How) -> {unavailable, Why, How};
unavailable(Why, How) -> {unavailable, Why, How}.

%%% libc ----------------------------------------------------------------------

libc(#{allocator := A} = Raw) when A =/= glibc ->
    %% glibc's own heap is nearly empty when another allocator replaced
    %% malloc; its figures are still shown, but they are not where the
    %% memory is.
    libc_glibc(Raw#{libc_note => <<"malloc is served by ", (atom_to_binary(A))/binary>>});
libc(Raw) ->
    libc_glibc(Raw).

libc_glibc(#{mallinfo := #{arena := _} = MI} = Raw) ->
    Arenas = case maps:get(libc_summary, Raw, undefined) of
                 #{arenas := L} ->
                     [#{arena => N, system_bytes => S, in_use_bytes => U, free_bytes => S - U}
                      || #{arena := N, system_bytes := S, in_use_bytes := U} <- L];
                 _ ->
                     undefined
             end,
    System = maps:get(arena, MI),
    InUse = maps:get(uordblks, MI),
    HeapMap = case maps:get(heap_map, Raw, undefined) of
                  {ok, #{total := _} = S} -> S;
                  Other ->
                      unavailable(Other, <<"mallocinfo_heap:summary() failed">>)
              end,
    Cores = maps:get(cores, Raw, 1),
    Env = maps:get(env, Raw, #{}),
    Base = #{mallinfo => MI,
             system_bytes => System,
             in_use_bytes => InUse,
             free_bytes => maps:get(fordblks, MI),
             mmap_bytes => maps:get(hblkhd, MI),
             mmap_count => maps:get(hblks, MI),
             arenas => case Arenas of undefined -> []; _ -> Arenas end,
             arena_count => case Arenas of undefined -> undefined; _ -> length(Arenas) end,
             arena_max => arena_max(Env, Cores),
             heap_map => HeapMap},
    case Raw of
        #{libc_note := Note} -> Base#{note => Note};
        _ -> Base
    end;
libc_glibc(#{mallinfo := {error, {wrong_allocator, A}} = Error}) ->
    unavailable(Error, <<"malloc is served by ", (atom_to_binary(A))/binary,
                         ", not glibc: see section 5">>);
libc_glibc(#{mallinfo := Error}) ->
    unavailable(Error, <<"mallocinfo_nif could not be loaded or mallinfo2 failed">>);
libc_glibc(_) ->
    {unavailable, no_mallinfo, <<"mallocinfo_nif is needed">>}.

%% @doc How many arenas glibc may create: `MALLOC_ARENA_MAX', else
%% `glibc.malloc.arena_max' in `GLIBC_TUNABLES', else glibc's default of
%% 8 per online core (64-bit). A `mallopt(M_ARENA_MAX)' made at run time
%% cannot be read back and is not seen.
-spec arena_max(#{string() => string() | false}, pos_integer()) ->
          #{value := pos_integer(), source := env | tunable | default}.
arena_max(Env, Cores) ->
    FromEnv = positive(maps:get("MALLOC_ARENA_MAX", Env, false)),
    FromTunable = case maps:get("GLIBC_TUNABLES", Env, false) of
                      false -> undefined;
                      T -> tunable(string:split(T, ":", all))
                  end,
    if
        FromEnv =/= undefined -> #{value => FromEnv, source => env};
        FromTunable =/= undefined -> #{value => FromTunable, source => tunable};
        true -> #{value => 8 * Cores, source => default}
    end.

tunable([]) -> undefined;
tunable(["glibc.malloc.arena_max=" ++ V | _]) -> positive(V);
tunable([_ | Rest]) -> tunable(Rest).

positive(false) -> undefined;
positive(S) ->
    case string:to_integer(S) of
        {N, ""} when N > 0 -> N;
        _ -> undefined
    end.

%%% Native callers ------------------------------------------------------------

native(#{trace_status := #{preloaded := false} = S}) when not is_map_key(attached_at, S);
                                                           map_get(attached_at, S) =:= undefined ->
    {unavailable, not_preloaded,
     <<"mallocinfo_trace:attach() loads the tracker into this node now, without a restart "
       "(doc/attach.md); or start the node with "
       "LD_PRELOAD=<mallocinfo>/priv/libmallocinfo_preload.so (mallocinfo_trace:preload_env/0)">>};
native(#{trace_status := #{recording := false, preloaded := false, attached := false,
                             attached_at := At}}) when is_integer(At) ->
    {unavailable, detached,
     <<"the tracker was detached and records nothing; mallocinfo_trace:attach() records again">>};
native(#{trace_status := #{recording := false}}) ->
    {unavailable, not_recording,
     <<"the interposer is loaded but this executable does not match MALLOCINFO_TRACE_EXE">>};
native(#{trace_status := #{mode := Mode}}) when Mode =:= off; Mode =:= counters ->
    {unavailable, {mode, Mode},
     <<"mallocinfo_trace:set_mode(full) records blocks allocated from then on">>};
native(#{trace_status := #{} = S, olds := Olds,
         rollup := #{functions := F, objects := O} = Rollup} = Raw)
  when is_list(Olds), is_list(F), is_list(O) ->
    %% The figures of one snapshot (the roll-ups', the oldest blocks'), not
    %% the tracker's counters read at another moment; `self' is what
    %% mallocinfo's own work allocated, never recorded (status/0).
    Base = maps:with([mode, dropped, table_bytes, stack_bytes, tables_bytes, tables_resident,
                      attached, attached_at, self], S),
    Live = #{live_bytes => maps:get(live_bytes, Rollup, maps:get(live_bytes, S, 0)),
             live_entries => maps:get(live_blocks, Rollup, maps:get(live_entries, S, 0))},
    Processes = maps:get(native_processes, Raw, []),
    maps:merge(maps:merge(Base, Live#{olds => Olds, processes => Processes,
                                      churn => churn_view(maps:get(churn, Raw, none))}),
               culprit_view(F, O, Raw));
native(#{trace_status := #{}, rollup := Error}) when not is_map(Error) ->
    unavailable(Error, <<"mallocinfo_trace:snapshot/0 failed">>);
native(#{trace_status := #{} = S, sites := Sites, olds := Olds})
  when is_list(Sites), is_list(Olds) ->
    (maps:with([mode, live_bytes, live_entries, dropped, table_bytes, stack_bytes, tables_bytes,
                tables_resident, attached, attached_at], S))#{sites => Sites, olds => Olds};
native(#{trace_status := #{}, sites := Error}) when not is_list(Error) ->
    unavailable(Error, <<"mallocinfo_trace:sites/2 failed">>);
native(#{trace_status := #{}, olds := Error}) ->
    unavailable(Error, <<"mallocinfo_trace:olds/2 failed">>);
native(#{trace_status := Error}) ->
    unavailable(Error, <<"mallocinfo_nif is needed">>);
native(_) ->
    {unavailable, no_tracker, <<"mallocinfo_nif is needed">>}.

%% @doc The native section's churn: the native functions that allocated
%% most since the tracker started or was reset (mallocinfo_trace:churn/2
%% by function; the VM's own malloc and mallocinfo's own left out), at
%% most ?TOP, each with its rate, temporary share and typical lifetime
%% (`median_ms', the bound of the bucket of the median freed block);
%% `none' without churn (an older interposer, the counters mode, an
%% error).
-spec churn_view(term()) -> [map()] | none.
churn_view({ok, Rows}) when is_list(Rows) ->
    [R#{median_ms => mallocinfo_trace_churn:median_lifetime_ms(L),
        temporary_percent => case C of 0 -> 0; _ -> T * 100 div C end}
     || #{label := native, lifetimes := L, temporary_count := T, freed_count := C} = R
            <- lists:sublist([X || #{label := native} = X <- Rows], ?TOP)];
churn_view(_) ->
    none.

%% @doc The native section's culprits from the roll-ups of one snapshot:
%% the top `native' functions and objects (the VM's own malloc and
%% mallocinfo's own allocations are left out of them and summed apart as
%% `erts_bytes'/`erts_blocks' and `self_bytes'/`self_blocks'), the growth
%% over the report's interval and the comparison with the previous report.
-spec culprit_view([map()], [map()], map()) -> map().
culprit_view(Functions, Objects, Raw) ->
    Sum = fun(Label, Key) -> lists:sum([maps:get(Key, R) || #{label := L} = R <- Functions,
                                                           L =:= Label]) end,
    #{functions => lists:sublist([R || #{label := native} = R <- Functions], ?FUNCTIONS),
      objects => lists:sublist([R || #{label := native} = R <- Objects], ?TOP),
      erts_bytes => Sum(erts, bytes), erts_blocks => Sum(erts, count),
      self_bytes => Sum(self, bytes), self_blocks => Sum(self, count),
      growth => growth_view(maps:get(growth, Raw, none)),
      previous => previous_view(maps:get(previous_run, Raw, undefined),
                                maps:get(this_run, Raw, undefined))}.

%% @doc The growth over a report's interval: the `native' call sites that
%% grew in every sample (at most 5), `leak' when the first grew by at
%% least 1 MiB, and what the VM's own malloc grew (`erts_growth').
-spec growth_view(term()) -> none | map() | mallocinfo_report:unavailable().
growth_view(#{growers := G} = M) when is_list(G) ->
    Native = [R || #{label := native} = R <- G],
    Leak = case Native of
               [#{growth_bytes := B} | _] -> B >= ?GROWTH_LEAK_BYTES;
               [] -> false
           end,
    M#{growers => lists:sublist(Native, ?TOP), leak => Leak,
       erts_growth => lists:sum([B || #{label := erts, growth_bytes := B} <- G])};
growth_view(none) -> none;
growth_view(Error) -> unavailable(Error, <<"a tracker snapshot failed during the interval">>).

%% @doc This report against the previous one on the node: how long ago
%% (`age_ms'), the tracker's live bytes since (`native_delta') and the
%% functions that grew most (`grew', at most 3, each with `object',
%% `function', `bytes_delta'). `none' for the first report.
-spec previous_view(map() | undefined, map() | undefined) -> none | map().
previous_view(#{monotonic_ms := T0, live_bytes := L0, functions := F0} = Prev,
              #{monotonic_ms := T1, live_bytes := L1, functions := F1}) ->
    Deltas = [{maps:get(K, F1, 0) - maps:get(K, F0, 0), K}
              || K <- lists:usort(maps:keys(F0) ++ maps:keys(F1))],
    Grew = [#{object => O, function => Fn, bytes_delta => D}
            || {D, {O, Fn}} <- lists:sublist(lists:reverse(lists:sort(Deltas)), 3), D > 0],
    #{age_ms => T1 - T0, time_ms => maps:get(time_ms, Prev, undefined),
      native_delta => L1 - L0, grew => Grew};
previous_view(_, _) ->
    none.

%%% Every layer's growth (issue 24) --------------------------------------------

%% The growth of every layer over the report's interval
%% (mallocinfo_layers_growth), `none' without one. The tracker's own
%% growth rule names native call sites: the native part is left to it.
layer_growth(#{layer_samples := [_, _ | _] = Samples}) ->
    mallocinfo_layers_growth:growth(Samples, #{exclude => [native]});
layer_growth(#{layer_samples := {error, _} = E}) ->
    unavailable(E, <<"sampling the layers failed during the interval">>);
layer_growth(_) ->
    none.

%%% Other allocator -----------------------------------------------------------

other_allocator(#{allocator := jemalloc} = Raw) ->
    case maps:get(jemalloc, Raw, undefined) of
        {ok, #{resident := Resident} = S} ->
            #{allocator => jemalloc, summary => S, resident => Resident};
        Other -> unavailable(Other, <<"mallocinfo_jemalloc:summary() is needed">>)
    end;
other_allocator(#{allocator := tcmalloc} = Raw) ->
    case maps:get(tcmalloc, Raw, undefined) of
        {ok, Text} when is_binary(Text) ->
            #{allocator => tcmalloc, stats => Text,
              resident => tcmalloc_figure(Text, <<"Actual memory used">>),
              allocated => tcmalloc_figure(Text, <<"Bytes in use by application">>)};
        Other ->
            unavailable(Other, <<"mallocinfo_tcmalloc:stats() is needed">>)
    end;
other_allocator(#{allocator := glibc}) ->
    none;
other_allocator(#{allocator := A}) ->
    {unavailable, {unsupported, A}, <<"no figures for this allocator">>};
other_allocator(_) ->
    none.

%% "MALLOC: =     123456 (    0.1 MiB) Actual memory used (physical + swap)"
tcmalloc_figure(Text, Label) ->
    Lines = [L || L <- binary:split(Text, <<"\n">>, [global]), binary:match(L, Label) =/= nomatch],
    case Lines of
        [L | _] ->
            case re:run(L, "MALLOC:\\s*[=+-]?\\s*([0-9]+)", [{capture, all_but_first, binary}]) of
                {match, [N]} -> binary_to_integer(N);
                nomatch -> undefined
            end;
        [] ->
            undefined
    end.

%%% Mapped memory (issue 14) -------------------------------------------------

%% @doc The tracker's live regions (mmap/mmap64/mremap through the
%% interposer, `regions' in the raw data) attributed by address: each
%% region lies in one anonymous mapping of smaps (the one holding its
%% start); its resident bytes (mincore) go to ERTS when the function that
%% called mmap is in the emulator (`beam*'), else to that function (its
%% symbol and object). Only regions in plain anonymous mappings (the `anon'
%% and `noreserve' groups) count: glibc's heaps and mmapped blocks are
%% never regions (glibc maps them without the mmap symbol), file mappings
%% are files. `{unavailable, ...}' without the tracker's regions.
%% Only on a node preloaded with the tracker recording (`sample' or
%% `full'): an attached tracker has not seen what was mapped before it.
-spec mappings(map()) -> map() | {unavailable, term(), binary()}.
mappings(#{trace_status := #{preloaded := true, mode := Mode}, regions := {ok, Regions},
           smaps := Vmas})
  when is_list(Vmas), (Mode =:= full orelse Mode =:= sample) ->
    Known = [R || #{start := _, length := _, resident := _} = R <- Regions],
    Kinds = mallocinfo_report_smaps:anon_kinds(Vmas, [S || #{start := S} <- Known]),
    Owned = [{owner(R), Kind, Res, L}
             || {#{length := L, resident := Res} = R, Kind} <- lists:zip(Known, Kinds),
                Kind =/= none],
    Sum = fun(F) -> lists:sum([Res || {_, _, Res, _} = O <- Owned, F(O)]) end,
    Sites = lists:foldl(fun({{site, Label}, _, Res, L}, Acc) ->
                                maps:update_with(Label, fun({C, B, M}) -> {C + 1, B + Res, M + L} end,
                                                 {1, Res, L}, Acc);
                           (_, Acc) -> Acc
                        end, #{}, Owned),
    #{erts => Sum(fun({O, _, _, _}) -> O =:= erts end),
      erts_mapped => lists:sum([L || {erts, _, _, L} <- Owned]),
      sites => lists:reverse(lists:keysort(3, [{Label, C, B, M} || {Label, {C, B, M}} <- maps:to_list(Sites)])),
      anon => Sum(fun({_, K, _, _}) -> K =:= anon end),
      noreserve => Sum(fun({_, K, _, _}) -> K =:= noreserve end),
      regions => length(Regions)};
mappings(#{regions := {error, Why}}) ->
    {unavailable, Why, <<"the tracker records mappings in sample and full modes">>};
mappings(_) ->
    {unavailable, no_regions,
     <<"a node preloaded with the tracker in sample or full mode attributes mappings">>}.

%% The emulator's own mappings (its carriers, the literal area) are ERTS's;
%% any other first frame names a call site.
owner(#{stack := [#{object := Obj, symbol := Sym} | _]}) ->
    Base = filename:basename(Obj),
    case Base of
        <<"beam", _/binary>> -> erts;
        _ -> {site, iolist_to_binary([case Sym of
                                            undefined -> <<"?">>;
                                            _ -> Sym
                                        end, " (", Base, ")"])}
    end;
owner(_) ->
    {site, <<"(no stack)">>}.

%%% Accounting ----------------------------------------------------------------

%% What each layer explains of the resident set. The kernel's grouping is
%% exact; the layers' figures are what each says it holds, and a layer
%% explains at most what is resident in the mappings it owns:
%%   files, JIT, stacks, special: what they are;
%%   glibc heaps ([heap] + arenas): up to libc's arena bytes (mallinfo arena);
%%   NORESERVE anonymous: up to the tracker's tables;
%%   other anonymous: libc's mmapped blocks, another allocator's resident
%%   bytes, then ERTS up to what it has mapped (carriers and mseg cache).
%% Whatever is left is unaccounted. ERTS's claim is bounded by a virtual
%% size, so the unaccounted figure is a lower bound: memory mapped behind
%% ERTS's back can hide in the part of ERTS's mappings that is not resident.
%% With the tracker's regions (mappings/1) the anonymous memory is split by
%% address first: ERTS's and each call site's regions are exact, libc's
%% mmapped blocks and another allocator claim what is left, and the rest
%% is unaccounted: an exact figure, no longer a lower bound. One sequence
%% of claims for both, so a new layer is added once.
account(#{resident := #{groups := G, rss := Rss}} = R) ->
    Rss_ = fun(K) -> maps:get(rss, maps:get(K, G)) end,
    #{heaps := Heaps, libc_arena := LibcArena, libc_mmap := LibcMmap, tracker := Tracker,
      other_alloc := OtherAlloc} = claims(R),
    %% With the tracker's regions the accounting is exact: they claim
    %% their bytes first, by address.
    Regions = regions(R, Rss_),
    Exact = Regions =/= none,
    {InAnon, InNr, ErtsRegions} = case Regions of
                                      none -> {0, 0, 0};
                                      Claimed -> Claimed
                                  end,
    Anon = Rss_(anon) - InAnon,
    NoReserve = Rss_(noreserve) - InNr,
    %% The tracker's tables are NORESERVE mappings. libc's mmapped blocks
    %% and another allocator's resident bytes are resident figures (jemalloc
    %% maps NORESERVE where the kernel overcommits, so it may claim either
    %% kind); ERTS's figure is what it mapped (virtual), so without regions
    %% ERTS takes what is left of the anonymous memory, up to that.
    TrackerPart = min(NoReserve, Tracker),
    MmapPart = min(Anon, LibcMmap),
    OtherFromNoReserve = min(NoReserve - TrackerPart, OtherAlloc),
    OtherFromAnon = min(Anon - MmapPart, OtherAlloc - OtherFromNoReserve),
    ErtsMmap = case maps:get(erts, R) of
                   #{mmap_bytes := EM} when is_integer(EM) -> EM;
                   _ -> 0
               end,
    ErtsFromAnon = case Exact of
                       false -> min(Anon - MmapPart - OtherFromAnon, ErtsMmap);
                       true -> 0
                   end,
    Sites = [{mapped_sites, InAnon + InNr - ErtsRegions} || Exact],
    Attributed = [{files, Rss_(files)}, {jit, Rss_(jit)}, {stacks, Rss_(stacks)},
                  {special, Rss_(special)},
                  {libc_heaps, min(Heaps, LibcArena)},
                  {tracker_tables, TrackerPart},
                  {erts_carriers, ErtsRegions + ErtsFromAnon}]
        ++ Sites ++
        [{libc_mmap, MmapPart},
         {other_allocator, OtherFromNoReserve + OtherFromAnon}],
    Mapped = lists:sum([Rss_(K) || K <- maps:keys(G)]),
    Unaccounted = max(0, Mapped - lists:sum([B || {_, B} <- Attributed])),
    ExactKeys = case Exact of
                    true -> #{mapped_sites => maps:get(sites, maps:get(mappings, R)),
                              exact => true};
                    false -> #{}
                end,
    ExactKeys#{attributed => Attributed,
               %% Anonymous memory (not NORESERVE, not glibc heaps) nothing
               %% claims.
               anon_unclaimed => Anon - MmapPart - OtherFromAnon - ErtsFromAnon,
               %% What the other allocator (and the regions) claim of the
               %% NORESERVE memory.
               noreserve_other => OtherFromNoReserve + InNr,
               %% How much of ERTS's claim is not backed by resident memory:
               %% up to this much of what is unaccounted could be hidden in
               %% it (none when the regions say where ERTS's memory is).
               erts_slack_bytes => case Exact of
                                       false -> max(0, ErtsMmap - ErtsFromAnon);
                                       true -> 0
                                   end,
               unaccounted_bytes => Unaccounted,
               unaccounted_percent => percent(Unaccounted, Mapped),
               rss_for_accounting => Mapped,
               headline_rss => Rss};
account(_) ->
    #{attributed => [], anon_unclaimed => undefined, erts_slack_bytes => undefined,
      unaccounted_bytes => undefined, unaccounted_percent => undefined}.

%% The tracker's regions' resident bytes in the anonymous and NORESERVE
%% groups, capped by their Rss (mincore reads them a moment after smaps),
%% and ERTS's part of them; `none' without regions (mappings/1).
regions(#{mappings := #{erts := Erts, anon := Anon, noreserve := NoReserve}}, Rss_) ->
    InAnon = min(Rss_(anon), Anon),
    InNr = min(Rss_(noreserve), NoReserve),
    {InAnon, InNr, min(InAnon + InNr, Erts)};
regions(_, _) ->
    none.

%% What each layer says it holds: the glibc heaps' resident bytes and
%% libc's, the tracker's and another allocator's own figures (0 where a
%% layer has none).
claims(#{resident := #{groups := G}} = R) ->
    Rss_ = fun(K) -> maps:get(rss, maps:get(K, G)) end,
    #{heaps => Rss_(main_heap) + Rss_(arenas),
      libc_arena => case maps:get(libc, R) of #{system_bytes := S} -> S; _ -> 0 end,
      libc_mmap => case maps:get(libc, R) of #{mmap_bytes := M} -> M; _ -> 0 end,
      tracker => mallocinfo_report_verdicts:tracker_reserved(maps:get(native, R)),
      other_alloc => case maps:get(other_allocator, R) of
                         #{resident := OR} when is_integer(OR) -> OR;
                         _ -> 0
                     end}.

percent(_, 0) -> 0.0;
percent(Part, Whole) -> round(Part * 1000 / Whole) / 10.
