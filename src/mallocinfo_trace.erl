%% @doc The allocation tracker: who allocated the native memory that is
%% still live, grouped by call site, from the running node.
%%
%% Needs the interposer `priv/libmallocinfo_preload.so' in `LD_PRELOAD' when
%% the node starts (see {@link preload_env/0} and README "Tracking
%% allocations"). Without it every call but {@link status/0},
%% {@link preload_path/0} and {@link preload_env/0} returns
%% `{error, not_preloaded}'. Queries walk the live table on dirty schedulers
%% and never stall allocating threads (the table is lock-free).
-module(mallocinfo_trace).

-export([status/0, set_mode/1, olds/1, olds/2, sites/1, sites/2, heap_profile/0, stats/0,
         reset/0, preload_path/0, preload_env/0, preload_env/1]).

-export_type([mode/0, frame/0, old/0, site/0]).

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
-type opts() :: #{demangle => boolean(), min_age_ms => non_neg_integer(),
                  min_size => non_neg_integer()}
              | [demangle | {demangle, boolean()} | {min_age_ms, non_neg_integer()}
                 | {min_size, non_neg_integer()}].

-define(PRELOAD_SO, "libmallocinfo_preload.so").

%% @doc What the tracker is doing. Always succeeds: `preloaded => false'
%% when the interposer is not in this process; `recording => false' when it
%% is, but this executable did not match `MALLOCINFO_TRACE_EXE'.
%% Other keys (with the interposer): `table_capacity', `table_bytes',
%% `live_entries', `live_bytes', `dropped' (allocations the full table
%% could not record), `stacks', `stack_capacity', `stack_bytes',
%% `stacks_dropped', `stack_depth', `sample_bytes', `unwinder'
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
-spec olds(non_neg_integer()) -> [old()] | {error, not_preloaded | not_recording}.
olds(N) ->
    olds(N, #{}).

%% @doc The `N' oldest live blocks, oldest first, each with its size, age
%% and allocation stack. `Opts': `demangle' (C++ names), `min_age_ms',
%% `min_size' (bytes).
-spec olds(non_neg_integer(), opts()) -> [old()] | {error, not_preloaded | not_recording}.
olds(N, Opts) when is_integer(N), N >= 0 ->
    #{demangle := D, min_age_ms := Age, min_size := Size} =
        options(Opts, [demangle, min_age_ms, min_size], [N, Opts]),
    unwrap(mallocinfo_nif:trace_olds(N, Age, Size, D));
olds(N, Opts) ->
    erlang:error(badarg, [N, Opts]).

%% @equiv sites(N, #{})
-spec sites(non_neg_integer()) -> [site()] | {error, not_preloaded | not_recording}.
sites(N) ->
    sites(N, #{}).

%% @doc Live blocks grouped by allocation stack, largest total first: the
%% call sites holding memory now. In `sample' mode (or for blocks recorded
%% while sampling) `count' and `bytes' are unbiased estimates and the site
%% says `estimated => true'. `Opts': `demangle'.
-spec sites(non_neg_integer(), opts()) -> [site()] | {error, not_preloaded | not_recording}.
sites(N, Opts) when is_integer(N), N >= 0 ->
    #{demangle := D} = options(Opts, [demangle], [N, Opts]),
    unwrap(mallocinfo_nif:trace_sites(N, D));
sites(N, Opts) ->
    erlang:error(badarg, [N, Opts]).

%% @doc Every live call site as a heap profile in the legacy gperftools
%% text format (`heap profile: ...', one line per site with raw return
%% addresses, then `MAPPED_LIBRARIES:' and this process's
%% `/proc/self/maps'), which `jeprof --text', `google-pprof --text' and
%% `pprof' read and symbolize themselves: give them the emulator
%% (`beam.smp') as the program. In `sample' mode the figures are the same
%% unbiased estimates {@link sites/1} gives. The file is built in memory;
%% nothing is written to disk.
-spec heap_profile() -> {ok, binary()} | {error, not_preloaded | not_recording | posix()}.
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
        #{preloaded := false} ->
            {error, not_preloaded};
        Status ->
            Keys = [mode, recording, calls, bytes_allocated, bytes_freed, live_bytes,
                    live_entries, dropped, frees_untracked, stacks],
            (maps:with(Keys, Status))#{mallinfo => mallocinfo:mallinfo()}
    end.

%% @doc Forgets every recorded live block (e.g. after start-up, to see only
%% what is allocated from now on). Returns how many were forgotten.
-spec reset() -> non_neg_integer() | {error, not_preloaded | not_recording}.
reset() ->
    unwrap(mallocinfo_nif:trace_reset()).

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
%% `stack_table_size' (64..2^30), `sample_bytes' (1..2^40), `stack_depth'
%% (1..128), `exe' (the `MALLOCINFO_TRACE_EXE' glob, a string), `unwind'
%% (`cached', the only unwinder: `libunwind' is gone, it could deadlock the
%% node). Anything else raises `badarg'.
-spec preload_env(map()) -> [{string(), string()}].
preload_env(Opts) when is_map(Opts) ->
    Knobs = [{mode, "MALLOCINFO_TRACE", {one_of, [full, sample, counters, off]}},
             {table_size, "MALLOCINFO_TABLE_SIZE", {range, 64, 1 bsl 32}},
             {stack_table_size, "MALLOCINFO_STACK_TABLE_SIZE", {range, 64, 1 bsl 30}},
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
