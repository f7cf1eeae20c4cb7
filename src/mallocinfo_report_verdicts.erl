%% @private The report's verdicts, with pure functions only: the rules,
%% each of which reads the finished report (its layers and accounting,
%% from `mallocinfo_report_build') and says one ranked sentence when its
%% evidence is there, and what the sentences and the report's text share:
%% the frame that names who allocated, the resident set's parts and their
%% labels. `mallocinfo_report_build:build/1' calls verdicts/1 last;
%% `mallocinfo_report_text' renders the parts. Exported for them and for
%% EUnit, which feeds crafted reports. Not an API: arguments are not
%% checked.
-module(mallocinfo_report_verdicts).

-export([rules/0, rule/2, verdicts/1]).
%% What the report's text shares with the sentences.
-export([culprit/1, proc_name/1, resident_parts/1, part_label/1, rss/1, mfa_text/1,
         processes_text/1, row_processes_text/1, tracker_reserved/1]).

-define(MiB, (1 bsl 20)).
%% A verdict needs at least this many bytes and this share of RSS.
-define(SIGNIFICANT_BYTES, (16 * ?MiB)).
-define(SIGNIFICANT_PERCENT, 5).
%% Blocks older than this make a large call site "a leak".
-define(LEAK_AGE_MS, 60000).

%%% The rules, ranked ---------------------------------------------------------

%% @doc The rules, in no particular order; verdicts/1 ranks what they say.
-spec rules() -> [atom()].
rules() ->
    [native_holder, native_growth, native_stable, libc_fragmentation, erts_fragmentation,
     erts_mseg_cache, process_heap, erts_binary, erts_ets, other_allocator, tracker_tables,
     unexplained, layer_growth, layers_stable].

%% @doc The sentences of every rule that fires, most bytes first; a single
%% "nothing stands out" sentence, with the two largest groups, when none
%% does.
-spec verdicts(mallocinfo_report:report()) -> [binary()].
verdicts(R) ->
    %% A rule that meets a shape it does not know says nothing rather than
    %% taking the report down.
    %% layer_growth says one sentence per part that grew.
    Fired = [V || Name <- rules(), V <- lists:flatten([safe_rule(Name, R)]), is_tuple(V)],
    case lists:reverse(lists:keysort(1, Fired)) of
        [] -> [nothing_stands_out(R)];
        [{0, _} | _] = Sorted -> [nothing_stands_out(R) | [S || {_, S} <- Sorted]];
        Sorted -> [S || {_, S} <- Sorted]
    end.

%% A rule's {Bytes, Sentence}, or none when it crashed (a crash term must
%% never read as a verdict).
safe_rule(Name, R) ->
    try rule(Name, R) catch _:_ -> none end.

sign(D) when D < 0 -> "-";
sign(_) -> "+".

same_function(#{object := O} = A, #{object := O} = B) ->
    maps:get(symbol, A, undefined) =:= maps:get(function, B, undefined)
        andalso (maps:get(symbol, A, undefined) =/= undefined
                 orelse maps:get(address, A, x) =:= maps:get(address, maps:get(frame, B, #{}), y));
same_function(_, _) -> false.

%% @doc One rule on a report: `{Bytes, Sentence}' when its evidence is in
%% the report (Bytes ranks it), `none' otherwise. A rule needs at least
%% 16 MiB and 5% of RSS behind it, but the growth rules: `layer_growth'
%% says one sentence per part of the node that grew beyond the noise over
%% the report's interval, fastest first (a list, ranked by the growth over
%% an hour at that rate), `layers_stable' that none did.
-spec rule(atom(), mallocinfo_report:report()) ->
          {non_neg_integer(), binary()} | [{non_neg_integer(), binary()}] | none.
rule(layer_growth, #{layer_growth := #{growing := _} = G}) ->
    case mallocinfo_layers_growth:verdicts(G) of
        [] -> none;
        Vs -> Vs
    end;
rule(layers_stable, #{layer_growth := #{growing := [], span_ms := Ms, rss := Rss} = G}) ->
    case Rss of
        #{growing := true} -> none;
        _ -> {0, fmt("every layer stable over ~ts: no part of the node's memory grew by the "
                     "noise threshold (~ts)", [age(Ms), bytes(maps:get(noise_bytes, G))])}
    end;
rule(native_holder, #{native := #{functions := [#{bytes := B, count := C} = F | _]} = N} = R) ->
    case significant(B, R) of
        false -> none;
        true ->
            About = case maps:get(estimated, F, false) of true -> "about "; false -> "" end,
            {Who, From} = who(maps:get(frame, F, undefined)),
            Tail = case maps:get(growth, N, none) of
                       #{growers := G, interval_ms := Ms} ->
                           case [X || #{culprit := C1} = X <- G, same_function(C1, F)] of
                               [] -> fmt("it did not grow in every sample over ~ts",
                                         [age(Ms)]);
                               _ -> <<"it grew in every sample">>
                           end;
                       _ ->
                           <<"a leak if it keeps growing: mallocinfo:report(#{interval => 60000})"
                             " measures that">>
                   end,
            {B, fmt("~ts holds ~ts~ts in ~ts~ts live blocks allocated from ~ts~ts~ts: ~ts",
                    [Who, About, bytes(B), About, count(C), From,
                     called_from(maps:get(erlang, F, []), B),
                     row_processes_text(F), Tail])}
    end;
rule(native_growth, #{native := #{growth := #{leak := true, interval_ms := Ms0,
                                              growers := [G | _]} = Growth}}) ->
    Ms = maps:get(span_ms, Growth, Ms0),
    #{growth_bytes := Grew, rate := Rate, bytes := B, count := C} = G,
    {Who, From} = who(maps:get(culprit, G)),
    {max(B, Grew),
     fmt("~ts (~ts) grew by ~ts (~ts/s) over ~ts, in every sample: a leak; it holds ~ts in ~ts "
         "blocks now", [From, Who, bytes(Grew), bytes(Rate), age(Ms), bytes(B), count(C)])};
rule(native_stable, #{native := #{growth := #{leak := false, interval_ms := Ms0,
                                              live_delta := D} = Growth}}) ->
    Ms = maps:get(span_ms, Growth, Ms0),
    {0, fmt("native memory stable over ~ts: no native call site grew by 1 MiB in every sample "
            "(the tracker's live bytes changed by ~ts~ts)",
            [age(Ms), sign(D), bytes(abs(D))])};
rule(native_holder, #{native := #{sites := [#{bytes := B, count := C, stack := Stack} = Site | _]}}
     = R) ->
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
            {B, fmt("~ts holds ~ts~ts in ~ts~ts live blocks allocated from ~ts, the oldest ~ts "
                    "old: ~ts",
                    [Who, About, bytes(B), About, count(C), From, age(Age), Tail])}
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
                               "between live blocks", [bytes(T), bytes(P)]);
                       _ -> ""
                   end,
            NonMainFree = lists:sum([F || #{arena := A, free_bytes := F} <- Arenas, A =/= 0]),
            ArenaMax = case L of
                           #{arena_max := #{value := Max}} ->
                               io_lib:format(" of ~b allowed", [Max]);
                           _ -> ""
                       end,
            Cap = case N > 2 andalso NonMainFree * 2 >= Free of
                      true -> fmt("; ~ts of the free memory is in per-thread arenas: consider "
                                  "MALLOC_ARENA_MAX=2", [bytes(NonMainFree)]);
                      false -> ""
                  end,
            {Free, fmt("libc arenas hold ~ts of which ~ts (~b%) is free: fragmentation in libc "
                       "(~ts~ts)~ts~ts~ts",
                       [bytes(System), bytes(Free), Free * 100 div max(1, System),
                        plural(N, "arena"), ArenaMax, Trim, Cap, churners(R)])}
    end;
rule(erts_fragmentation, #{erts := #{allocated := A, used := U, allocators := [_ | _] = Types}}
     = R) ->
    %% Every allocator instance (one per scheduler and type) keeps a main
    %% carrier for good, mostly free on a quiet node, and fills its newest
    %% carrier gradually: a freshly booted node with 16 schedulers and a few
    %% applications holds 23 MiB of free carrier space, all of it that
    %% headroom. That is the design, not fragmentation: only free space
    %% beyond each instance's headroom counts.
    Excess = fun(#{allocated := TA, used := TU} = T) ->
                     max(0, TA - TU - maps:get(headroom, T, 0))
             end,
    Waste = lists:sum([Excess(T) || T <- Types]),
    case significant(Waste, R) andalso U * 100 < 60 * A of
        false -> none;
        true ->
            ByExcess = lists:sort(fun(X, Y) -> Excess(X) >= Excess(Y) end, Types),
            [#{name := Worst, allocated := WA, used := WU} | _] = ByExcess,
            {Waste, fmt("ERTS allocators hold ~ts in carriers but use ~ts (~b%), ~ts free beyond "
                        "the main and newest carrier of each allocator instance: fragmentation "
                        "inside erts_alloc, most in ~ts (~ts allocated, ~b% used)",
                        [bytes(A), bytes(U), U * 100 div max(1, A), bytes(Waste), Worst,
                         bytes(WA), WU * 100 div max(1, WA)])}
    end;
rule(erts_mseg_cache, #{erts := #{mseg_cache_bytes := C, mmap_bytes := M}} = R)
  when is_integer(C) ->
    case significant(C, R) of
        false -> none;
        true ->
            {C, fmt("ERTS keeps ~ts of freed carriers mapped in mseg_alloc's cache (~ts mapped in "
                    "all): they are reused for new carriers or released over time",
                    [bytes(C), bytes(M)])}
    end;
rule(tracker_tables, #{native := #{table_bytes := _, stack_bytes := _} = N,
                       attributed := Attributed} = R) ->
    case proplists:get_value(tracker_tables, Attributed, 0) of
        B when is_integer(B) ->
            case significant(B, R) of
                false -> none;
                true -> {B, tracker_tables_text(B, tracker_reserved(N), N, R)}
            end;
        _ -> none
    end;
rule(process_heap, #{erts := #{processes := [#{pid := Pid, value := B} = P | _]}} = R) ->
    case significant(B, R) of
        false -> none;
        true ->
            {B, fmt("process ~ts~ts holds ~ts (~ts of RSS): mallocinfo_process:print(~ts) shows "
                    "what is on its heap",
                    [pid_to_list(Pid), proc_name(maps:get(name, P, undefined)), bytes(B),
                     share(B, R), pid_to_list(Pid)])}
    end;
rule(erts_binary, #{erts := #{memory := #{binary := B}}} = R) ->
    case significant(B, R) andalso B * 4 >= rss(R) of
        false -> none;
        true ->
            {B, fmt("refc binaries take ~ts (~ts of RSS): mallocinfo_process:top(10, binary) names "
                    "the processes that keep them", [bytes(B), share(B, R)])}
    end;
rule(erts_ets, #{erts := #{memory := #{ets := B}} = E} = R) ->
    case significant(B, R) andalso B * 4 >= rss(R) of
        false -> none;
        true ->
            Largest = case maps:get(ets, E, []) of
                          [#{table := T, bytes := TB} | _] ->
                              fmt(", the largest ~tp with ~ts", [T, bytes(TB)]);
                          _ -> ""
                      end,
            {B, fmt("ETS tables take ~ts (~ts of RSS)~ts", [bytes(B), share(B, R), Largest])}
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
                 [A, bytes(Res), bytes(Allocated), bytes(Res - Allocated)])}
    end;
rule(unexplained, #{unaccounted_bytes := U, unaccounted_percent := P} = R) when is_integer(U) ->
    case significant(U, R) andalso P >= 15 of
        false -> none;
        true ->
            Maps = case R of
                       #{resident := #{anon_top := [_ | _] = Top}} ->
                           Largest = [[hex(S), " ", bytes(Rs)]
                                      || #{start := S, rss := Rs} <- lists:sublist(Top, 3)],
                           ["; the largest anonymous mappings: " | lists:join(", ", Largest)];
                       _ -> ""
                   end,
            {U, fmt("~ts (~.1f% of RSS) is memory no layer accounts for: most likely mapped "
                    "directly (mmap) by a NIF or a library~ts", [bytes(U), float(P), Maps])}
    end;
rule(_, _) ->
    none.

%% Fragmentation is made by churn: with the tracker's churn, the native
%% functions that allocate most (rate, temporary share, typical lifetime).
churners(#{native := #{churn := [_ | _] = Rows}}) ->
    Named = [begin
                 {_, From} = who(maps:get(frame, Row, undefined)),
                 io_lib:format("~ts (~ts allocations/s, ~b% temporary, typically ~ts)",
                               [From, count(Rate), T, lifetime(M)])
             end || #{allocated_per_s := Rate, temporary_percent := T, median_ms := M} = Row
                        <- lists:sublist(Rows, 3)],
    ["; the call sites that churn most: " | lists:join(", ", Named)];
churners(_) ->
    "".

lifetime(undefined) -> "not freed yet";
lifetime(infinity) -> "over 70 min";
lifetime(1) -> "freed within 1 ms";
lifetime(Ms) -> io_lib:format("freed within ~ts", [mallocinfo_units:age(Ms)]).

%%% Who holds it --------------------------------------------------------------

%% The holder and the function of a sentence, from a culprit frame. Names
%% are bytes (mallocinfo_text:name/1 makes them printable).
who(undefined) ->
    {"native code", "an unknown function"};
who(#{object := Object} = F) ->
    Base = filename:basename(Object),
    Name = mallocinfo_text:name(Base),
    Who = case {binary:match(Base, <<"beam">>), binary:match(Base, <<".so">>)} of
              {{0, _}, _} -> "the VM itself (" ++ Name ++ ")";
              {_, nomatch} -> "native code in " ++ Name;
              _ -> "the NIF " ++ Name
          end,
    From = case F of
               #{symbol := S} when is_binary(S) -> short_symbol(S);
               #{offset := Off} -> io_lib:format("~ts+0x~.16b", [Name, Off]);
               _ -> "an unnamed function"
           end,
    {Who, From}.

%% A demangled C++ name can run to hundreds of characters: the sentence
%% keeps its first 60.
short_symbol(S) ->
    L = mallocinfo_text:name(S),
    case string:length(L) > 60 of
        true -> string:slice(L, 0, 57) ++ "...";
        false -> L
    end.

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

%% @doc A process's name as `mallocinfo_process' gives it (registered name,
%% label or initial call), for a sentence: printed as `top/2' and `print/1'
%% print it.
-spec proc_name(term()) -> iolist().
proc_name(Name) -> mallocinfo_process:name_text(Name).

