%% @private Every layer of the node's memory at one instant, cheaply: the
%% lower floor that the report's interval (`mallocinfo_report:collect/1'
%% with `interval') and the sampler (`mallocinfo_watch') both read, so
%% that a layer means the same in the report, on the timeline page, in
%% `/metrics' and in a capture.
%%
%% A sample ({@link sample/1}) holds the totals of every layer, each an
%% integer (bytes, but `mappings', a count) or `undefined' where its
%% source could not be read:
%% <ul>
%% <li>`rss': the resident set (`/proc/self/statm');</li>
%% <li>`{smaps, Kind}' (`main_heap', `arenas', `anon', `noreserve',
%%     `jit', `stacks', `files', `special') and `mappings' (how many), from
%%     `/proc/self/smaps' grouped as section 1 of the report groups it,
%%     when `smaps' is asked (the default);</li>
%% <li>`{memory, Type}': every category of `erlang:memory()';</li>
%% <li>`{allocated, A}', `{used, A}': each erts_alloc allocator type's
%%     carriers and blocks (`erlang:system_info({allocator_sizes, A})',
%%     summed over its instances);</li>
%% <li>`{libc, arena | in_use | free | mmap}': `mallinfo2()' (`arena',
%%     `uordblks', `fordblks', `hblkhd'), glibc only;</li>
%% <li>`native': the tracker's live bytes, when it records;</li>
%% <li>`mapped_sites': resident bytes of the regions native call sites
%%     outside the VM mapped themselves (the tracker's regions), when the
%%     tracker records them.</li>
%% </ul>
%% and, for the layers asked in `culprits', who holds them
%% ({@link culprits/2}). Totals never walk a process or a table; a culprit
%% search makes one `process_info/2' call per process (never reading a
%% heap; the refc binaries of at most 300 candidates) or one `ets:info/2'
%% per table, so its callers decide when to pay for it.
-module(mallocinfo_layers).

-export([sample/0, sample/1, culprits/2, figures/3, heap_evidence/1]).
-export([keys/0, smaps_kinds/0, culprit_layers/0]).
%% An allocator's figures, for the report's accounting too.
-export([current/2, blocks_size/1]).

-export_type([sample/0, key/0, culprit/0]).

-type key() :: rss | mappings | native | mapped_sites
             | {smaps, atom()} | {memory, atom()} | {allocated, atom()} | {used, atom()}
             | {libc, arena | in_use | free | mmap}.
%% Who holds a layer: texts made when the sample is taken (a name is any
%% term: bounded text keeps a sample's size bounded), figures in bytes.
-type culprit() :: #{atom() => binary() | integer() | undefined}.
-type sample() :: #{t := integer(), time := integer(),
                    layers := #{key() => integer() | undefined},
                    culprits := #{atom() => [culprit()]},
                    cost_us := non_neg_integer(), figures => map()}.

%% The culprits a search keeps per layer.
-define(TOP, 5).
%% A culprit search measures the refc binaries of at most this many
%% processes per ranking (largest, longest queue, grown most, and the
%% earlier search's): 300 in all.
-define(CANDIDATES, 50).
%% Names are cut to this many bytes of text.
-define(NAME_BYTES, 160).

%% @doc The layers that can name culprits: `binary' (refc binaries, by the
%% process that holds them), `processes' (process memory, by process),
%% `ets' (by table), `native' (by call site: function and object),
%% `mapped_sites' (by the function that mapped the region).
-spec culprit_layers() -> [atom()].
culprit_layers() ->
    [binary, processes, ets, native, mapped_sites].

%% @doc Every layer key a sample of this node can hold, in a fixed order
%% (the sampler's ring keeps values in it): RSS, the mappings and their
%% kinds, `erlang:memory()''s categories, each allocator type's carriers
%% and blocks, libc's, the tracker's.
-spec keys() -> [key()].
keys() ->
    [rss, mappings | [{smaps, K} || K <- smaps_kinds()]]
        ++ [{memory, K} || K <- [total, processes, processes_used, system, atom, atom_used,
                                 binary, code, ets]]
        ++ lists:append([[{allocated, A}, {used, A}]
                         || A <- erlang:system_info(alloc_util_allocators)])
        ++ [{libc, K} || K <- [arena, in_use, free, mmap]]
        ++ [native, mapped_sites].

%% @doc The smaps kinds a sample holds (section 1 of the report's groups).
-spec smaps_kinds() -> [atom()].
smaps_kinds() ->
    [main_heap, arenas, anon, noreserve, jit, stacks, files, special].

%% @equiv sample(#{})
-spec sample() -> sample().
sample() ->
    sample(#{}).

%% @doc The layers now. Options: `smaps' (default `true': read and group
%% `/proc/self/smaps'), `culprits' (default `[]': the layers of
%% {@link culprit_layers/0} whose culprits to search, see
%% {@link culprits/2}), `top' (default 5: culprits kept per layer),
%% `since' (an earlier sample's `figures': the culprits are ranked by
%% growth since), `figures' (default `false': keep this search's figures
%% in the sample, under `figures', for a later `since'), `exclude' (pids
%% left out of the culprits: the caller's own). Never fails: a source that
%% fails gives `undefined'. `cost_us' is the time the sample took.
-spec sample(map()) -> sample().
sample(Opts) ->
    Start = erlang:monotonic_time(microsecond),
    %% The culprits first: asking a process for its figures the first time
    %% makes it allocate (a few hundred bytes each, 20 MB for 100k
    %% processes), which the totals then include rather than report as
    %% growth.
    {Culprits, Figures} = culprits_and_figures(maps:get(culprits, Opts, []), Opts),
    %% A sample's time is when its totals were read.
    T0 = erlang:monotonic_time(microsecond),
    Time = erlang:system_time(millisecond),
    Layers = maps:merge(maps:merge(erts(), libc()),
                        maps:merge(smaps(maps:get(smaps, Opts, true)), tracker())),
    T1 = erlang:monotonic_time(microsecond),
    Sample = #{t => erlang:convert_time_unit(T0, microsecond, millisecond), time => Time,
               layers => Layers, culprits => Culprits, cost_us => T1 - Start},
    case maps:get(figures, Opts, false) of
        true -> Sample#{figures => Figures};
        false -> Sample
    end.

%%% Totals --------------------------------------------------------------------

erts() ->
    Mem = try erlang:memory() catch error:notsup -> [] end,
    Allocs = [{A, guard(fun() -> erlang:system_info({allocator_sizes, A}) end)}
              || A <- erlang:system_info(alloc_util_allocators)],
    maps:from_list([{{memory, K}, V} || {K, V} <- Mem]
                   ++ lists:append([[{{allocated, A}, Al}, {{used, A}, U}]
                                    || {A, Info} <- Allocs, {Al, U} <- [allocator_sizes(Info)]])).

%% Carriers (`carriers_size') and blocks (`size' of every block type in
%% them) of an allocator type, over its instances' mbcs, mbcs_pool and
%% sbcs: recon_alloc's allocated and used, as the report counts them.
allocator_sizes(Instances) when is_list(Instances) ->
    Parts = [Props || {instance, _, Info} <- Instances, is_list(Info), {Kind, Props} <- Info,
                      lists:member(Kind, [mbcs, mbcs_pool, sbcs]), is_list(Props)],
    {lists:sum([current(carriers_size, P) || P <- Parts]),
     lists:sum([blocks_size(P) || P <- Parts])};
allocator_sizes(_) ->
    {undefined, undefined}.

%% @doc The current value of figure Key of an allocator instance's
%% properties (`erlang:system_info({allocator, A})'): `{Key, Cur, ...}',
%% 0 when absent.
-spec current(atom(), list()) -> non_neg_integer().
current(Key, Props) ->
    case lists:keyfind(Key, 1, Props) of
        T when is_tuple(T), tuple_size(T) >= 2, is_integer(element(2, T)) -> element(2, T);
        _ -> 0
    end.

%% @doc The bytes of an allocator instance's blocks. OTP 23+: {blocks,
%% [{Type, [{count, ...}, {size, Cur, ...}]}]}; before: {blocks_size, Cur, ...}.
-spec blocks_size(list()) -> non_neg_integer().
blocks_size(Props) ->
    case lists:keyfind(blocks, 1, Props) of
        {blocks, Types} when is_list(Types) ->
            lists:sum([current(size, L) || {_, L} <- Types, is_list(L)]);
        _ ->
            current(blocks_size, Props)
    end.

libc() ->
    Rss = #{rss => guard(fun mallocinfo_glibc:rss/0)},
    case guard(fun mallocinfo_glibc:mallinfo/0) of
        {ok, #{arena := A, uordblks := U, fordblks := F, hblkhd := M}} ->
            Rss#{{libc, arena} => A, {libc, in_use} => U, {libc, free} => F, {libc, mmap} => M};
        _ ->
            Rss
    end.

smaps(false) ->
    #{};
smaps(true) ->
    case file:read_file("/proc/self/smaps") of
        {ok, Text} ->
            case guard(fun() ->
                               Vmas = mallocinfo_report_smaps:parse_smaps(Text),
                               #{groups := G} = mallocinfo_report_smaps:group_mappings(
                                                  Vmas, heap_evidence(Vmas)),
                               {length(Vmas), G}
                       end) of
                {N, #{} = G} ->
                    maps:from_list([{mappings, N}
                                    | [{{smaps, K}, maps:get(rss, maps:get(K, G, #{}), 0)}
                                       || K <- smaps_kinds()]]);
                _ ->
                    #{}
            end;
        {error, _} ->
            #{}
    end.

tracker() ->
    case guard(fun mallocinfo_trace:status/0) of
        #{recording := true, live_bytes := Live} = S ->
            Mapped = case S of
                         #{preloaded := true, mode := M} when M =:= full; M =:= sample ->
                             case mapped_sites() of
                                 undefined -> #{};
                                 {Bytes, _} -> #{mapped_sites => Bytes}
                             end;
                         _ -> #{}
                     end,
            Mapped#{native => Live};
        _ ->
            #{}
    end.

%% Regions mapped by call sites outside the VM (the tracker's regions:
%% `mmap' through the interposer), their resident bytes and the sites
%% that hold most: `{Bytes, [Culprit]}', or undefined.
mapped_sites() ->
    case guard(fun() -> mallocinfo_nif:trace_regions(true) end) of
        {ok, Regions} when is_list(Regions) ->
            BySite = lists:foldl(
                       fun(#{resident := R, stack := [#{object := O} = F | _]}, Acc) ->
                               case filename:basename(O) of
                                   <<"beam", _/binary>> -> Acc;
                                   Base ->
                                       K = {maps:get(symbol, F, undefined), Base},
                                       maps:update_with(K, fun(B) -> B + R end, R, Acc)
                               end;
                          (_, Acc) -> Acc
                       end, #{}, Regions),
            Sites = lists:reverse(lists:keysort(2, maps:to_list(BySite))),
            {lists:sum([B || {_, B} <- Sites]),
             [#{function => text(Sym), object => text(Obj), bytes => B}
              || {{Sym, Obj}, B} <- lists:sublist(Sites, ?TOP)]};
        _ ->
            undefined
    end.

%%% Culprits ------------------------------------------------------------------

%% @doc Who holds each of `Layers' now, at most `top' (5) each, largest
%% (or, with `since', fastest-growing) first. What it reads
%% ({@link figures/3}): `processes' and `binary' share one pass over every
%% process with `process_info(P, [memory, message_queue_len])' (constant
%% work per process but its message queue: never its heap), then
%% `process_info(P, binary)' (the refc binaries it references, counted as
%% `mallocinfo_process:top(N, binary)' counts them) only for the bounded
%% candidates: the 50 largest processes, the 50 longest message queues,
%% the 50 processes that grew most since `since', and the candidates of
%% `since' itself: at most 300 processes. `ets' reads every table's
%% `memory' (`ets:info/2'), `native' the tracker's sites by function,
%% `mapped_sites' its regions. With `since' (the `figures' of an earlier
%% sample) each process and table culprit has its `delta' since. The
%% winners are named with `mallocinfo_process:name/1', names cut to 160
%% bytes of text. mallocinfo's own processes (its sampler, its
%% supervisors), the calling process and the pids in `exclude' are left
%% out.
-spec culprits([atom()], map()) -> #{atom() => [culprit()]}.
culprits(Layers, Opts) ->
    element(1, culprits_and_figures(Layers, Opts)).

culprits_and_figures([], _Opts) ->
    {#{}, #{}};
culprits_and_figures(Layers, Opts) ->
    Top = maps:get(top, Opts, ?TOP),
    Since = maps:get(since, Opts, #{}),
    Exclude = [self() | maps:get(exclude, Opts, [])] ++ own_pids(),
    Figures = figures(Layers, Since, Exclude),
    Queues = maps:get(message_queue_len, Figures, #{}),
    Named = fun(ets) -> fun ets_culprit/2;
               (_) -> fun(P, Bytes) -> process_culprit(P, Bytes, Queues) end
            end,
    Culprits = maps:from_list(
                 [{L, C} || L <- Layers,
                            C <- [case Figures of
                                      #{L := Values} ->
                                          ranked(Values, maps:get(L, Since, undefined), Top,
                                                 Named(L));
                                      #{} ->
                                          other_culprits(L, Top)
                                  end],
                            C =/= undefined]),
    {Culprits, Figures}.

other_culprits(native, Top) ->
    case guard(fun() -> mallocinfo_trace:sites(Top, #{by => function, demangle => true}) end) of
        {ok, Rows} when is_list(Rows) ->
            [#{function => text(maps:get(function, R, undefined)),
               object => text(base(maps:get(object, R, undefined))),
               bytes => maps:get(bytes, R, 0), blocks => maps:get(count, R, 0)}
             || #{label := native} = R <- Rows];
        _ -> undefined
    end;
other_culprits(mapped_sites, _Top) ->
    case mapped_sites() of
        {_, Sites} -> Sites;
        undefined -> undefined
    end;
other_culprits(_, _) ->
    undefined.

%% @doc What a culprit search ranks, for the layers among `Layers' that
%% are held by processes or tables: `#{processes => #{Pid => Bytes},
%% message_queue_len => #{Pid => N}, binary => #{Pid => Bytes}, ets =>
%% #{Tab => Bytes}}', `binary' for the bounded candidates only (see
%% {@link culprits/2}; `Since': an earlier search's figures, whose
%% candidates are measured again), the pids in `Exclude' left out.
-spec figures([atom()], map(), [pid()]) -> #{atom() => #{term() => non_neg_integer()}}.
figures(Layers, Since, Exclude) ->
    Binary = lists:member(binary, Layers),
    Procs = case Binary orelse lists:member(processes, Layers) of
                true -> process_figures(Binary, Since, Exclude);
                false -> #{}
            end,
    Ets = case lists:member(ets, Layers) of
              true -> #{ets => ets_holders()};
              false -> #{}
          end,
    maps:merge(maps:with(Layers ++ [message_queue_len], Procs), Ets).

process_figures(Binary, Since, Exclude) ->
    Rows = [{P, M, Q} || P <- erlang:processes(),
                         [{memory, M}, {message_queue_len, Q}]
                             <- [process_info(P, [memory, message_queue_len])]],
    Memory = maps:without(Exclude, maps:from_list([{P, M} || {P, M, _} <- Rows])),
    Queues = maps:without(Exclude, maps:from_list([{P, Q} || {P, _, Q} <- Rows])),
    Figures = #{processes => Memory, message_queue_len => Queues},
    case Binary of
        false ->
            Figures;
        true ->
            Grown = case Since of
                        #{processes := Before} ->
                            maps:map(fun(P, M) -> M - maps:get(P, Before, M) end, Memory);
                        #{} ->
                            #{}
                    end,
            Candidates = lists:usort(largest(Memory) ++ largest(Queues) ++ largest(Grown)
                                     ++ maps:keys(maps:get(binary, Since, #{})))
                -- Exclude,
            Figures#{binary => maps:from_list(
                                 [{P, maps:get(bytes, mallocinfo_process:binaries(Bins))}
                                  || P <- Candidates,
                                     {binary, Bins} <- [process_info(P, binary)]])}
    end.

%% The keys of the ?CANDIDATES largest values of a map (positive only).
largest(Values) ->
    Best = lists:sublist(lists:reverse(lists:sort([{V, K} || {K, V} <- maps:to_list(Values),
                                                            V > 0])),
                         ?CANDIDATES),
    [K || {_, K} <- Best].

%% mallocinfo's own processes: the sampler and its supervisors.
own_pids() ->
    Sup = whereis(mallocinfo_sup),
    Children = case is_pid(Sup) of
                   true -> [P || {_, P, _, _} <- guard_list(fun() -> supervisor:which_children(Sup) end),
                                 is_pid(P)];
                   false -> []
               end,
    [P || P <- [Sup, whereis(mallocinfo_watch_server) | Children], is_pid(P)].

guard_list(F) ->
    case guard(F) of
        L when is_list(L) -> L;
        _ -> []
    end.

ets_holders() ->
    W = erlang:system_info(wordsize),
    maps:from_list([{T, Words * W} || T <- ets:all(), Words <- [ets:info(T, memory)],
                                      is_integer(Words)]).

%% The Top keys of Values by value (or, with Since, by growth since),
%% each made a culprit by Name(Key, Bytes), `delta' added with Since. A
%% key Since does not hold was not measured then (a process that was not
%% a candidate, a new table): its growth is counted from zero.
ranked(Values, Since, Top, Name) ->
    Scored = case Since of
                 undefined -> [{V, K} || {K, V} <- maps:to_list(Values)];
                 #{} -> [{V - maps:get(K, Since, 0), K} || {K, V} <- maps:to_list(Values)]
             end,
    Best = lists:sublist(lists:reverse(lists:sort(Scored)), Top),
    [case Since of
         undefined -> C;
         #{} -> C#{delta => Score}
     end || {Score, K} <- Best, C <- [Name(K, maps:get(K, Values))], C =/= undefined].

process_culprit(P, Bytes, Queues) ->
    #{pid => list_to_binary(pid_to_list(P)), name => process_name(P), bytes => Bytes,
      message_queue_len => maps:get(P, Queues, undefined)}.

ets_culprit(T, Bytes) ->
    case ets_info(T) of
        undefined -> undefined;
        {Name, Owner, Size} ->
            #{table => text(io_lib:format("~0tp", [Name])), bytes => Bytes, objects => Size,
              owner => list_to_binary(pid_to_list(Owner)), owner_name => process_name(Owner)}
    end.

ets_info(T) ->
    case {ets:info(T, name), ets:info(T, owner), ets:info(T, size)} of
        {undefined, _, _} -> undefined;
        {_, undefined, _} -> undefined;
        Info -> Info
    end.

%% A process's name as mallocinfo_process names it everywhere (its
%% name_text/1, already escaped, without the parentheses), bounded; empty
%% when it has none.
process_name(P) ->
    case guard(fun() -> mallocinfo_process:name(P) end) of
        {error, _} -> <<>>;
        Name ->
            Text = unicode:characters_to_binary(mallocinfo_process:name_text(Name)),
            cut(string:trim(string:trim(Text, leading, " ("), trailing, ")"))
    end.

%%% Helpers -------------------------------------------------------------------

%% @doc What confirms glibc's heaps among `Vmas' (parsed smaps), as
%% `mallocinfo_report_smaps:group_mappings/2' takes it: the first bytes at
%% each candidate address, read from /proc/self/mem (the kernel copies
%% them: nothing in this process can fault), and, for a mapping that
%% merged with a heap, its resident pages inside the heap from
%% /proc/self/pagemap (bit 63: present). `#{}' when it cannot be read:
%% the grouping then falls back to the heaps' shape and to proportions.
-spec heap_evidence(term()) -> map().
heap_evidence(Vmas) when is_list(Vmas) ->
    case guard(fun() ->
                       Candidates = mallocinfo_report_smaps:heap_candidates(Vmas),
                       Headers = read_at("/proc/self/mem", [{A, 48} || A <- Candidates]),
                       Windows = mallocinfo_report_smaps:heap_windows(Vmas, Headers),
                       Straddling = mallocinfo_report_smaps:straddling(Vmas, Windows),
                       #{heap_headers => Headers,
                         straddle_rss => maps:from_list(
                                           [{Start, resident_in(Page, Ranges)}
                                            || {Start, Page, Ranges} <- Straddling])}
               end) of
        #{} = Evidence -> Evidence;
        {error, _} -> #{}
    end;
heap_evidence(_) ->
    #{}.

%% #{Offset => Bytes} for the ranges that could be read (a mapping may be
%% gone since smaps was read); throws when the file cannot be opened.
read_at(File, Ranges) ->
    {ok, F} = file:open(File, [read, raw, binary]),
    try
        maps:from_list([{Off, Bin} || {Off, Len} <- Ranges,
                                      {ok, Bin} <- [file:pread(F, Off, Len)]])
    after
        file:close(F)
    end.

resident_in(Page, Ranges) ->
    Entries = read_at("/proc/self/pagemap",
                      [{From div Page * 8, (To - From) div Page * 8} || {From, To} <- Ranges]),
    Page * lists:sum([1 || Bin <- maps:values(Entries), <<E:64/native>> <= Bin, E bsr 63 =:= 1]).

base(undefined) -> undefined;
base(Path) -> filename:basename(Path).

%% Bounded printable text of a name (bytes, a string, undefined).
text(undefined) ->
    undefined;
text(Name) ->
    cut(unicode:characters_to_binary(mallocinfo_text:name(Name))).

cut(Bin) when byte_size(Bin) > ?NAME_BYTES ->
    <<(unicode:characters_to_binary(string:slice(Bin, 0, ?NAME_BYTES div 2)))/binary, "...">>;
cut(Bin) ->
    iolist_to_binary(Bin).

%% Any exception is `{error, _}': one failing source never loses the rest.
guard(F) ->
    try F()
    catch Class:Reason -> {error, {Class, Reason}}
    end.
