%% @doc The allocation tracker: who allocated the native memory that is
%% still live, grouped by call site, from the running node.
%%
%% Needs the interposer `priv/libmallocinfo_preload.so': in `LD_PRELOAD' when
%% the node starts (see {@link preload_env/0} and README "Tracking
%% allocations"), or loaded into the running node by {@link attach/0}
%% (README "Attach without restart"). Without either, every call but
%% {@link status/0}, {@link attach/0}, {@link preload_path/0} and
%% {@link preload_env/0} returns `{error, not_preloaded}'. Queries walk the live table on dirty schedulers
%% and never stall allocating threads (the table is lock-free).
-module(mallocinfo_trace).

-export([status/0, set_mode/1, olds/1, olds/2, sites/1, sites/2, mappings/1, mappings/2,
         heap_profile/0, stats/0,
         reset/0, reclaim/0, preload_path/0, preload_env/0, preload_env/1, attach/0, attach/1, detach/0]).

-export_type([mode/0, frame/0, old/0, site/0, mapping/0]).

-type posix() :: file:posix().

-type mode() :: full | sample | counters | off.
-type frame() :: #{address := non_neg_integer(),
                   object := binary(),
                   symbol := binary() | undefined,
                   offset := non_neg_integer()}.
-type old() :: #{address := non_neg_integer(),
                 size := non_neg_integer(),
                 age_ms := non_neg_integer(),
                 stack := [frame()],
                 estimated := boolean()}.
-type site() :: #{stack := [frame()],
                  count := non_neg_integer(),
                  bytes := non_neg_integer(),
                  oldest_age_ms := non_neg_integer(),
                  estimated := boolean()}.
-type mapping() :: #{stack := [frame()],
                     count := non_neg_integer(),
                     bytes := non_neg_integer(),
                     resident := non_neg_integer(),
                     flags := [anonymous | private_file | shared | no_access | remapped],
                     oldest_age_ms := non_neg_integer()}.
-type opts() :: #{demangle => boolean(), min_age_ms => non_neg_integer(),
                  min_size => non_neg_integer()}
              | [demangle | {demangle, boolean()} | {min_age_ms, non_neg_integer()}
                 | {min_size, non_neg_integer()}].

-type attach_error() :: preloaded | already_attached
                      | {unsupported, atom() | {atom(), binary()}}
                      | {load_failed, binary()} | posix().

-define(PRELOAD_SO, "libmallocinfo_preload.so").

%% @doc What the tracker is doing. Always succeeds: `preloaded => false'
%% when the interposer was not preloaded; `attached => true' between
%% {@link attach/0} and {@link detach/0}, `attached_at' the time of the last
%% attach (`erlang:system_time(millisecond)' units, `undefined' if never)
%% and `attach' its figures (`objects', `slots' patched, `slots_foreign'
%% left alone, `data_pointers', `attach_us'); `recording => false' when the
%% interposer is preloaded but this executable did not match
%% `MALLOCINFO_TRACE_EXE'.
%% Other keys (with the interposer): `table_capacity', `table_bytes',
%% `live_entries', `live_bytes', `dropped' (allocations the full table
%% could not record), `stacks' (distinct call stacks stored now),
%% `stack_capacity', `stack_bytes', `stacks_dropped' (allocations recorded
%% without a stack because the stack table had no room), `stacks_reclaimed'
%% (stacks freed because no live block used them any more), `stack_sweeps'
%% (reclamation passes done), `stack_depth', `sample_bytes', `unwinder'
%% (`cached': lock-free CFI rules cached per thread; `libunwind' only from
%% interposers older than this one, started with `MALLOCINFO_UNWIND=libunwind'),
%% `frees_untracked', `bytes_allocated', `bytes_freed', `calls' (per function).
-spec status() -> #{preloaded := boolean(), recording := boolean(), mode := mode(),
                    atom() => term()}.
status() ->
    mallocinfo_nif:trace_status().