%%% The resident set's parts --------------------------------------------------

%% @doc The resident set in the parts section 1 of the report lists, in its
%% order: the kernel's groups of mappings, with the anonymous memory split
%% by the layer that explains it (ERTS, libc's mmapped blocks, another
%% allocator, nothing). They add up to the mapped RSS, each page once.
%% The "nothing stands out" verdict names the largest two with the same
%% labels and figures. `[]' when the resident set could not be read.
-spec resident_parts(mallocinfo_report:report()) -> [{atom(), non_neg_integer()}].
resident_parts(#{resident := #{groups := G}} = R) ->
    Rss = fun(K) -> maps:get(rss, maps:get(K, G)) end,
    A = maps:from_list(maps:get(attributed, R, [])),
    Layer = fun(K) -> maps:get(K, A, 0) end,
    Unclaimed = case maps:get(anon_unclaimed, R, undefined) of
                    U when is_integer(U) -> U;
                    _ -> Rss(anon) - Layer(erts_carriers) - Layer(libc_mmap)
                end,
    Erts = case maps:get(exact, R, false) of
               true -> erts_mapped;
               false -> erts_carriers
           end,
    [{main_heap, Rss(main_heap)}, {arenas, Rss(arenas)},
     {Erts, Layer(erts_carriers)}, {mapped_sites, Layer(mapped_sites)},
     {libc_mmap, Layer(libc_mmap)},
     {other_allocator, Layer(other_allocator)}, {anon_unclaimed, Unclaimed},
     {noreserve, Rss(noreserve) - maps:get(noreserve_other, R, 0)},
     {jit, Rss(jit)}, {stacks, Rss(stacks)}, {files, Rss(files)}, {special, Rss(special)}];
resident_parts(_) ->
    [].

%% @doc What section 1 calls a part of resident_parts/1.
-spec part_label(atom()) -> string().
part_label(main_heap) -> "glibc main heap [heap]";
part_label(arenas) -> "glibc arenas (64 MiB heaps)";
part_label(erts_carriers) -> "ERTS carriers, mseg cache (est.)";
part_label(erts_mapped) -> "ERTS carriers (by address)";
part_label(mapped_sites) -> "mapped by NIFs, libraries";
part_label(libc_mmap) -> "libc mmapped blocks (est.)";
part_label(other_allocator) -> "other allocator (est.)";
part_label(anon_unclaimed) -> "other anonymous";
part_label(noreserve) -> "MAP_NORESERVE anonymous";
part_label(jit) -> "JIT code";
part_label(stacks) -> "thread stacks";
part_label(files) -> "files";
part_label(special) -> "vdso, other shared".

nothing_stands_out(#{resident := #{groups := _}} = R) ->
    Sorted = lists:reverse(lists:keysort(2, resident_parts(R))),
    Parts = [io_lib:format("~ts ~ts", [part_label(K), bytes(B)])
             || {K, B} <- lists:sublist(Sorted, 2)],
    fmt("nothing stands out: RSS ~ts, the largest parts: ~ts",
        [bytes(rss(R)), lists:join("; ", Parts)]);
nothing_stands_out(_) ->
    <<"nothing stands out (the resident set could not be read)">>.

%%% Sentences -----------------------------------------------------------------

plural(1, Noun) -> ["1 ", Noun];
plural(N, Noun) -> [integer_to_list(N), " ", Noun, "s"].

hex(N) -> string:lowercase(integer_to_list(N, 16)).

significant(Bytes, R) ->
    Rss = rss(R),
    Bytes >= ?SIGNIFICANT_BYTES andalso Bytes * 100 >= ?SIGNIFICANT_PERCENT * Rss.

%% @doc RSS of a report (0 when the resident set could not be read).
-spec rss(mallocinfo_report:report()) -> non_neg_integer().
rss(#{resident := #{rss := Rss}}) -> Rss;
rss(_) -> 0.

share(B, R) ->
    io_lib:format("~b%", [B * 100 div max(1, rss(R))]).

fmt(Format, Args) ->
    unicode:characters_to_binary(io_lib:format(Format, Args)).


% Shorthands for the units the sentences use.
bytes(B) -> mallocinfo_units:bytes(B).
count(N) -> mallocinfo_units:count(N).
age(Ms) -> mallocinfo_units:age(Ms).

%% @doc What the tracker's tables reserved, from its status: every table
%% (`tables_bytes') from interposers that say it; the live and stack tables
%% only from older ones (0 without a tracker, or for a native section that is
%% not a map of them).
-spec tracker_reserved(term()) -> non_neg_integer().
tracker_reserved(#{tables_bytes := T}) when is_integer(T), T > 0 -> T;
tracker_reserved(#{table_bytes := TB, stack_bytes := SB}) when is_integer(TB), is_integer(SB) ->
    TB + SB;
tracker_reserved(_) -> 0.

%% The tracker verdict reads the mode: what the tables cost in it, and what
%% each knob would change from there (never "switch to sample" in sample).
tracker_tables_text(B, Reserved, N, R) ->
    Live = maps:get(live_entries, N, 0),
    Head = fmt("the mallocinfo tracker's own tables keep ~ts resident (~ts of RSS, ~ts reserved~ts)",
               [bytes(B), share(B, R), bytes(Reserved), by_table(N)]),
    case maps:get(mode, N, full) of
        sample ->
            fmt("~ts in sample mode, for ~b sampled blocks: mostly the stack table and the "
                "per-thread unwind caches; mallocinfo_trace:reset() gives the live table's pages "
                "back, a larger MALLOCINFO_SAMPLE_BYTES samples fewer blocks, and "
                "MALLOCINFO_TRACE=counters keeps no table at all", [Head, Live]);
        _ ->
            PerBlock = case Live of
                           0 -> "with no live block recorded";
                           _ -> fmt("~ts per live block for ~b blocks", [bytes(B div Live), Live])
                       end,
            fmt("~ts in full mode, ~ts: MALLOCINFO_TRACE=sample "
                "(or mallocinfo_trace:set_mode(sample)) keeps an unbiased sample in a few MiB, "
                "mallocinfo_trace:reset() gives the live table's pages back, and a smaller "
                "MALLOCINFO_TABLE_SIZE caps the table", [Head, PerBlock])
    end.

%% "; live table 2.1 MiB, stacks 3.4 MiB, ..." from an interposer that says
%% what each table keeps resident (status/0's `tables_resident'), else "".
by_table(#{tables_resident := #{live := L, stacks := S, churn := C, threads := T}})
  when is_integer(L), is_integer(S), is_integer(C), is_integer(T) ->
    fmt("; live table ~ts, stacks ~ts, churn counters ~ts, threads' states and unwind caches ~ts",
        [bytes(L), bytes(S), bytes(C), bytes(T)]);
by_table(_) ->
    "".

%% @doc An Erlang function as the VM prints it: "module:function/arity".
-spec mfa_text(#{module := atom(), function := atom(), arity := arity()}) -> string().
mfa_text(#{module := M, function := F, arity := A}) ->
    lists:flatten(io_lib:format("~ts:~ts/~b", [atom_to_list(M), atom_to_list(F), A])).

%% @doc " in 16 xmpp_stream_in processes" for a roll-up row's processes
%% (`[{Name, HowMany}]', most first: mallocinfo_report's `processes'): a
%% process by what it runs, its registered name, its label or the module
%% of its initial call (`{Mod, init, 1}' for a proc_lib gen_server, as
%% mallocinfo_process:name/1 reads '$initial_call'); several kinds: " in
%% 17 processes (16 xmpp_stream_in, 1 mi_ctx_alpha)", at most three named.
%% "" for none.
-spec processes_text([{term(), pos_integer()}]) -> string().
processes_text([]) ->
    "";
processes_text([{Name, N}]) ->
    lists:flatten(io_lib:format(" in ~ts ~ts process~ts", [count(N), kind_text(Name),
                                                            plural(N)]));
processes_text(Kinds) ->
    Total = lists:sum([N || {_, N} <- Kinds]),
    Named = [io_lib:format("~ts ~ts", [count(N), kind_text(Name)])
             || {Name, N} <- lists:sublist(Kinds, 3)],
    More = case length(Kinds) - 3 of
               M when M > 0 -> io_lib:format(" and ~b more kinds", [M]);
               _ -> ""
           end,
    lists:flatten(io_lib:format(" in ~ts processes (~ts~ts)",
                                [count(Total), lists:join(", ", Named), More])).

%% @doc processes_text/1 of a roll-up row's `processes', followed by the
%% share of the row's bytes they hold when it is not all of them (the
%% rest was allocated outside any process, or before the Erlang context
%% was on): " in 1 ssl_gen_statem process (4% of the bytes)".
-spec row_processes_text(map()) -> string().
row_processes_text(#{processes := [_ | _] = Procs, processes_bytes := Held, bytes := B})
  when Held < B ->
    lists:flatten([processes_text(Procs),
                   io_lib:format(" (~b% of the bytes)", [Held * 100 div max(1, B)])]);
row_processes_text(Row) ->
    processes_text(maps:get(processes, Row, [])).

plural(1) -> "";
plural(_) -> "es".

%% What a process runs, in a word where there is one.
kind_text(undefined) -> "exited";
kind_text(Name) when is_atom(Name) -> mallocinfo_text:name(Name);
kind_text({M, init, 1}) when is_atom(M) -> mallocinfo_text:name(M);
kind_text({M, F, A}) when is_atom(M), is_atom(F), is_integer(A) ->
    mfa_text(#{module => M, function => F, arity => A});
kind_text(Label) -> mallocinfo_text:name(io_lib:format("~0tP", [Label, 10])).

%% ", called from m:f/2 (96%)" (and how many other Erlang functions) for a
%% roll-up row's Erlang callers; "" when it has none.
called_from([], _) ->
    "";
called_from([{Fn, B} | Rest], Total) ->
    Share = case Total of 0 -> ""; _ -> io_lib:format(" (~b%)", [round(100 * B / Total)]) end,
    Others = case Rest of
                 [] -> "";
                 [_] -> " and 1 other Erlang function";
                 _ -> io_lib:format(" and ~b other Erlang functions", [length(Rest)])
             end,
    lists:flatten([", called from ", mfa_text(Fn), Share, Others]).
