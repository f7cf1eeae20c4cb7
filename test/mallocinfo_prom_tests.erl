%% mallocinfo_prom: the exposition text read back by a strict parser of the
%% format (mi_prom_parse), families from canned readings, refusals; and the
%% parser's own strictness, so a passing test means something.
-module(mallocinfo_prom_tests).
-include_lib("eunit/include/eunit.hrl").

text(Families) -> iolist_to_binary(mallocinfo_prom:render(Families)).

parse(Families) -> mi_prom_parse:parse(text(Families)).

exact_text_test() ->
    ?assertEqual(<<"# HELP mallocinfo_x_bytes Some bytes\n"
                   "# TYPE mallocinfo_x_bytes gauge\n"
                   "mallocinfo_x_bytes 42\n"
                   "# HELP mallocinfo_calls_total Calls\n"
                   "# TYPE mallocinfo_calls_total counter\n"
                   "mallocinfo_calls_total{function=\"malloc\"} 7\n"
                   "mallocinfo_calls_total{function=\"free\",kind=\"x\"} 1.5\n">>,
                 text([#{name => <<"mallocinfo_x_bytes">>, type => gauge, help => <<"Some bytes">>,
                         samples => [{[], 42}]},
                       #{name => <<"mallocinfo_calls_total">>, type => counter, help => <<"Calls">>,
                         samples => [{[{function, malloc}], 7},
                                     {[{<<"function">>, <<"free">>}, {kind, x}], 1.5}]}])).

