%% @doc Prometheus text exposition (format 0.0.4) of everything mallocinfo
%% can measure, for `/metrics' of {@link mallocinfo_http}.
%%
%% Three layers, so the formatting is tested on canned data:
%% <ul>
%% <li>{@link collect/0} reads the node (NIF calls; each source that does
%%     not apply to the active allocator is left out);</li>
%% <li>{@link families/1} turns those readings into metric families (pure);</li>
%% <li>{@link render/1} writes families as exposition text (pure).</li>
%% </ul>
%% Every metric name starts with `mallocinfo_'. Which families appear:
%% `mallocinfo_allocator_info' and `mallocinfo_resident_bytes' always;
%% `mallocinfo_mallinfo_*' and `mallocinfo_arena_*' (label `arena') when
%% glibc is the allocator; `mallocinfo_tracker_*' when the interposer is
%% preloaded; `mallocinfo_jemalloc_*' when jemalloc is the allocator;
%% `mallocinfo_layer_bytes' (label `layer'), `mallocinfo_layer_mappings'
%% and `mallocinfo_layer_sample_time_seconds' (label `source') always: every
%% layer of `mallocinfo_layers', named as `/timeline.json' names them, from
%% the sampler's newest sample when `mallocinfo:watch/0' runs, else read
%% for the scrape.
-module(mallocinfo_prom).

-export([metrics/0, collect/0, families/1, render/1]).

-export_type([family/0, sample/0, value/0, sources/0]).

-type value() :: number() | nan | infinity | neg_infinity.
-type label() :: {Name :: atom() | binary(), Value :: atom() | binary() | integer()}.
-type sample() :: {[label()], value()}.
-type family() :: #{name := binary(),
                    type := counter | gauge | untyped,
                    help := binary(),
                    samples := [sample()]}.
-type sources() :: #{allocator => atom(),
                     rss => non_neg_integer() | undefined,
                     mallinfo => map(),
                     heaps => map(),
                     tracker => map(),
                     jemalloc => map(),
                     layers => #{source := watch | scrape, time := integer(),
                                 values := #{term() => integer() | undefined}}}.

-define(PREFIX, "mallocinfo_").

