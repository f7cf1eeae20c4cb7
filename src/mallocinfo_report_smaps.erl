%% @private `/proc/self' text as data, with pure functions only: the
%% mappings of `smaps' parsed and grouped by what they are (glibc's main
%% heap and per-thread heaps, thread stacks, the JIT, NORESERVE
%% reservations, other anonymous memory, files), where glibc's heaps may
%% start and which of those are heaps, and the `Key: value kB' fields of
%% `status' and `smaps_rollup'. `mallocinfo_report' parses `smaps' once
%% per report and hands the mappings to `mallocinfo_report_build'; both
%% call here. Exported for them and for EUnit, which feeds canned text.
%% Not an API: arguments are not checked.
-module(mallocinfo_report_smaps).

-export([parse_smaps/1, parse_fields/1]).
-export([group_mappings/1, group_mappings/2, anon_kinds/2]).
%% What mallocinfo_report reads from the process's memory to confirm heaps.
-export([heap_candidates/1, heap_windows/2, straddling/2]).

-export_type([vma/0]).

%% One mapping of smaps (see parse_smaps/1).
-type vma() :: #{start := non_neg_integer(), stop := non_neg_integer(), perms := binary(),
                 path := binary(), size := non_neg_integer(), rss := non_neg_integer(),
                 pss := non_neg_integer(), anon := non_neg_integer(),
                 swap := non_neg_integer(), page_size := pos_integer(),
                 flags := [binary()] | undefined}.

-define(MiB, (1 bsl 20)).
%% glibc's HEAP_MAX_SIZE on 64-bit: every non-main heap is a reservation
%% this big, aligned to it.
-define(HEAP_MAX, (64 * ?MiB)).
%% A stack guard is at most this big; anything larger that is PROT_NONE is
%% a reservation, not a guard.
-define(GUARD_MAX, ?MiB).
%% How many of the largest anonymous mappings group_mappings/2 lists.
-define(ANON_TOP, 5).

%%% Text ----------------------------------------------------------------------

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
-spec parse_smaps(binary()) -> [vma()].
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
               {<<"KernelPageSize">>, V} -> Cur#{page_size => V};
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
      size => E - S, rss => 0, pss => 0, anon => 0, swap => 0, page_size => 4096,
      flags => undefined}.

%%% Grouping ------------------------------------------------------------------

%% @doc The mappings grouped by what they are. Each group is
%% `#{rss, size, count}' (bytes; count of mappings, of 64 MiB heaps for
%% `arenas', of stacks for `stacks'):
%% <ul>
%% <li>`main_heap': `[heap]', glibc's main arena (brk).</li>
%% <li>`arenas': glibc's non-main arenas. Each heap of a non-main arena is
%%     an anonymous private reservation of HEAP_MAX (64 MiB on 64-bit),
%%     `MAP_NORESERVE' up to glibc 2.36 and not from 2.37 on, whose start is
%%     64 MiB aligned: readable and writable from the start up to what the
%%     arena uses, `PROT_NONE' after. A mapping that starts 64 MiB aligned
%%     and, with the mappings right after it, covers 64 MiB windows exactly
%%     that way (`rw' then `---', all `nr' or none) is counted as heaps; a mapping that merged with a neighbour and
%%     sticks out of the windows has its Rss split in proportion to the
%%     bytes inside (the kernel does not say which pages are where). A
%%     heap whose start merged with a writable NORESERVE mapping below it
%%     is missed (it is counted in `noreserve').</li>
%% <li>`stacks': `[stack]', and thread stacks: writable anonymous mappings
%%     directly above an anonymous `PROT_NONE' guard of at most 1 MiB.</li>
%% <li>`jit': the BEAM JIT's code: the two views of its `memfd:vmem'
%%     with each page counted once (the views' Pss; `jit_counted_twice'
%%     is what the kernel's Rss counts a second time), and any executable
%%     anonymous mapping.</li>
%% <li>`noreserve': other anonymous `MAP_NORESERVE' mappings (the tracker's
%%     tables are).</li>
%% <li>`anon': all other anonymous memory: ERTS carriers (mseg_alloc),
%%     glibc's mmapped blocks, other allocators, direct mmaps.</li>
%% <li>`files': file-backed mappings; `special': `[vdso]', other shared
%%     memory.</li>
%% </ul>
%% Also `files_top' and `anon_top': the largest files and anonymous
%% mappings by Rss.
-spec group_mappings([vma()]) -> map().
group_mappings(Vmas) ->
    group_mappings(Vmas, #{}).

%% @doc The same, with what was read from the process's memory: `heap_headers'
%% (`#{Address => Bytes}', the first bytes at each of heap_candidates/1)
%% confirms heaps by their glibc header instead of their shape alone, and
%% `straddle_rss' (`#{MappingStart => Bytes}', from `/proc/self/pagemap')
%% says exactly how much of a mapping that straddles a heap is resident
%% inside it.
-spec group_mappings([vma()], #{heap_headers => map(), straddle_rss => map()}) -> map().
group_mappings(Vmas, Evidence) ->
    Windows = heap_windows(Vmas, maps:get(heap_headers, Evidence, undefined)),
    Straddle = maps:get(straddle_rss, Evidence, #{}),
    {Parts, _} = lists:mapfoldl(fun(V, Prev) -> {classify(V, Prev, Windows, Straddle), V} end,
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
    Anon = [{Rss, S, E} || {anon, Rss, _, _, #{start := S, stop := E}} <- Flat, Rss > 0],
    AnonTop = lists:sublist(lists:reverse(lists:sort(Anon)), ?ANON_TOP),
    %% What the kernel's RSS counts twice: the JIT views' Rss beyond their
    %% pages counted once.
    JitTwice = lists:sum([Rss - Once || {jit, Once, _, _, #{path := <<"/memfd:vmem", _/binary>>,
                                                          rss := Rss}} <- Flat]),
    #{groups => Groups,
      jit_counted_twice => JitTwice,
      files_top => [#{path => P, rss => R} || {P, R} <- FilesTop],
      anon_top => [#{start => S, stop => E, rss => R} || {R, S, E} <- AnonTop]}.

%% One mapping -> [{Kind, Rss, Size, Count, Vma}]: two parts when it
%% straddles a glibc heap window.
classify(#{path := <<"[heap]">>} = V, _, _, _) -> [whole(main_heap, V)];
classify(#{path := <<"[stack", _/binary>>} = V, _, _, _) -> [whole(stacks, V)];
%% The JIT maps its code twice, an executable view and a writable one of
%% the same memfd pages, and the kernel's Rss counts each resident page in
%% both. The memfd belongs to this process alone, so each view's Pss is its
%% pages divided by the views that map them: the views' Pss add up to the
%% resident pages, each counted once.
classify(#{path := <<"/memfd:vmem", _/binary>>, pss := Pss, rss := Rss, size := Size} = V, _, _,
         _) ->
    %% (A kernel, or canned text, without Pss lines: the Rss as it is.)
    Once = case Pss > 0 of
               true -> min(Pss, Rss);
               false -> Rss
           end,
    [{jit, Once, Size, 1, V}];
classify(#{path := Path} = V, Prev, Windows, Straddle) ->
    case anonymous(Path) of
        false when binary_part(Path, 0, 1) =:= <<"/">> -> [whole(files, V)];
        false -> [whole(special, V)];
        true -> classify_anon(V, Prev, Windows, Straddle)
    end.

classify_anon(#{start := S, size := Size, rss := Rss} = V, Prev, Windows, Straddle) ->
    case overlap(V, Windows) of
        0 ->
            [whole(anon_kind(V, Prev), V)];
        Size ->
            [{arenas, Rss, Size, 1, V}];
        In ->
            %% Exact from pagemap when it was read, else in proportion.
            InRss = min(Rss, maps:get(S, Straddle, Rss * In div Size)),
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

%%% glibc's heaps -------------------------------------------------------------

%% @doc Where a glibc heap could start: every 64 MiB aligned address inside
%% a writable anonymous private mapping (merged mappings included; NORESERVE
%% or not: glibc 2.37 stopped mapping heaps NORESERVE). mallocinfo_report
%% reads the first bytes at each.
-spec heap_candidates([vma()]) -> [non_neg_integer()].
heap_candidates(Vmas) ->
    [B || #{perms := <<"rw", _, $p>>, path := P} = V <- Vmas, anonymous(P), B <- aligned_in(V)].

aligned_in(#{start := S, stop := E}) ->
    lists:seq((S + ?HEAP_MAX - 1) div ?HEAP_MAX * ?HEAP_MAX, E - 1, ?HEAP_MAX).

%% @doc Start addresses of the 64 MiB windows that are glibc heaps. With
%% the first bytes read at the candidates (`#{Address => Bytes}'), a
%% candidate is a heap when they are a plausible glibc `heap_info':
%% `ar_ptr' points just past the start of a 64 MiB window (the arena lives
%% at the start of its first heap), `prev' is 0 or 64 MiB aligned, `size'
%% is a positive multiple of 4 KiB up to 64 MiB and `mprotect_size' is at
%% least `size' (glibc never lowers it below). Zeros, table slots and
%% carrier contents do not pass. Without them (`undefined': memory could
%% not be read), by shape alone, see below.
-spec heap_windows([vma()], #{non_neg_integer() => binary()} | undefined) ->
          [non_neg_integer()].
heap_windows(Vmas, Headers) when is_map(Headers) ->
    [B || B <- heap_candidates(Vmas), heap_info(maps:get(B, Headers, <<>>), B)];
heap_windows(Vmas, _) ->
    heap_windows(Vmas).

heap_info(<<ArPtr:64/native, Prev:64/native, Size:64/native, Mprotect:64/native, _/binary>>, B) ->
    ArPtr rem ?HEAP_MAX > 0 andalso ArPtr rem ?HEAP_MAX < 256 andalso
        Prev rem ?HEAP_MAX =:= 0 andalso Prev =/= B andalso
        Size > 0 andalso Size rem 4096 =:= 0 andalso Size =< ?HEAP_MAX andalso
        Mprotect >= Size andalso Mprotect =< ?HEAP_MAX;
heap_info(_, _) ->
    false.

%% @doc The anonymous mappings that only partly lie in heap windows, and
%% the ranges of each that do: `[{Start, PageSize, [{From, To}]}]'. For
%% these mallocinfo_report counts resident pages in /proc/self/pagemap.
-spec straddling([vma()], [non_neg_integer()]) ->
          [{non_neg_integer(), pos_integer(), [{non_neg_integer(), non_neg_integer()}]}].
straddling(Vmas, Windows) ->
    [{S, Page, Ranges}
     || #{start := S, stop := E, size := Size, path := P, page_size := Page} = V <- Vmas,
        anonymous(P),
        Ranges <- [[{max(S, W), min(E, W + ?HEAP_MAX)} || W <- Windows,
                                                           W < E, W + ?HEAP_MAX > S]],
        Ranges =/= [], overlap(V, Windows) < Size].

%% By shape alone: a heap begins a mapping: glibc maps it on its own and
%% its first bytes are the heap header. So a candidate is a writable
%% anonymous private mapping that starts 64 MiB aligned; from there,
%% contiguous anonymous private mappings, NORESERVE exactly when the first
%% is (one reservation: up to glibc 2.36 all are, from 2.37 none), must cover each
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
                         B rem ?HEAP_MAX =:= 0, anonymous(P),
                         {ok, Ws} <- [heap_run(T, I, B, B, rw, noreserve(V))]])).