%% @doc Switches the recording mode at run time. Switching to `off' forgets
%% the live table (frees are not seen while off); switching back on starts
%% from an empty table. `{error, not_recording}' when the interposer is
%% loaded but this executable did not match `MALLOCINFO_TRACE_EXE'.
-spec set_mode(mode()) -> ok | {error, not_preloaded | not_recording}.
set_mode(Mode) when Mode =:= full; Mode =:= sample; Mode =:= counters; Mode =:= off ->
    mallocinfo_nif:trace_set_mode(Mode);
set_mode(Mode) ->
    erlang:error(badarg, [Mode]).

%% @equiv olds(N, #{})
-spec olds(non_neg_integer()) -> [old()] | {error, not_preloaded | not_recording | eagain}.
olds(N) ->
    olds(N, #{}).

%% @doc The `N' oldest live blocks, oldest first, each with its size, age
%% and allocation stack. `Opts': `demangle' (C++ names), `min_age_ms',
%% `min_size' (bytes). A block whose call stack could not be stored has
%% `stack => []'. `{error, eagain}' (in theory only) when so many stacks
%% were reclaimed while it ran that a stack id could have been reused,
%% three times in a row (README, "Tracking allocations").
-spec olds(non_neg_integer(), opts()) ->
          [old()] | {error, not_preloaded | not_recording | eagain}.
olds(N, Opts) when is_integer(N), N >= 0 ->
    #{demangle := D, min_age_ms := Age, min_size := Size} =
        options(Opts, [demangle, min_age_ms, min_size], [N, Opts]),
    unwrap(mallocinfo_nif:trace_olds(N, Age, Size, D));
olds(N, Opts) ->
    erlang:error(badarg, [N, Opts]).

