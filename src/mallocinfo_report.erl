%% @doc One report that accounts for a node's resident set: which layer
%% holds the memory (ERTS, libc, native callers, another allocator), what
%% nothing accounts for, and a few ranked sentences saying what it means.
%%
%% {@link collect/0} gathers everything the running node can tell (each
%% source guarded: a missing module, an absent interposer or a failing call
%% makes its section `{unavailable, Why, How}' instead of failing the
%% report), then `mallocinfo_report_build:build/1' turns that raw data into
%% the report with pure functions, which EUnit tests on canned `/proc' text
%% and crafted maps; `mallocinfo_report_text' renders it in 80 columns.
%% {@link collect/1} does the same for every node of a cluster in parallel,
%% loading mallocinfo over distribution where it is missing.
%% `mallocinfo:report/0,1' print it.
%%
%% The report map (`collect/0'):
%% <ul>
%% <li>`resident': RSS, PSS, anonymous/file/shmem (`smaps_rollup',
%%     `status') and `groups': the mappings of `/proc/self/smaps' by kind
%%     (`main_heap', `arenas', `stacks', `jit', `noreserve', `anon',
%%     `files', `special'), each `#{rss, size, count}'.</li>
%% <li>`erts': `erlang:memory()', per allocator type `allocated' (carriers)
%%     and `used' (blocks), what ERTS has mapped and how much of it is
%%     mseg_alloc's cache, carriers from `instrument:carriers/0' with their
%%     free-block histogram, tagged allocations by origin from
%%     `instrument:allocations/0', the largest processes and ETS tables.</li>
%% <li>`libc': `mallinfo2', per-arena system/in-use/free, arena count and
%%     `M_ARENA_MAX', the heap map summary (`mallocinfo_heap:summary/1',
%%     or why the walk could not run).</li>
%% <li>`native': the tracker's top call sites and oldest blocks.</li>
%% <li>`other_allocator': jemalloc or tcmalloc figures when active.</li>
%% <li>`mappings': on a node preloaded with the tracker recording, its
%%     regions (`mmap' through the interposer) attributed by address:
%%     `erts' (resident bytes beam.smp mapped), `sites' (`[{Label, Count,
%%     Resident, Mapped}]', the functions that mapped the rest), `anon' and
%%     `noreserve' (resident bytes in those groups).</li>
%% <li>`attributed', `unaccounted_bytes', `unaccounted_percent',
%%     `erts_slack_bytes'; with `mappings', also `mapped_sites' and
%%     `exact => true' (the unaccounted figure is then a measurement, not
%%     a lower bound).</li>
%% <li>`verdicts': sentences, most bytes first.</li>
%% </ul>
%% Any section may instead be `{unavailable, Why, How}'.
-module(mallocinfo_report).

-export([collect/0, collect/1, collect/2, format/1, format_cluster/1]).

-export_type([report/0, unavailable/0, node_result/0]).

%% A section that could not be produced: why, and how to get it.
-type unavailable() :: {unavailable, Why :: term(), How :: binary()}.
-type report() :: #{atom() => term()}.
-type node_result() :: {node(), {ok, report()} | {error, term()}}.

%% Native function rows whose processes the report names.
-define(PROCESS_ROWS, 20).
-define(HEAP_MAP_TIMEOUT, 10000).
-define(DEFAULT_TIMEOUT, 30000).
-define(OLDS, 3).
-define(TOP, 5).
%% Churn rows read (the VM's own and mallocinfo's are left out after).
-define(CHURN, 20).
-define(PREVIOUS, previous_report).
%% Start-up: the node's first 30 s (README "The report").
-define(STARTUP_MS, 30000).

%%% ---------------------------------------------------------------------------
%%% API