%% Walks mapping I.. of a run that started at B; WinStart is the current
%% window; State is rw (still writable) or none (PROT_NONE seen); Nr is
%% whether the first mapping was NORESERVE.
heap_run(T, I, B, WinStart, State, Nr) when I =< tuple_size(T) ->
    #{stop := E, perms := Perms, path := P} = V = element(I, T),
    WinEnd = WinStart + ?HEAP_MAX,
    Kind = case Perms of
               <<"rw", _, $p>> -> rw;
               <<"---p">> -> none;
               _ -> bad
           end,
    Fits = Kind =/= bad andalso anonymous(P) andalso noreserve(V) =:= Nr andalso
        not (Kind =:= rw andalso State =:= none),
    if
        not Fits -> error;
        E =:= WinEnd; Kind =:= none, E > WinEnd -> {ok, lists:seq(B, WinStart, ?HEAP_MAX)};
        E < WinEnd -> next_in_run(T, I, B, WinStart, Kind, E, Nr);
        true ->
            %% A writable mapping crossing into the next window(s).
            Last = (E - 1) div ?HEAP_MAX * ?HEAP_MAX,
            case E rem ?HEAP_MAX of
                0 -> {ok, lists:seq(B, Last, ?HEAP_MAX)};
                _ -> next_in_run(T, I, B, Last, rw, E, Nr)
            end
    end;
