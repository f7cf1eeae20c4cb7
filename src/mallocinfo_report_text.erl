%% @private The report as text, 80 columns wide, with humanised units. Pure:
%% it renders what `mallocinfo_report:collect/0,1' return.
-module(mallocinfo_report_text).

-export([format/1, format_cluster/1]).

%% One row of the cluster table: 78 columns at most.
-define(ROW, "~-20ts ~9ts ~9ts ~9ts ~9ts ~6ts  ~ts~n").

%% The sections every report has (each a map or `{unavailable, Why, How}').
-define(SECTIONS, [resident, erts, libc, native, other_allocator]).

%% @doc The report of one node. Anything but a report as
%% `mallocinfo_report:collect/0' makes it raises `badarg'.
-spec format(mallocinfo_report:report()) -> iolist().
format(R) ->
    report(R) orelse erlang:error(badarg, [R]),
    %% The formatter is pure and reads the report in many places; the shape
    %% check above catches what is not a report at all, and a report whose
    %% insides it cannot read (a hand-made or altered map) is a wrong
    %% argument too. io_lib formats eagerly, so every failure is raised
    %% here.
    try
        [header(R), section_verdicts(R), section_growth(R), section_resident(R), section_erts(R),
         section_libc(R), section_native(R), section_other(R), section_unaccounted(R)]
    catch
        error:_ -> erlang:error(badarg, [R])
    end.

%% @doc A cluster's reports: one row per node, why each failed node
%% failed, then each node's verdicts. Anything but a list as
%% `mallocinfo_report:collect/1' returns raises `badarg'.
-spec format_cluster([mallocinfo_report:node_result()]) -> iolist().
format_cluster(Results) ->
    node_results(Results) orelse erlang:error(badarg, [Results]),
    try cluster(Results)
    catch error:_ -> erlang:error(badarg, [Results])
    end.

