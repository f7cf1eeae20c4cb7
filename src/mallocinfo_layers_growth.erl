%% @private What grew, from samples of every layer (`mallocinfo_layers'),
%% with pure functions only: each layer's change and rate, which of the
%% node's parts grew beyond the noise, the fastest first with its culprit,
%% and the sentences that say so. The report's interval
%% (`mallocinfo_report_build', `mallocinfo_report_verdicts'), the
%% sampler's timeline (`mallocinfo_watch') and its page read it. Not an
%% API: arguments are not checked.
%%
%% The parts are disjoint pieces of the node's memory, each computed from
%% a sample's layers, so one growth is named once, where it happens:
%% `binary', `ets', `processes', `code', `atom' and `erts_other' (the rest
%% of `erlang:memory(system)') are `erlang:memory()''s; `erts_free' is the
%% free space in erts_alloc's carriers (allocated minus used, every
%% allocator type); `native' is the tracker's live bytes and `libc_in_use'
%% what libc has in use beyond them (all of it without the tracker);
%% `libc_free' is the free memory in libc's arenas, `libc_mmap' libc's
%% mmapped blocks, `mapped_sites' what native call sites mapped
%% themselves. When RSS grows by more than these parts explain, the
%% `rss' part says so and names the kind of mapping that grew.
%%
%% The noise threshold: a part grows when it grew by at least
%% `noise_bytes()' over the samples and never fell by that much from one
%% sample to the next, or (six samples or more) its last third stayed
%% that much above its first (rose/2). doc/report.md says how it was
%% chosen (idle nodes, measured by `make bench').
-module(mallocinfo_layers_growth).

-export([growth/1, growth/2, verdicts/1, sentences/1, noise_bytes/0]).
-export([parts/0, part_value/2, part_label/1, layer_name/1, rss_parts/1, stacked_labels/0]).

-define(MiB, (1 bsl 20)).
%% A part must grow by this much over the samples, and never fall by this
%% much between two of them (doc/report.md, "The noise threshold").
-define(NOISE_BYTES, ?MiB).
%% The free space in ERTS's carriers and libc's arenas moves with every
%% garbage collection and carrier allocation: up to 1.1 MiB over 10 s on
%% an idle node (doc/report.md), so it must grow by four times as much.
-define(FREE_NOISE_BYTES, (4 * ?MiB)).

noise(P) when P =:= erts_free; P =:= libc_free -> ?FREE_NOISE_BYTES;
noise(_) -> ?NOISE_BYTES.

%% @doc The noise threshold in bytes: a part that grew by less over the
%% samples, or fell by as much between two of them, did not grow.
-spec noise_bytes() -> pos_integer().
noise_bytes() ->
    ?NOISE_BYTES.

%% @doc The parts of the node's memory whose growth is named, in the order
%% a tie is broken (the part with a culprit first).
-spec parts() -> [atom()].
parts() ->
    [binary, ets, processes, native, mapped_sites, libc_in_use, libc_free, libc_mmap, erts_free,
     code, atom, erts_other].

%% @doc A part's bytes in a sample's layers, `undefined' when a layer it
%% is made of was not read.
-spec part_value(atom(), map()) -> integer() | undefined.
part_value(binary, L) -> get({memory, binary}, L);
part_value(ets, L) -> get({memory, ets}, L);
part_value(processes, L) -> get({memory, processes}, L);
part_value(code, L) -> get({memory, code}, L);
part_value(atom, L) -> get({memory, atom}, L);
part_value(erts_other, L) ->
    sub(get({memory, system}, L),
        add([get({memory, K}, L) || K <- [binary, ets, code, atom]]));
part_value(erts_free, L) ->
    Allocated = [V || {{allocated, _}, V} <- maps:to_list(L)],
    Used = [V || {{used, _}, V} <- maps:to_list(L)],
    case Allocated of
        [] -> undefined;
        _ -> sub(add(Allocated), add(Used))
    end;
part_value(native, L) -> get(native, L);
part_value(mapped_sites, L) -> get(mapped_sites, L);
part_value(libc_in_use, L) ->
    case maps:get(native, L, undefined) of
        undefined -> get({libc, in_use}, L);
        %% The tracker's live bytes are malloc'ed: in libc's in-use bytes.
        Native -> sub(get({libc, in_use}, L), Native)
    end;
part_value(libc_free, L) -> get({libc, free}, L);
part_value(libc_mmap, L) -> get({libc, mmap}, L);
part_value(rss, L) -> get(rss, L).

get(K, L) ->
    case maps:get(K, L, undefined) of
        V when is_integer(V) -> V;
        _ -> undefined
    end.

add(Vs) ->
    case lists:all(fun is_integer/1, Vs) of
        true -> lists:sum(Vs);
        false -> undefined
    end.

sub(A, B) when is_integer(A), is_integer(B) -> A - B;
sub(_, _) -> undefined.

%% @doc How a sentence names a part.
-spec part_label(atom()) -> string().
part_label(binary) -> "refc binaries";
part_label(ets) -> "ETS tables";
part_label(processes) -> "process memory (heaps, stacks, queues)";
part_label(native) -> "native memory (tracker's live blocks)";
part_label(mapped_sites) -> "memory mapped by native call sites";
part_label(libc_in_use) -> "libc's memory in use";
part_label(libc_free) -> "free memory in libc's arenas";
part_label(libc_mmap) -> "libc's mmapped blocks";
part_label(erts_free) -> "free space in ERTS's carriers";
part_label(code) -> "loaded code";
part_label(atom) -> "the atom table";
part_label(erts_other) -> "ERTS's other system memory";
part_label(rss) -> "RSS".

%% @doc A layer's name in JSON, on the page and in `/metrics' labels.
-spec layer_name(term()) -> binary().
layer_name({smaps, K}) -> <<"smaps_", (atom_to_binary(K))/binary>>;
layer_name({memory, K}) -> <<"erts_", (atom_to_binary(K))/binary>>;
layer_name({allocated, A}) -> <<"alloc_", (atom_to_binary(A))/binary, "_allocated">>;
layer_name({used, A}) -> <<"alloc_", (atom_to_binary(A))/binary, "_used">>;
layer_name({libc, K}) -> <<"libc_", (atom_to_binary(K))/binary>>;
layer_name(K) when is_atom(K) -> atom_to_binary(K).

%% @equiv growth(Samples, #{})
-spec growth([map()]) -> map().
growth(Samples) ->
    growth(Samples, #{}).

%% @doc The growth over `Samples' (oldest first, at least two): `span_ms',
%% `samples', `parts' (every part: `part', `first', `last', `delta',
%% `rate' in bytes per second, `growing'), `growing' (the parts that grew
%% beyond the noise, fastest first, each with the `culprits' of the last
%% sample at that part: the free space in ERTS's carriers (libc's arenas)
%% is left out while what ERTS (libc) holds grows, as it follows that
%% growth), `rss' (its delta and rate, and `unexplained'
%% bytes with the smaps kind that grew most when the parts explain less
%% than RSS grew by the noise threshold), `noise_bytes'. `exclude': parts
%% left out (the report leaves `native' to its tracker rule).
-spec growth([map()], map()) -> map().
growth([_, _ | _] = Samples, Opts) ->
    Exclude = maps:get(exclude, Opts, []),
    First = hd(Samples),
    Last = lists:last(Samples),
    SpanMs = max(1, maps:get(t, Last) - maps:get(t, First)),
    Rows = [row(P, [part_value(P, maps:get(layers, S)) || S <- Samples], SpanMs)
            || P <- parts() -- Exclude],
    Culprits = maps:get(culprits, Last, #{}),
    Grew = [P || #{part := P, growing := true} <- Rows],
    Growing = lists:sort(fun(#{rate := A}, #{rate := B}) -> A >= B end,
                         [R#{culprits => [C || C <- maps:get(P, Culprits, []), grew(C)]}
                          || #{part := P, growing := true} = R <- Rows,
                             not follows(P, Grew)]),
    Rss = row(rss, [part_value(rss, maps:get(layers, S)) || S <- Samples], SpanMs),
    #{span_ms => SpanMs, samples => length(Samples), parts => Rows, growing => Growing,
      rss => unexplained(Rss, Rows, First, Last), noise_bytes => ?NOISE_BYTES};
growth(_, _) ->
    #{span_ms => 0, samples => 0, parts => [], growing => [], rss => none,
      noise_bytes => ?NOISE_BYTES}.

%% Free space that follows what uses it: carriers and arenas grow ahead of
%% their blocks, so while what ERTS (or libc) holds grows, the free space
%% in its carriers (arenas) growing is that growth, not another one.
follows(erts_free, Grew) ->
    lists:any(fun(P) -> lists:member(P, Grew) end,
              [binary, ets, processes, code, atom, erts_other]);
follows(libc_free, Grew) ->
    lists:member(libc_in_use, Grew) orelse lists:member(native, Grew);
follows(_, _) ->
    false.

%% A culprit ranked by growth that did not grow holds none of it.
grew(#{delta := D}) -> D > 0;
grew(_) -> true.

row(Part, Values, SpanMs) ->
    case lists:all(fun is_integer/1, Values) of
        false ->
            #{part => Part, first => undefined, last => undefined, delta => undefined,
              rate => 0, growing => false};
        true ->
            Delta = lists:last(Values) - hd(Values),
            #{part => Part, first => hd(Values), last => lists:last(Values), delta => Delta,
              rate => Delta * 1000 div SpanMs,
              growing => Delta >= noise(Part) andalso rose(Values, noise(Part))}
    end.

%% Values rose, not just moved: no fall of Noise between two samples (a
%% heap that grows and is collected is not a leak), or, over six samples
%% or more, a last third entirely above the first by Noise. The second
%% form is for a part that keeps growing through its collections: a
%% process whose live heap grows 1 MB/s on OTP 27 falls by more than 1 MiB
%% at some collections, and the first form alone never named it (the
%% watch suite's heap, over 300 samples). A collected heap that does not
%% keep its growth has a trough in its last third below the peaks of its
%% first.
rose(Values, Noise) ->
    Steps = lists:zipwith(fun(A, B) -> B - A end, lists:droplast(Values), tl(Values)),
    lists:all(fun(S) -> S > -Noise end, Steps) orelse separated(Values, Noise).

separated(Values, Noise) when length(Values) >= 6 ->
    K = length(Values) div 3,
    lists:min(lists:nthtail(length(Values) - K, Values))
        - lists:max(lists:sublist(Values, K)) >= Noise;
separated(_, _) ->
    false.

%% RSS that grew beyond what the parts explain (their positive deltas),
%% by the noise threshold: the kind of mapping that grew most says where.
unexplained(#{delta := D} = Rss, Rows, First, Last) when is_integer(D) ->
    Explained = lists:sum([max(0, Dp) || #{delta := Dp} <- Rows, is_integer(Dp)]),
    Kinds = [{get(K, maps:get(layers, Last)), get(K, maps:get(layers, First)), K}
             || {{smaps, _} = K, _} <- maps:to_list(maps:get(layers, Last))],
    ByKind = lists:reverse(lists:sort([{B - A, K} || {B, A, K} <- Kinds, is_integer(A),
                                                     is_integer(B)])),
    Unexplained = D - Explained,
    Rss#{unexplained => Unexplained,
         %% What the layers leave out must be noise-sized and a quarter
         %% of the growth at least: carriers and pages follow their
         %% blocks by a few MiB.
         growing => maps:get(growing, Rss) andalso Unexplained >= ?NOISE_BYTES
             andalso Unexplained * 4 >= D,
         kinds => [#{kind => K, delta => Dk} || {Dk, {smaps, K}} <- lists:sublist(ByKind, 3)]};
unexplained(Rss, _, _, _) ->
    Rss#{unexplained => undefined, growing => false, kinds => []}.

%% @doc The growth verdicts, `{RankBytes, Sentence}', fastest first: one
%% per part that grew beyond the noise, then RSS when the parts leave at
%% least the noise and a quarter of its growth unexplained. RankBytes is
%% the growth over an hour at that rate (RSS: its unexplained growth),
%% what the report ranks verdicts by. `[]' when nothing grew: an idle node gets no
%% growth verdict.
-spec verdicts(map()) -> [{non_neg_integer(), binary()}].
verdicts(#{growing := Growing, span_ms := Span} = G) ->
    Parts = [{Rate * 3600, part_sentence(R, Span)} || #{rate := Rate} = R <- Growing],
    Rss = case G of
              #{rss := #{growing := true, unexplained := U} = R} ->
                  [{U * 1000 div max(1, Span) * 3600, rss_sentence(R, Span)}];
              _ -> []
          end,
    Parts ++ Rss;
verdicts(_) ->
    [].

%% @doc The sentences of {@link verdicts/1}, fastest first.
-spec sentences(map()) -> [binary()].
sentences(G) ->
    [S || {_, S} <- verdicts(G)].

part_sentence(#{part := P, delta := D, rate := Rate, culprits := Cs}, Span) ->
    Head = io_lib:format("~ts grew ~ts/s (+~ts over ~ts)",
                         [part_label(P), bytes(Rate), bytes(D), age(Span)]),
    fmt("~ts~ts", [Head, culprit_text(P, D, Cs)]).

rss_sentence(#{rate := Rate, delta := D, unexplained := U, kinds := Kinds}, Span) ->
    Where = case Kinds of
                [#{kind := K, delta := Dk} | _] when Dk > 0 ->
                    io_lib:format("; by mapping, ~ts grew most (+~ts)", [kind_label(K), bytes(Dk)]);
                _ -> ""
            end,
    fmt("RSS grew ~ts/s (+~ts over ~ts), ~ts of it beyond what the layers explain~ts",
        [bytes(Rate), bytes(D), age(Span), bytes(U), Where]).

kind_label(main_heap) -> "the glibc main heap";
kind_label(arenas) -> "glibc's arenas";
kind_label(anon) -> "anonymous memory (ERTS carriers, libc mmapped blocks, mmap by NIFs)";
kind_label(noreserve) -> "MAP_NORESERVE memory";
kind_label(jit) -> "JIT code";
kind_label(stacks) -> "thread stacks";
kind_label(files) -> "file mappings";
kind_label(special) -> "vdso and other shared mappings";
kind_label(K) -> atom_to_list(K).

%% Who holds the growth: the first culprit of the part, its share of the
%% growth when the culprits were ranked by growth (`delta'), else of the
%% part now.
culprit_text(binary, D, [#{pid := Pid, bytes := B} = C | _]) ->
    io_lib:format("; ~ts ~ts~ts~ts, which references ~ts of binaries ~ts",
                  [share_text(C, D), Pid, name_text(C), queue_text(C), bytes(B), when_text(C)]);
culprit_text(processes, D, [#{pid := Pid, bytes := B} = C | _]) ->
    io_lib:format("; ~ts ~ts~ts~ts, ~ts ~ts: mallocinfo_process:print(~ts) shows what is on "
                  "its heap",
                  [share_text(C, D), Pid, name_text(C), queue_text(C), bytes(B), when_text(C),
                   Pid]);
culprit_text(ets, D, [#{table := T, bytes := B, owner := O} = C | _]) ->
    Objects = case C of
                  #{objects := N} when is_integer(N) -> io_lib:format(" in ~ts objects", [count(N)]);
                  _ -> ""
              end,
    io_lib:format("; ~ts table ~ts (owner ~ts~ts), ~ts~ts ~ts",
                  [share_text(C, D), T, O, name_text(C#{name => maps:get(owner_name, C, <<>>)}),
                   bytes(B), Objects, when_text(C)]);
culprit_text(P, _D, [#{function := F, object := O, bytes := B} | _])
  when P =:= native; P =:= mapped_sites ->
    Fn = case F of undefined -> "an unnamed function"; _ -> F end,
    io_lib:format("; the largest call site: ~ts (~ts) with ~ts", [Fn, O, bytes(B)]);
culprit_text(libc_in_use, _, _) ->
    "; mallocinfo_trace:attach() (or the tracker preloaded) names the native call sites";
culprit_text(libc_free, _, _) ->
    ": libc's fragmentation is growing; mallocinfo:trim() returns what it can";
culprit_text(erts_free, _, _) ->
    ": ERTS's carriers are emptying without being released";
culprit_text(_, _, _) ->
    "".

%% "96% of that growth is held by" (by growth) or "the largest holder
%% is" (by size).
share_text(#{delta := Dc} = C, D0) when is_integer(Dc) ->
    %% The sampler's culprits grew since its previous search: their share
    %% is of the part's growth over that span.
    case maps:get(part_delta, C, D0) of
        D when is_integer(D), D > 0 ->
            io_lib:format("~b% of that growth is held by", [max(0, min(100, Dc * 100 div D))]);
        _ ->
            "the largest holder is"
    end;
share_text(_, _) ->
    "the largest holder is".

%% When the culprit was found: the sampler searches a layer at most once
%% a minute, so its culprits may be older than the growth.
when_text(#{searched_ago_ms := Ms}) when is_integer(Ms), Ms >= 1000 ->
    io_lib:format("~ts ago", [age(Ms)]);
when_text(_) ->
    "now".

name_text(#{name := N}) when is_binary(N), N =/= <<>> -> [" (", N, ")"];
name_text(_) -> "".

queue_text(#{message_queue_len := Q}) when is_integer(Q) ->
    io_lib:format(" (message queue ~ts)", [count(Q)]);
queue_text(_) ->
    "".

%%% The resident set by layer, for the timeline's stacked chart -----------

%% @doc RSS in parts that add up to what the mappings hold, for a stacked
%% chart: the smaps kinds, the anonymous memory split as section 1 of the
%% report estimates it (libc's mmapped blocks, then ERTS up to its
%% carriers, then the rest). `[{Label, Bytes}]' in stacking order, `[]'
%% without the smaps kinds.
-spec rss_parts(map()) -> [{binary(), non_neg_integer()}].
rss_parts(L) ->
    case get({smaps, anon}, L) of
        undefined ->
            [];
        Anon ->
            Mmap = min(Anon, max(0, default(get({libc, mmap}, L)))),
            Erts = min(Anon - Mmap, max(0, default(add([V || {{allocated, _}, V}
                                                                <- maps:to_list(L)])))),
            Kind = fun(K) -> max(0, default(get({smaps, K}, L))) end,
            lists:zip(stacked_labels(),
                      [Erts, Kind(main_heap) + Kind(arenas), Mmap, Anon - Mmap - Erts,
                       Kind(noreserve), Kind(jit), Kind(stacks), Kind(files) + Kind(special)])
    end.

%% @doc The labels of rss_parts/1, bottom to top.
-spec stacked_labels() -> [binary()].
stacked_labels() ->
    [<<"ERTS carriers (est.)">>, <<"glibc heaps">>, <<"libc mmapped blocks">>,
     <<"other anonymous">>, <<"MAP_NORESERVE">>, <<"JIT code">>, <<"thread stacks">>,
     <<"files, vdso">>].

default(undefined) -> 0;
default(V) -> V.

fmt(Format, Args) ->
    unicode:characters_to_binary(io_lib:format(Format, Args)).

bytes(B) -> mallocinfo_units:bytes(B).
count(N) -> mallocinfo_units:count(N).
age(Ms) -> mallocinfo_units:age(Ms).