%% @equiv sites(N, #{})
-spec sites(non_neg_integer()) -> [site()] | {error, not_preloaded | not_recording | eagain}.
sites(N) ->
    sites(N, #{}).

%% @doc Live blocks grouped by allocation stack, largest total first: the
%% call sites holding memory now. In `sample' mode (or for blocks recorded
%% while sampling) `count' and `bytes' are unbiased estimates and the site
%% says `estimated => true'. `Opts': `demangle'. One call site is one row,
%% even when the tracker stored its stack twice (two threads meeting on a
%% new stack); blocks without a stored stack form one row with
%% `stack => []'. Only the `N' stacks returned are symbolized. `{error,
%% eagain}' as for {@link olds/2}.
-spec sites(non_neg_integer(), opts()) ->
          [site()] | {error, not_preloaded | not_recording | eagain}.
sites(N, Opts) when is_integer(N), N >= 0 ->
    #{demangle := D} = options(Opts, [demangle], [N, Opts]),
    unwrap(mallocinfo_nif:trace_sites(N, D));
sites(N, Opts) ->
    erlang:error(badarg, [N, Opts]).

%% @equiv mappings(N, #{})
-spec mappings(non_neg_integer()) ->
          [mapping()] | {error, not_preloaded | not_recording | enotsup}.
mappings(N) ->
    mappings(N, #{}).

%% @doc Live memory mappings made through `mmap'/`mmap64' (and moved or
%% resized by `mremap') while the tracker recorded, grouped by the call
%% stack that mapped them, largest first: what a NIF or library mapped
%% itself (its own arenas, caches, ring buffers), and ERTS's carriers.
%% `bytes' is what is mapped, `resident' what of it is in memory now
%% (`mincore(2)'), `flags' the union of the group's kinds (`anonymous',
%% `private_file', `shared' (counted, flagged), `no_access' (mapped
%% `PROT_NONE': a reservation), `remapped' (moved or resized since)).
%% glibc's own mappings (malloc's large blocks and arenas) are not here:
%% they are malloc's, seen by {@link sites/2}. `Opts': `demangle', and `by'
%% (`stack', the default: one row per call stack). Regions are recorded in
%% `sample' and `full' modes (all of them: they are few); `counters' mode
%% only counts calls (`mappings' in {@link status/0}). `{error, enotsup}'
%% from an interposer older than this function.
-spec mappings(non_neg_integer(), opts() | #{by => stack}) ->
          [mapping()] | {error, not_preloaded | not_recording | enotsup}.
mappings(N, Opts) when is_integer(N), N >= 0, N < 1 bsl 64, is_map(Opts) ->
    By = case maps:get(by, Opts, stack) of
             stack -> stack;
             _ -> erlang:error(badarg, [N, Opts])
         end,
    #{demangle := D} = options(maps:remove(by, Opts), [demangle], [N, Opts]),
    case mallocinfo_nif:trace_regions(D) of
        {ok, Regions} -> lists:sublist(rollup(By, Regions), N);
        {error, _} = E -> E
    end;
mappings(N, Opts) when is_integer(N), N >= 0, N < 1 bsl 64, is_list(Opts) ->
    Map = try maps:from_list([case O of
                                  demangle -> {demangle, true};
                                  {K, V} -> {K, V}
                              end || O <- Opts])
          catch error:_ -> erlang:error(badarg, [N, Opts])
          end,
    mappings(N, Map);
mappings(N, Opts) ->
    erlang:error(badarg, [N, Opts]).

%% @doc Every live call site as a heap profile in the legacy gperftools
%% text format (`heap profile: ...', one line per site with raw return
%% addresses, then `MAPPED_LIBRARIES:' and this process's
%% `/proc/self/maps'), which `jeprof --text', `google-pprof --text' and
%% `pprof' read and symbolize themselves: give them the emulator
%% (`beam.smp') as the program. In `sample' mode the figures are the same
%% unbiased estimates {@link sites/1} gives. The file is built in memory;
%% nothing is written to disk.
-spec heap_profile() ->
          {ok, binary()} | {error, not_preloaded | not_recording | eagain | posix()}.
heap_profile() ->
    case mallocinfo_nif:trace_profile() of
        {ok, Sites} ->
            %% Read after the snapshot, so every object a stack points
            %% into is mapped (unless unloaded in between).
            case file:read_file("/proc/self/maps") of
                {ok, Maps} -> {ok, iolist_to_binary(mallocinfo_pprof:heap_profile(Sites, Maps))};
                {error, _} = E -> E
            end;
        {error, _} = E ->
            E
    end.

%% @doc Call counters per interposed function, bytes allocated and freed,
%% live tracked bytes and entries, dropped, plus `mallinfo2()' under
%% `mallinfo' (`{error, {wrong_allocator, Which}}' there when the interposer
%% forwards to another allocator than glibc, see
%% {@link mallocinfo:allocator/0}).
-spec stats() -> map() | {error, not_preloaded}.
stats() ->
    case status() of
        #{preloaded := false, attached_at := undefined} ->
            {error, not_preloaded};
        Status ->
            Keys = [mode, recording, calls, bytes_allocated, bytes_freed, live_bytes,
                    live_entries, dropped, frees_untracked, stacks],
            (maps:with(Keys, Status))#{mallinfo => mallocinfo:mallinfo()}
    end.

%% @doc Forgets every recorded live block (e.g. after start-up, to see only
%% what is allocated from now on), then frees every stored call stack (as
%% {@link reclaim/0}). Returns how many blocks were forgotten.
-spec reset() -> non_neg_integer() | {error, not_preloaded | not_recording}.
reset() ->
    unwrap(mallocinfo_nif:trace_reset()).

%% @equiv attach(#{})
-spec attach() -> ok | {error, attach_error()}.
attach() ->
    attach(#{}).

%% @doc Loads the tracker into this running node, without `LD_PRELOAD' and
%% without a restart: the interposer is `dlopen'ed from `priv/' and the
%% malloc family of every loaded object (the emulator, NIFs, drivers,
%% libcrypto...) is redirected to it; objects loaded later are redirected
%% as they load. Blocks allocated before are not seen (their frees are
%% counted in `frees_untracked'). `Opts' (a map): `mode' (`full' |
%% `sample' | `counters', default `full'), `sample_bytes' (1..2^40, default
%% 512 KiB), `table_size' (64..2^32, default 2 Mi entries),
%% `stack_table_size' (64..2^28, default 64 Ki), `stack_depth' (1..128,
%% default 32): the environment knobs' meaning. The sizes apply to the
%% first attach of the node only (the tables then stay); a later attach
%% forgets what was recorded. Errors: `preloaded' (the tracker is already
%% there), `already_attached', `{unsupported, What}' (`static_allocator',
%% `elf_layout', `too_many_slots', `libc', `arch', or `{What, Object}'),
%% `{load_failed, Message}', or a POSIX atom (`eacces' when a slot could
%% not be written). A failed attach leaves every slot as it was.
-spec attach(map()) -> ok | {error, attach_error()}.
attach(Opts) when is_map(Opts) ->
    Allowed = #{mode => {one_of, [full, sample, counters]},
                sample_bytes => {range, 1, 1 bsl 40},
                table_size => {range, 64, 1 bsl 32},
                stack_table_size => {range, 64, 1 bsl 28},
                stack_depth => {range, 1, 128}},
    case maps:keys(Opts) -- maps:keys(Allowed) of
        [] -> ok;
        _ -> erlang:error(badarg, [Opts])
    end,
    maps:foreach(fun(K, V) -> env_value(V, maps:get(K, Allowed), Opts) end, Opts),
    O = maps:merge(#{mode => full, sample_bytes => 512 * 1024, table_size => 1 bsl 21,
                     stack_table_size => 1 bsl 16, stack_depth => 32}, Opts),
    mallocinfo_nif:trace_attach(maps:get(mode, O), maps:get(sample_bytes, O),
                                maps:get(table_size, O), maps:get(stack_table_size, O),
                                maps:get(stack_depth, O));
attach(Opts) ->
    erlang:error(badarg, [Opts]).

%% @doc Puts every slot {@link attach/0} changed back. Nothing new is
%% recorded after; what was recorded stays readable ({@link sites/1},
%% {@link olds/1}, the report) until {@link reset/0} or the next attach.
%% The tracker's code stays loaded (a thread may still be inside a hook).
-spec detach() -> ok | {error, not_attached}.
detach() ->
    mallocinfo_nif:trace_detach().

%% @doc Frees every stored call stack that no live block uses any more, now,
%% and returns how many. The tracker also does this by itself as its stack
%% table fills (see `stacks_reclaimed' and `stack_sweeps' in
%% {@link status/0}); this call is for tests and for an operator who wants
%% the table compact before a long quiet period. It waits (on a dirty
%% scheduler, up to 5 s) while other `sites'/`olds'/`heap_profile' calls
%% are reading stacks. `{error, enotsup}' when the preloaded interposer is
%% older than this function.
-spec reclaim() -> non_neg_integer() | {error, not_preloaded | not_recording | enotsup}.
reclaim() ->
    unwrap(mallocinfo_nif:trace_reclaim()).

%% @doc Absolute path of the interposer shared object.
-spec preload_path() -> file:filename().
preload_path() ->
    filename:join(filename:dirname(mallocinfo_nif:so_path()), ?PRELOAD_SO).

%% @equiv preload_env(#{})
-spec preload_env() -> [{string(), string()}].
preload_env() ->
    preload_env(#{}).

%% @doc Environment for a node that should be tracked: for `peer:start/1'
%% (`env'), a release's `env.sh', or a shell. `Opts': `mode' (`full' |
%% `sample' | `counters' | `off'), `table_size' (64..2^32 entries),
%% `stack_table_size' (64..2^28), `sample_bytes' (1..2^40), `stack_depth'
%% (1..128), `exe' (the `MALLOCINFO_TRACE_EXE' glob, a string), `unwind'
%% (`cached', the only unwinder: `libunwind' is gone, it could deadlock the
%% node). Anything else raises `badarg'.
-spec preload_env(map()) -> [{string(), string()}].
preload_env(Opts) when is_map(Opts) ->
    Knobs = [{mode, "MALLOCINFO_TRACE", {one_of, [full, sample, counters, off]}},
             {table_size, "MALLOCINFO_TABLE_SIZE", {range, 64, 1 bsl 32}},
             {stack_table_size, "MALLOCINFO_STACK_TABLE_SIZE", {range, 64, 1 bsl 28}},
             {sample_bytes, "MALLOCINFO_SAMPLE_BYTES", {range, 1, 1 bsl 40}},
             {stack_depth, "MALLOCINFO_STACK_DEPTH", {range, 1, 128}},
             {exe, "MALLOCINFO_TRACE_EXE", glob},
             {unwind, "MALLOCINFO_UNWIND", {one_of, [cached]}}],
    case maps:keys(Opts) -- [K || {K, _, _} <- Knobs] of
        [] -> ok;
        _ -> erlang:error(badarg, [Opts])
    end,
    [{"LD_PRELOAD", preload_path()}
     | [{Var, env_value(maps:get(K, Opts), Check, Opts)}
        || {K, Var, Check} <- Knobs, maps:is_key(K, Opts)]];
preload_env(Opts) ->
    erlang:error(badarg, [Opts]).

%%% ---------------------------------------------------------------------------

env_value(V, {one_of, Allowed}, Opts) ->
    case lists:member(V, Allowed) of
        true -> atom_to_list(V);
        false -> erlang:error(badarg, [Opts])
    end;
env_value(V, {range, Min, Max}, _) when is_integer(V), V >= Min, V =< Max ->
    integer_to_list(V);
env_value(V, glob, Opts) when is_list(V), V =/= [] ->
    case io_lib:printable_latin1_list(V) of
        true -> V;
        false -> erlang:error(badarg, [Opts])
    end;
env_value(_, _, Opts) ->
    erlang:error(badarg, [Opts]).

%% Regions (mallocinfo_nif:trace_regions/1) to mapping() rows, largest
%% first. `stack': one row per call stack (frames compared by address).
rollup(stack, Regions) ->
    Groups = lists:foldl(
               fun(#{stack := Stack} = R, Acc) ->
                       Key = [A || #{address := A} <- Stack],
                       maps:update_with(Key, fun(Row) -> add_region(R, Row) end,
                                        add_region(R, #{stack => Stack, count => 0, bytes => 0,
                                                        resident => 0, flags => [],
                                                        oldest_age_ms => 0}),
                                        Acc)
               end, #{}, Regions),
    lists:sort(fun(#{bytes := A}, #{bytes := B}) -> A >= B end, maps:values(Groups)).

add_region(#{length := L, resident := Res, flags := F, age_ms := Age},
           #{count := C, bytes := B, resident := R0, flags := F0, oldest_age_ms := O} = Row) ->
    Row#{count := C + 1, bytes := B + L, resident := R0 + Res,
         flags := lists:usort(F ++ F0), oldest_age_ms := max(O, Age)}.

unwrap({ok, V}) -> V;
unwrap({error, _} = E) -> E.

options(Opts, Allowed, Args) when is_list(Opts) ->
    Map = try maps:from_list([case O of
                                  demangle -> {demangle, true};
                                  {K, V} -> {K, V}
                              end || O <- Opts])
          catch error:_ -> erlang:error(badarg, Args)
          end,
    options(Map, Allowed, Args);
options(Opts, Allowed, Args) when is_map(Opts) ->
    case maps:keys(Opts) -- Allowed of
        [] -> ok;
        _ -> erlang:error(badarg, Args)
    end,
    Defaults = #{demangle => false, min_age_ms => 0, min_size => 0},
    Merged = maps:merge(maps:with(Allowed, Defaults), Opts),
    maps:foreach(fun(demangle, V) when is_boolean(V) -> ok;
                    (K, V) when K =/= demangle, is_integer(V), V >= 0 -> ok;
                    (_, _) -> erlang:error(badarg, Args)
                 end, Merged),
    Merged;
options(_, _, Args) ->
    erlang:error(badarg, Args).