report(#{verdicts := Vs} = R) ->
    lists:all(fun(K) -> maps:is_key(K, R) end, [unaccounted_bytes | ?SECTIONS])
        andalso binaries(Vs);
report(_) ->
    false.

binaries([]) -> true;
binaries([B | Rest]) when is_binary(B) -> binaries(Rest);
binaries(_) -> false.

node_results([]) -> true;
node_results([{N, {ok, R}} | Rest]) when is_atom(N) -> report(R) andalso node_results(Rest);
node_results([{N, {error, _}} | Rest]) when is_atom(N) -> node_results(Rest);
node_results(_) -> false.

cluster(Results) ->
    Head = io_lib:format(?ROW, ["node", "RSS", "ERTS", "libc free", "native", "unacct", "status"]),
    Failures = [para(io_lib:format("~ts: ~0tp", [name(N), Why]))
                || {N, {error, Why}} <- Results, Why =/= unreachable, Why =/= timeout]
               ++ [para(io_lib:format("~ts: attach: ~0tp", [name(N), Why]))
                   || {N, {ok, #{attach := {error, Why}}}} <- Results,
                      Why =/= already_attached, Why =/= preloaded],
    Verdicts = [[io_lib:format("~ts:~n", [name(N)]),
                 [io_lib:format("  - ~ts~n", [wrap(V, 76, "    ")])
                  || V <- maps:get(verdicts, R, [])]]
                || {N, {ok, R}} <- Results],
    [rule_line(io_lib:format("cluster: ~b nodes", [length(Results)])), Head,
     [cluster_row(N, Res) || {N, Res} <- Results],
     [["failed:\n", Failures] || Failures =/= []],
     [[rule_line("Verdicts"), Verdicts] || Verdicts =/= []]].

%%% ---------------------------------------------------------------------------
%%% Text (80 columns)

header(R) ->
    Libc = case maps:get(libc_version, R, undefined) of
               V when is_binary(V) -> V;
               _ -> "?"
           end,
    [rule_line(io_lib:format("mallocinfo report: ~ts", [name(maps:get(node, R, '?'))])),
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

%% With `interval': every part's change and rate, and who holds what grew.
section_growth(#{layer_growth := {unavailable, _, _} = U}) ->
    [rule_line("Growth"), unavailable_line(U)];
section_growth(#{layer_growth := #{parts := Parts, span_ms := Ms, samples := N} = G}) ->
    Rss = maps:get(rss, G),
    Rows = [Rss#{part => rss} || is_map(Rss), is_integer(map_get(delta, Rss))]
        ++ [P || #{delta := D} = P <- Parts, is_integer(D)],
    [rule_line(io_lib:format("Growth over ~ts (~b samples)", [age(Ms), N])),
     io_lib:format("  ~-38ts ~10ts ~10ts ~10ts~n", ["part", "at end", "change", "per s"]),
     [io_lib:format("  ~-38ts ~10ts ~10ts ~10ts~ts~n",
                    [mallocinfo_layers_growth:part_label(P), bytes(Last), signed(D), signed(Rate),
                     case Growing of true -> "  grew"; false -> "" end])
      || #{part := P, last := Last, delta := D, rate := Rate, growing := Growing} <- Rows],
     para(io_lib:format("noise threshold: a part grew when it grew by ~ts or more over the "
                        "interval (free space: ~ts) and never fell by that much between two "
                        "samples (over six or more: or its last third stayed that much above "
                        "its first)",
                        [bytes(maps:get(noise_bytes, G)), bytes(4 * maps:get(noise_bytes, G))])),
     [[io_lib:format("~ts (largest growth first):~n", [mallocinfo_layers_growth:part_label(P)]),
       [io_lib:format("  ~ts~n", [culprit_line(C)]) || C <- lists:sublist(Cs, 3)]]
      || #{part := P, culprits := [_ | _] = Cs} <- maps:get(growing, G)]];
section_growth(_) ->
    [].

signed(D) when D < 0 -> ["-", bytes(-D)];
signed(D) -> ["+", bytes(D)].

culprit_line(#{pid := Pid, bytes := B} = C) ->
    Name = case C of #{name := N} when N =/= <<>> -> [" (", N, ")"]; _ -> "" end,
    Queue = case C of
                #{message_queue_len := Q} when is_integer(Q) -> [", queue ", count(Q)];
                _ -> ""
            end,
    truncate([delta_text(C), bytes(B), " ", Pid, Name, Queue], 76);
culprit_line(#{table := T, bytes := B, owner := O} = C) ->
    truncate([delta_text(C), bytes(B), " table ", T, " owner ", O, " ",
              maps:get(owner_name, C, <<>>)], 76);
culprit_line(#{function := F, object := O, bytes := B}) ->
    truncate([bytes(B), " ", case F of undefined -> "?"; _ -> F end, " (", O, ")"], 76).

delta_text(#{delta := D}) when is_integer(D) -> [signed(D), " to "];
delta_text(_) -> "".

section_resident(#{resident := {unavailable, _, _} = U}) ->
    [rule_line("1. Resident set"), unavailable_line(U)];
section_resident(#{resident := Res} = R) ->
    #{groups := G} = Res,
    Count = fun(K, What) ->
                    case maps:get(count, maps:get(K, G)) of
                        0 -> "";
                        N -> io_lib:format("~b ~ts", [N, What])
                    end
            end,
    TopFiles = lists:sublist(maps:get(files_top, Res, []), 2),
    Files = lists:join(", ", [io_lib:format("~ts ~ts", [name(filename:basename(P)), bytes(B)])
                              || #{path := P, rss := B} <- TopFiles]),
    Twice = maps:get(jit_counted_twice, Res, 0),
    Notes = #{arenas => Count(arenas, "heaps"),
              erts_carriers => "up to what ERTS mapped",
              erts_mapped => "regions beam.smp mapped",
              mapped_sites => case maps:get(mapped_sites, R, []) of
                                  [{Top, _, _, _} | _] -> name(Top);
                                  [] -> ""
                              end,
              anon_unclaimed => "no layer claims it",
              noreserve => "tracker tables, reserves",
              jit => case Twice of
                         0 -> "";
                         _ -> "its two views counted once"
                     end,
              stacks => Count(stacks, "stacks"),
              files => Files},
    %% Parts that are never empty on a BEAM node are always shown.
    Optional = [libc_mmap, other_allocator, special, mapped_sites],
    B = fun(K) -> bytes(maps:get(K, Res, undefined)) end,
    [rule_line("1. Resident set"),
     para(io_lib:format("RSS ~ts (peak ~ts), PSS ~ts: anonymous ~ts, file ~ts, shmem ~ts, swap ~ts",
                        [B(rss), B(peak), B(pss), B(anonymous), B(file), B(shmem), B(swap)])),
     io_lib:format("~b mappings, by kind:~n", [maps:get(mappings, Res, 0)]),
     [group_line(mallocinfo_report_verdicts:part_label(K), Bytes, maps:get(K, Notes, ""))
      || {K, Bytes} <- mallocinfo_report_verdicts:resident_parts(R),
         Bytes > 0 orelse not lists:member(K, Optional)],
     [para(io_lib:format("(the kernel's RSS counts ~ts of JIT code twice: its executable and "
                         "writable views map the same pages)", [bytes(Twice)])) || Twice > 0],
     mapped_sites_lines(R)].

%% The call sites that mapped anonymous memory themselves (the tracker's
%% regions, attributed by address), largest resident first.
mapped_sites_lines(#{mapped_sites := [_ | _] = Sites}) ->
    ["anonymous memory mapped by call sites (resident, mapped):\n",
     [io_lib:format("  ~-44ts ~10ts ~10ts~n", [truncate(name(Label), 44), bytes(B), bytes(M)])
      || {Label, _, B, M} <- lists:sublist(Sites, 5)]];
mapped_sites_lines(_) ->
    [].

group_line(Label, Bytes, Note) ->
    io_lib:format("  ~-32ts ~10ts  ~ts~n", [Label, bytes(Bytes), truncate(Note, 32)]).


section_erts(#{erts := {unavailable, _, _} = U}) ->
    [rule_line("2. ERTS"), unavailable_line(U)];
section_erts(#{erts := _} = R) ->
    [section_erts_layer(R) | erts_malloc_line(R)].

%% The VM's own malloc as the tracker sees it (ERTS memory, never a native
%% caller): after the carriers' line's "from malloc".
erts_malloc_line(#{native := #{erts_bytes := B, erts_blocks := N}}) ->
    para(io_lib:format("the tracker sees ~ts in ~ts blocks malloc'ed by the VM itself "
                       "(erts_sys_alloc and the rest of beam.smp): counted here, not as a native "
                       "caller", [bytes(B), count(N)]));
erts_malloc_line(_) ->
    [].

section_erts_layer(#{erts := E}) ->
    Mem = maps:get(memory, E),
    M = fun(K) -> bytes(maps:get(K, Mem, undefined)) end,
    Types = [T || #{allocated := A} = T <- maps:get(allocators, E), A > 0],
    #{allocated := Alloc, used := Used} = E,
    [rule_line("2. ERTS"),
     para(io_lib:format("erlang:memory(): total ~ts = processes ~ts + system ~ts (binary ~ts, "
                        "ets ~ts, code ~ts, atom ~ts)",
                        [M(total), M(processes), M(system), M(binary), M(ets), M(code), M(atom)])),
     para(io_lib:format("carriers: ~ts allocated, ~ts used (~b%); ~ts of them from malloc; ERTS "
                        "has ~ts mapped, ~ts of it mseg_alloc's cache of freed carriers",
                        [bytes(Alloc), bytes(Used), Used * 100 div max(1, Alloc),
                         bytes(maps:get(sys_alloc_bytes, E)),
                         bytes(maps:get(mmap_bytes, E)),
                         bytes(maps:get(mseg_cache_bytes, E, undefined))])),
     io_lib:format("  ~-16s ~11s ~11s ~6s~n", ["allocator", "allocated", "used", "usage"]),
     [io_lib:format("  ~-16ts ~11ts ~11ts ~5b%~n",
                    [N, bytes(A), bytes(U), U * 100 div max(1, A)])
      || #{name := N, allocated := A, used := U} <- lists:sublist(Types, 6)],
     carriers_lines(maps:get(carriers, E)),
     allocations_lines(maps:get(allocations, E)),
     case maps:get(processes, E) of
         [] -> [];
         Ps ->
             Procs = [io_lib:format("~ts~ts ~ts", [pid_to_list(P), proc_name(N), bytes(V)])
                      || #{pid := P, name := N, value := V} <- lists:sublist(Ps, 3)],
             para(["largest processes: " | lists:join("; ", Procs)])
     end,
     case maps:get(ets, E) of
         [] -> [];
         Ts -> para(["largest ETS tables: ",
                     lists:join("; ", [io_lib:format("~0tp ~ts", [T, bytes(TB)])
                                       || #{table := T, bytes := TB} <- lists:sublist(Ts, 3)])])
     end].

carriers_lines({unavailable, _, _} = U) ->
    unavailable_line("instrument:carriers/0 ", U);
carriers_lines(#{count := C, bytes := B, allocated := A, hist_start := H,
                 free_histogram := Hist}) ->
    Last = length(Hist) - 1,
    Label = fun(0) -> "<=" ++ bytes(H);
               (I) when I =:= Last -> ">" ++ bytes(H bsl (I - 1));
               (I) -> "<=" ++ bytes(H bsl I)
            end,
    [para(io_lib:format("instrument: ~b carriers of ~ts hold ~ts in blocks; free blocks by size:",
                        [C, bytes(B), bytes(A)])),
     para_indented(lists:join("; ", [io_lib:format("~ts: ~ts", [Label(I), count(N)])
                                     || {I, N} <- lists:zip(lists:seq(0, Last), Hist), N > 0]))].

allocations_lines({unavailable, _, _} = U) ->
    unavailable_line("instrument:allocations/0 ", U);
allocations_lines([]) ->
    [];
allocations_lines(Rows) ->
    ["tagged allocations (enif_alloc, driver_alloc, binaries) by origin:\n",
     [io_lib:format("  ~-22ts ~-14ts ~8ts blocks  ~ts-~ts~n",
                    [truncate(atom_to_list(O), 22), truncate(atom_to_list(T), 14), count(C),
                     bytes(Min), bytes(Max)])
      || #{origin := O, type := T, count := C, min_bytes := Min, max_bytes := Max}
             <- lists:sublist(Rows, 5)]].

section_libc(#{libc := {unavailable, _, _} = U}) ->
    [rule_line("3. libc"), unavailable_line(U)];
section_libc(#{libc := L}) ->
    #{mallinfo := MI, arenas := Arenas, arena_max := #{value := Max, source := Src}} = L,
    BySystem = lists:reverse(lists:keysort(2, [{A, S} || #{arena := A, system_bytes := S}
                                                            <- Arenas])),
    Shown = [A || {A, _} <- lists:sublist(BySystem, 8)],
    M = fun(K) -> bytes(maps:get(K, MI)) end,
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
                      [A, bytes(S), bytes(U), bytes(F), F * 100 div max(1, S)])
        || #{arena := A, system_bytes := S, in_use_bytes := U, free_bytes := F} <- Arenas,
           lists:member(A, Shown)],
       [io_lib:format("  (~b smaller arenas not shown)~n", [length(Arenas) - length(Shown)])
        || length(Arenas) > length(Shown)]] || Arenas =/= []],
     heap_map_lines(maps:get(heap_map, L))].

heap_map_lines({unavailable, _, _} = U) ->
    unavailable_line("heap map ", U);
heap_map_lines(#{total := T}) ->
    B = fun(K) -> bytes(maps:get(K, T, undefined)) end,
    para(io_lib:format("heap map: free ~ts in ~ts chunks (largest ~ts); malloc_trim could return "
                       "~ts now; ~ts pinned between live blocks; resident ~ts",
                       [B(free_bytes), count(maps:get(free_chunks, T, 0)), B(largest_free),
                        B(trimmable_bytes), B(pinned_bytes), B(resident_bytes)])).

section_native(#{native := {unavailable, _, _} = U}) ->
    [rule_line("4. Native callers (tracker)"), unavailable_line(U)];
section_native(#{native := #{functions := Functions, objects := Objects, olds := Olds} = N} = R) ->
    [rule_line("4. Native callers (tracker)"),
     attached_line(N),
     coverage_line(N, R),
     para(io_lib:format("left out of every ranking and verdict: the VM's own malloc (~ts in ~ts "
                        "blocks, erts_alloc's carriers: ERTS memory, section 2), "
                        "mallocinfo's own work (~ts), its processes and this shell",
                        [bytes(maps:get(erts_bytes, N, 0)), count(maps:get(erts_blocks, N, 0)),
                         self_text(N)])),
     "top functions (live bytes, blocks, stacks, first caller past the allocator):\n",
     case Functions of
         [] -> "  none: no native call site outside the VM holds a live block\n";
         _ -> [[io_lib:format("  ~10ts ~7ts ~6ts  ~ts~n",
                              [bytes(B), count(C), count(St),
                               frame_text(maps:get(frame, F, undefined), 50)]),
                erlang_lines(maps:get(erlang, F, []), F, B)]
               || #{bytes := B, count := C, stacks := St} = F <- lists:sublist(Functions, 6)]
     end,
     processes_lines(maps:get(processes, N, [])),
     "top objects (live bytes, blocks, stacks, object):\n",
     case Objects of
         [] -> "  none\n";
         _ -> [io_lib:format("  ~10ts ~7ts ~6ts  ~ts~n",
                             [bytes(B), count(C), count(St), object_text(O)])
               || #{bytes := B, count := C, stacks := St, object := O} <- Objects]
     end,
     churn_lines(maps:get(churn, N, none)),
     growth_lines(maps:get(growth, N, none)),
     previous_lines(maps:get(previous, N, none)),
     "oldest live blocks (size, age, allocated from), start-up (the node's first 30 s)\n"
     "  left out unless mallocinfo:report(#{startup_blocks => true}):\n",
     case Olds of
         [] -> "  none\n";
         _ -> [io_lib:format("  ~10ts ~8ts  ~ts~n", [bytes(Sz), age(A), frame_text(culprit(St), 57)])
               || #{size := Sz, age_ms := A, stack := St} <- Olds]
     end];
section_native(#{native := N}) ->
    #{sites := Sites, olds := Olds} = N,
    [rule_line("4. Native callers (tracker)"),
     attached_line(N),
     para(io_lib:format("mode ~ts: ~ts live in ~ts blocks, ~b dropped",
                        [maps:get(mode, N), bytes(maps:get(live_bytes, N, 0)),
                         count(maps:get(live_entries, N, 0)), maps:get(dropped, N, 0)])),
     "top call sites (live bytes, blocks, oldest, allocated from):\n",
     [io_lib:format("  ~10ts ~7ts ~8ts  ~ts~n",
                    [bytes(B), count(C), age(maps:get(oldest_age_ms, S, 0)),
                     frame_text(culprit(St), 49)])
      || #{bytes := B, count := C, stack := St} = S <- lists:sublist(Sites, 6)],
     "oldest live blocks (size, age, allocated from):\n",
     [io_lib:format("  ~10ts ~8ts  ~ts~n", [bytes(Sz), age(A), frame_text(culprit(St), 57)])
      || #{size := Sz, age_ms := A, stack := St} <- Olds]].

%% Under a function: the Erlang functions that drove its blocks, and the
%% processes holding them ("called from m:f/2 (80%), n:g/1 (20%) in 16
%% xmpp_stream_in processes").
erlang_lines(Erl, Row, B) ->
    Callers = case Erl of
                  [] -> "";
                  _ -> "called from " ++ callers_text(Erl, B)
              end,
    case string:trim(Callers ++ mallocinfo_report_verdicts:row_processes_text(Row), leading) of
        "" -> [];
        Text -> ["    ", wrap(Text, 76, "      "), "\n"]
    end.

%% Who churns: the native functions that allocated most since the tracker
%% started or was reset (mallocinfo_trace:churn/2), beside what they hold.
churn_lines(none) ->
    [];
churn_lines([]) ->
    "churn since start or reset: none outside the VM\n";
churn_lines([#{since_ms := Since} | _] = Rows) ->
    [io_lib:format("churn, the last ~ts (allocated, per s, temporary, lifetime, function):~n",
                   [age(Since)]),
     [io_lib:format("  ~10ts ~8ts ~4ts ~7ts  ~ts~n",
                    [bytes(B), count(Rate), [integer_to_list(T), "%"], lifetime_text(M),
                     frame_text(maps:get(frame, R, undefined), 42)])
      || #{allocated_bytes := B, allocated_per_s := Rate, temporary_percent := T,
           median_ms := M} = R <- Rows]].

%% A typical lifetime: "<1ms", "<8ms", ">70min", "-" (none freed).
lifetime_text(undefined) -> "-";
lifetime_text(infinity) -> ">70min";
lifetime_text(Ms) when Ms < 1000 -> ["<", integer_to_list(Ms), "ms"];
lifetime_text(Ms) -> ["<", age(Ms)].

%% "m:f/2 (80%), n:g/1 (20%)": the Erlang functions that drove a row's
%% blocks, with their share of its bytes.
callers_text(Erl, Total) ->
    lists:flatten(lists:join(", ", [io_lib:format("~ts (~ts)", [mallocinfo_report_verdicts:mfa_text(Fn),
                                                               share(B, Total)])
                                    || {Fn, B} <- Erl])).

share(_, 0) -> "-";
share(B, Total) -> io_lib:format("~b%", [round(100 * B / Total)]).

processes_lines([]) ->
    [];
processes_lines(Rows) ->
    [para("processes holding the most native memory (live bytes, blocks, process; every "
          "malloc made while they ran, the VM's own on their behalf included):"),
     [io_lib:format("  ~10ts ~7ts  ~ts~ts~n", [bytes(B), count(C), pid_to_list(P),
                                               mallocinfo_process:name_text(Name)])
      || #{pid := P, name := Name, bytes := B, count := C} <- Rows]].

object_text(undefined) -> "(no stack)";
object_text(O) -> truncate(name(filename:basename(O)), 57).

growth_lines(#{interval_ms := Ms0, samples := N, growers := G, live_delta := D} = Growth) ->
    Ms = maps:get(span_ms, Growth, Ms0),
    Head = io_lib:format("growth over ~ts (~b samples): tracker live bytes ~ts~ts; ", [age(Ms), N,
                                                                                    sign(D),
                                                                                    bytes(abs(D))]),
    case G of
        [] ->
            para([Head, "no native call site grew in every sample: stable"]);
        _ ->
            [para([Head, "native call sites that grew in every sample (growth, per s, now):"]),
             [io_lib:format("  ~10ts ~10ts ~10ts  ~ts~n",
                            [bytes(Gr), bytes(R), bytes(B), frame_text(C, 38)])
              || #{growth_bytes := Gr, rate := R, bytes := B, culprit := C} <- G]]
    end;
growth_lines({unavailable, _, _} = U) ->
    unavailable_line("growth ", U);
growth_lines(_) ->
    "growth: mallocinfo:report(#{interval => Ms}) measures it\n".

previous_lines(#{age_ms := Age, native_delta := D, grew := Grew}) ->
    Head = io_lib:format("since the previous report (~ts ago): tracker live bytes ~ts~ts",
                         [age(Age), sign(D), bytes(abs(D))]),
    case Grew of
        [] -> para([Head, "; no native function grew"]);
        _ ->
            [para([Head, "; grew most:"]),
             [io_lib:format("  +~9ts  ~ts~n", [bytes(B), function_text(O, F)])
              || #{bytes_delta := B, object := O, function := F} <- Grew]]
    end;
previous_lines(_) ->
    [].

function_text(undefined, _) -> "(no stack)";
function_text(O, F) -> frame_text(#{object => O, symbol => F}, 60).

sign(D) when D < 0 -> "-";
sign(_) -> "+".

%% A tracker brought in by mallocinfo_trace:attach/0 has not seen what was
%% allocated before: the report says since when it looks.
%% What the section covers, beside the node's resident set: the tracker
%% sees malloc'ed blocks only, from the moment it started recording.
coverage_line(N, R) ->
    Since = case N of
                #{attached_at := At} when is_integer(At) -> "since attach";
                _ -> "since the node started"
            end,
    Rss = case R of
              #{resident := #{rss := Bytes}} when is_integer(Bytes), Bytes > 0 ->
                  io_lib:format(" of the node's ~ts RSS", [bytes(Bytes)]);
              _ -> ""
          end,
    para(io_lib:format("mode ~ts: malloc'ed memory seen ~ts: ~ts live in ~ts blocks~ts, ~b "
                       "dropped; ERTS's carriers, libc's free memory and mappings are in "
                       "sections 1 to 3",
                       [maps:get(mode, N), Since, bytes(maps:get(live_bytes, N, 0)),
                        count(maps:get(live_entries, N, 0)), Rss, maps:get(dropped, N, 0)])).

%% mallocinfo's own allocations: never recorded, counted apart by the
%% tracker (status/0's `self'); blocks whose stacks pass through its
%% objects anyway (the loader's, when it loaded the NIF) are summed too.
self_text(N) ->
    Recorded = case maps:get(self_bytes, N, 0) of
                   0 -> "";
                   B -> io_lib:format("; ~ts in ~ts blocks through its objects",
                                      [bytes(B), count(maps:get(self_blocks, N, 0))])
               end,
    case maps:get(self, N, undefined) of
        #{calls := C, bytes := Bytes} ->
            io_lib:format("~ts allocations, ~ts, never recorded~ts", [count(C), bytes(Bytes),
                                                                      Recorded]);
        _ ->
            io_lib:format("not counted by this interposer~ts", [Recorded])
    end.

attached_line(#{attached_at := At} = N) when is_integer(At) ->
    When = calendar:system_time_to_rfc3339(At, [{unit, millisecond}, {offset, "Z"}]),
    Detached = case maps:get(attached, N, true) of
                   true -> "";
                   false -> " (detached since: nothing newer is seen)"
               end,
    para(io_lib:format("attached at ~ts; blocks allocated before that are not seen~ts",
                       [When, Detached]));
attached_line(_) ->
    [].

%% "symbol (object)" in at most Width columns: the symbol gives way first.
%% Both are bytes: name/1 makes them printable.
frame_text(undefined, _) ->
    "?";
frame_text(#{object := O} = F, Width) ->
    Obj = truncate(name(filename:basename(O)), Width div 2),
    Sym = case maps:get(symbol, F, undefined) of
              undefined -> io_lib:format("+0x~.16b", [maps:get(offset, F, 0)]);
              S -> name(S)
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
                        [bytes(maps:get(K, S, undefined))
                         || K <- [allocated, active, resident, mapped, retained, metadata]]))];
section_other(#{other_allocator := #{allocator := A} = O}) ->
    [rule_line(io_lib:format("5. Other allocator: ~ts", [A])),
     para(io_lib:format("allocated ~ts, resident ~ts",
                        [bytes(maps:get(allocated, O, undefined)),
                         bytes(maps:get(resident, O, undefined))]))].

section_unaccounted(#{unaccounted_bytes := undefined}) ->
    [rule_line("6. Unaccounted"), "unknown: the resident set could not be read\n"];
section_unaccounted(#{unaccounted_bytes := U, unaccounted_percent := P, attributed := A} = R) ->
    Parts = [io_lib:format("~ts ~ts", [attributed_label(K), bytes(B)]) || {K, B} <- A, B > 0],
    [rule_line("6. Unaccounted"),
     para(["mapped ", bytes(maps:get(rss_for_accounting, R, 0)),
           "; explained by the layers: ", lists:join(", ", Parts)]),
     io_lib:format("unaccounted: ~ts (~.1f% of RSS)~n", [bytes(U), float(P)]),
     case maps:get(erts_slack_bytes, R, 0) of
         _ when map_get(exact, R) =:= true ->
             para("(exact: the tracker saw every mmap made through the symbol since it "
                  "started, and each anonymous mapping is attributed by address)");
         Slack when Slack > 0 ->
             para(io_lib:format("(a lower bound: ERTS has ~ts more mapped than is resident for "
                                "it, and memory mapped behind its back could hide there)",
                                [bytes(Slack)]));
         _ -> []
     end].

attributed_label(files) -> "files";
attributed_label(jit) -> "JIT";
attributed_label(stacks) -> "stacks";
attributed_label(special) -> "vdso etc.";
attributed_label(libc_heaps) -> "libc heaps";
attributed_label(tracker_tables) -> "tracker tables";
attributed_label(erts_carriers) -> "ERTS mappings";
attributed_label(mapped_sites) -> "mapped by call sites";
attributed_label(libc_mmap) -> "libc mmapped blocks";
attributed_label(other_allocator) -> "other allocator".

unavailable_line(U) ->
    unavailable_line("", U).

unavailable_line(What, {unavailable, Why, How}) ->
    para(io_lib:format("~tsunavailable (~ts): ~ts",
                       [What, truncate(io_lib:format("~0tP", [Why, 8]), 120), How])).

%% A paragraph: wrapped at 78 columns, continuation lines indented by two.
para(Text) ->
    [wrap(Text, 78, "  "), "\n"].

%% The same, every line indented by two.
para_indented(Text) ->
    ["  ", wrap(Text, 76, "  "), "\n"].

%% Greedy word wrap; continuation lines start with Indent and are at most
%% Width wide including it. A unit stays with its number ("186.2 MiB",
%% "160 k", "5 s"); a word longer than a line (a C++ symbol, a term) is cut.
wrap(Text, Width, Indent) ->
    Narrow = Width - length(Indent),
    Words = lists:append([cut(W, Narrow)
                          || W <- glue_units(string:lexemes(unicode:characters_to_list(Text),
                                                            " "))]),
    Room = fun([]) -> Width; (_) -> Narrow end,
    {Lines, Last} = lists:foldl(
                      fun(W, {Acc, []}) -> {Acc, W};
                         (W, {Acc, Cur}) ->
                              case string:length(Cur) + 1 + string:length(W) > Room(Acc) of
                                  true -> {[Cur | Acc], W};
                                  false -> {Acc, Cur ++ " " ++ W}
                              end
                      end, {[], []}, Words),
    lists:join(["\n", Indent], lists:reverse([Last | Lines])).

cut(Word, Max) ->
    case string:length(Word) > Max of
        true -> [string:slice(Word, 0, Max) | cut(string:slice(Word, Max), Max)];
        false -> [Word]
    end.

glue_units([N, U | Rest]) ->
    case is_unit(U) of
        true -> glue_units([N ++ " " ++ U | Rest]);
        false -> [N | glue_units([U | Rest])]
    end;
glue_units(Words) ->
    Words.

is_unit(W) ->
    lists:member(string:trim(W, trailing, ",;:)."),
                 ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "k", "M", "G",
                  "ms", "s", "min", "h", "d"]).

%%% ---------------------------------------------------------------------------
%%% The cluster table

cluster_row(Node, {ok, R}) ->
    Erts = case R of #{erts := #{memory := #{total := T}}} -> T; _ -> undefined end,
    Free = case R of
               #{libc := #{arenas := [_ | _] = A}} -> lists:sum([F || #{free_bytes := F} <- A]);
               #{libc := #{free_bytes := F}} -> F;
               _ -> undefined
           end,
    Native = case R of #{native := #{live_bytes := L}} -> L; _ -> undefined end,
    Unacct = case R of
                 #{unaccounted_percent := P} when is_number(P) ->
                     io_lib:format("~.1f%", [float(P)]);
                 _ -> "-"
             end,
    Loaded = case maps:get(injected, R, false) of
                 true -> "injected";
                 false -> "ok"
             end,
    Status = case maps:get(attach, R, none) of
                 none -> Loaded;
                 ok -> Loaded ++ ", attached now";
                 {error, already_attached} -> Loaded ++ ", attached";
                 {error, preloaded} -> Loaded ++ ", preloaded";
                 {error, _} -> Loaded ++ ", attach failed"
             end,
    io_lib:format(?ROW, [truncate(name(Node), 20), short_bytes(rss(R)), short_bytes(Erts),
                         short_bytes(Free), short_bytes(Native), Unacct, Status]);
cluster_row(Node, {error, Why}) ->
    Status = case Why of
                 unreachable -> "unreachable";
                 timeout -> "timeout";
                 _ -> "failed"
             end,
    io_lib:format(?ROW, [truncate(name(Node), 20), "-", "-", "-", "-", "-", Status]).

short_bytes(undefined) -> "-";
short_bytes(B) -> bytes(B).

% Shorthands for the units the text use.
bytes(B) -> mallocinfo_units:bytes(B).
count(N) -> mallocinfo_units:count(N).
age(Ms) -> mallocinfo_units:age(Ms).
culprit(Stack) -> mallocinfo_report_verdicts:culprit(Stack).
rss(R) -> mallocinfo_report_verdicts:rss(R).
proc_name(Name) -> mallocinfo_report_verdicts:proc_name(Name).
name(Name) -> mallocinfo_text:name(Name).