%% @doc The report of this node. Never fails: a source that is missing or
%% fails makes its section `{unavailable, Why, How}'. Takes as long as its
%% sources together, all of them safe on a live node: `instrument' scans
%% every carrier, the libc summary forks once, the process ranking makes
%% one `process_info/2' call per process (about 5 s for a million), and
%% the heap map forks and walks every arena, bounded by a 10 s timeout.
%% On the demo node, 260-290 ms plus the heap map's walk (doc/report.md).
-spec collect() -> report().
collect() ->
    mallocinfo_report_build:build(gather(#{})).

%% @doc With a list of nodes: `collect(Nodes, #{})'. With a map: the
%% report of this node with options: `interval' (ms, 1..2^32-1): three
%% snapshots of the tracker over that time (the first and last `interval'
%% apart) and the native verdict says which call sites grew in every
%% sample, at what rate (`native => #{growth => ...}'); `startup_blocks'
%% (boolean, default `false'): "oldest live blocks" includes the blocks
%% allocated during the node's start-up (its first 30 s).
-spec collect([node()] | #{interval => pos_integer(), startup_blocks => boolean()}) ->
          [node_result()] | report().
collect(Opts) when is_map(Opts) ->
    case local_opts(Opts) of
        {ok, O} -> mallocinfo_report_build:build(gather(O));
        error -> erlang:error(badarg, [Opts])
    end;
collect(Nodes) ->
    collect(Nodes, #{}).

%% The options of one node's report (collect/1 with a map): ok with them,
%% or error.
local_opts(Opts) ->
    Valid = fun(interval, V) -> is_integer(V) andalso V > 0 andalso V =< 16#ffffffff;
               (startup_blocks, V) -> is_boolean(V);
               (_, _) -> false
            end,
    case maps:fold(fun(K, V, Acc) -> Acc andalso Valid(K, V) end, true, Opts) of
        true -> {ok, Opts};
        false -> error
    end.

%% @doc The report of every node in `Nodes', collected in parallel with
%% `erpc', in the order given. A node that lacks mallocinfo gets it first:
%% the modules' object code and the NIF shared object are sent from this
%% node, the shared object is written to a private directory (mode 0700,
%% random name, under the target's `TMPDIR' or `/tmp'), loaded, and the
%% directory removed; the report then says `injected => true'.
%% A node that cannot be reached gives `{error, unreachable}', one that
%% does not answer in time `{error, timeout}', any other failure
%% `{error, Reason}'; none of them fails the call. `Opts': `timeout' (ms
%% for the whole collection, default 30000); `attach' (default `false'):
%% when `true', {@link mallocinfo_trace:attach/0} is called on each node
%% before its report, and the report's `attach' key holds the answer (`ok',
%% or `{error, preloaded | already_attached | ...}': a node already
%% tracking stays as it is). A node given mallocinfo over distribution
%% cannot attach (the interposer is not sent): it says
%% `{error, {load_failed, _}}'. `interval' and `startup_blocks' are
%% passed to each node's report (see {@link collect/1}); with `interval'
%% the default timeout is 30000 ms plus the interval.
-spec collect([node()], #{timeout => pos_integer(), attach => boolean(),
                          interval => pos_integer(), startup_blocks => boolean()}) ->
          [node_result()].
collect(Nodes, Opts) when is_map(Opts) ->
    Local = maps:with([interval, startup_blocks], Opts),
    case node_list(Nodes) andalso maps:keys(Opts) -- [timeout, attach, interval, startup_blocks] =:= []
        andalso local_opts(Local) =:= {ok, Local} of
        true -> ok;
        false -> erlang:error(badarg, [Nodes, Opts])
    end,
    %% The interval is spent on each node, in parallel: the default timeout
    %% grows by it.
    Timeout = maps:get(timeout, Opts, ?DEFAULT_TIMEOUT + maps:get(interval, Local, 0)),
    Attach = maps:get(attach, Opts, false),
    %% A receive timeout above 2^32-1 ms would raise in await/3.
    case is_integer(Timeout) andalso Timeout > 0 andalso Timeout =< 16#ffffffff
         andalso is_boolean(Attach) of
        true -> cluster(Nodes, Timeout, Attach, Local);
        false -> erlang:error(badarg, [Nodes, Opts])
    end;
collect(Nodes, Opts) ->
    erlang:error(badarg, [Nodes, Opts]).

%% A proper list of atoms (an improper one is not a list of nodes).
node_list([]) -> true;
node_list([N | Rest]) when is_atom(N) -> node_list(Rest);
node_list(_) -> false.