%% @doc The exposition text for this node: `render(families(collect()))'.
-spec metrics() -> iodata().
metrics() ->
    render(families(collect())).

%% @doc Reads what applies to this node. glibc's figures only under glibc
%% (under another allocator they describe an almost empty heap nobody
%% uses), the tracker only when preloaded, jemalloc's summary only under
%% jemalloc. A source that fails (`heaps' without xmerl, say) is left out
%% rather than failing the scrape.
-spec collect() -> sources().
collect() ->
    Allocator = mallocinfo_glibc:allocator(),
    Base = #{allocator => Allocator, rss => mallocinfo_glibc:rss()},
    Glibc = case Allocator of
                glibc -> ok_sources([{mallinfo, fun mallocinfo_glibc:mallinfo/0},
                                     {heaps, fun mallocinfo_glibc:heaps/0}]);
                _ -> #{}
            end,
    Tracker = case mallocinfo_trace:status() of
                  #{preloaded := true} = Status -> #{tracker => Status};
                  %% Attached at run time (mallocinfo_trace:attach/0).
                  #{attached_at := At} = Status when is_integer(At) -> #{tracker => Status};
                  #{} -> #{}
              end,
    Jemalloc = case Allocator of
                   jemalloc -> ok_sources([{jemalloc, fun mallocinfo_jemalloc:summary/0}]);
                   _ -> #{}
               end,
    maps:merge(maps:merge(Base#{layers => layers()}, Glibc), maps:merge(Tracker, Jemalloc)).

%% The sampler's newest sample when it runs (its mappings carried from
%% the last minute's read: mallocinfo_watch:latest_layers/0), so a scrape
%% costs it nothing; else the layers read now, mappings included.
layers() ->
    {Source, #{time := Time, layers := L}} =
        case mallocinfo_watch:latest_layers() of
            {ok, Sample} -> {watch, Sample};
            {error, _} -> {scrape, mallocinfo_layers:sample()}
        end,
    #{source => Source, time => Time, values => L}.

ok_sources(Readers) ->
    maps:from_list([{Key, V} || {Key, Read} <- Readers, {ok, V} <- [Read()]]).

%% @doc Metric families from readings (see {@link collect/0}); keys that
%% are absent give no families. Families with no samples are left out.
%% Raises `badarg' for anything but a map of the keys collect/0 makes, each
%% with a value of its type.
-spec families(sources()) -> [family()].
families(Sources) ->
    sources(Sources) orelse erlang:error(badarg, [Sources]),
    %% Inside each source, what collect/0 would not produce (a list where a
    %% map belongs, say) is a wrong argument too.
    Fams = try
               allocator(Sources) ++ rss(Sources) ++ mallinfo(Sources) ++ arenas(Sources)
                   ++ tracker(Sources) ++ jemalloc(Sources) ++ layers(Sources)
           catch
               error:_ -> erlang:error(badarg, [Sources])
           end,
    [F || #{samples := [_ | _]} = F <- Fams].

%% The keys collect/0 may produce, each with a value of its type: another
%% key or a value of the wrong type is a wrong argument, not a source to
%% leave out silently.
sources(#{} = S) ->
    lists:all(fun({allocator, A}) -> is_atom(A);
                 ({rss, R}) -> R =:= undefined orelse (is_integer(R) andalso R >= 0);
                 ({layers, #{source := Src, time := T, values := #{} = L} = M})
                    when map_size(M) =:= 3 ->
                      (Src =:= watch orelse Src =:= scrape) andalso is_integer(T)
                          andalso lists:all(fun layer_value/1, maps:to_list(L));
                 ({K, M}) -> lists:member(K, [mallinfo, heaps, tracker, jemalloc]) andalso is_map(M)
              end, maps:to_list(S));
sources(_) ->
    false.

%% A key of mallocinfo_layers:keys/0 and its value.
layer_value({K, V}) ->
    (lists:member(K, [rss, mappings, native, mapped_sites])
     orelse is_tuple(K) andalso tuple_size(K) =:= 2
     andalso lists:member(element(1, K), [smaps, memory, allocated, used, libc])
     andalso is_atom(element(2, K)))
        andalso (V =:= undefined orelse is_integer(V) andalso V >= 0).

allocator(#{allocator := A}) ->
    [gauge(<<"allocator_info">>,
           <<"The allocator serving malloc in this process (glibc, jemalloc, tcmalloc, mimalloc or unknown); always 1">>,
           [{[{allocator, A}], 1}])];
allocator(#{}) ->
    [].

rss(#{rss := Rss}) when is_integer(Rss) ->
    [gauge(<<"resident_bytes">>, <<"Resident set size of the process (/proc/self/statm)">>,
           [{[], Rss}])];
rss(#{}) ->
    [].

mallinfo(#{mallinfo := M}) ->
    Fields = [{arena, <<"mallinfo_arena_bytes">>,
               <<"glibc mallinfo2 arena: bytes the arenas got from the system (brk and arena mmaps), mmapped blocks excluded">>},
              {ordblks, <<"mallinfo_free_chunks">>,
               <<"glibc mallinfo2 ordblks: free chunks outside the fastbins">>},
              {smblks, <<"mallinfo_fastbin_chunks">>,
               <<"glibc mallinfo2 smblks: free chunks in fastbins">>},
              {hblks, <<"mallinfo_mmap_chunks">>,
               <<"glibc mallinfo2 hblks: blocks allocated with their own mmap">>},
              {hblkhd, <<"mallinfo_mmap_bytes">>,
               <<"glibc mallinfo2 hblkhd: bytes in blocks allocated with their own mmap">>},
              {fsmblks, <<"mallinfo_fastbin_free_bytes">>,
               <<"glibc mallinfo2 fsmblks: bytes in free fastbin chunks">>},
              {uordblks, <<"mallinfo_in_use_bytes">>,
               <<"glibc mallinfo2 uordblks: bytes in chunks in use, mmapped blocks excluded">>},
              {fordblks, <<"mallinfo_free_bytes">>,
               <<"glibc mallinfo2 fordblks: bytes in free chunks">>},
              {keepcost, <<"mallinfo_releasable_bytes">>,
               <<"glibc mallinfo2 keepcost: free bytes at the top of the main heap that malloc_trim could release">>}],
    [gauge(Name, Help, [{[], V}]) || {Key, Name, Help} <- Fields, #{Key := V} <- [M]];
mallinfo(#{}) ->
    [].

arenas(#{heaps := #{heaps := Heaps}}) ->
    Per = fun(Get) -> [{[{arena, Nr}], V} || #{nr := Nr} = H <- Heaps, V <- [Get(H)],
                                              is_integer(Nr), is_integer(V)]
          end,
    [gauge(<<"arena_system_bytes">>,
           <<"Bytes an arena got from the system (malloc_info system current)">>,
           Per(fun(#{system := S}) -> maps:get(current, S, undefined) end)),
     gauge(<<"arena_in_use_bytes">>,
           <<"Bytes of an arena in use: system current minus free chunks (malloc_info)">>,
           Per(fun(#{in_use_bytes := V}) -> V end)),
     gauge(<<"arena_free_bytes">>,
           <<"Bytes of an arena in free chunks, fastbins included (malloc_info)">>,
           Per(fun(#{free_bytes := V}) -> V end))];
arenas(#{}) ->
    [].

tracker(#{tracker := #{preloaded := Pre} = T}) when Pre;
                                                   is_integer(map_get(attached_at, T)) ->
    Mode = maps:get(mode, T, off),
    Opt = fun(Key, Name, Type, Help) ->
                  case T of
                      #{Key := V} when is_integer(V) -> [family(Name, Type, Help, [{[], V}])];
                      #{} -> []
                  end
          end,
    [gauge(<<"tracker_recording">>,
           <<"1 when the interposer records in this process (the executable matched MALLOCINFO_TRACE_EXE)">>,
           [{[], bool(maps:get(recording, T, false))}]),
     gauge(<<"tracker_mode">>, <<"The tracker's recording mode: 1 for the current one">>,
           [{[{mode, M}], bool(M =:= Mode)} || M <- [full, sample, counters, off]]),
     counter(<<"tracker_calls_total">>, <<"Calls to each interposed allocation function">>,
             [{[{function, F}], N} || {F, N} <- lists:sort(maps:to_list(maps:get(calls, T, #{})))])]
        ++ Opt(bytes_allocated, <<"tracker_allocated_bytes_total">>, counter,
               <<"Bytes allocated while the tracker counted: requested bytes of recorded blocks in "
                 "full mode, usable bytes of every call in counters mode, the sample's unbiased "
                 "estimate in sample mode">>)
        ++ Opt(bytes_freed, <<"tracker_freed_bytes_total">>, counter,
               <<"Bytes freed (or forgotten by a reset), counted as tracker_allocated_bytes_total "
                 "counts them: in full mode allocated minus freed is tracker_live_bytes">>)
        ++ Opt(live_bytes, <<"tracker_live_bytes">>, gauge,
               <<"Bytes of recorded blocks still live (in sample mode, of the sampled blocks only)">>)
        ++ Opt(live_entries, <<"tracker_live_blocks">>, gauge,
               <<"Recorded blocks still live">>)
        ++ Opt(dropped, <<"tracker_dropped_total">>, counter,
               <<"Allocations the live table could not record (a window of the table was full)">>)
        ++ Opt(frees_untracked, <<"tracker_untracked_frees_total">>, counter,
               <<"Frees of blocks the tracker had not recorded">>)
        ++ Opt(stacks, <<"tracker_stacks">>, gauge, <<"Distinct allocation stacks stored">>)
        ++ Opt(table_capacity, <<"tracker_table_capacity_blocks">>, gauge,
               <<"Capacity of the live table">>)
        ++ case T of
               #{self := #{calls := SC, bytes := SB}} ->
                   [counter(<<"tracker_self_allocations_total">>,
                            <<"Allocations mallocinfo's own work made, never recorded as the node's">>,
                            [{[], SC}]),
                    counter(<<"tracker_self_allocated_bytes_total">>,
                            <<"Bytes mallocinfo's own work allocated, never recorded as the node's">>,
                            [{[], SB}])];
               #{} -> []
           end;
tracker(#{}) ->
    [].

jemalloc(#{jemalloc := J}) ->
    Fields = [{allocated, <<"Bytes allocated by the application (jemalloc stats.allocated)">>},
              {active, <<"Bytes in active pages (jemalloc stats.active)">>},
              {resident, <<"Bytes in physically resident data pages mapped by jemalloc (stats.resident)">>},
              {mapped, <<"Bytes in active extents mapped by jemalloc (stats.mapped)">>},
              {retained, <<"Bytes in virtual memory mappings retained rather than returned to the system (stats.retained)">>},
              {metadata, <<"Bytes dedicated to jemalloc metadata (stats.metadata)">>}],
    [gauge(<<"jemalloc_", (atom_to_binary(K))/binary, "_bytes">>, Help, [{[], V}])
     || {K, Help} <- Fields, #{K := V} <- [J]];
jemalloc(#{}) ->
    [].

%% One family for every layer in bytes, labelled as /timeline.json names
%% the layers (`rss', `erts_binary', `smaps_anon', `alloc_binary_alloc_used',
%% `libc_in_use', `native', ...): they overlap (RSS holds the rest), so
%% they are never summed across `layer'. A layer that could not be read is
%% left out of the scrape.
layers(#{layers := #{source := Source, time := Time, values := L}}) ->
    Bytes = lists:sort([{mallocinfo_layers_growth:layer_name(K), V}
                        || {K, V} <- maps:to_list(L), K =/= mappings, is_integer(V)]),
    [gauge(<<"layer_bytes">>,
           <<"Every layer of the node's memory (mallocinfo:watch/0's, named as in /timeline.json); "
             "layers overlap, never sum them">>,
           [{[{layer, N}], V} || {N, V} <- Bytes]),
     gauge(<<"layer_mappings">>, <<"Mappings of the process (/proc/self/smaps)">>,
           [{[], V} || #{mappings := V} <- [L], is_integer(V)]),
     gauge(<<"layer_sample_time_seconds">>,
           <<"When the layers were read (Unix time): source watch is the sampler's newest sample, "
             "scrape a read for this scrape">>,
           [{[{source, Source}], Time / 1000}])];
layers(#{}) ->
    [].

gauge(Name, Help, Samples) -> family(Name, gauge, Help, Samples).
counter(Name, Help, Samples) -> family(Name, counter, Help, Samples).

family(Name, Type, Help, Samples) ->
    #{name => <<?PREFIX, Name/binary>>, type => Type, help => Help, samples => Samples}.

bool(true) -> 1;
bool(_) -> 0.

%% @doc The exposition text of `Families': for each, `# HELP', `# TYPE',
%% then its samples, every line ending in a line feed. Label values and
%% help text are escaped as the format requires. Raises `badarg' for a
%% metric or label name outside the format's grammar, a reserved (`__')
%% label name, a label repeated in one sample, a family name used twice,
%% a help text or label value that is not UTF-8, or a value that is not a
%% number, `nan', `infinity' or `neg_infinity'.
-spec render([family()]) -> iodata().
render(Families) when is_list(Families) ->
    %% length/1 raises badarg on an improper list.
    _ = length(Families),
    try
        check_unique([N || #{name := N} <- Families]),
        [family_text(F) || F <- Families]
    catch
        throw:{?MODULE, bad} -> erlang:error(badarg, [Families])
    end;
render(Families) ->
    erlang:error(badarg, [Families]).

family_text(#{name := Name, type := Type, help := Help, samples := Samples})
  when Type =:= counter; Type =:= gauge; Type =:= untyped ->
    metric_name(Name),
    [<<"# HELP ">>, Name, $\s, escape(utf8(Help), help), $\n,
     <<"# TYPE ">>, Name, $\s, atom_to_binary(Type), $\n
     | [sample_text(Name, Labels, Value) || {Labels, Value} <- Samples]];
family_text(_) ->
    bad().

sample_text(Name, [], Value) ->
    [Name, $\s, number(Value), $\n];
sample_text(Name, Labels, Value) when is_list(Labels) ->
    Pairs = [{label_name(K), escape(utf8(text(V)), label)} || {K, V} <- Labels],
    check_unique([K || {K, _} <- Pairs]),
    Text = lists:join($,, [[K, $=, $", V, $"] || {K, V} <- Pairs]),
    [Name, ${, Text, $}, $\s, number(Value), $\n];
sample_text(_, _, _) ->
    bad().

number(I) when is_integer(I) -> integer_to_binary(I);
number(F) when is_float(F) -> float_to_binary(F, [short]);
number(nan) -> <<"NaN">>;
number(infinity) -> <<"+Inf">>;
number(neg_infinity) -> <<"-Inf">>;
number(_) -> bad().

text(A) when is_atom(A) -> atom_to_binary(A);
text(I) when is_integer(I) -> integer_to_binary(I);
text(B) when is_binary(B) -> B;
text(_) -> bad().

%% [a-zA-Z_:][a-zA-Z0-9_:]*
metric_name(<<C, Rest/binary>>) when C >= $a, C =< $z; C >= $A, C =< $Z; C =:= $_; C =:= $: ->
    name_rest(Rest, true);
metric_name(_) ->
    bad().

%% [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved).
label_name(A) when is_atom(A) ->
    label_name(atom_to_binary(A));
label_name(<<"__", _/binary>>) ->
    bad();
label_name(<<C, Rest/binary>> = Name) when C >= $a, C =< $z; C >= $A, C =< $Z; C =:= $_ ->
    name_rest(Rest, false),
    Name;
label_name(_) ->
    bad().

name_rest(<<>>, _) -> ok;
name_rest(<<C, Rest/binary>>, Colon)
  when C >= $a, C =< $z; C >= $A, C =< $Z; C >= $0, C =< $9; C =:= $_; C =:= $:, Colon ->
    name_rest(Rest, Colon);
name_rest(_, _) -> bad().

utf8(B) when is_binary(B) ->
    case unicode:characters_to_binary(B) of
        B -> B;
        _ -> bad()
    end;
utf8(_) ->
    bad().

%% HELP text escapes backslash and line feed; label values also the double
%% quote. Byte by byte is safe: no UTF-8 continuation byte is ASCII.
escape(B, Kind) ->
    << <<(escape_byte(C, Kind))/binary>> || <<C>> <= B >>.

escape_byte($\\, _) -> <<"\\\\">>;
escape_byte($\n, _) -> <<"\\n">>;
escape_byte($", label) -> <<"\\\"">>;
escape_byte(C, _) -> <<C>>.

check_unique(List) ->
    case length(lists:usort(List)) =:= length(List) of
        true -> ok;
        false -> bad()
    end.

bad() -> throw({?MODULE, bad}).