escapes_round_trip_test() ->
    Nasty = <<"a\\b\"c\nd ", 16#e9/utf8, " {x=\"y\"} # HELP">>,
    [F] = parse([#{name => <<"m:sub_total">>, type => untyped,
                   help => <<"line one\nline two \\ with \"quotes\"">>,
                   samples => [{[{l, Nasty}, {n, 12}], nan},
                               {[{l, <<>>}], infinity},
                               {[{l, <<"\\n">>}], neg_infinity},
                               {[{l, <<"big">>}], 1.0e300},
                               {[{l, <<"neg">>}], -3}]}]),
    ?assertMatch(#{name := <<"m:sub_total">>, type := untyped,
                   help := <<"line one\nline two \\ with \"quotes\"">>}, F),
    ?assertEqual([{#{<<"l">> => Nasty, <<"n">> => <<"12">>}, nan},
                  {#{<<"l">> => <<>>}, infinity},
                  {#{<<"l">> => <<"\\n">>}, neg_infinity},
                  {#{<<"l">> => <<"big">>}, 1.0e300},
                  {#{<<"l">> => <<"neg">>}, -3}],
                 [{L, V} || #{labels := L, value := V} <- maps:get(samples, F)]).

render_refuses_test_() ->
    Fam = fun(Over) -> maps:merge(#{name => <<"ok_name">>, type => gauge, help => <<"h">>,
                                    samples => [{[], 1}]}, Over) end,
    Bad = [[Fam(#{name => <<"1starts_with_digit">>})],
           [Fam(#{name => <<"has-dash">>})],
           [Fam(#{name => <<>>})],
           [Fam(#{name => ok_name})],
           [Fam(#{type => histogram})],
           [Fam(#{help => <<255>>})],
           [Fam(#{samples => [{[{'__reserved', a}], 1}]})],
           [Fam(#{samples => [{[{<<"has:colon">>, a}], 1}]})],
           [Fam(#{samples => [{[{a, 1}, {a, 2}], 1}]})],
           [Fam(#{samples => [{[{a, <<16#c3>>}], 1}]})],
           [Fam(#{samples => [{[], <<"1">>}]})],
           [Fam(#{samples => [{[], undefined}]})],
           [Fam(#{}), Fam(#{})],
           not_a_list],
    [?_assertError(badarg, mallocinfo_prom:render(B)) || B <- Bad].

sources() ->
    #{allocator => glibc,
      rss => 52428800,
      mallinfo => #{arena => 10825728, ordblks => 362, smblks => 247, hblks => 9,
                    hblkhd => 4509696, usmblks => 0, fsmblks => 13488, uordblks => 3959632,
                    fordblks => 6866096, keepcost => 1152},
      heaps => #{heaps => [#{nr => 0, system => #{current => 2551808, max => 2551808},
                             in_use_bytes => 1724832, free_bytes => 826976},
                           #{nr => 1, system => #{current => 135168, max => 135168},
                             in_use_bytes => 100000, free_bytes => 35168}]},
      tracker => #{preloaded => true, recording => true, mode => sample,
                   calls => #{malloc => 100, free => 90, calloc => 3},
                   bytes_allocated => 123456, bytes_freed => 23456, live_bytes => 100000,
                   live_entries => 10, dropped => 0, frees_untracked => 2, stacks => 5,
                   table_capacity => 2097152},
      jemalloc => #{allocated => 1, active => 2, resident => 3, mapped => 4,
                    retained => 5, metadata => 6}}.

values(Fams) ->
    maps:from_list([{{N, L}, V} || #{samples := S} <- Fams,
                                  #{name := N, labels := L, value := V} <- S]).

families_from_readings_test() ->
    Fams = mi_prom_parse:parse(mallocinfo_prom:render(mallocinfo_prom:families(sources()))),
    Names = [N || #{name := N} <- Fams],
    [?assertMatch(<<"mallocinfo_", _/binary>>, N) || N <- Names],
    [?assertNotEqual(undefined, H) || #{help := H} <- Fams],
    %% Counters end in _total, and only counters do.
    [?assertEqual(T =:= counter, binary:longest_common_suffix([N, <<"_total">>]) =:= 6)
     || #{name := N, type := T} <- Fams],
    V = values(Fams),
    ?assertEqual(1, maps:get({<<"mallocinfo_allocator_info">>, #{<<"allocator">> => <<"glibc">>}}, V)),
    ?assertEqual(52428800, maps:get({<<"mallocinfo_resident_bytes">>, #{}}, V)),
    ?assertEqual(3959632, maps:get({<<"mallocinfo_mallinfo_in_use_bytes">>, #{}}, V)),
    ?assertEqual(1152, maps:get({<<"mallocinfo_mallinfo_releasable_bytes">>, #{}}, V)),
    ?assertEqual(135168, maps:get({<<"mallocinfo_arena_system_bytes">>, #{<<"arena">> => <<"1">>}}, V)),
    ?assertEqual(1724832, maps:get({<<"mallocinfo_arena_in_use_bytes">>, #{<<"arena">> => <<"0">>}}, V)),
    ?assertEqual(35168, maps:get({<<"mallocinfo_arena_free_bytes">>, #{<<"arena">> => <<"1">>}}, V)),
    ?assertEqual(100, maps:get({<<"mallocinfo_tracker_calls_total">>, #{<<"function">> => <<"malloc">>}}, V)),
    ?assertEqual(100000, maps:get({<<"mallocinfo_tracker_live_bytes">>, #{}}, V)),
    ?assertEqual(10, maps:get({<<"mallocinfo_tracker_live_blocks">>, #{}}, V)),
    ?assertEqual(123456, maps:get({<<"mallocinfo_tracker_allocated_bytes_total">>, #{}}, V)),
    ?assertEqual(1, maps:get({<<"mallocinfo_tracker_mode">>, #{<<"mode">> => <<"sample">>}}, V)),
    ?assertEqual(0, maps:get({<<"mallocinfo_tracker_mode">>, #{<<"mode">> => <<"full">>}}, V)),
    ?assertEqual(6, maps:get({<<"mallocinfo_jemalloc_metadata_bytes">>, #{}}, V)),
    ?assertEqual(3, maps:get({<<"mallocinfo_jemalloc_resident_bytes">>, #{}}, V)),
    %% usmblks is always 0 in glibc: not exported.
    ?assertEqual([], [N || N <- Names, binary:match(N, <<"usmblks">>) =/= nomatch]).

%% The layers: one bytes family labelled as /timeline.json names them,
%% the mappings' count apart, unread layers left out, and when they were
%% read with their source.
families_layers_test() ->
    Layers = #{source => watch, time => 1700000000500,
               values => #{rss => 100, mappings => 7, {smaps, anon} => 40,
                           {memory, binary} => 30, {allocated, binary_alloc} => 20,
                           {used, binary_alloc} => 10, {libc, in_use} => 5, native => undefined}},
    Fams = mi_prom_parse:parse(mallocinfo_prom:render(mallocinfo_prom:families(
                                                        #{layers => Layers}))),
    ?assertEqual([<<"mallocinfo_layer_bytes">>, <<"mallocinfo_layer_mappings">>,
                  <<"mallocinfo_layer_sample_time_seconds">>], [N || #{name := N} <- Fams]),
    [?assertEqual(gauge, T) || #{type := T} <- Fams],
    V = values(Fams),
    Bytes = fun(L) -> maps:get({<<"mallocinfo_layer_bytes">>, #{<<"layer">> => L}}, V, none) end,
    ?assertEqual([100, 40, 30, 20, 10, 5, none, none],
                 [Bytes(L) || L <- [<<"rss">>, <<"smaps_anon">>, <<"erts_binary">>,
                                    <<"alloc_binary_alloc_allocated">>,
                                    <<"alloc_binary_alloc_used">>, <<"libc_in_use">>,
                                    <<"native">>, <<"mappings">>]]),
    ?assertEqual(6, length([K || {<<"mallocinfo_layer_bytes">>, _} = K <- maps:keys(V)])),
    ?assertEqual(7, maps:get({<<"mallocinfo_layer_mappings">>, #{}}, V)),
    ?assertEqual(1700000000.5, maps:get({<<"mallocinfo_layer_sample_time_seconds">>,
                                         #{<<"source">> => <<"watch">>}}, V)).

%% This node's scrape has the layers, read for the scrape (no sampler).
metrics_has_layers_test() ->
    V = values(mi_prom_parse:parse(iolist_to_binary(mallocinfo_prom:metrics()))),
    Rss = maps:get({<<"mallocinfo_layer_bytes">>, #{<<"layer">> => <<"rss">>}}, V),
    ?assert(Rss > 0),
    ?assert(maps:get({<<"mallocinfo_layer_bytes">>, #{<<"layer">> => <<"erts_total">>}}, V) > 0),
    ?assert(maps:is_key({<<"mallocinfo_layer_sample_time_seconds">>,
                         #{<<"source">> => <<"scrape">>}}, V)).

%% Only what is there: no tracker, no glibc, no jemalloc families.
families_absent_sources_test() ->
    Fams = mallocinfo_prom:families(#{allocator => tcmalloc, rss => undefined,
                                      tracker => #{preloaded => false}}),
    ?assertEqual([<<"mallocinfo_allocator_info">>], [N || #{name := N} <- Fams]),
    ?assertEqual([], mallocinfo_prom:families(#{})).

%% The parser refuses what a scraper refuses.
parser_is_strict_test_() ->
    Bad = [<<"m 1">>,                                                 % no final line feed
           <<"m 1\nm 2\n">>,                                          % duplicate sample
           <<"m 1\n# TYPE m gauge\n">>,                               % TYPE after samples
           <<"# TYPE m gauge\n# TYPE m gauge\nm 1\n">>,               % second TYPE
           <<"# HELP m a\n# HELP m b\nm 1\n">>,                       % second HELP
           <<"# TYPE m gauges\nm 1\n">>,                              % unknown type
           <<"a 1\nb 1\na{x=\"1\"} 2\n">>,                            % family not contiguous
           <<"m{x=\"1\",x=\"2\"} 1\n">>,                              % repeated label
           <<"m{x=\"a\\tb\"} 1\n">>,                                  % bad escape
           <<"m{x=\"a} 1\n">>,                                        % unterminated
           <<"m{x=1} 1\n">>,                                          % unquoted
           <<"m{1x=\"a\"} 1\n">>,                                     % bad label name
           <<"1m 1\n">>,                                              % bad metric name
           <<"m 1x\n">>, <<"m .\n">>, <<"m 1e\n">>, <<"m nan\n">>,    % bad values
           <<"m\n">>,                                                 % no value
           <<"m 1 2 3\n">>,                                           % trailing text
           <<"m 1 1.5\n">>,                                           % bad timestamp
           <<"# HELP m a\\tb\nm 1\n">>],                              % bad help escape
    [?_assertError({prom, _, _}, mi_prom_parse:parse(B)) || B <- Bad].

parser_accepts_test() ->
    [#{name := <<"m">>, type := gauge, help := <<"h">>, samples := [S1, S2]},
     #{name := <<"h">>, type := histogram, samples := HS}] =
        mi_prom_parse:parse(<<"# a comment\n\n# HELP m h\n# TYPE m gauge\n"
                              "m{a=\"1\",} 1.5e3 1700000000000\n  m { b = \"2\" } -Inf\n"
                              "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 2\nh_count 1\n">>),
    ?assertMatch(#{labels := #{<<"a">> := <<"1">>}, value := 1500.0}, S1),
    ?assertMatch(#{labels := #{<<"b">> := <<"2">>}, value := neg_infinity}, S2),
    ?assertEqual([<<"h_bucket">>, <<"h_sum">>, <<"h_count">>], [N || #{name := N} <- HS]).
