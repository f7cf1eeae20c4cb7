%% @doc One report that accounts for a node's resident set: which layer
%% holds the memory (ERTS, libc, native callers, another allocator), what
%% nothing accounts for, and a few ranked sentences saying what it means.
%%
%% {@link collect/0} gathers everything the running node can tell (each
%% source guarded: a missing module, an absent interposer or a failing call
%% makes its section `{unavailable, Why, How}' instead of failing the
%% report), then {@link build/1} turns that raw data into the report with
%% pure functions, which EUnit tests on canned `/proc' text and crafted
%% maps. {@link collect/1} does the same for every node of a cluster in
%% parallel, loading mallocinfo over distribution where it is missing.
%% `mallocinfo:report/0,1' print it.
%%
%% The report map (`collect/0'):
%% <ul>
%% <li>`resident': RSS, PSS, anonymous/file/shmem (`smaps_rollup',
%%     `status') and `groups': the mappings of `/proc/self/smaps' by kind
%%     (`main_heap', `arenas', `stacks', `jit', `noreserve', `anon',
%%     `files', `special'), each `#{rss, size, count}'.</li>
%% <li>`erts': `erlang:memory()', per allocator type `allocated' (carriers)
%%     and `used' (blocks), carriers from `instrument:carriers/0' with their
%%     free-block histogram, tagged allocations by origin from
%%     `instrument:allocations/0', the largest processes and ETS tables.</li>
%% <li>`libc': `mallinfo2', per-arena system/in-use/free, arena count and
%%     `M_ARENA_MAX', the heap map summary when `mallocinfo_heap' is
%%     there.</li>
%% <li>`native': the tracker's top call sites and oldest blocks.</li>
%% <li>`other_allocator': jemalloc or tcmalloc figures when active.</li>
%% <li>`attributed', `unaccounted_bytes', `unaccounted_percent'.</li>
%% <li>`verdicts': sentences, most bytes first.</li>
%% </ul>
-module(mallocinfo_report).

-export([collect/0, collect/1, collect/2, format/1, format_cluster/1]).
%% Pure, exported for tests.
-export([build/1, parse_smaps/1, parse_fields/1, group_mappings/1, allocator_types/1,
         erts_mmap_bytes/1, carriers_summary/1, allocations_summary/1, arena_max/2,
         rules/0, rule/2, verdicts/1, culprit/1,
         human_bytes/1, human_count/1, human_age/1]).

-export_type([report/0, unavailable/0, node_result/0]).

%% A section that could not be produced: why, and how to get it.
-type unavailable() :: {unavailable, Why :: term(), How :: binary()}.
-type report() :: #{atom() => term()}.
-type node_result() :: {node(), {ok, report()} | {error, term()}}.

-define(MiB, (1 bsl 20)).
-define(HEAP_MAX, (64 * ?MiB)).
%% A stack guard is at most this big; anything larger that is PROT_NONE is
%% a reservation, not a guard.
-define(GUARD_MAX, ?MiB).
%% A verdict needs at least this many bytes and this share of RSS.
-define(SIGNIFICANT_BYTES, (16 * ?MiB)).
-define(SIGNIFICANT_PERCENT, 5).
%% Blocks older than this make a large call site "a leak".
-define(LEAK_AGE_MS, 60000).
-define(HEAP_MAP_TIMEOUT, 10000).
-define(DEFAULT_TIMEOUT, 30000).
-define(SITES, 10).
-define(OLDS, 5).
-define(TOP, 5).
%% One row of the cluster table: 78 columns at most.
-define(ROW, "~-20ts ~9ts ~9ts ~9ts ~9ts ~6ts  ~ts~n").

%%% ---------------------------------------------------------------------------
%%% API

%% @doc The report of this node. Never fails: a source that is missing or
%% fails makes its section `{unavailable, Why, How}'. Takes as long as its
%% slowest source: `instrument' scans every carrier, the libc summary forks
%% once, the heap map (when `mallocinfo_heap' is loaded) forks and walks
%% every arena, bounded by a 10 s timeout.
-spec collect() -> report().
collect() ->
    build(gather()).

%% @equiv collect(Nodes, #{})
-spec collect([node()]) -> [node_result()].
collect(Nodes) ->
    collect(Nodes, #{}).

%% @doc The report of every node in `Nodes', collected in parallel with
%% `erpc', in the order given. A node that lacks mallocinfo gets it first:
%% the modules' object code and the NIF shared object are sent from this
%% node, the shared object is written to a private directory (mode 0700,
%% random name, under the target's `TMPDIR' or `/tmp'), loaded, and the
%% directory removed; the report then says `injected => true'.
%% A node that cannot be reached gives `{error, unreachable}', one that
%% does not answer in time `{error, timeout}', any other failure
%% `{error, Reason}'; none of them fails the call. `Opts': `timeout' (ms
%% for the whole collection, default 30000).
-spec collect([node()], #{timeout => pos_integer()}) -> [node_result()].
collect(Nodes, Opts) when is_list(Nodes), is_map(Opts) ->
    case lists:all(fun is_atom/1, Nodes) andalso maps:keys(Opts) -- [timeout] =:= [] of
        true -> ok;
        false -> erlang:error(badarg, [Nodes, Opts])
    end,
    Timeout = maps:get(timeout, Opts, ?DEFAULT_TIMEOUT),
    case is_integer(Timeout) andalso Timeout > 0 of
        true -> cluster(Nodes, Timeout);
        false -> erlang:error(badarg, [Nodes, Opts])
    end;
collect(Nodes, Opts) ->
    erlang:error(badarg, [Nodes, Opts]).

%% @doc The report as text, at most 80 columns wide.
-spec format(report()) -> iolist().
format(R) ->
    [header(R), section_verdicts(R), section_resident(R), section_erts(R),
     section_libc(R), section_native(R), section_other(R), section_unaccounted(R)].

%% @doc A cluster's reports as text: one row per node (RSS, `erlang:memory(total)',
%% libc free bytes, live bytes the tracker sees, the unaccounted share,
%% and whether mallocinfo had to be injected), why each failed node failed,
%% then each node's verdicts.
-spec format_cluster([node_result()]) -> iolist().
format_cluster(Results) ->
    Head = io_lib:format(?ROW, ["node", "RSS", "ERTS", "libc free", "native", "unacct", "status"]),
    Failures = [para(io_lib:format("~ts: ~0tp", [N, Why]))
                || {N, {error, Why}} <- Results, Why =/= unreachable, Why =/= timeout],
    Verdicts = [[io_lib:format("~ts:~n", [N]),
                 [io_lib:format("  - ~ts~n", [wrap(V, 76, "    ")]) || V <- maps:get(verdicts, R, [])]]
                || {N, {ok, R}} <- Results],
    [rule_line(io_lib:format("cluster: ~b nodes", [length(Results)])), Head,
     [cluster_row(N, Res) || {N, Res} <- Results],
     [["failed:\n", Failures] || Failures =/= []],
     [[rule_line("Verdicts"), Verdicts] || Verdicts =/= []]].

%%% ---------------------------------------------------------------------------
%%% Gathering (impure): each source guarded

gather() ->
    Mem = erlang:memory(),
    #{node => node(),
      os_pid => list_to_integer(os:getpid()),
      otp_release => list_to_binary(erlang:system_info(otp_release)),
      time => list_to_binary(calendar:system_time_to_rfc3339(erlang:system_time(millisecond),
                                                             [{unit, millisecond}])),
      cores => erlang:system_info(logical_processors_online),
      word_size => erlang:system_info(wordsize),
      libc_version => guard(fun() -> mallocinfo_nif:libc_version() end),
      smaps => read_proc("smaps"),
      smaps_rollup => read_proc("smaps_rollup"),
      status => read_proc("status"),
      memory => maps:from_list(Mem),
      allocators => [{A, guard(fun() -> erlang:system_info({allocator, A}) end)}
                     || A <- erlang:system_info(alloc_util_allocators)],
      erts_mmap => guard(fun() -> erlang:system_info({allocator, erts_mmap}) end),
      carriers => instrument_call(carriers),
      allocations => instrument_call(allocations),
      processes => guard(fun() -> mallocinfo_proc:top(?TOP, memory) end),
      ets => guard(fun ets_top/0),
      allocator => allocator(),
      mallinfo => guard(fun mallocinfo:mallinfo/0),
      libc_summary => libc_summary(),
      heap_map => heap_map(),
      env => maps:from_list([{V, os:getenv(V)} || V <- ["MALLOC_ARENA_MAX", "GLIBC_TUNABLES"]]),
      trace_status => guard(fun mallocinfo_trace:status/0),
      sites => guard(fun() -> mallocinfo_trace:sites(?SITES, #{demangle => true}) end),
      olds => guard(fun() -> mallocinfo_trace:olds(?OLDS, #{demangle => true}) end),
      jemalloc => optional(mallocinfo_jemalloc, summary, []),
      tcmalloc => optional(mallocinfo_tcmalloc, stats, [])}.

%% Any exception becomes {error, _}: one failing source must not lose the
%% rest of the report.
guard(F) ->
    try F()
    catch Class:Reason -> {error, {Class, Reason}}
    end.

read_proc(Name) ->
    case file:read_file("/proc/self/" ++ Name) of
        {ok, Bin} -> Bin;
        {error, _} = E -> E
    end.

%% instrument is in the tools application, which a release may lack.
instrument_call(F) ->
    case code:ensure_loaded(instrument) of
        {module, instrument} -> guard(fun() -> instrument:F() end);
        {error, _} -> {error, {missing_application, tools}}
    end.

%% A function of a module that may not exist in this node (another part of
%% mallocinfo, or an older version): {error, {missing, M, F}} when absent.
%% The module is a variable, so xref does not ask for it.
optional(M, F, Args) ->
    case code:ensure_loaded(M) =:= {module, M} andalso
        erlang:function_exported(M, F, length(Args)) of
        true -> guard(fun() -> apply(M, F, Args) end);
        false -> {error, {missing, M, F}}
    end.

allocator() ->
    case optional(mallocinfo, allocator, []) of
        A when is_atom(A) -> A;
        _ -> glibc
    end.

libc_summary() ->
    case guard(fun mallocinfo:summary/0) of
        #{arenas := _} = S -> S;
        Error -> Error
    end.

%% The heap map forks and walks every arena: tens of ms to about a second.
%% It runs in its own process so a stuck walk costs at most the timeout.
heap_map() ->
    case code:ensure_loaded(mallocinfo_heap) =:= {module, mallocinfo_heap} andalso
        erlang:function_exported(mallocinfo_heap, summary, 0) of
        false ->
            {error, {missing, mallocinfo_heap, summary}};
        true ->
            {Pid, Ref} = spawn_monitor(fun() -> exit({heap_map, optional(mallocinfo_heap, summary, [])}) end),
            receive
                {'DOWN', Ref, process, Pid, {heap_map, Result}} -> Result;
                {'DOWN', Ref, process, Pid, Other} -> {error, Other}
            after ?HEAP_MAP_TIMEOUT ->
                    exit(Pid, kill),
                    receive {'DOWN', Ref, process, Pid, _} -> ok end,
                    {error, timeout}
            end
    end.

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
%%% Building the report (pure)

%% @doc The report from the raw data `collect/0' gathers. Pure: EUnit feeds
%% it canned `/proc' text and crafted terms.
-spec build(map()) -> report().
build(Raw) ->
    Resident = resident(Raw),
    Erts = erts(Raw),
    Libc = libc(Raw),
    Native = native(Raw),
    Other = other_allocator(Raw),
    Base = (maps:with([node, os_pid, otp_release, time, libc_version, allocator], Raw))#{
             resident => Resident, erts => Erts, libc => Libc, native => Native,
             other_allocator => Other},
    R = maps:merge(Base, account(Base)),
    R#{verdicts => verdicts(R)}.

%%% Resident set --------------------------------------------------------------

resident(#{smaps := Smaps} = Raw) when is_binary(Smaps) ->
    Vmas = parse_smaps(Smaps),
    #{groups := Groups} = Grouped = group_mappings(Vmas),
    Total = lists:sum([Rss || #{rss := Rss} <- maps:values(Groups)]),
    Rollup = fields_or_empty(maps:get(smaps_rollup, Raw, undefined)),
    Status = fields_or_empty(maps:get(status, Raw, undefined)),
    Grouped#{rss => maps:get(<<"Rss">>, Rollup, maps:get(<<"VmRSS">>, Status, Total)),
             mapped_rss => Total,
             pss => maps:get(<<"Pss">>, Rollup, undefined),
             anonymous => maps:get(<<"RssAnon">>, Status, maps:get(<<"Anonymous">>, Rollup, undefined)),
             file => maps:get(<<"RssFile">>, Status, undefined),
             shmem => maps:get(<<"RssShmem">>, Status, undefined),
             swap => maps:get(<<"VmSwap">>, Status, maps:get(<<"Swap">>, Rollup, undefined)),
             peak => maps:get(<<"VmHWM">>, Status, undefined),
             mappings => length(Vmas)};
resident(#{smaps := {error, Why}}) ->
    {unavailable, {smaps, Why}, <<"/proc/self/smaps is needed (Linux, /proc mounted)">>};
resident(_) ->
    {unavailable, no_smaps, <<"/proc/self/smaps is needed (Linux, /proc mounted)">>}.

fields_or_empty(Bin) when is_binary(Bin) -> parse_fields(Bin);
fields_or_empty(_) -> #{}.

%% @doc `Key: value kB' lines (`status', `smaps_rollup') as a map of bytes;
%% lines without a kB value are left out.
-spec parse_fields(binary()) -> #{binary() => non_neg_integer()}.
parse_fields(Bin) ->
    maps:from_list([KV || Line <- binary:split(Bin, <<"\n">>, [global, trim_all]),
                          {_, _} = KV <- [kb_field(Line)]]).

kb_field(Line) ->
    case binary:split(Line, <<":">>) of
        [Key, Rest] ->
            case binary:split(string:trim(Rest), <<" ">>, [global, trim_all]) of
                [N, <<"kB">>] -> to_bytes(Key, N);
                _ -> none
            end;
        _ ->
            none
    end.

to_bytes(Key, N) ->
    try {Key, binary_to_integer(N) * 1024}
    catch error:badarg -> none
    end.

%% @doc `/proc/<pid>/smaps' text as a list of mappings, in address order:
%% `#{start, stop, perms, path, size, rss, pss, anon, swap, flags}' (bytes;
%% `flags' is the `VmFlags' list, or `undefined' on kernels without it;
%% `path' is `<<>>' for anonymous memory).
-spec parse_smaps(binary()) -> [map()].
parse_smaps(Bin) ->
    Lines = binary:split(Bin, <<"\n">>, [global, trim_all]),
    lists:reverse(smaps_lines(Lines, undefined, [])).

smaps_lines([], Cur, Acc) ->
    push(Cur, Acc);
smaps_lines([<<C, _/binary>> = Line | Rest], Cur, Acc)
  when (C >= $0 andalso C =< $9) orelse (C >= $a andalso C =< $f) ->
    smaps_lines(Rest, vma_header(Line), push(Cur, Acc));
smaps_lines([_ | Rest], undefined, Acc) ->
    smaps_lines(Rest, undefined, Acc);
smaps_lines([<<"VmFlags:", Flags/binary>> | Rest], Cur, Acc) ->
    smaps_lines(Rest, Cur#{flags => binary:split(Flags, <<" ">>, [global, trim_all])}, Acc);
smaps_lines([Line | Rest], Cur, Acc) ->
    Cur1 = case kb_field(Line) of
               {<<"Size">>, V} -> Cur#{size => V};
               {<<"Rss">>, V} -> Cur#{rss => V};
               {<<"Pss">>, V} -> Cur#{pss => V};
               {<<"Anonymous">>, V} -> Cur#{anon => V};
               {<<"Swap">>, V} -> Cur#{swap => V};
               _ -> Cur
           end,
    smaps_lines(Rest, Cur1, Acc).

push(undefined, Acc) -> Acc;
push(Vma, Acc) -> [Vma | Acc].

%% "7f0e12a1c000-7f0e12e1c000 rw-p 00000000 00:00 0      [path with spaces]"
vma_header(Line) ->
    [Range, Perms, _Offset, _Dev, _Inode | Path] = binary:split(Line, <<" ">>, [global, trim_all]),
    [Start, Stop] = binary:split(Range, <<"-">>),
    S = binary_to_integer(Start, 16),
    E = binary_to_integer(Stop, 16),
    #{start => S, stop => E, perms => Perms, path => iolist_to_binary(lists:join(<<" ">>, Path)),
      size => E - S, rss => 0, pss => 0, anon => 0, swap => 0, flags => undefined}.

%% @doc The mappings grouped by what they are. Each group is
%% `#{rss, size, count}' (bytes; count of mappings, of 64 MiB heaps for
%% `arenas', of stacks for `stacks'):
%% <ul>
%% <li>`main_heap': `[heap]', glibc's main arena (brk).</li>
%% <li>`arenas': glibc's non-main arenas. Each heap of a non-main arena is
%%     an anonymous private `MAP_NORESERVE' reservation of HEAP_MAX (64 MiB
%%     on 64-bit) whose start is 64 MiB aligned: readable and writable from
%%     the start up to what the arena uses, `PROT_NONE' after. A mapping
%%     that starts 64 MiB aligned and, with the mappings right after it,
%%     covers 64 MiB windows exactly that way (`rw' then `---', all `nr')
%%     is counted as heaps; a mapping that merged with a neighbour and
%%     sticks out of the windows has its Rss split in proportion to the
%%     bytes inside (the kernel does not say which pages are where). A
%%     heap whose start merged with a writable NORESERVE mapping below it
%%     is missed (it is counted in `noreserve').</li>
%% <li>`stacks': `[stack]', and thread stacks: writable anonymous mappings
%%     directly above an anonymous `PROT_NONE' guard of at most 1 MiB.</li>
%% <li>`jit': the BEAM JIT's code, the two views of its `memfd:vmem'
%%     (or any executable anonymous mapping).</li>
%% <li>`noreserve': other anonymous `MAP_NORESERVE' mappings (the tracker's
%%     tables are).</li>
%% <li>`anon': all other anonymous memory: ERTS carriers (mseg_alloc),
%%     glibc's mmapped blocks, other allocators, direct mmaps.</li>
%% <li>`files': file-backed mappings; `special': `[vdso]', other shared
%%     memory.</li>
%% </ul>
%% Also `files_top' and `anon_top': the largest files and anonymous
%% mappings by Rss.
-spec group_mappings([map()]) -> map().
group_mappings(Vmas) ->
    Windows = heap_windows(Vmas),
    {Parts, _} = lists:mapfoldl(fun(V, Prev) -> {classify(V, Prev, Windows), V} end,
                                undefined, Vmas),
    Flat = lists:append(Parts),
    Kinds = [main_heap, arenas, stacks, jit, noreserve, anon, files, special],
    Empty = maps:from_list([{K, #{rss => 0, size => 0, count => 0}} || K <- Kinds]),
    Groups0 = lists:foldl(
                fun({K, Rss, Size, Count, _V}, Acc) ->
                        #{rss := R0, size := S0, count := C0} = maps:get(K, Acc),
                        Acc#{K => #{rss => R0 + Rss, size => S0 + Size, count => C0 + Count}}
                end, Empty, Flat),
    Groups = maps:update_with(arenas, fun(G) -> G#{count => length(Windows)} end, Groups0),
    Files = lists:foldl(fun({files, Rss, _, _, #{path := P}}, Acc) ->
                                maps:update_with(P, fun(X) -> X + Rss end, Rss, Acc);
                           (_, Acc) -> Acc
                        end, #{}, Flat),
    FilesTop = lists:sublist(lists:reverse(lists:keysort(2, maps:to_list(Files))), 3),
    AnonTop = lists:sublist(
                lists:reverse(lists:sort([{Rss, S, E} || {anon, Rss, _, _, #{start := S, stop := E}} <- Flat,
                                                          Rss > 0])), ?TOP),
    #{groups => Groups,
      files_top => [#{path => P, rss => R} || {P, R} <- FilesTop],
      anon_top => [#{start => S, stop => E, rss => R} || {R, S, E} <- AnonTop]}.

%% One mapping -> [{Kind, Rss, Size, Count, Vma}]: two parts when it
%% straddles a glibc heap window.
classify(#{path := <<"[heap]">>} = V, _, _) -> [whole(main_heap, V)];
classify(#{path := <<"[stack", _/binary>>} = V, _, _) -> [whole(stacks, V)];
classify(#{path := <<"/memfd:vmem", _/binary>>} = V, _, _) -> [whole(jit, V)];
classify(#{path := Path} = V, Prev, Windows) ->
    case anonymous(Path) of
        false when binary_part(Path, 0, 1) =:= <<"/">> -> [whole(files, V)];
        false -> [whole(special, V)];
        true -> classify_anon(V, Prev, Windows)
    end.

classify_anon(#{size := Size, rss := Rss} = V, Prev, Windows) ->
    case overlap(V, Windows) of
        0 ->
            [whole(anon_kind(V, Prev), V)];
        Size ->
            [{arenas, Rss, Size, 1, V}];
        In ->
            InRss = Rss * In div Size,
            [{arenas, InRss, In, 1, V},
             {anon_kind(V, Prev), Rss - InRss, Size - In, 1, V}]
    end.

anon_kind(#{perms := <<_, _, $x, _>>}, _) ->
    jit;
anon_kind(#{perms := <<"rw", _, _>>, start := S} = V, #{stop := S, perms := <<"---", _>>, path := P,
                                                    size := G})
  when G =< ?GUARD_MAX ->
    case anonymous(P) of
        true -> stacks;
        false -> plain_anon_kind(V)
    end;
anon_kind(V, _) ->
    plain_anon_kind(V).

plain_anon_kind(#{flags := Flags}) when is_list(Flags) ->
    case lists:member(<<"nr">>, Flags) of
        true -> noreserve;
        false -> anon
    end;
plain_anon_kind(_) ->
    anon.

whole(Kind, #{rss := Rss, size := Size} = V) -> {Kind, Rss, Size, 1, V}.

anonymous(<<>>) -> true;
anonymous(<<"[anon:", _/binary>>) -> true;
anonymous(_) -> false.

overlap(#{start := S, stop := E}, Windows) ->
    lists:sum([max(0, min(E, W + ?HEAP_MAX) - max(S, W)) || W <- Windows]).

%% Start addresses of the 64 MiB windows that are glibc heaps (see
%% group_mappings/1). A heap begins a mapping: glibc maps it on its own and
%% its first bytes are the heap header. So a candidate is a writable
%% anonymous private NORESERVE mapping that starts 64 MiB aligned; from
%% there, contiguous anonymous private NORESERVE mappings must cover each
%% window writable first and PROT_NONE after (never writable again), and
%% the run must end on a window boundary (a PROT_NONE tail that goes on
%% past it is a reservation beside the heap). A writable mapping that runs
%% on into the next window (heaps that filled up and merged) continues
%% into a window that must qualify too.
heap_windows(Vmas) ->
    T = list_to_tuple(Vmas),
    lists:usort(lists:append(
                  [Ws || I <- lists:seq(1, tuple_size(T)),
                         #{start := B, perms := <<"rw", _, $p>>, path := P} = V <- [element(I, T)],
                         B rem ?HEAP_MAX =:= 0, anonymous(P), noreserve(V),
                         {ok, Ws} <- [heap_run(T, I, B, B, rw)]])).

%% Walks mapping I.. of a run that started at B; WinStart is the current
%% window; State is rw (still writable) or none (PROT_NONE seen).
heap_run(T, I, B, WinStart, State) when I =< tuple_size(T) ->
    #{stop := E, perms := Perms, path := P} = V = element(I, T),
    WinEnd = WinStart + ?HEAP_MAX,
    Kind = case Perms of
               <<"rw", _, $p>> -> rw;
               <<"---p">> -> none;
               _ -> bad
           end,
    Fits = Kind =/= bad andalso anonymous(P) andalso noreserve(V) andalso
        not (Kind =:= rw andalso State =:= none),
    if
        not Fits -> error;
        E =:= WinEnd; Kind =:= none, E > WinEnd -> {ok, lists:seq(B, WinStart, ?HEAP_MAX)};
        E < WinEnd -> next_in_run(T, I, B, WinStart, Kind, E);
        true ->
            %% A writable mapping crossing into the next window(s).
            Last = (E - 1) div ?HEAP_MAX * ?HEAP_MAX,
            case E rem ?HEAP_MAX of
                0 -> {ok, lists:seq(B, Last, ?HEAP_MAX)};
                _ -> next_in_run(T, I, B, Last, rw, E)
            end
    end;
heap_run(_, _, _, _, _) ->
    error.

next_in_run(T, I, B, WinStart, State, Stop) ->
    case I + 1 =< tuple_size(T) andalso maps:get(start, element(I + 1, T)) =:= Stop of
        true -> heap_run(T, I + 1, B, WinStart, State);
        false -> error
    end.

%% Kernels without VmFlags (before 3.8) cannot tell; assume it is.
noreserve(#{flags := undefined}) -> true;
noreserve(#{flags := Flags}) -> lists:member(<<"nr">>, Flags).

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
%% heap) and from `mseg_alloc' (mmap). Largest `allocated' first.
%% Input: `[{Name, erlang:system_info({allocator, Name})}]'.
-spec allocator_types([{atom(), term()}]) ->
          [#{name := atom(), allocated := non_neg_integer(), used := non_neg_integer(),
             sys_alloc := non_neg_integer(), mseg := non_neg_integer()}].
allocator_types(Allocs) ->
    Types = [allocator_type(Name, Instances) || {Name, Instances} <- Allocs, is_list(Instances)],
    lists:reverse(lists:sort(fun(#{allocated := A}, #{allocated := B}) -> A =< B end, Types)).

allocator_type(Name, Instances) ->
    Parts = [{Kind, Props} || {instance, _, Info} <- Instances, is_list(Info),
                              {Kind, Props} <- Info,
                              lists:member(Kind, [mbcs, mbcs_pool, sbcs]), is_list(Props)],
    Sum = fun(F) -> lists:sum([F(P) || {_, P} <- Parts]) end,
    #{name => Name,
      allocated => Sum(fun(P) -> current(carriers_size, P) end),
      used => Sum(fun blocks_size/1),
      sys_alloc => Sum(fun(P) -> current(sys_alloc_carriers_size, P) end),
      mseg => Sum(fun(P) -> current(mseg_alloc_carriers_size, P) end)}.

%% {Key, Current, ...}: the current value is the first.
current(Key, Props) ->
    case lists:keyfind(Key, 1, Props) of
        T when is_tuple(T), tuple_size(T) >= 2, is_integer(element(2, T)) -> element(2, T);
        _ -> 0
    end.

%% OTP 23+: {blocks, [{Type, [{count, ...}, {size, Cur, ...}]}]};
%% before: {blocks_size, Cur, ...}.
blocks_size(Props) ->
    case lists:keyfind(blocks, 1, Props) of
        {blocks, Types} when is_list(Types) ->
            lists:sum([current(size, L) || {_, L} <- Types, is_list(L)]);
        _ ->
            current(blocks_size, Props)
    end.

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
-spec carriers_summary(term()) -> map() | unavailable().
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
      by_type => lists:reverse(lists:keysort(2, [{T, S, C, A} || {T, {C, S, A}} <- maps:to_list(ByType)]))};
carriers_summary({error, {missing_application, tools}} = E) ->
    unavailable(E, <<"instrument is in the tools application: add tools to the release">>);
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
-spec allocations_summary(term()) -> [map()] | unavailable().
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
allocations_summary({error, {missing_application, tools}} = E) ->
    unavailable(E, <<"instrument is in the tools application: add tools to the release">>);
allocations_summary(Other) ->
    unavailable(Other, <<"instrument:allocations/0 failed">>).

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
                  {error, {missing, mallocinfo_heap, _}} = E ->
                      unavailable(E, <<"the heap map needs mallocinfo_heap (not in this build)">>);
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

native(#{trace_status := #{preloaded := false}}) ->
    {unavailable, not_preloaded,
     <<"start the node with LD_PRELOAD=<mallocinfo>/priv/libmallocinfo_preload.so "
       "(mallocinfo_trace:preload_env/0; README \"Preloading\")">>};
native(#{trace_status := #{recording := false}}) ->
    {unavailable, not_recording,
     <<"the interposer is loaded but this executable does not match MALLOCINFO_TRACE_EXE">>};
native(#{trace_status := #{mode := Mode}}) when Mode =:= off; Mode =:= counters ->
    {unavailable, {mode, Mode},
     <<"mallocinfo_trace:set_mode(full) records blocks allocated from then on">>};
native(#{trace_status := #{} = S, sites := Sites, olds := Olds}) when is_list(Sites), is_list(Olds) ->
    (maps:with([mode, live_bytes, live_entries, dropped, table_bytes, stack_bytes], S))#{
      sites => Sites, olds => Olds};
native(#{trace_status := #{}, sites := Error}) when not is_list(Error) ->
    unavailable(Error, <<"mallocinfo_trace:sites/2 failed">>);
native(#{trace_status := #{}, olds := Error}) ->
    unavailable(Error, <<"mallocinfo_trace:olds/2 failed">>);
native(#{trace_status := Error}) ->
    unavailable(Error, <<"mallocinfo_nif is needed">>);
native(_) ->
    {unavailable, no_tracker, <<"mallocinfo_nif is needed">>}.

%% @doc The frame that names who allocated: the first frame of the stack
%% outside the C and C++ runtime (a `malloc' called through `operator
%% new', `strdup' or a C++ container names its user, not libstdc++), else
%% the first frame. `undefined' for an empty stack.
-spec culprit([map()]) -> map() | undefined.
culprit([]) ->
    undefined;
culprit([First | _] = Stack) ->
    case [F || #{object := O} = F <- Stack, not runtime_object(O)] of
        [F | _] -> F;
        [] -> First
    end.

runtime_object(Object) ->
    Base = filename:basename(Object),
    lists:any(fun(P) -> binary:longest_common_prefix([Base, P]) =:= byte_size(P) end,
              [<<"libc.so">>, <<"libc-">>, <<"libstdc++.so">>, <<"libgcc_s.so">>,
               <<"ld-linux">>, <<"libmallocinfo_preload.so">>]).

%%% Other allocator -----------------------------------------------------------

other_allocator(#{allocator := jemalloc} = Raw) ->
    case maps:get(jemalloc, Raw, undefined) of
        {ok, #{resident := _} = S} -> #{allocator => jemalloc, summary => S, resident => maps:get(resident, S)};
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
account(#{resident := #{groups := G, rss := Rss}} = R) ->
    Rss_ = fun(K) -> maps:get(rss, maps:get(K, G)) end,
    Heaps = Rss_(main_heap) + Rss_(arenas),
    Anon = Rss_(anon),
    LibcArena = case maps:get(libc, R) of #{system_bytes := S} -> S; _ -> 0 end,
    LibcMmap = case maps:get(libc, R) of #{mmap_bytes := M} -> M; _ -> 0 end,
    Tracker = case maps:get(native, R) of
                  #{table_bytes := TB, stack_bytes := SB} -> TB + SB;
                  _ -> 0
              end,
    ErtsMmap = case maps:get(erts, R) of
                   #{mmap_bytes := E} when is_integer(E) -> E;
                   _ -> 0
               end,
    OtherAlloc = case maps:get(other_allocator, R) of
                     #{resident := OR} when is_integer(OR) -> OR;
                     _ -> 0
                 end,
    %% libc's mmapped blocks and another allocator's resident bytes are
    %% resident figures; ERTS's is what it mapped (virtual), so ERTS takes
    %% what is left, up to that.
    MmapPart = min(Anon, LibcMmap),
    OtherPart = min(Anon - MmapPart, OtherAlloc),
    ErtsPart = min(Anon - MmapPart - OtherPart, ErtsMmap),
    Attributed = [{files, Rss_(files)}, {jit, Rss_(jit)}, {stacks, Rss_(stacks)},
                  {special, Rss_(special)},
                  {libc_heaps, min(Heaps, LibcArena)},
                  {tracker_tables, min(Rss_(noreserve), Tracker)},
                  {erts_carriers, ErtsPart},
                  {libc_mmap, MmapPart},
                  {other_allocator, OtherPart}],
    Mapped = lists:sum([Rss_(K) || K <- maps:keys(G)]),
    Unaccounted = max(0, Mapped - lists:sum([B || {_, B} <- Attributed])),
    #{attributed => Attributed,
      %% How much of ERTS's claim is not backed by resident memory: up to
      %% this much of what is unaccounted could be hidden in it.
      erts_slack_bytes => max(0, ErtsMmap - ErtsPart),
      unaccounted_bytes => Unaccounted,
      unaccounted_percent => percent(Unaccounted, Mapped),
      rss_for_accounting => Mapped,
      headline_rss => Rss};
account(_) ->
    #{attributed => [], unaccounted_bytes => undefined, unaccounted_percent => undefined}.

percent(_, 0) -> 0.0;
percent(Part, Whole) -> round(Part * 1000 / Whole) / 10.

%%% Verdicts ------------------------------------------------------------------

%% @doc The rules, in no particular order; verdicts/1 ranks what they say.
-spec rules() -> [atom()].
rules() ->
    [native_holder, libc_fragmentation, erts_fragmentation, erts_mseg_cache, process_heap,
     erts_binary, erts_ets, other_allocator, tracker_tables, unexplained].

%% @doc The sentences of every rule that fires, most bytes first; a single
%% "nothing stands out" sentence, with the two largest groups, when none
%% does.
-spec verdicts(report()) -> [binary()].
verdicts(R) ->
    Fired = [V || Name <- rules(), {_, _} = V <- [rule(Name, R)]],
    case lists:reverse(lists:keysort(1, Fired)) of
        [] -> [nothing_stands_out(R)];
        Sorted -> [S || {_, S} <- Sorted]
    end.

%% @doc One rule on a report: `{Bytes, Sentence}' when its evidence is in
%% the report (Bytes ranks it), `none' otherwise. A rule needs at least
%% 16 MiB and 5% of RSS behind it.
-spec rule(atom(), report()) -> {non_neg_integer(), binary()} | none.
rule(native_holder, #{native := #{sites := [#{bytes := B, count := C, stack := Stack} = Site | _]}} = R) ->
    case significant(B, R) of
        false -> none;
        true ->
            Age = maps:get(oldest_age_ms, Site, 0),
            About = case maps:get(estimated, Site, false) of true -> "about "; false -> "" end,
            {Who, From} = who(culprit(Stack)),
            Tail = case Age >= ?LEAK_AGE_MS of
                       true -> "a leak";
                       false -> "a leak if it keeps growing (compare with a later report)"
                   end,
            {B, fmt("~ts holds ~ts~ts in ~ts~ts live blocks allocated from ~ts, the oldest ~ts old: ~ts",
                    [Who, About, human_bytes(B), About, human_count(C), From, human_age(Age), Tail])}
    end;
rule(libc_fragmentation, #{libc := #{arenas := [_ | _] = Arenas} = L} = R) ->
    System = lists:sum([S || #{system_bytes := S} <- Arenas]),
    Free = lists:sum([F || #{free_bytes := F} <- Arenas]),
    N = length(Arenas),
    case significant(Free, R) andalso Free * 100 >= 30 * System of
        false -> none;
        true ->
            Trim = case L of
                       #{heap_map := #{total := #{trimmable_bytes := T, pinned_bytes := P}}} ->
                           fmt("; mallocinfo:trim() would return about ~ts now, ~ts is pinned "
                               "between live blocks", [human_bytes(T), human_bytes(P)]);
                       _ -> ""
                   end,
            NonMainFree = lists:sum([F || #{arena := A, free_bytes := F} <- Arenas, A =/= 0]),
            ArenaMax = case L of
                           #{arena_max := #{value := Max}} -> io_lib:format(" of ~b allowed", [Max]);
                           _ -> ""
                       end,
            Cap = case N > 2 andalso NonMainFree * 2 >= Free of
                      true -> fmt("; ~ts of the free memory is in per-thread arenas: consider "
                                  "MALLOC_ARENA_MAX=2", [human_bytes(NonMainFree)]);
                      false -> ""
                  end,
            {Free, fmt("libc arenas hold ~ts of which ~ts (~b%) is free: fragmentation in libc "
                       "(~ts~ts)~ts~ts",
                       [human_bytes(System), human_bytes(Free), Free * 100 div max(1, System),
                        plural(N, "arena"), ArenaMax, Trim, Cap])}
    end;
rule(erts_fragmentation, #{erts := #{allocated := A, used := U, allocators := [_ | _] = Types}} = R) ->
    Unused = A - U,
    case significant(Unused, R) andalso U * 100 < 60 * A of
        false -> none;
        true ->
            [#{name := Worst, allocated := WA, used := WU} | _] =
                lists:reverse(lists:sort(fun(#{allocated := A1, used := U1}, #{allocated := A2, used := U2}) ->
                                                 A1 - U1 =< A2 - U2
                                         end, Types)),
            {Unused, fmt("ERTS allocators hold ~ts in carriers but use ~ts (~b%): fragmentation "
                         "inside erts_alloc, most in ~ts (~ts allocated, ~b% used)",
                         [human_bytes(A), human_bytes(U), U * 100 div max(1, A), Worst,
                          human_bytes(WA), WU * 100 div max(1, WA)])}
    end;
rule(erts_mseg_cache, #{erts := #{mseg_cache_bytes := C, mmap_bytes := M}} = R) when is_integer(C) ->
    case significant(C, R) of
        false -> none;
        true ->
            {C, fmt("ERTS keeps ~ts of freed carriers mapped in mseg_alloc's cache (~ts mapped in "
                    "all): they are reused for new carriers or released over time",
                    [human_bytes(C), human_bytes(M)])}
    end;
rule(tracker_tables, #{native := #{table_bytes := TB, stack_bytes := SB},
                       attributed := Attributed} = R) ->
    case proplists:get_value(tracker_tables, Attributed, 0) of
        B when is_integer(B) ->
            case significant(B, R) of
                false -> none;
                true ->
                    {B, fmt("the mallocinfo tracker's own tables keep ~ts resident (~ts of RSS, "
                            "~ts reserved): MALLOCINFO_TABLE_SIZE and MALLOCINFO_TRACE=sample "
                            "make them smaller",
                            [human_bytes(B), share(B, R), human_bytes(TB + SB)])}
            end;
        _ -> none
    end;
rule(process_heap, #{erts := #{processes := [#{pid := Pid, value := B} = P | _]}} = R) ->
    case significant(B, R) of
        false -> none;
        true ->
            {B, fmt("process ~ts~ts holds ~ts (~ts of RSS): mallocinfo_proc:print(~ts) shows what "
                    "is on its heap",
                    [pid_to_list(Pid), proc_name(maps:get(name, P, undefined)), human_bytes(B),
                     share(B, R), pid_to_list(Pid)])}
    end;
rule(erts_binary, #{erts := #{memory := #{binary := B}}} = R) ->
    case significant(B, R) andalso B * 4 >= rss(R) of
        false -> none;
        true ->
            {B, fmt("refc binaries take ~ts (~ts of RSS): mallocinfo_proc:top(10, binary) names the "
                    "processes that keep them", [human_bytes(B), share(B, R)])}
    end;
rule(erts_ets, #{erts := #{memory := #{ets := B}} = E} = R) ->
    case significant(B, R) andalso B * 4 >= rss(R) of
        false -> none;
        true ->
            Largest = case maps:get(ets, E, []) of
                          [#{table := T, bytes := TB} | _] ->
                              fmt(", the largest ~tp with ~ts", [T, human_bytes(TB)]);
                          _ -> ""
                      end,
            {B, fmt("ETS tables take ~ts (~ts of RSS)~ts", [human_bytes(B), share(B, R), Largest])}
    end;
rule(other_allocator, #{other_allocator := #{allocator := A, resident := Res} = O} = R)
  when is_integer(Res) ->
    Allocated = case O of
                    #{summary := #{allocated := X}} -> X;
                    #{allocated := X} when is_integer(X) -> X;
                    _ -> undefined
                end,
    case is_integer(Allocated) andalso significant(Res - Allocated, R) of
        false -> none;
        true ->
            {Res - Allocated,
             fmt("~ts keeps ~ts resident for ~ts allocated: ~ts it has not returned to the system",
                 [A, human_bytes(Res), human_bytes(Allocated), human_bytes(Res - Allocated)])}
    end;
rule(unexplained, #{unaccounted_bytes := U, unaccounted_percent := P} = R) when is_integer(U) ->
    case significant(U, R) andalso P >= 15 of
        false -> none;
        true ->
            Maps = case R of
                       #{resident := #{anon_top := [_ | _] = Top}} ->
                           "; the largest anonymous mappings: " ++
                               lists:join(", ", [[hex(S), " ", human_bytes(Rs)]
                                                 || #{start := S, rss := Rs} <- lists:sublist(Top, 3)]);
                       _ -> ""
                   end,
            {U, fmt("~ts (~.1f% of RSS) is memory no layer accounts for: most likely mapped directly "
                    "(mmap) by a NIF or a library~ts", [human_bytes(U), float(P), Maps])}
    end;
rule(_, _) ->
    none.

who(undefined) ->
    {"native code", "an unknown function"};
who(#{object := Object} = F) ->
    Base = filename:basename(Object),
    Who = case {binary:match(Base, <<"beam">>), binary:match(Base, <<".so">>)} of
              {{0, _}, _} -> "the VM itself (" ++ binary_to_list(Base) ++ ")";
              {_, nomatch} -> "native code in " ++ binary_to_list(Base);
              _ -> "the NIF " ++ binary_to_list(Base)
          end,
    From = case F of
               #{symbol := S} when is_binary(S) -> binary_to_list(S);
               #{offset := Off} -> io_lib:format("~ts+0x~.16b", [Base, Off]);
               _ -> "an unnamed function"
           end,
    {Who, From}.

proc_name(undefined) -> "";
proc_name(Name) when is_atom(Name) -> io_lib:format(" (~ts)", [Name]);
proc_name({M, F, A}) -> io_lib:format(" (~ts:~ts/~b)", [M, F, A]);
proc_name(Other) -> io_lib:format(" (~tp)", [Other]).

nothing_stands_out(#{resident := #{groups := G}} = R) ->
    Sorted = lists:reverse(lists:sort([{Rss, K} || {K, #{rss := Rss}} <- maps:to_list(G)])),
    Parts = [io_lib:format("~ts ~ts", [group_label(K), human_bytes(B)]) || {B, K} <- lists:sublist(Sorted, 2)],
    fmt("nothing stands out: RSS ~ts, the largest parts ~ts", [human_bytes(rss(R)), lists:join(" and ", Parts)]);
nothing_stands_out(_) ->
    <<"nothing stands out (the resident set could not be read)">>.

plural(1, Noun) -> ["1 ", Noun];
plural(N, Noun) -> [integer_to_list(N), " ", Noun, "s"].

hex(N) -> string:lowercase(integer_to_list(N, 16)).

significant(Bytes, R) ->
    Rss = rss(R),
    Bytes >= ?SIGNIFICANT_BYTES andalso Bytes * 100 >= ?SIGNIFICANT_PERCENT * Rss.

rss(#{resident := #{rss := Rss}}) -> Rss;
rss(_) -> 0.

share(B, R) ->
    io_lib:format("~b%", [B * 100 div max(1, rss(R))]).

fmt(Format, Args) ->
    unicode:characters_to_binary(io_lib:format(Format, Args)).

%%% ---------------------------------------------------------------------------
%%% Humanised units

%% @doc Bytes with a binary unit and one decimal: `512 B', `1.5 KiB',
%% `64.0 MiB', `1.8 GiB'.
-spec human_bytes(integer() | undefined) -> string().
human_bytes(undefined) -> "-";
human_bytes(B) when B < 0 -> "-" ++ human_bytes(-B);
human_bytes(B) when B < 1024 -> integer_to_list(B) ++ " B";
human_bytes(B) -> scaled(B, 1024, ["KiB", "MiB", "GiB", "TiB", "PiB"]).

%% @doc A count: as is below 10,000, else `12.3 k', `160 k', `3.2 M'.
-spec human_count(non_neg_integer()) -> string().
human_count(N) when N < 10000 -> integer_to_list(N);
human_count(N) -> scaled(N, 1000, ["k", "M", "G", "T"]).

scaled(V, Base, [Unit | Rest]) ->
    X = V / Base,
    if
        X >= Base, Rest =/= [] -> scaled(X, Base, Rest);
        X >= 100, Base =:= 1000 -> io_lib:format("~b ~s", [round(X), Unit]);
        true -> io_lib:format("~.1f ~s", [X, Unit])
    end.

%% @doc An age: `850 ms', `42 s', `5.2 min', `5.0 h', `3.1 d'.
-spec human_age(non_neg_integer()) -> string().
human_age(Ms) when Ms < 1000 -> io_lib:format("~b ms", [Ms]);
human_age(Ms) when Ms < 60000 -> io_lib:format("~b s", [Ms div 1000]);
human_age(Ms) when Ms < 3600000 -> io_lib:format("~.1f min", [Ms / 60000]);
human_age(Ms) when Ms < 2 * 86400000 -> io_lib:format("~.1f h", [Ms / 3600000]);
human_age(Ms) -> io_lib:format("~.1f d", [Ms / 86400000]).

%%% ---------------------------------------------------------------------------
%%% Text (80 columns)

header(R) ->
    Libc = case maps:get(libc_version, R, undefined) of
               V when is_binary(V) -> V;
               _ -> "?"
           end,
    [rule_line(io_lib:format("mallocinfo report: ~ts", [maps:get(node, R, '?')])),
     para(io_lib:format("os pid ~tp, OTP ~ts, glibc ~ts, malloc: ~ts, ~ts",
                        [maps:get(os_pid, R, '?'), maps:get(otp_release, R, "?"), Libc,
                         maps:get(allocator, R, glibc), maps:get(time, R, "")]))].

rule_line(Title) ->
    T = lists:flatten(Title),
    ["== ", T, " ", lists:duplicate(max(3, 76 - string:length(T)), $=), "\n"].

section_verdicts(R) ->
    Vs = maps:get(verdicts, R, []),
    [rule_line("Verdict"),
     [io_lib:format("~2b. ~ts~n", [I, wrap(V, 76, "    ")])
      || {I, V} <- lists:zip(lists:seq(1, length(Vs)), Vs)]].

section_resident(#{resident := {unavailable, _, _} = U}) ->
    [rule_line("1. Resident set"), unavailable_line(U)];
section_resident(#{resident := Res} = R) ->
    #{groups := G} = Res,
    Attributed = maps:from_list(maps:get(attributed, R, [])),
    Anon = rss_of(anon, G),
    Erts = maps:get(erts_carriers, Attributed, 0),
    Mmap = maps:get(libc_mmap, Attributed, 0),
    Other = maps:get(other_allocator, Attributed, 0),
    Count = fun(K, What) ->
                    case maps:get(count, maps:get(K, G)) of
                        0 -> "";
                        N -> io_lib:format("~b ~ts", [N, What])
                    end
            end,
    Files = lists:join(", ", [io_lib:format("~ts ~ts", [filename:basename(P), human_bytes(B)])
                              || #{path := P, rss := B} <- lists:sublist(maps:get(files_top, Res, []), 2)]),
    B = fun(K) -> human_bytes(maps:get(K, Res, undefined)) end,
    [rule_line("1. Resident set"),
     para(io_lib:format("RSS ~ts (peak ~ts), PSS ~ts: anonymous ~ts, file ~ts, shmem ~ts, swap ~ts",
                        [B(rss), B(peak), B(pss), B(anonymous), B(file), B(shmem), B(swap)])),
     io_lib:format("~b mappings, by kind:~n", [maps:get(mappings, Res, 0)]),
     group_line("glibc main heap [heap]", rss_of(main_heap, G), ""),
     group_line("glibc arenas (64 MiB heaps)", rss_of(arenas, G), Count(arenas, "heaps")),
     group_line("ERTS carriers, mseg cache (est.)", Erts, "up to what ERTS mapped"),
     [group_line("libc mmapped blocks (est.)", Mmap, "") || Mmap > 0],
     [group_line("other allocator (est.)", Other, "") || Other > 0],
     group_line("other anonymous", Anon - Erts - Mmap - Other, "no layer claims it"),
     group_line("MAP_NORESERVE anonymous", rss_of(noreserve, G), "tracker tables, reserves"),
     group_line("JIT code", rss_of(jit, G), "both views of the code"),
     group_line("thread stacks", rss_of(stacks, G), Count(stacks, "stacks")),
     group_line("files", rss_of(files, G), Files),
     [group_line("vdso, other shared", rss_of(special, G), "") || rss_of(special, G) > 0]].

group_line(Label, Bytes, Note) ->
    io_lib:format("  ~-32ts ~10ts  ~ts~n", [Label, human_bytes(Bytes), truncate(Note, 32)]).

rss_of(K, G) -> maps:get(rss, maps:get(K, G)).

section_erts(#{erts := E}) ->
    Mem = maps:get(memory, E),
    M = fun(K) -> human_bytes(maps:get(K, Mem, undefined)) end,
    Types = [T || #{allocated := A} = T <- maps:get(allocators, E), A > 0],
    #{allocated := Alloc, used := Used} = E,
    [rule_line("2. ERTS"),
     para(io_lib:format("erlang:memory(): total ~ts = processes ~ts + system ~ts (binary ~ts, "
                        "ets ~ts, code ~ts, atom ~ts)",
                        [M(total), M(processes), M(system), M(binary), M(ets), M(code), M(atom)])),
     para(io_lib:format("carriers: ~ts allocated, ~ts used (~b%); ~ts of them from malloc; ERTS "
                        "has ~ts mapped, ~ts of it mseg_alloc's cache of freed carriers",
                        [human_bytes(Alloc), human_bytes(Used), Used * 100 div max(1, Alloc),
                         human_bytes(maps:get(sys_alloc_bytes, E)),
                         human_bytes(maps:get(mmap_bytes, E)),
                         human_bytes(maps:get(mseg_cache_bytes, E, undefined))])),
     io_lib:format("  ~-16s ~11s ~11s ~6s~n", ["allocator", "allocated", "used", "usage"]),
     [io_lib:format("  ~-16ts ~11ts ~11ts ~5b%~n",
                    [N, human_bytes(A), human_bytes(U), U * 100 div max(1, A)])
      || #{name := N, allocated := A, used := U} <- lists:sublist(Types, 6)],
     carriers_lines(maps:get(carriers, E)),
     allocations_lines(maps:get(allocations, E)),
     case maps:get(processes, E) of
         [] -> [];
         Ps -> para(["largest processes: ",
                     lists:join("; ", [io_lib:format("~ts~ts ~ts", [pid_to_list(P), proc_name(N),
                                                                  human_bytes(V)])
                                       || #{pid := P, name := N, value := V} <- lists:sublist(Ps, 3)])])
     end,
     case maps:get(ets, E) of
         [] -> [];
         Ts -> para(["largest ETS tables: ",
                     lists:join("; ", [io_lib:format("~0tp ~ts", [T, human_bytes(TB)])
                                       || #{table := T, bytes := TB} <- lists:sublist(Ts, 3)])])
     end].

carriers_lines({unavailable, _, _} = U) ->
    unavailable_line("instrument:carriers/0 ", U);
carriers_lines(#{count := C, bytes := B, allocated := A, hist_start := H, free_histogram := Hist}) ->
    Last = length(Hist) - 1,
    Label = fun(0) -> "<=" ++ human_bytes(H);
               (I) when I =:= Last -> ">" ++ human_bytes(H bsl (I - 1));
               (I) -> "<=" ++ human_bytes(H bsl I)
            end,
    [para(io_lib:format("instrument: ~b carriers of ~ts hold ~ts in blocks; free blocks by size:",
                        [C, human_bytes(B), human_bytes(A)])),
     para_indented(lists:join("; ", [io_lib:format("~ts: ~ts", [Label(I), human_count(N)])
                                     || {I, N} <- lists:zip(lists:seq(0, Last), Hist), N > 0]))].

allocations_lines({unavailable, _, _} = U) ->
    unavailable_line("instrument:allocations/0 ", U);
allocations_lines([]) ->
    [];
allocations_lines(Rows) ->
    ["tagged allocations (enif_alloc, driver_alloc, binaries) by origin:\n",
     [io_lib:format("  ~-22ts ~-14ts ~8ts blocks  ~ts-~ts~n",
                    [truncate(atom_to_list(O), 22), truncate(atom_to_list(T), 14), human_count(C),
                     human_bytes(Min), human_bytes(Max)])
      || #{origin := O, type := T, count := C, min_bytes := Min, max_bytes := Max}
             <- lists:sublist(Rows, 5)]].

section_libc(#{libc := {unavailable, _, _} = U}) ->
    [rule_line("3. libc"), unavailable_line(U)];
section_libc(#{libc := L}) ->
    #{mallinfo := MI, arenas := Arenas, arena_max := #{value := Max, source := Src}} = L,
    Largest = lists:sublist(lists:reverse(lists:keysort(2, [{A, S} || #{arena := A, system_bytes := S}
                                                                         <- Arenas])), 8),
    Shown = [A || {A, _} <- Largest],
    M = fun(K) -> human_bytes(maps:get(K, MI)) end,
    [rule_line("3. libc (glibc malloc)"),
     [para(maps:get(note, L)) || maps:is_key(note, L)],
     para(io_lib:format("mallinfo2: arenas ~ts, in use ~ts, free ~ts (fastbins ~ts), releasable "
                        "top ~ts; mmapped blocks ~ts in ~b",
                        [M(arena), M(uordblks), M(fordblks), M(fsmblks), M(keepcost), M(hblkhd),
                         maps:get(hblks, MI)])),
     case maps:get(arena_count, L) of
         undefined -> para("per-arena figures unavailable (malloc_stats could not fork)");
         N -> para(io_lib:format("~b arenas, M_ARENA_MAX ~b (~ts)", [N, Max, Src]))
     end,
     [[io_lib:format("  ~-7s ~11s ~11s ~11s ~5s~n", ["arena", "system", "in use", "free", "free%"]),
       [io_lib:format("  ~-7b ~11ts ~11ts ~11ts ~4b%~n",
                      [A, human_bytes(S), human_bytes(U), human_bytes(F), F * 100 div max(1, S)])
        || #{arena := A, system_bytes := S, in_use_bytes := U, free_bytes := F} <- Arenas,
           lists:member(A, Shown)],
       [io_lib:format("  (~b smaller arenas not shown)~n", [length(Arenas) - length(Shown)])
        || length(Arenas) > length(Shown)]] || Arenas =/= []],
     heap_map_lines(maps:get(heap_map, L))].

heap_map_lines({unavailable, _, _} = U) ->
    unavailable_line("heap map ", U);
heap_map_lines(#{total := T}) ->
    B = fun(K) -> human_bytes(maps:get(K, T, undefined)) end,
    para(io_lib:format("heap map: free ~ts in ~ts chunks (largest ~ts); malloc_trim could return "
                       "~ts now; ~ts pinned between live blocks; resident ~ts",
                       [B(free_bytes), human_count(maps:get(free_chunks, T, 0)), B(largest_free),
                        B(trimmable_bytes), B(pinned_bytes), B(resident_bytes)])).

section_native(#{native := {unavailable, _, _} = U}) ->
    [rule_line("4. Native callers (tracker)"), unavailable_line(U)];
section_native(#{native := N}) ->
    #{sites := Sites, olds := Olds} = N,
    [rule_line("4. Native callers (tracker)"),
     para(io_lib:format("mode ~ts: ~ts live in ~ts blocks, ~b dropped",
                        [maps:get(mode, N), human_bytes(maps:get(live_bytes, N, 0)),
                         human_count(maps:get(live_entries, N, 0)), maps:get(dropped, N, 0)])),
     "top call sites (live bytes, blocks, oldest, allocated from):\n",
     [io_lib:format("  ~10ts ~7ts ~8ts  ~ts~n",
                    [human_bytes(B), human_count(C), human_age(maps:get(oldest_age_ms, S, 0)),
                     frame_text(culprit(St), 49)])
      || #{bytes := B, count := C, stack := St} = S <- lists:sublist(Sites, 6)],
     "oldest live blocks (size, age, allocated from):\n",
     [io_lib:format("  ~10ts ~8ts  ~ts~n", [human_bytes(Sz), human_age(A), frame_text(culprit(St), 57)])
      || #{size := Sz, age_ms := A, stack := St} <- Olds]].

%% "symbol (object)" in at most Width columns: the symbol gives way first.
frame_text(undefined, _) ->
    "?";
frame_text(#{object := O} = F, Width) ->
    Obj = truncate(filename:basename(O), Width div 2),
    Sym = case maps:get(symbol, F, undefined) of
              undefined -> io_lib:format("+0x~.16b", [maps:get(offset, F, 0)]);
              S -> S
          end,
    [truncate(Sym, Width - 3 - string:length(Obj)), " (", Obj, ")"].

truncate(S, N) ->
    Flat = unicode:characters_to_list(S),
    case string:length(Flat) > N of
        true -> [string:slice(Flat, 0, max(0, N - 3)), "..."];
        false -> Flat
    end.

section_other(#{other_allocator := none}) ->
    [rule_line("5. Other allocator"), "none: malloc is glibc's\n"];
section_other(#{other_allocator := {unavailable, _, _} = U}) ->
    [rule_line("5. Other allocator"), unavailable_line(U)];
section_other(#{other_allocator := #{allocator := jemalloc, summary := S}}) ->
    [rule_line("5. Other allocator: jemalloc"),
     para(io_lib:format("allocated ~ts, active ~ts, resident ~ts, mapped ~ts, retained ~ts, "
                        "metadata ~ts",
                        [human_bytes(maps:get(K, S, undefined))
                         || K <- [allocated, active, resident, mapped, retained, metadata]]))];
section_other(#{other_allocator := #{allocator := A} = O}) ->
    [rule_line(io_lib:format("5. Other allocator: ~ts", [A])),
     para(io_lib:format("allocated ~ts, resident ~ts",
                        [human_bytes(maps:get(allocated, O, undefined)),
                         human_bytes(maps:get(resident, O, undefined))]))].

section_unaccounted(#{unaccounted_bytes := undefined}) ->
    [rule_line("6. Unaccounted"), "unknown: the resident set could not be read\n"];
section_unaccounted(#{unaccounted_bytes := U, unaccounted_percent := P, attributed := A} = R) ->
    Parts = [io_lib:format("~ts ~ts", [attributed_label(K), human_bytes(B)]) || {K, B} <- A, B > 0],
    [rule_line("6. Unaccounted"),
     para(["mapped ", human_bytes(maps:get(rss_for_accounting, R, 0)),
           "; explained by the layers: ", lists:join(", ", Parts)]),
     io_lib:format("unaccounted: ~ts (~.1f% of RSS)~n", [human_bytes(U), float(P)]),
     case maps:get(erts_slack_bytes, R, 0) of
         Slack when Slack > 0 ->
             para(io_lib:format("(a lower bound: ERTS has ~ts more mapped than is resident for "
                                "it, and memory mapped behind its back could hide there)",
                                [human_bytes(Slack)]));
         _ -> []
     end].

attributed_label(files) -> "files";
attributed_label(jit) -> "JIT";
attributed_label(stacks) -> "stacks";
attributed_label(special) -> "vdso etc.";
attributed_label(libc_heaps) -> "libc heaps";
attributed_label(tracker_tables) -> "tracker tables";
attributed_label(erts_carriers) -> "ERTS mappings";
attributed_label(libc_mmap) -> "libc mmapped blocks";
attributed_label(other_allocator) -> "other allocator".

group_label(main_heap) -> "the glibc main heap";
group_label(arenas) -> "glibc arenas";
group_label(stacks) -> "thread stacks";
group_label(jit) -> "JIT code";
group_label(noreserve) -> "MAP_NORESERVE memory";
group_label(anon) -> "anonymous memory";
group_label(files) -> "files";
group_label(special) -> "vdso and shared memory".

unavailable_line(U) ->
    unavailable_line("", U).

unavailable_line(What, {unavailable, Why, How}) ->
    para(io_lib:format("~tsunavailable (~0tp): ~ts", [What, Why, How])).

%% A paragraph: wrapped at 78 columns, continuation lines indented by two.
para(Text) ->
    [wrap(Text, 78, "  "), "\n"].

%% The same, every line indented by two.
para_indented(Text) ->
    ["  ", wrap(Text, 76, "  "), "\n"].

%% Greedy word wrap; continuation lines start with Indent and are at most
%% Width wide including it. A word longer than a line stays whole, and a
%% unit stays with its number ("186.2 MiB", "160 k", "5 s").
wrap(Text, Width, Indent) ->
    Words = glue_units(string:lexemes(unicode:characters_to_list(Text), " ")),
    Room = fun([]) -> Width; (_) -> Width - length(Indent) end,
    {Lines, Last} = lists:foldl(
                      fun(W, {Acc, []}) -> {Acc, W};
                         (W, {Acc, Cur}) ->
                              case string:length(Cur) + 1 + string:length(W) > Room(Acc) of
                                  true -> {[Cur | Acc], W};
                                  false -> {Acc, Cur ++ " " ++ W}
                              end
                      end, {[], []}, Words),
    lists:join(["\n", Indent], lists:reverse([Last | Lines])).

glue_units([N, U | Rest]) ->
    case is_unit(U) of
        true -> glue_units([N ++ " " ++ U | Rest]);
        false -> [N | glue_units([U | Rest])]
    end;
glue_units(Words) ->
    Words.

is_unit(W) ->
    lists:member(string:trim(W, trailing, ",;:)."),
                 ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "k", "M", "G", "ms", "s", "min", "h", "d"]).

%%% ---------------------------------------------------------------------------
%%% A cluster

cluster(Nodes, Timeout) ->
    Workers = [{spawn_monitor(fun() -> exit({?MODULE, node_report(N, Timeout)}) end), N}
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

node_report(Node, _Timeout) when Node =:= node() ->
    {ok, collect()};
node_report(Node, Timeout) ->
    try
        Injected = ensure_remote(Node, Timeout),
        Report = erpc:call(Node, ?MODULE, collect, [], Timeout),
        {ok, Report#{injected => Injected}}
    catch
        error:{erpc, noconnection} -> {error, unreachable};
        error:{erpc, timeout} -> {error, timeout};
        throw:{inject, Why} -> {error, {inject_failed, Why}};
        error:{exception, Reason, _Stack} -> {error, {collect_failed, Reason}};
        Class:Reason -> {error, {Class, Reason}}
    end.

%% true when mallocinfo had to be loaded over distribution, false when the
%% node had it. Throws {inject, Why} when it cannot be loaded there.
ensure_remote(Node, Timeout) ->
    case erpc:call(Node, code, ensure_loaded, [?MODULE], Timeout) of
        {module, ?MODULE} -> false;
        {error, _} -> inject(Node, Timeout), true
    end.

%% Modules whose object code is sent: the application's, without the demo.
-define(NOT_SENT, [mallocinfo_demo, mallocinfo_demo_nif]).
%% Shared objects that are not sent: the interposer only works from
%% LD_PRELOAD at start, and the demo is not the tool.
-define(SO_NOT_SENT, ["libmallocinfo_preload.so", "mallocinfo_demo_nif.so"]).

inject(Node, Timeout) ->
    Call = fun(M, F, A) -> erpc:call(Node, M, F, A, Timeout) end,
    Missing = [M || M <- app_modules() -- ?NOT_SENT,
                    element(1, Call(code, ensure_loaded, [M])) =:= error],
    Objects = [case code:get_object_code(M) of
                   {M, Bin, _File} -> {M, Bin};
                   error -> throw({inject, {no_object_code, M}})
               end || M <- Missing],
    Tmp = case Call(os, getenv, ["TMPDIR"]) of
              false -> "/tmp";
              T -> T
          end,
    Dir = private_dir(Call, Tmp, 3),
    try
        Priv = filename:dirname(mallocinfo_nif:so_path()),
        [begin
             {ok, Bin} = file:read_file(filename:join(Priv, So)),
             ok = Call(file, write_file, [filename:join(Dir, So), Bin]),
             ok = Call(file, change_mode, [filename:join(Dir, So), 8#500])
         end || So <- filelib:wildcard("*.so", Priv) -- ?SO_NOT_SENT],
        %% mallocinfo_nif's on_load looks here first (see so_path/0); the
        %% NIF first, mallocinfo last (its on_load loads its siblings).
        ok = Call(application, set_env, [mallocinfo, nif_dir, Dir]),
        Order = [M || M <- [mallocinfo_nif], lists:keymember(M, 1, Objects)]
            ++ [M || {M, _} <- Objects, M =/= mallocinfo_nif, M =/= mallocinfo]
            ++ [M || M <- [mallocinfo], lists:keymember(M, 1, Objects)],
        [case Call(code, load_binary, [M, filename:join(Dir, atom_to_list(M) ++ ".beam"),
                                       element(2, lists:keyfind(M, 1, Objects))]) of
             {module, M} -> ok;
             {error, Why} -> throw({inject, {load_failed, M, Why}})
         end || M <- Order],
        ok
    after
        %% A loaded shared object stays mapped after its file is gone:
        %% nothing is left on the target's disk.
        _ = Call(application, unset_env, [mallocinfo, nif_dir]),
        _ = Call(file, del_dir_r, [Dir])
    end.

%% mkdtemp over distribution: a fresh random name, created (never reused:
%% make_dir fails on anything that exists, links included), then 0700.
private_dir(_Call, _Tmp, 0) ->
    throw({inject, no_private_dir});
private_dir(Call, Tmp, Tries) ->
    Dir = filename:join(Tmp, "mallocinfo-" ++ string:lowercase(binary_to_list(binary:encode_hex(rand:bytes(8))))),
    case Call(file, make_dir, [Dir]) of
        ok ->
            ok = Call(file, change_mode, [Dir, 8#700]),
            Dir;
        {error, eexist} ->
            private_dir(Call, Tmp, Tries - 1);
        {error, Why} ->
            throw({inject, {make_dir, Dir, Why}})
    end.

%% The application's modules as this node knows them: its .app file beside
%% mallocinfo.beam, else every loaded mallocinfo* module.
app_modules() ->
    App = case code:which(mallocinfo) of
              File when is_list(File) -> filename:join(filename:dirname(File), "mallocinfo.app");
              _ -> "mallocinfo.app"
          end,
    case file:consult(App) of
        {ok, [{application, mallocinfo, Props}]} ->
            proplists:get_value(modules, Props, []);
        _ ->
            lists:usort([?MODULE | [M || {M, _} <- code:all_loaded(),
                                         lists:prefix("mallocinfo", atom_to_list(M))]])
    end.

cluster_row(Node, {ok, R}) ->
    Erts = case R of #{erts := #{memory := #{total := T}}} -> T; _ -> undefined end,
    Free = case R of
               #{libc := #{arenas := [_ | _] = A}} -> lists:sum([F || #{free_bytes := F} <- A]);
               #{libc := #{free_bytes := F}} -> F;
               _ -> undefined
           end,
    Native = case R of #{native := #{live_bytes := L}} -> L; _ -> undefined end,
    Unacct = case R of
                 #{unaccounted_percent := P} when is_number(P) -> io_lib:format("~.1f%", [float(P)]);
                 _ -> "-"
             end,
    Status = case maps:get(injected, R, false) of
                 true -> "injected";
                 false -> "ok"
             end,
    io_lib:format(?ROW, [truncate(atom_to_list(Node), 20), short_bytes(rss(R)), short_bytes(Erts),
                         short_bytes(Free), short_bytes(Native), Unacct, Status]);
cluster_row(Node, {error, Why}) ->
    Status = case Why of
                 unreachable -> "unreachable";
                 timeout -> "timeout";
                 _ -> "failed"
             end,
    io_lib:format(?ROW, [truncate(atom_to_list(Node), 20), "-", "-", "-", "-", "-", Status]).

short_bytes(undefined) -> "-";
short_bytes(B) -> human_bytes(B).
