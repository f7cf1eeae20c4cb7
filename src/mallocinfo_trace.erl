%% @doc The allocation tracker: who allocated the native memory that is
%% still live, grouped by call site, from the running node.
%%
%% Needs the interposer `priv/libmallocinfo_preload.so': in `LD_PRELOAD' when
%% the node starts (see {@link preload_env/0} and doc/tracking.md), or loaded into the running node by {@link attach/0}
%% (doc/attach.md). Without either, every call but
%% {@link status/0}, {@link attach/0}, {@link preload_path/0} and
%% {@link preload_env/0} returns `{error, not_preloaded}'. Queries walk the live table on dirty schedulers
%% and never stall allocating threads (the table is lock-free). They
%% return `{ok, Value}' or `{error, Reason}' (README, "Results and
%% errors"); {@link diff/2} and {@link growth_of/1}, pure functions of
%% snapshots in hand, their value.
-module(mallocinfo_trace).

-export([status/0, set_mode/1, olds/1, olds/2, sites/1, sites/2, churn/1, churn/2, mappings/1, mappings/2, heap_profile/0, stats/0,
         pprof/0, pprof/1, folded/0, folded/1, profile_data/1,
         snapshot/0, snapshot/1, diff/2, diff/3, growth/2, growth/3, growth_of/1, growth_of/2,
         reset/0, reclaim/0, preload_path/0, preload_env/0, preload_env/1, attach/0, attach/1, detach/0]).

-export([knobs/0]).

-export_type([process_row/0, function_row/0, erlang_function/0]).
-export_type([mode/0, frame/0, old/0, site/0, profile_opts/0, snapshot/0, change/0, grower/0,
              rollup/0, mapping/0, churn_row/0]).

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
                 erlang => [erlang_function()],
                 estimated := boolean()}.
-type site() :: #{stack := [frame()],
                  erlang => [erlang_function()],
                  thread => binary(),
                  count := non_neg_integer(),
                  bytes := non_neg_integer(),
                  oldest_age_ms := non_neg_integer(),
                  estimated := boolean()}.
-type label() :: native | erts | self.
-type churn_row() :: #{stack => [frame()], erlang => [erlang_function()], thread => binary(),
                       culprit => frame() | undefined,
                       object => binary() | undefined, function => binary() | undefined,
                       frame => frame(), stacks => pos_integer(),
                       label := label(),
                       allocated_count := non_neg_integer(),
                       allocated_bytes := non_neg_integer(),
                       freed_count := non_neg_integer(),
                       freed_bytes := non_neg_integer(),
                       temporary_count := non_neg_integer(),
                       short_lived_count := non_neg_integer(),
                       allocated_per_s := non_neg_integer(),
                       allocated_bytes_per_s := non_neg_integer(),
                       since_ms := non_neg_integer(),
                       lifetimes := [{pos_integer() | infinity, non_neg_integer()}],
                       estimated := boolean()}.
-type process_row() :: #{pid := pid(), name := term(), count := non_neg_integer(),
                         bytes := non_neg_integer(), estimated := boolean()}.
-type function_row() :: #{module := atom(), function := atom(), arity := arity(),
                          count := non_neg_integer(), bytes := non_neg_integer(),
                          estimated := boolean()}.
-type snapshot() :: mallocinfo_trace_growth:snapshot().
-type change() :: #{stack := [frame()], count := non_neg_integer(), bytes := non_neg_integer(),
                    count_delta := integer(), bytes_delta := integer(),
                    change := appeared | vanished | changed, estimated := boolean(),
                    culprit := frame() | undefined, label := label(),
                    erlang := [erlang_function()], thread => binary()}.
-type grower() :: #{stack := [frame()], count := non_neg_integer(), bytes := non_neg_integer(),
                    growth_bytes := pos_integer(), rate := non_neg_integer(),
                    samples := pos_integer(), estimated := boolean(),
                    culprit := frame() | undefined, label := label(),
                    erlang := [erlang_function()], thread => binary()}.
-type rollup() :: #{label := label(), object := binary() | undefined,
                    function => binary() | undefined, frame => frame(),
                    count := non_neg_integer(), bytes := non_neg_integer(),
                    stacks := pos_integer(), estimated := boolean(),
                    erlang => [{erlang_function(), non_neg_integer()}]}.