%% @doc The report as text, at most 80 columns wide. `Report' is what
%% {@link collect/0} returns (or a cluster's `{ok, Report}'); anything else
%% raises `badarg'.
-spec format(report()) -> iolist().
format(R) ->
    mallocinfo_report_text:format(R).

%% @doc A cluster's reports as text: one row per node (RSS,
%% `erlang:memory(total)', libc free bytes, live bytes the tracker sees,
%% the unaccounted share, and whether mallocinfo had to be injected), why
%% each failed node failed, then each node's verdicts. `Results' is what
%% {@link collect/1} returns; anything else raises `badarg'.
-spec format_cluster([node_result()]) -> iolist().
format_cluster(Results) ->
    mallocinfo_report_text:format_cluster(Results).

%%% ---------------------------------------------------------------------------
%%% Gathering (impure): each source guarded

gather(Opts) ->
    %% erlang:memory/0 raises notsup when some ERTS allocators are off
    %% (+Mea min): the report goes on without it.
    Mem = try erlang:memory() catch error:notsup -> [] end,
    SmapsText = read_proc("smaps"),
    %% The tracker's regions right after smaps: they are attributed to its
    %% mappings by address, and ERTS maps and unmaps carriers meanwhile.
    Regions = guard(fun() -> mallocinfo_nif:trace_regions(true) end),
    %% Parsed once, after the regions are read (parsing allocates): the
    %% heap evidence below, the resident set and the regions' attribution
    %% in mallocinfo_report_build all read these mappings.
    Smaps = parse_smaps(SmapsText),
    Raw = #{node => node(),
      os_pid => list_to_integer(os:getpid()),
      otp_release => list_to_binary(erlang:system_info(otp_release)),
      time => list_to_binary(calendar:system_time_to_rfc3339(erlang:system_time(millisecond),
                                                             [{unit, millisecond}])),
      cores => erlang:system_info(logical_processors_online),
      word_size => erlang:system_info(wordsize),
      libc_version => guard(fun mallocinfo_glibc:libc_version/0),
      smaps => Smaps,
      smaps_rollup => read_proc("smaps_rollup"),
      status => read_proc("status"),
      memory => maps:from_list(Mem),
      allocators => [{A, guard(fun() -> erlang:system_info({allocator, A}) end)}
                     || A <- erlang:system_info(alloc_util_allocators)],
      erts_mmap => guard(fun() -> erlang:system_info({allocator, erts_mmap}) end),
      carriers => instrument_call(carriers),
      allocations => instrument_call(allocations),
      processes => guard(fun top_processes/0),
      ets => guard(fun ets_top/0),
      allocator => allocator(),
      mallinfo => ok_value(guard(fun mallocinfo_glibc:mallinfo/0)),
      libc_summary => libc_summary(),
      heap_map => heap_map(),
      env => maps:from_list([{V, os:getenv(V)} || V <- ["MALLOC_ARENA_MAX", "GLIBC_TUNABLES"]]),
      trace_status => guard(fun mallocinfo_trace:status/0),
      %% Who churns (since the tracker started or was reset): the libc
      %% fragmentation verdict names them, the native section lists them.
      churn => guard(fun() -> mallocinfo_trace:churn(?CHURN, #{by => function,
                                                               demangle => true}) end),
      regions => Regions,
      jemalloc => guard(fun mallocinfo_jemalloc:summary/0),
      tcmalloc => guard(fun mallocinfo_tcmalloc:stats/0)},
    Layers = layer_sampler(Opts),
    Culprits = culprits(Opts),
    maps:merge(maps:merge(Raw, mallocinfo_layers:heap_evidence(Smaps)),
               Culprits#{layer_samples => layer_samples(Layers)}).

%% With `interval', every layer is sampled at 0, half-way and at the end
%% (mallocinfo_layers, as the sampler reads them), beside the tracker's
%% snapshots: in a process of its own, so the tracker's samples keep
%% their times. Each sample searches the culprits of the process and
%% table layers (the native ones are the tracker's), the later two
%% ranked by growth since the first. Without `interval', none.
layer_sampler(#{interval := Ms}) ->
    Caller = self(),
    Exclude = [Caller | [P || P <- element(2, process_info(Caller, links)), is_pid(P)]],
    spawn_monitor(fun() -> exit({layer_samples, layer_samples(Ms, Exclude)}) end);
layer_sampler(_) ->
    none.

layer_samples(none) ->
    none;
layer_samples({Pid, Ref}) ->
    receive
        {'DOWN', Ref, process, Pid, {layer_samples, Samples}} -> Samples;
        {'DOWN', Ref, process, Pid, Other} -> {error, Other}
    end.

layer_samples(Ms, Exclude) ->
    Opts = #{culprits => [L || L <- mallocinfo_layers:culprit_layers(), L =/= native],
             exclude => [self() | Exclude]},
    #{figures := Since, t := Start} = S0 = mallocinfo_layers:sample(Opts#{figures => true}),
    sleep_until(Start + Ms div 2),
    S1 = mallocinfo_layers:sample(Opts#{since => Since}),
    sleep_until(Start + Ms),
    S2 = mallocinfo_layers:sample(Opts#{since => Since}),
    [maps:remove(figures, S0), S1, S2].

sleep_until(T) ->
    timer:sleep(max(0, T - erlang:monotonic_time(millisecond))).

%% The tracker's culprits from one snapshot (so the roll-ups, the totals
%% and the oldest blocks agree with each other), the growth over `interval'
%% when asked (three snapshots: at 0, half-way and at the end; the last one
%% is the report's), and this run's summary against the previous run's on
%% this node.
culprits(Opts) ->
    Last = olds_options(maps:get(startup_blocks, Opts, false)),
    case maps:get(interval, Opts, undefined) of
        undefined ->
            case guard(fun() -> mallocinfo_trace:snapshot(Last) end) of
                {ok, S} -> culprits_of([S], undefined);
                Error -> #{rollup => Error}
            end;
        Ms ->
            case guard(fun mallocinfo_trace:snapshot/0) of
                {ok, S0} -> culprits_of(later_snapshots(S0, Ms, Last), Ms);
                Error -> #{rollup => Error}
            end
    end.

later_snapshots(S0, Ms, LastOpts) ->
    timer:sleep(Ms div 2),
    S1 = mallocinfo_trace:snapshot(),
    timer:sleep(Ms - Ms div 2),
    S2 = mallocinfo_trace:snapshot(LastOpts),
    case {S1, S2} of
        {{ok, Middle}, {ok, End}} -> [S0, Middle, End];
        _ -> [S0]
    end.

culprits_of(Snaps, Interval) ->
    Last = lists:last(Snaps),
    Rollup = guard(fun() ->
                           {ok, Functions} = mallocinfo_trace:sites(infinity,
                                                                    #{by => function,
                                                                      snapshot => Last,
                                                                      demangle => true}),
                           #{functions => with_processes(Functions),
                             objects => mallocinfo_trace_growth:objects_of(Functions),
                             live_bytes => maps:get(live_bytes, Last),
                             live_blocks => maps:get(live_blocks, Last)}
                   end),
    Olds = case Last of
               #{olds := _} ->
                   ok_value(guard(fun() -> mallocinfo_trace:olds(?OLDS, #{snapshot => Last,
                                                                          demangle => true})
                                  end));
               #{} ->
                   {error, snapshot_failed}  % the last of an interval's snapshots failed
           end,
    Growth = case Snaps of
                 [_, _ | _] ->
                     guard(fun() ->
                                   #{interval_ms => Interval, samples => length(Snaps),
                                     span_ms => maps:get(monotonic_ms, Last) -
                                         maps:get(monotonic_ms, hd(Snaps)),
                                     live_delta => maps:get(live_bytes, Last) -
                                         maps:get(live_bytes, hd(Snaps)),
                                     growers => mallocinfo_trace:growth_of(
                                                  Snaps, #{demangle => true, limit => 200})}
                           end);
                 _ when Interval =/= undefined -> {error, snapshot_failed};
                 _ -> none
             end,
    This = this_run(Rollup),
    Previous = application:get_env(mallocinfo, ?PREVIOUS, undefined),
    %% A node's application environment (application_controller's ETS
    %% table): it outlives the calling process and the shell, costs one
    %% ETS write per report, and goes with the node. persistent_term would
    %% make every update a global GC pass; a process of ours would have to
    %% be started and supervised on nodes that never start mallocinfo.
    _ = is_map(This) andalso application:set_env(mallocinfo, ?PREVIOUS, This),
    %% The processes whose native blocks weigh most (their Erlang context:
    %% mallocinfo_trace:sites/2 by process), read right after the snapshot.
    Processes = case guard(fun() -> mallocinfo_trace:sites(5, #{by => process}) end) of
                    {ok, P} -> P;
                    _ -> []
                end,
    #{rollup => Rollup, olds => Olds, growth => Growth, previous_run => Previous,
      this_run => This, native_processes => Processes}.

%% The first ?PROCESS_ROWS native functions with `processes': the
%% processes holding their blocks (the Erlang context), by name, as
%% `[{Name, HowMany}]', most first (Name as mallocinfo_process:name/1 gives
%% it, `undefined' for a process that exited), and `processes_bytes', the
%% bytes of the row they hold (blocks without a process are the rest). Read right after the
%% snapshot the roll-up is of; the rows as they were without the context.
with_processes(Functions) ->
    case mallocinfo_trace_culprits:function_processes(true) of
        {ok, ByKey} when map_size(ByKey) > 0 ->
            {Top, Rest} = lists:split(min(?PROCESS_ROWS, length(Functions)), Functions),
            {Named, _} = lists:mapfoldl(fun(Row, Names) -> row_processes(Row, ByKey, Names) end,
                                        #{}, Top),
            Named ++ Rest;
        _ ->
            Functions
    end.

row_processes(#{label := native} = Row, ByKey, Names0) ->
    case maps:get(mallocinfo_trace_growth:row_key(Row), ByKey, #{}) of
        Pids when map_size(Pids) =:= 0 ->
            {Row, Names0};
        Pids ->
            {Names, Names1} =
                lists:mapfoldl(fun(P, N) ->
                                       case N of
                                           #{P := Name} -> {Name, N};
                                           #{} -> Name = mallocinfo_process:name(P),
                                                  {Name, N#{P => Name}}
                                       end
                               end, Names0, maps:keys(Pids)),
            Counts = lists:foldl(fun(Name, M) -> M#{Name => maps:get(Name, M, 0) + 1} end,
                                 #{}, Names),
            Sorted = lists:sort(fun({A, X}, {B, Y}) -> X > Y orelse (X =:= Y andalso A =< B) end,
                                maps:to_list(Counts)),
            {Row#{processes => Sorted, processes_bytes => lists:sum(maps:values(Pids))}, Names1}
    end;
row_processes(Row, _, Names) ->
    {Row, Names}.

%% What the next report compares with: when, the tracker's live bytes and
%% the native functions' bytes (the largest 100).
this_run(#{functions := Rows, live_bytes := Live}) ->
    Native = [R || #{label := native} = R <- Rows],
    #{monotonic_ms => erlang:monotonic_time(millisecond),
      time_ms => erlang:system_time(millisecond),
      live_bytes => Live,
      functions => maps:from_list([{{maps:get(object, R), maps:get(function, R, undefined)},
                                    maps:get(bytes, R)}
                                   || R <- lists:sublist(Native, 100)])};
this_run(_) ->
    undefined.

%% The report's snapshot options: its ?OLDS oldest blocks. Blocks allocated
%% in the node's first ?STARTUP_MS are start-up blocks: "oldest live
%% blocks" leaves them out unless asked.
olds_options(true) ->
    #{olds => ?OLDS};
olds_options(false) ->
    Start = erlang:convert_time_unit(erlang:system_info(start_time), native, millisecond),
    Uptime = erlang:monotonic_time(millisecond) - Start,
    case Uptime - ?STARTUP_MS of
        MaxAge when MaxAge > 0 -> #{olds => ?OLDS, max_age_ms => MaxAge};
        _ -> #{olds => 0}
    end.

%% The largest processes but mallocinfo's own (registered under, or
%% started in, one of the application's modules: the demo is not one, its
%% processes stand for an application's and stay) and the calling shell's (this process and the shell linked to
%% it).
top_processes() ->
    Self = self(),
    Shell = [P || P <- element(2, process_info(Self, links)), is_pid(P),
                  shell_process(P)],
    Excluded = [Self | Shell],
    Ours = mallocinfo_lib:app_modules(),
    Top = mallocinfo_process:top(?TOP + length(Excluded) + 5, memory),
    lists:sublist([P || #{pid := Pid, name := Name} = P <- Top,
                        not lists:member(Pid, Excluded), not ours(Name, Ours)], ?TOP).

shell_process(P) ->
    case process_info(P, [initial_call, current_function]) of
        [{initial_call, {M1, _, _}}, {current_function, {M2, _, _}}] ->
            M1 =:= shell orelse M2 =:= shell;
        _ -> false
    end.

ours({M, _, _}, Ours) -> lists:member(M, Ours);
ours(Name, Ours) -> lists:member(Name, Ours).

%% Any exception becomes {error, _}: one failing source must not lose the
%% rest of the report.
guard(F) ->
    try F()
    catch Class:Reason -> {error, {Class, Reason}}
    end.

%% A source's value as the raw data holds it: the value itself, or the
%% error (mallocinfo_report_build says why a section is unavailable).
ok_value({ok, Value}) -> Value;
ok_value({error, _} = E) -> E.

read_proc(Name) ->
    case file:read_file("/proc/self/" ++ Name) of
        {ok, Bin} -> Bin;
        {error, _} = E -> E
    end.

%% `/proc/self/smaps' as mallocinfo_report_smaps:parse_smaps/1's mappings, or
%% why not: the file could not be read, or its text was not what the
%% parser knows (the resident set then says so, and the rest of the report
%% goes on).
parse_smaps(Text) when is_binary(Text) ->
    try mallocinfo_report_smaps:parse_smaps(Text)
    catch Class:Reason -> {error, {unexpected_input, {Class, Reason}}}
    end;
parse_smaps({error, _} = Error) ->
    Error.

%% instrument is in the tools application up to OTP 25 and in runtime_tools
%% from OTP 26 on; a release may lack either.
instrument_call(F) ->
    case code:ensure_loaded(instrument) of
        {module, instrument} ->
            guard(fun() -> instrument:F() end);
        {error, _} ->
            App = mallocinfo_report_build:instrument_app(erlang:system_info(otp_release)),
            {error, {missing_application, App}}
    end.

allocator() ->
    case guard(fun mallocinfo_glibc:allocator/0) of
        A when is_atom(A) -> A;
        _ -> glibc
    end.

libc_summary() ->
    case guard(fun mallocinfo_glibc:summary/0) of
        {ok, #{arenas := _} = S} -> S;
        Error -> Error
    end.

%% The heap map forks and walks every arena: tens of ms to about a second.
%% The walk's own timeout kills its child and frees the dirty scheduler
%% (killing a waiting Erlang process would not); the report reads only the
%% totals, so no call sites are numbered or symbolized.
heap_map() ->
    guard(fun() -> mallocinfo_heap:summary(#{timeout => ?HEAP_MAP_TIMEOUT, max_sites => 0}) end).

ets_top() ->
    W = erlang:system_info(wordsize),
    Tables = [{Words * W, T, Name, Size}
              || T <- ets:all(),
                 [{memory, Words}, {name, Name}, {size, Size}] <- [ets_info(T)]],
    [#{table => Name, bytes => B, objects => S}
     || {B, _, Name, S} <- lists:sublist(lists:reverse(lists:sort(Tables)), ?TOP)].

ets_info(T) ->
    case ets:info(T) of
        undefined -> [];
        Info -> [{K, proplists:get_value(K, Info)} || K <- [memory, name, size]]
    end.

%%% ---------------------------------------------------------------------------
%%% A cluster

cluster(Nodes, Timeout, Attach, Local) ->
    Workers = [{spawn_monitor(fun() -> exit({?MODULE, node_report(N, Timeout, Attach, Local)}) end),
                N}
               || N <- Nodes],
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    [{N, await(Pid, Ref, Deadline)} || {{Pid, Ref}, N} <- Workers].

await(Pid, Ref, Deadline) ->
    Left = max(0, Deadline - erlang:monotonic_time(millisecond)),
    receive
        {'DOWN', Ref, process, Pid, {?MODULE, Result}} -> Result;
        {'DOWN', Ref, process, Pid, Other} -> {error, {crashed, Other}}
    after Left ->
            exit(Pid, kill),
            receive {'DOWN', Ref, process, Pid, _} -> ok end,
            {error, timeout}
    end.

node_report(Node, _Timeout, Attach, Local) when Node =:= node() ->
    case Attach of
        true -> A = mallocinfo_trace:attach(), {ok, (collect(Local))#{attach => A}};
        false -> {ok, collect(Local)}
    end;
node_report(Node, Timeout, Attach, Local) ->
    try
        Injected = case mallocinfo_remote:ensure_app(Node, Timeout) of
                       {ok, I} -> I;
                       {error, NotLoaded} -> throw({inject, NotLoaded})
                   end,
        Attached = case Attach of
                       true -> #{attach => erpc:call(Node, mallocinfo_trace, attach, [], Timeout)};
                       false -> #{}
                   end,
        %% collect/0 when there are no options: a node running an older
        %% mallocinfo answers it.
        Args = case map_size(Local) of 0 -> []; _ -> [Local] end,
        Report = erpc:call(Node, ?MODULE, collect, Args, Timeout),
        {ok, maps:merge(Report#{injected => Injected}, Attached)}
    catch
        error:{erpc, noconnection} -> {error, unreachable};
        error:{erpc, timeout} -> {error, timeout};
        throw:{inject, Why} -> {error, {inject_failed, Why}};
        error:{exception, Reason, _Stack} -> {error, {collect_failed, Reason}};
        Class:Reason -> {error, {Class, Reason}}
    end.