heap_run(_, _, _, _, _, _) ->
    error.

next_in_run(T, I, B, WinStart, State, Stop, Nr) ->
    case I + 1 =< tuple_size(T) andalso maps:get(start, element(I + 1, T)) =:= Stop of
        true -> heap_run(T, I + 1, B, WinStart, State, Nr);
        false -> error
    end.

%% Kernels without VmFlags (before 3.8) cannot tell; assume it is.
noreserve(#{flags := undefined}) -> true;
noreserve(#{flags := Flags}) -> lists:member(<<"nr">>, Flags).

%%% Attribution by address ----------------------------------------------------

%% @doc For each address, the group of the mapping that holds it when that
%% mapping is plain anonymous memory: `noreserve' or `anon' (as
%% group_mappings/2 would count it, heaps and stacks aside); `none' when
%% no mapping holds it, or one that is a file, special or executable.
%% `Vmas' in address order (parse_smaps/1's); one binary search per
%% address.
-spec anon_kinds([vma()], [non_neg_integer()]) -> [anon | noreserve | none].
anon_kinds(Vmas, Addresses) ->
    T = list_to_tuple(Vmas),
    [vma_kind(find_vma(A, T)) || A <- Addresses].

%% Binary search over the mappings (in address order).
find_vma(A, Vmas) -> find_vma(A, Vmas, 1, tuple_size(Vmas)).

find_vma(_, _, Lo, Hi) when Lo > Hi -> none;
find_vma(A, Vmas, Lo, Hi) ->
    Mid = (Lo + Hi) div 2,
    case element(Mid, Vmas) of
        #{start := S} when A < S -> find_vma(A, Vmas, Lo, Mid - 1);
        #{stop := E} when A >= E -> find_vma(A, Vmas, Mid + 1, Hi);
        V -> V
    end.

vma_kind(none) -> none;
vma_kind(#{perms := <<_, _, $x, _>>}) -> none;
vma_kind(#{path := P} = V) ->
    case anonymous(P) of
        true -> plain_anon_kind(V);
        false -> none
    end.