%% An Erlang function of a mixed stack (sites/2 `erlang', innermost first).
-type erlang_function() :: #{module := atom(), function := atom(), arity := arity()}.
-type mapping() :: #{stack => [frame()],
                     label => label(), object => binary() | undefined,
                     function => binary() | undefined, frame => frame(),
                     count := non_neg_integer(),
                     bytes := non_neg_integer(),
                     resident := non_neg_integer(),
                     flags := [anonymous | private_file | shared | no_access | remapped],
                     oldest_age_ms := non_neg_integer()}.
-type opts() :: #{demangle => boolean(), min_age_ms => non_neg_integer(),
                  min_size => non_neg_integer(), max_age_ms => non_neg_integer()}
              | [demangle | {demangle, boolean()} | {min_age_ms, non_neg_integer()}
                 | {min_size, non_neg_integer()}].

-type profile_opts() :: #{demangle => boolean(), seconds => 1..300, profile => heap | allocs}.

-type attach_error() :: preloaded | already_attached
                      | {unsupported, atom() | {atom(), binary()}}
                      | {load_failed, binary()} | posix().

-define(PRELOAD_SO, "libmallocinfo_preload.so").
%% The longest delta profile window: a caller (an HTTP request) waits that
%% long for its answer.
-define(MAX_DELTA_S, 300).

%% @doc What the tracker is doing. Always succeeds: `preloaded => false'
%% when the interposer was not preloaded; `attached => true' between
%% {@link attach/0} and {@link detach/0}, `attached_at' the time of the last
%% attach (`erlang:system_time(millisecond)' units, `undefined' if never)
%% and `attach' its figures (`objects', `slots' and `data_pointers' holding
%% a hook now, as counted at the last attach, detach or `dlopen';
%% `slots_foreign' left alone, `attach_us'); `recording => false' (and
%% `mode => off') when the interposer is preloaded but this executable did
%% not match `MALLOCINFO_TRACE_EXE', and after {@link detach/0}.
%% Other keys (with the interposer): `table_capacity', `table_bytes',
%% `live_entries', `live_bytes', `dropped' (allocations the full table
%% could not record), `stacks' (distinct call stacks stored now),
%% `stack_capacity', `stack_bytes', `tables_bytes' (what all the tracker's
%% tables reserved: live, stack and churn tables, thread states, regions;
%% 0 from older interposers), `tables_resident' (what they keep resident
%% now, by table: `#{live, stacks, churn, threads}', the last the thread
%% states with their unwind caches; pages of their own, from
%% `/proc/self/pagemap'; `undefined' from older interposers),
%% `stacks_dropped' (allocations recorded
%% without a stack because the stack table had no room), `stacks_reclaimed'
%% (stacks freed because no live block used them any more), `stack_sweeps'
%% (reclamation passes done), `stack_depth', `sample_bytes', `unwinder'
%% (`cached': lock-free CFI rules cached per thread; `libunwind' only from
%% interposers older than this one, started with `MALLOCINFO_UNWIND=libunwind'),
%% `frees_untracked', `bytes_allocated', `bytes_freed' (full mode: requested
%% bytes of recorded blocks, so that their difference is `live_bytes';
%% counters mode: usable bytes of every call; doc/tracking.md), `calls'
%% (per function), `mappings' (the mmap family), and `self': what
%% mallocinfo's own work allocated and mapped, which the tracker never
%% records (`#{calls, bytes, mmaps, bytes_mapped}').
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
-spec olds(non_neg_integer()) -> {ok, [old()]} | {error, not_preloaded | not_recording | eagain}.
olds(N) ->
    olds(N, #{}).

%% @doc The `N' oldest live blocks, oldest first, each with its size, age
%% and allocation stack. `Opts': `demangle' (C++ names), `min_age_ms',
%% `min_size' (bytes), `max_age_ms' (leave out older blocks: the report
%% leaves out the node's start-up this way). A block whose call stack could not be stored has
%% `stack => []'. `{error, eagain}' (in theory only) when so many stacks
%% were reclaimed while it ran that a stack id could have been reused,
%% three times in a row (doc/tracking.md).
%% With `snapshot => S' (a {@link snapshot/1} taken with `olds') the
%% blocks are that snapshot's oldest (its first `N'), so they agree with
%% its sites and totals; `demangle' is then the only other option.
-spec olds(non_neg_integer(), opts() | #{snapshot => snapshot(), demangle => boolean()}) ->
          {ok, [old()]} | {error, not_preloaded | not_recording | eagain}.
olds(N, #{snapshot := S} = Opts) when is_integer(N), N >= 0, N < 1 bsl 64 ->
    #{demangle := D} = options(maps:remove(snapshot, Opts), [demangle], [N, Opts]),
    case S of
        #{mallocinfo_snapshot := 1, olds := Olds} when is_list(Olds) ->
            Rows = try [#{address => A, size => Size, age_ms => Age, estimated => E, frames => F}
                        || {A, Size, Age, E, F} <- lists:sublist(Olds, N),
                           is_integer(A), is_integer(Size), is_integer(Age), is_boolean(E),
                           is_binary(F)]
                   catch error:_ -> erlang:error(badarg, [N, Opts])
                   end,
            length(Rows) =:= min(N, length(Olds)) orelse erlang:error(badarg, [N, Opts]),
            Stacks = mallocinfo_trace_culprits:symbolize_stacks([F || #{frames := F} <- Rows], D),
            {ok, [(maps:remove(frames, R))#{stack => maps:get(F, Stacks)}
                  || #{frames := F} = R <- Rows]};
        _ ->
            erlang:error(badarg, [N, Opts])
    end;
olds(N, Opts) when is_integer(N), N >= 0 ->
    #{demangle := D, min_age_ms := Age, min_size := Size} = O =
        options(Opts, [demangle, min_age_ms, min_size, max_age_ms], [N, Opts]),
    MaxAge = min(maps:get(max_age_ms, O, 1 bsl 62), 1 bsl 62),
    ok = with_context(),
    mallocinfo_nif:trace_olds(N, Age, Size, D, MaxAge);
olds(N, Opts) ->
    erlang:error(badarg, [N, Opts]).

%% @equiv sites(N, #{})
-spec sites(non_neg_integer()) -> {ok, [site()]} | {error, not_preloaded | not_recording | eagain}.
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
%%
%% `by => function' or `by => object' (default `stack') rolls the live
%% blocks up by their culprit: the first frame of the stack outside the
%% allocator family (`malloc' and its siblings, `strdup', `operator new',
%% the C++ runtime `libstdc++', C++ allocator templates, OpenSSL's
%% `CRYPTO_malloc' family; README "Growth and culprits"), or by the
%% object (shared library or executable) that frame is in. Each row says
%% `label': `erts' when the culprit is in the emulator (the VM's own
%% malloc: erts_alloc's carriers), `self' when a frame of the stack is in
%% mallocinfo's own objects, `native' otherwise. Rows hold `object',
%% `function' (`by => function'; `undefined' for an unnamed function,
%% then one row per address), `frame', `count', `bytes', `stacks' (call
%% stacks rolled in) and `estimated'. Every live block is in exactly one
%% row: the rows of `sites(infinity, #{by => B})' add up to the totals of
%% `by => stack'. Symbolizes, one batch per stack depth, only as many
%% frames of each stack as it takes to pass its allocator frames. With
%% `snapshot => S' (a {@link snapshot/0} of this node) the roll-up is of
%% that snapshot: its rows add up to its `live_bytes' and `live_blocks'.
%%
%% `by => process' and `by => erlang_function' need the Erlang context
%% ({@link attach/0} and a preloaded tracker turn it on where the VM's
%% layout can be learned, see `status()''s `erlang_context'): the live
%% blocks by the process that allocated them (rows `pid', `name' as
%% {@link mallocinfo_process:top/2} names processes, `count', `bytes',
%% `estimated'), or by the Erlang function that drove the allocation, the
%% caller of the NIF (rows `module', `function', `arity', `count', `bytes',
%% `estimated'). Blocks allocated outside a process (other threads, ports,
%% the VM itself, before the context was on) are in no row. Not with
%% `snapshot'.
-spec sites(non_neg_integer() | infinity,
            opts() | #{by => stack | function | object | process | erlang_function,
                       snapshot => snapshot(), demangle => boolean()}) ->
          {ok, [site()] | [rollup()] | [process_row()] | [function_row()]}
          | {error, not_preloaded | not_recording | eagain}.
sites(N, Opts) when (is_integer(N) andalso N >= 0) orelse N =:= infinity ->
    {By, Rest0} = take_by(Opts, [N, Opts]),
    {Snap, Rest} = case Rest0 of
                       #{snapshot := S} when By =/= stack ->
                           is_snapshot(S) orelse erlang:error(badarg, [N, Opts]),
                           {S, maps:remove(snapshot, Rest0)};
                       _ -> {undefined, Rest0}
                   end,
    #{demangle := D} = options(Rest, [demangle], [N, Opts]),
    case By of
        _ when By =:= process; By =:= erlang_function ->
            Snap =:= undefined orelse erlang:error(badarg, [N, Opts]),
            context_rows(By, N);
        _ when Snap =/= undefined ->
            Raw = [{C, B, E, F} || {F, {C, B, E}} <- maps:to_list(maps:get(sites, Snap))],
            {ok, take(N, mallocinfo_trace_culprits:rollup(By, Raw, D))};
        stack ->
            Limit = case N of infinity -> 1 bsl 62; _ -> N end,
            ok = with_context(),
            case mallocinfo_nif:trace_sites(Limit, D) of
                {ok, Sites} ->
                    {ok, [S#{label => mallocinfo_trace_culprits:stack_label(Stack)}
                          || #{stack := Stack} = S <- Sites]};
                {error, _} = E -> E
            end;
        _ ->
            case mallocinfo_nif:trace_snapshot(0, 0) of
                {ok, {_Mode, _Now, Raw, []}} ->
                    {ok, take(N, mallocinfo_trace_culprits:rollup(By, Raw, D))};
                {error, _} = E ->
                    E
            end
    end;
sites(N, Opts) ->
    erlang:error(badarg, [N, Opts]).

%% @equiv churn(N, #{})
-spec churn(non_neg_integer() | infinity) ->
          {ok, [churn_row()]} | {error, not_preloaded | not_recording | eagain | enotsup}.
churn(N) ->
    churn(N, #{}).

%% @doc Who churns: every call site's allocations and frees since the
%% tracker started or was {@link reset/0}, most allocated bytes first, the
%% first `N'. Rows: `allocated_count', `allocated_bytes', `freed_count',
%% `freed_bytes' (blocks that entered the live table and left it by free
%% or realloc: exact in `full' mode, unbiased estimates in `sample' mode,
%% then `estimated => true'), `temporary_count' (blocks freed by the
%% thread that allocated them before it allocated anything else: memray's
%% rule with N = 1, a container's grow-and-copy), `lifetimes' (the freed
%% blocks by lifetime, `[{BelowMs, Count}]', non-empty buckets only:
%% `{1, C}' freed within 1 ms, `{2^k, C}' lived [2^(k-1), 2^k) ms,
%% `{infinity, C}' longer; the tracker's clock is the coarse monotonic one,
%% so "within 1 ms" means within its tick, 1 to 4 ms) and
%% `short_lived_count' (freed within `short_lived_ms', default 1, counted
%% to the largest bucket bound not above it), `allocated_per_s' and
%% `allocated_bytes_per_s' (since start or reset: `since_ms' ago), with
%% the stack as
%% {@link sites/2} gives it (`stack', `erlang', `thread' for another
%% thread, `culprit', `label'). Blocks without a stored stack, and sites
%% whose stacks were reclaimed since (no live block used them and the
%% stack table needed room), are one row with `stack => []'.
%%
%% `Opts': `demangle', `short_lived_ms', and `by => function | object':
%% rows rolled up by culprit as {@link sites/2} does (`label', `object',
%% `function', `frame', `stacks'). Runs on a dirty scheduler; the
%% `counters' mode counts no churn (rows from before a switch to it stay
%% until {@link reset/0}). `{error, enotsup}' from an
%% interposer older than churn.
-spec churn(non_neg_integer() | infinity,
            #{by => stack | function | object, demangle => boolean(),
              short_lived_ms => pos_integer()}
            | [demangle | {demangle, boolean()} | {by, stack | function | object}
               | {short_lived_ms, pos_integer()}]) ->
          {ok, [churn_row()]} | {error, not_preloaded | not_recording | eagain | enotsup}.
churn(N, Opts) when (is_integer(N) andalso N >= 0 andalso N < 1 bsl 64) orelse N =:= infinity ->
    {By, Rest0} = take_by(Opts, [N, Opts]),
    By =:= stack orelse By =:= function orelse By =:= object
        orelse erlang:error(badarg, [N, Opts]),
    Parsed = options(Rest0, [demangle, short_lived_ms], [N, Opts]),
    D = maps:get(demangle, Parsed),
    Short = maps:get(short_lived_ms, Parsed, 1),
    Short >= 1 orelse erlang:error(badarg, [N, Opts]),
    ok = with_context(),
    case mallocinfo_nif:trace_churn() of
        {ok, _Mode, ElapsedMs, Raw} ->
            {ok, mallocinfo_trace_churn:rows(By, Raw, N, #{demangle => D,
                                                           short_lived_ms => Short,
                                                           elapsed_ms => ElapsedMs})};
        {error, _} = E ->
            E
    end;
churn(N, Opts) ->
    erlang:error(badarg, [N, Opts]).

%% Before a view that names Erlang functions: the Erlang context on (once
%% per node, mallocinfo_trace_context:ensure/0: a tracker preloaded at
%% start records it from mallocinfo's first call on) and the NIF's atom
%% bound fresh.
with_context() ->
    _ = mallocinfo_trace_context:ensure(),
    mallocinfo_trace_context:refresh().

take(infinity, L) -> L;
take(N, L) -> lists:sublist(L, N).

%% sites/2 by process or by Erlang function: the NIF groups, the names of
%% the processes are looked up here (the winners' only).
context_rows(By, N) ->
    Limit = case N of infinity -> 1 bsl 62; _ -> N end,
    ok = with_context(),
    case mallocinfo_nif:trace_by_context(Limit, By) of
        {ok, Rows, _Without} when By =:= process ->
            {ok, [#{pid => P, name => mallocinfo_process:name(P), count => C, bytes => B,
                    estimated => E} || {P, C, B, E} <- Rows]};
        {ok, Rows, _Without} ->
            {ok, [#{module => M, function => F, arity => A, count => C, bytes => B,
                    estimated => E} || {{M, F, A}, C, B, E} <- Rows]};
        {error, _} = E ->
            E
    end.

%% `by' out of sites/2's options (a map or a list), the rest for options/3.
take_by(Opts, Args) when is_map(Opts) ->
    case maps:take(by, Opts) of
        {By, Rest} when By =:= stack; By =:= function; By =:= object; By =:= process;
                        By =:= erlang_function -> {By, Rest};
        {_, _} -> erlang:error(badarg, Args);
        error -> {stack, Opts}
    end;
take_by(Opts, Args) when is_list(Opts) ->
    try length(Opts)
    catch error:badarg -> erlang:error(badarg, Args)
    end,
    case [By || {by, By} <- Opts] of
        [] -> {stack, Opts};
        [By] when By =:= stack; By =:= function; By =:= object; By =:= process;
                  By =:= erlang_function -> {By, Opts -- [{by, By}]};
        _ -> erlang:error(badarg, Args)
    end;
take_by(_, Args) ->
    erlang:error(badarg, Args).

%% @doc A snapshot of every live call site: its count, bytes and raw
%% stack (return addresses, not symbolized: a snapshot of thousands of
%% sites costs about what {@link heap_profile/0} does and is cheap to keep),
%% the totals (`live_bytes', `live_blocks'), the `mode', `time_ms'
%% (`erlang:system_time(millisecond)') and the node. Give two to
%% {@link diff/2}; {@link growth/2} takes them for you. A snapshot is
%% meaningful on the node (OS process) that took it: its stacks are
%% addresses there.
-spec snapshot() -> {ok, snapshot()} | {error, not_preloaded | not_recording | eagain}.
snapshot() ->
    snapshot(#{}).

%% @doc {@link snapshot/0}, and with `olds => N' also the `N' oldest live
%% blocks of the same pass over the table (raw, under the key `olds';
%% {@link olds/2} with `snapshot' symbolizes them), leaving out blocks
%% older than `max_age_ms' when given. The report takes one snapshot this
%% way, so its call sites, totals and oldest blocks are of one instant.
-spec snapshot(#{olds => non_neg_integer(), max_age_ms => non_neg_integer()}) ->
          {ok, snapshot()} | {error, not_preloaded | not_recording | eagain}.
snapshot(Opts) when is_map(Opts) ->
    maps:foreach(fun(K, V) when (K =:= olds orelse K =:= max_age_ms), is_integer(V), V >= 0 -> ok;
                    (_, _) -> erlang:error(badarg, [Opts])
                 end, Opts),
    N = maps:get(olds, Opts, 0),
    MaxAge = min(maps:get(max_age_ms, Opts, 1 bsl 62), 1 bsl 62),
    ok = with_context(),
    case mallocinfo_nif:trace_snapshot(N, MaxAge) of
        {ok, {Mode, Now, Raw, Olds}} ->
            Meta = #{node => node(), os_pid => os:getpid(),
                     time_ms => erlang:system_time(millisecond),
                     monotonic_ms => erlang:monotonic_time(millisecond)},
            {ok, mallocinfo_trace_growth:snapshot(Mode, {Now, Raw},
                                                  case maps:is_key(olds, Opts) of
                                                      true -> Meta#{olds => Olds};
                                                      false -> Meta
                                                  end)};
        {error, _} = E ->
            E
    end;
snapshot(Opts) ->
    erlang:error(badarg, [Opts]).

%% @equiv diff(Old, New, #{})
-spec diff(snapshot(), snapshot()) -> [change()].
diff(Old, New) ->
    diff(Old, New, #{}).

%% @doc What changed between two snapshots of this node: one row per call
%% site whose live count or bytes changed, largest `bytes_delta' first
%% (the largest loss last), sites that `appeared' and `vanished'
%% included: `stack' (symbolized), `count' and `bytes' in `New', the
%% deltas, `change', `culprit' and `label' (as {@link sites/2}), and
%% `estimated' (`sample' mode: the deltas are differences of estimates).
%% Exact in `full' mode. `Opts': `demangle', `limit' (rows returned, the
%% only ones symbolized; default all).
-spec diff(snapshot(), snapshot(), #{demangle => boolean(), limit => non_neg_integer()}) ->
          [change()].
diff(Old, New, Opts) ->
    case is_snapshot(Old) andalso is_snapshot(New) of
        true -> ok;
        false -> erlang:error(badarg, [Old, New, Opts])
    end,
    #{demangle := D} = O = options(Opts, [demangle, limit], [Old, New, Opts]),
    Rows = take(maps:get(limit, O, infinity), mallocinfo_trace_growth:diff(Old, New)),
    mallocinfo_trace_culprits:symbolized(Rows, D).

%% @doc The call sites whose live bytes grew in every interval between
%% `Snapshots' (two or more {@link snapshot/0}s of this node, oldest
%% first), as {@link growth/3} returns them (`Opts' the same).
-spec growth_of([snapshot()], #{demangle => boolean(), limit => non_neg_integer()}) ->
          [grower()].
growth_of(Snapshots, Opts) when is_list(Snapshots) ->
    case length(Snapshots) >= 2 andalso lists:all(fun is_snapshot/1, Snapshots) of
        true -> ok;
        false -> erlang:error(badarg, [Snapshots, Opts])
    end,
    #{demangle := D} = O = options(Opts, [demangle, limit], [Snapshots, Opts]),
    Rows = take(maps:get(limit, O, infinity), mallocinfo_trace_growth:growth(Snapshots)),
    mallocinfo_trace_culprits:symbolized(Rows, D);
growth_of(Snapshots, Opts) ->
    erlang:error(badarg, [Snapshots, Opts]).

%% @equiv growth_of(Snapshots, #{})
-spec growth_of([snapshot()]) -> [grower()].
growth_of(Snapshots) ->
    growth_of(Snapshots, #{}).

%% @equiv growth(IntervalMs, Samples, #{})
-spec growth(pos_integer(), pos_integer()) ->
          {ok, [grower()]} | {error, not_preloaded | not_recording | eagain}.
growth(IntervalMs, Samples) ->
    growth(IntervalMs, Samples, #{}).

%% @doc Takes `Samples' snapshots (2 to 2^20) `IntervalMs' apart, in the
%% calling process (it sleeps between them: no scheduler is held), and
%% returns the call sites whose live bytes grew in every interval, most
%% growth first: `growth_bytes' from the first snapshot to the last,
%% `rate' (bytes per second), `bytes' and `count' now, `samples', `stack',
%% `culprit', `label', `estimated'. A site that grows every time is a
%% leak suspect; one that also shrinks (a cache that fills and drains) is
%% not returned. `Opts': `demangle', `limit'. Lasts about
%% `IntervalMs * (Samples - 1)'.
-spec growth(pos_integer(), pos_integer(), #{demangle => boolean(), limit => non_neg_integer()}) ->
          {ok, [grower()]} | {error, not_preloaded | not_recording | eagain}.
growth(IntervalMs, Samples, Opts) when is_integer(IntervalMs), IntervalMs > 0,
                                       IntervalMs =< 16#ffffffff,
                                       is_integer(Samples), Samples >= 2,
                                       Samples =< 1 bsl 20 ->
    #{demangle := D} = O = options(Opts, [demangle, limit], [IntervalMs, Samples, Opts]),
    case snapshots(IntervalMs, Samples, []) of
        {error, _} = E ->
            E;
        Snaps ->
            Rows = take(maps:get(limit, O, infinity), mallocinfo_trace_growth:growth(Snaps)),
            {ok, mallocinfo_trace_culprits:symbolized(Rows, D)}
    end;
growth(IntervalMs, Samples, Opts) ->
    erlang:error(badarg, [IntervalMs, Samples, Opts]).

snapshots(_, 0, Acc) ->
    lists:reverse(Acc);
snapshots(IntervalMs, Left, Acc) ->
    _ = Acc =/= [] andalso timer:sleep(IntervalMs),
    case snapshot() of
        {ok, S} -> snapshots(IntervalMs, Left - 1, [S | Acc]);
        {error, _} = E -> E
    end.

%% What diff/2, growth_of/1 and sites/2 read of a snapshot, all checked: a
%% forged one is a badarg, not a crash halfway through.
is_snapshot(#{mallocinfo_snapshot := 1, sites := S, monotonic_ms := T})
  when is_map(S), is_integer(T) ->
    maps:fold(fun(K, V, Ok) -> Ok andalso is_site(K, V) end, true, S);
is_snapshot(_) ->
    false.

is_site(Frames, {C, B, E}) ->
    is_binary(Frames) andalso byte_size(Frames) rem 8 =:= 0
        andalso is_integer(C) andalso C >= 0 andalso is_integer(B) andalso B >= 0
        andalso is_boolean(E);
is_site(_, _) ->
    false.

%% @equiv mappings(N, #{})
-spec mappings(non_neg_integer()) ->
          {ok, [mapping()]} | {error, not_preloaded | not_recording | enotsup}.
mappings(N) ->
    mappings(N, #{}).

%% @doc Live memory mappings made through `mmap'/`mmap64' (and moved or
%% resized by `mremap') while the tracker recorded, grouped by the call
%% stack that mapped them, largest first: what a NIF or library mapped
%% itself (its own arenas, caches, ring buffers), and ERTS's carriers.
%% `bytes' is what is mapped, `resident' what of it is in memory now (the
%% kernel's Rss of each mapping in `/proc/self/smaps'; `mincore(2)' only
%% on the part of a mapping a region shares with other memory, at most
%% 16 GiB of such pages per call, past which a mapping's Rss is shared out
%% by length: a huge `PROT_NONE' reservation costs nothing), `flags' the
%% union of the group's kinds (`anonymous', `private_file', `shared'
%% (counted, flagged), `no_access' (mapped `PROT_NONE': a reservation),
%% `remapped' (moved or resized since)).
%% glibc's own mappings (malloc's large blocks and arenas) are not here:
%% they are malloc's, seen by {@link sites/2}. `Opts': `demangle', and `by':
%% `stack' (the default: one row per call stack), `function' (one row per
%% function that called `mmap': the first frame outside the allocator
%% family, as {@link sites/2}; rows then carry `label', `object',
%% `function' and `frame' instead of `stack') or `object' (one row per
%% object of that frame: `label', `object'). Regions are recorded in
%% `sample' and `full' modes (all of them: they are few); `counters' mode
%% counts calls (`mappings' in {@link status/0}) and records no new
%% region, but what is unmapped or moved meanwhile still leaves or moves
%% in the table. `{error, enotsup}'
%% from an interposer older than this function.
-spec mappings(non_neg_integer(), opts() | #{by => stack | function | object}) ->
          {ok, [mapping()]} | {error, not_preloaded | not_recording | enotsup}.
mappings(N, Opts) when is_integer(N), N >= 0, N < 1 bsl 64, is_map(Opts) ->
    By = case maps:get(by, Opts, stack) of
             B when B =:= stack; B =:= function; B =:= object -> B;
             _ -> erlang:error(badarg, [N, Opts])
         end,
    #{demangle := D} = options(maps:remove(by, Opts), [demangle], [N, Opts]),
    case mallocinfo_nif:trace_regions(D) of
        {ok, Regions} -> {ok, lists:sublist(mallocinfo_trace_culprits:mappings(By, Regions), N)};
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
                {ok, Maps} ->
                    {ok, iolist_to_binary(mallocinfo_trace_pprof:heap_profile(Sites, Maps))};
                {error, _} = E -> E
            end;
        {error, _} = E ->
            E
    end.

%% @equiv pprof(#{})
-spec pprof() -> {ok, binary()} | {error, not_preloaded | not_recording | eagain | posix()}.
pprof() ->
    pprof(#{}).

%% @doc Every call site as a gzipped pprof `profile.proto', the format of
%% Go's `/debug/pprof/heap', which `go tool pprof', Pyroscope, Parca and
%% speedscope read. Sample types `alloc_objects', `alloc_space',
%% `inuse_objects' and `inuse_space' (the default): `inuse_*' what each
%% site holds now, `alloc_*' what it allocated since the tracker started or
%% was {@link reset/0} (the churn counters of {@link churn/2}; from an
%% interposer older than churn, alloc_* equal inuse_*, as the profile's
%% comment then says). Every location has its
%% address, its mapping (the executable mappings of `/proc/self/maps',
%% the emulator's first) and a function named here (the readers need not
%% find the binaries): the symbol, or `object+0xoffset' when none covers
%% it; each function's file name is its object, so `pprof -files' groups
%% by object. In `sample' mode the values are the unbiased estimates of
%% {@link sites/1}, already scaled; `period' is `sample_bytes' (1 in
%% `full' mode). Blocks without a recorded stack are one sample at a
%% `[no stack recorded]' frame.
%%
%% `Opts': `demangle' (default `true'); `profile => allocs' (Go's
%% `/debug/pprof/allocs': the same profile, `alloc_space' its default
%% sample type); `seconds' (1..300): a delta profile, waiting that long in
%% the calling process. For the heap profile, of the blocks allocated
%% during those seconds and still live at their end (from their
%% timestamps); for `allocs', Go's difference of two cumulative profiles
%% (alloc_* what each site allocated in the window, inuse_* how much more
%% it holds). The work (snapshot, symbolization) runs on a dirty
%% scheduler; about 0.3 s for 30,000 sites (README, "Profiles").
-spec pprof(profile_opts()) ->
          {ok, binary()} | {error, not_preloaded | not_recording | eagain | posix()}.
pprof(Opts) ->
    case profile_data(Opts) of
        {ok, Data} -> {ok, mallocinfo_trace_profile:pprof(Data)};
        {error, _} = E -> E
    end.

%% @equiv folded(#{})
-spec folded() -> {ok, binary()} | {error, not_preloaded | not_recording | eagain | posix()}.
folded() ->
    folded(#{}).

%% @doc The live heap as collapsed stacks, the text `flamegraph.pl' and
%% speedscope read: one line per call site, `root;...;leaf bytes', each
%% frame `function (object)'. The lines sum to the live bytes the tracker
%% holds (blocks without a stack: a `[no stack recorded]' line). `Opts' as
%% {@link pprof/1}.
-spec folded(profile_opts()) ->
          {ok, binary()} | {error, not_preloaded | not_recording | eagain | posix()}.
folded(Opts) ->
    case profile_data(Opts) of
        {ok, Data} -> {ok, iolist_to_binary(mallocinfo_trace_profile:folded(Data))};
        {error, _} = E -> E
    end.

%% @private The snapshot both formats are made of (mallocinfo_trace_profile:data()).
profile_data(Opts) when is_map(Opts) ->
    case maps:keys(Opts) -- [demangle, seconds, profile] of
        [] -> ok;
        _ -> erlang:error(badarg, [Opts])
    end,
    Demangle = maps:get(demangle, Opts, true),
    Seconds = maps:get(seconds, Opts, 0),
    Profile = maps:get(profile, Opts, heap),
    is_boolean(Demangle) andalso is_integer(Seconds)
        andalso (Profile =:= heap orelse Profile =:= allocs)
        andalso (Seconds =:= 0 andalso not is_map_key(seconds, Opts)
                 orelse Seconds >= 1 andalso Seconds =< ?MAX_DELTA_S)
        orelse erlang:error(badarg, [Opts]),
    Start = erlang:system_time(nanosecond),
    case {Profile, Seconds} of
        {allocs, 0} ->
            profile_data(Demangle, 0, Start, 0, Profile);
        {allocs, _} ->
            %% Go's way: the difference of two cumulative profiles.
            case profile_data(Demangle, 0, Start, 0, Profile) of
                {ok, Old} ->
                    timer:sleep(Seconds * 1000),
                    case profile_data(Demangle, 0, Start, Seconds, Profile) of
                        {ok, New} -> {ok, mallocinfo_trace_profile:delta(Old, New)};
                        {error, _} = E -> E
                    end;
                {error, _} = E ->
                    E
            end;
        {heap, 0} ->
            profile_data(Demangle, 0, Start, 0, Profile);
        {heap, _} ->
            case mallocinfo_nif:trace_now() of
                {ok, SinceNs} ->
                    %% The caller waits, not a scheduler.
                    timer:sleep(Seconds * 1000),
                    profile_data(Demangle, SinceNs, Start, Seconds, Profile);
                {error, _} = E ->
                    E
            end
    end;
profile_data(Opts) ->
    erlang:error(badarg, [Opts]).

profile_data(Demangle, SinceNs, Start, Seconds, Profile) ->
    ok = with_context(),
    case mallocinfo_nif:trace_pprof(Demangle, SinceNs) of
        {ok, #{mode := Mode} = Snap} ->
            Churn = maps:get(churn, Snap, false),
            %% Read after the snapshot, so every object a stack points
            %% into is mapped (unless unloaded in between).
            case file:read_file("/proc/self/maps") of
                {ok, Maps} ->
                    Exe = case file:read_link_all("/proc/self/exe") of
                              {ok, E} -> unicode:characters_to_binary(E);
                              {error, _} -> <<>>
                          end,
                    Comments =
                        [iolist_to_binary(["mallocinfo tracker, mode ", atom_to_list(Mode),
                                           case Mode of
                                               sample -> ": values are unbiased estimates";
                                               _ -> ""
                                           end,
                                           case Churn of
                                               true -> "; alloc_*: since start or reset";
                                               false -> "; alloc_* = inuse_* (live blocks only)"
                                           end])
                         | [iolist_to_binary(
                              case Profile of
                                  heap ->
                                      io_lib:format("delta over ~b s: blocks allocated in that "
                                                    "window and still live at its end",
                                                    [Seconds]);
                                  allocs ->
                                      io_lib:format("delta over ~b s: the difference of two "
                                                    "cumulative profiles", [Seconds])
                              end)
                            || Seconds > 0]],
                    #{sites := Sites} = Snap,
                    Default = case Profile of
                                  heap -> inuse_space;
                                  allocs -> alloc_space
                              end,
                    {ok, (maps:remove(churn, Snap))#{sites => labelled(Sites), maps => Maps,
                                                     exe => Exe, time_nanos => Start,
                                                     duration_nanos => Seconds * 1000000000,
                                                     comments => Comments,
                                                     default_sample => Default}};
                {error, _} = E ->
                    E
            end;
        {error, _} = E ->
            E
    end.

%% With the Erlang context on, the NIF splits each site's live blocks by
%% the process that allocated them ({InuseCount, InuseBytes, AllocCount,
%% AllocBytes, Stack, Pid | undefined}): the process becomes the sample's
%% pprof labels, `pid' (as pid_to_list/1 writes it) and `process' (its
%% name as mallocinfo_process:name/1 gives it, while it lives). Each
%% process is named once.
labelled(Sites) ->
    {Labelled, _} =
        lists:mapfoldl(
          fun({_, _, _, _, _} = Site, Names) ->
                  {Site, Names};
             ({C, B, AC, AB, S, undefined}, Names) ->
                  {{C, B, AC, AB, S, []}, Names};
             ({C, B, AC, AB, S, Pid}, Names) ->
                  {Labels, Names1} =
                      case Names of
                          #{Pid := L} -> {L, Names};
                          #{} -> L = process_labels(Pid), {L, Names#{Pid => L}}
                      end,
                  {{C, B, AC, AB, S, Labels}, Names1}
          end, #{}, Sites),
    Labelled.

process_labels(Pid) ->
    [{<<"pid">>, list_to_binary(pid_to_list(Pid))}
     | case mallocinfo_process:name(Pid) of
           undefined -> [];
           Name -> [{<<"process">>, name_label(Name)}]
       end].

%% A name as the text mallocinfo_process:name_text/1 puts in parentheses.
name_label(Name) ->
    case iolist_to_binary(mallocinfo_process:name_text(Name)) of
        <<" (", Rest/binary>> -> binary:part(Rest, 0, byte_size(Rest) - 1);
        Other -> Other
    end.

%% @doc Call counters per interposed function, bytes allocated and freed,
%% live tracked bytes and entries, dropped, plus `mallinfo2()' under
%% `mallinfo' (`{error, {wrong_allocator, Which}}' there when the interposer
%% forwards to another allocator than glibc, see
%% {@link mallocinfo_glibc:allocator/0}).
-spec stats() -> {ok, map()} | {error, not_preloaded}.
stats() ->
    case status() of
        #{preloaded := false, attached_at := undefined} ->
            {error, not_preloaded};
        Status ->
            Keys = [mode, recording, calls, bytes_allocated, bytes_freed, live_bytes,
                    live_entries, dropped, frees_untracked, stacks],
            Mallinfo = case mallocinfo_glibc:mallinfo() of
                           {ok, M} -> M;
                           {error, _} = E -> E
                       end,
            {ok, (maps:with(Keys, Status))#{mallinfo => Mallinfo}}
    end.

%% @doc Forgets every recorded live block (e.g. after start-up, to see only
%% what is allocated from now on) and every site's churn ({@link churn/2}),
%% then frees every stored call stack (as {@link reclaim/0}). `{ok,
%% Forgotten}': how many blocks were forgotten.
-spec reset() -> {ok, non_neg_integer()} | {error, not_preloaded | not_recording}.
reset() ->
    mallocinfo_nif:trace_reset().

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
    Sizes = [{K, {range, Min, Max}} || #{option := K, min := Min, max := Max} <- knobs()],
    Allowed = maps:from_list([{mode, {one_of, [full, sample, counters]}} | Sizes]),
    case maps:keys(Opts) -- maps:keys(Allowed) of
        [] -> ok;
        _ -> erlang:error(badarg, [Opts])
    end,
    maps:foreach(fun(K, V) -> env_value(V, maps:get(K, Allowed), Opts) end, Opts),
    Defaults = maps:from_list([{mode, full}
                               | [{K, D} || #{option := K, default := D} <- knobs()]]),
    O = maps:merge(Defaults, Opts),
    case mallocinfo_nif:trace_attach(maps:get(mode, O), maps:get(sample_bytes, O),
                                     maps:get(table_size, O), maps:get(stack_table_size, O),
                                     maps:get(stack_depth, O)) of
        ok ->
            %% Blocks carry their Erlang context from here on, where the
            %% VM's layout can be learned (status() says erlang_context).
            _ = mallocinfo_trace_context:enable(),
            ok;
        Error ->
            Error
    end;
attach(Opts) ->
    erlang:error(badarg, [Opts]).

%% @doc The tracker's size knobs: the `attach/1' and `preload_env/1'
%% option, its environment variable, its range and its default. The same
%% table as the interposer's (`c_src/common/mi_limits.h'; a test checks
%% that they agree).
-spec knobs() -> [#{option := atom(), env := string(), min := pos_integer(),
                    max := pos_integer(), default := pos_integer()}].
knobs() ->
    [#{option => table_size, env => "MALLOCINFO_TABLE_SIZE",
       min => 64, max => 1 bsl 32, default => 1 bsl 21},
     #{option => stack_table_size, env => "MALLOCINFO_STACK_TABLE_SIZE",
       min => 64, max => 1 bsl 28, default => 1 bsl 16},
     #{option => sample_bytes, env => "MALLOCINFO_SAMPLE_BYTES",
       min => 1, max => 1 bsl 40, default => 512 * 1024},
     #{option => stack_depth, env => "MALLOCINFO_STACK_DEPTH",
       min => 1, max => 128, default => 32}].

%% @doc Puts every slot {@link attach/0} changed back. Nothing new is
%% recorded after; what was recorded stays readable ({@link sites/1},
%% {@link olds/1}, the report) until {@link reset/0} or the next attach.
%% The tracker's code stays loaded (a thread may still be inside a hook).
-spec detach() -> ok | {error, not_attached}.
detach() ->
    mallocinfo_nif:trace_detach().

%% @doc Frees every stored call stack that no live block uses any more, now:
%% `{ok, Freed}', how many. The tracker also does this by itself as its stack
%% table fills (see `stacks_reclaimed' and `stack_sweeps' in
%% {@link status/0}); this call is for tests and for an operator who wants
%% the table compact before a long quiet period. It waits (on a dirty
%% scheduler, up to 5 s) while other `sites'/`olds'/`heap_profile' calls
%% are reading stacks. `{error, enotsup}' when the preloaded interposer is
%% older than this function.
-spec reclaim() -> {ok, non_neg_integer()} | {error, not_preloaded | not_recording | enotsup}.
reclaim() ->
    mallocinfo_nif:trace_reclaim().

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
    Knobs = [{mode, "MALLOCINFO_TRACE", {one_of, [full, sample, counters, off]}}
             | [{K, Var, {range, Min, Max}}
                || #{option := K, env := Var, min := Min, max := Max} <- knobs()]]
        ++ [{exe, "MALLOCINFO_TRACE_EXE", glob},
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
