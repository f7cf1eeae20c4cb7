%% EUnit for the profile formats, on canned data: protobuf's wire format
%% (known bytes from the protobuf documentation's examples, and every
%% value read back by an independent reader, mi_pprof_decode), a tiny
%% profile.proto byte for byte, and collapsed stacks.
-module(mallocinfo_trace_profile_tests).
-include_lib("eunit/include/eunit.hrl").

-import(mallocinfo_protobuf, [varint/1, uint/2, int/2, bool/2, bytes/2, packed/2]).

b(IoData) -> iolist_to_binary(IoData).

%%% Wire format --------------------------------------------------------------------

varint_known_bytes_test() ->
    ?assertEqual(<<0>>, varint(0)),
    ?assertEqual(<<1>>, varint(1)),
    ?assertEqual(<<127>>, varint(127)),
    ?assertEqual(<<128, 1>>, varint(128)),
    ?assertEqual(<<172, 2>>, varint(300)),
    ?assertEqual(<<255, 127>>, varint(16383)),
    ?assertEqual(<<128, 128, 1>>, varint(16384)),
    ?assertEqual(<<255, 255, 127>>, varint(16#1fffff)),
    ?assertEqual(<<128, 128, 128, 1>>, varint(16#200000)),
    ?assertEqual(<<255, 255, 255, 255, 255, 255, 255, 255, 255, 1>>, varint(1 bsl 64 - 1)),
    %% int64 -1: the 64-bit two's complement, ten bytes.
    ?assertEqual(varint(1 bsl 64 - 1), varint(-1)).

varint_round_trip_test() ->
    Values = [0, 1, 127, 128, 255, 256, 16383, 16384, 16#1fffff, 16#200000, 1 bsl 32,
              1 bsl 35 + 17, 1 bsl 63, 1 bsl 64 - 1]
        ++ [rand:uniform(1 bsl 64) - 1 || _ <- lists:seq(1, 200)],
    [?assertEqual({V, <<>>}, mi_pprof_decode:varint(varint(V))) || V <- Values],
    ?assertEqual(Values, mi_pprof_decode:varints(b(tl(tl(packed(1, Values)))))).

varint_badarg_test() ->
    ?assertError(badarg, varint(1 bsl 64)),
    ?assertError(badarg, varint(-(1 bsl 63) - 1)),
    ?assertError(badarg, varint(1.0)),
    ?assertError(badarg, varint(a)).

%% The examples of protobuf's encoding guide.
fields_known_bytes_test() ->
    ?assertEqual(<<8, 150, 1>>, b(uint(1, 150))),
    ?assertEqual(<<18, 7, "testing">>, b(bytes(2, "testing"))),
    ?assertEqual(<<34, 6, 3, 142, 2, 158, 167, 5>>, b(packed(4, [3, 270, 86942]))),
    ?assertEqual(<<8, 1>>, b(bool(1, true))),
    %% proto3 defaults are not written; strings are (the string table
    %% keeps its empty first entry).
    ?assertEqual(<<>>, b([uint(1, 0), int(2, 0), bool(3, false), packed(4, [])])),
    ?assertEqual(<<50, 0>>, b(bytes(6, <<>>))),
    ?assertEqual(<<16, 255, 255, 255, 255, 255, 255, 255, 255, 255, 1>>, b(int(2, -1))).

nested_decode_test() ->
    Msg = b([uint(1, 7), mallocinfo_protobuf:message(2, [bytes(1, "x"), packed(2, [1, 300])]),
             mallocinfo_protobuf:submessages(3, [uint(1, 1), uint(1, 2)])]),
    [{1, 7}, {2, Inner}, {3, A}, {3, B}] = mi_pprof_decode:fields(Msg),
    ?assertMatch([{1, <<"x">>}, {2, _}], mi_pprof_decode:fields(Inner)),
    [_, {2, P}] = mi_pprof_decode:fields(Inner),
    ?assertEqual([1, 300], mi_pprof_decode:varints(P)),
    ?assertEqual([{1, 1}], mi_pprof_decode:fields(A)),
    ?assertEqual([{1, 2}], mi_pprof_decode:fields(B)).

%%% profile.proto ------------------------------------------------------------------

tiny() ->
    #{sites => [{2, 64, [1]}],
      locations => [{16#1000, <<"/x.so">>, <<"f">>, 16#10}],
      mode => full, sample_bytes => 0,
      maps => <<"1000-2000 r-xp 00000000 00:00 0 /x.so\n">>, exe => <<"/x.so">>,
      time_nanos => 0, duration_nanos => 0, comments => []}.

%% Every byte of a one-sample profile, written out by hand from the schema.
tiny_profile_known_bytes_test() ->
    Expected = <<10, 4, 8, 1, 16, 2,                   % sample_type alloc_objects/count
                 10, 4, 8, 3, 16, 4,                   %   alloc_space/bytes
                 10, 4, 8, 5, 16, 2,                   %   inuse_objects/count
                 10, 4, 8, 6, 16, 4,                   %   inuse_space/bytes
                 18, 9, 10, 1, 1, 18, 4, 2, 64, 2, 64,  % sample [1] [2,64,2,64]
                 26, 12, 8, 1, 16, 128, 32, 24, 128, 64, 40, 8, 56, 1, % mapping
                 34, 11, 8, 1, 16, 1, 24, 128, 32, 34, 2, 8, 1, % location
                 42, 8, 8, 1, 16, 9, 24, 9, 32, 8,     % function f in /x.so
                 50, 0, 50, 13, "alloc_objects", 50, 5, "count", 50, 11, "alloc_space",
                 50, 5, "bytes", 50, 13, "inuse_objects", 50, 11, "inuse_space",
                 50, 5, "space", 50, 5, "/x.so", 50, 1, "f",
                 90, 4, 8, 7, 16, 4,                   % period_type space/bytes
                 96, 1,                                % period 1
                 112, 6>>,                             % default_sample_type
    ?assertEqual(Expected, b(mallocinfo_trace_profile:encode(tiny()))),
    ?assertEqual(Expected, zlib:gunzip(mallocinfo_trace_profile:pprof(tiny()))).

profile_read_back_test() ->
    Data = #{sites => [{3, 300, [1, 2]}, {1, 10, []}, {5, 1 bsl 40, [3, 2]}],
             locations => [{16#401000, <<"/bin/x">>, <<"leak">>, 16#1000},
                           {16#7f0000001000, <<"/lib/y.so">>, undefined, 16#1000},
                           {16#9000, <<>>, undefined, 0}],
             mode => sample, sample_bytes => 4096,
             maps => <<"00400000-00402000 r-xp 00000000 fe:00 1 /bin/x\n"
                       "00402000-00403000 rw-p 00002000 fe:00 1 /bin/x\n"
                       "7f0000000000-7f0000002000 r-xp 00001000 fe:00 2 /lib/y.so\n"
                       "7f0000004000-7f0000005000 r-xp 00000000 00:00 0 \n">>,
             exe => <<"/bin/x">>, time_nanos => 123, duration_nanos => 1000000000,
             comments => [<<"hello">>]},
    P = mi_pprof_decode:profile(b(mallocinfo_trace_profile:encode(Data))),
    ?assertMatch(#{sample_types := [{<<"alloc_objects">>, <<"count">>},
                                    {<<"alloc_space">>, <<"bytes">>},
                                    {<<"inuse_objects">>, <<"count">>},
                                    {<<"inuse_space">>, <<"bytes">>}],
                   default_sample_type := <<"inuse_space">>,
                   period_type := {<<"space">>, <<"bytes">>}, period := 4096,
                   time_nanos := 123, duration_nanos := 1000000000,
                   comments := [<<"hello">>]}, P),
    %% Executable mappings only, the executable first.
    ?assertMatch([#{id := 1, filename := <<"/bin/x">>, start := 16#400000, limit := 16#402000,
                    has_functions := true},
                  #{id := 2, filename := <<"/lib/y.so">>, offset := 16#1000},
                  #{id := 3, filename := <<>>}], maps:get(mappings, P)),
    #{locations := Locs, samples := Samples} = P,
    ?assertMatch(#{1 := #{mapping := 1, address := 16#401000},
                   2 := #{mapping := 2}, 3 := #{mapping := 0}, 4 := #{mapping := 0}}, Locs),
    ?assertEqual([#{values => [3, 300, 3, 300], frames => [<<"leak">>, <<"y.so+0x1000">>],
                    leaf => <<"leak">>, locations => [1, 2]},
                  #{values => [1, 10, 1, 10], frames => [<<"[no stack recorded]">>],
                    leaf => <<"[no stack recorded]">>, locations => [4]},
                  #{values => [5, 1 bsl 40, 5, 1 bsl 40],
                    frames => [<<"[unmapped]+0x0">>, <<"y.so+0x1000">>],
                    leaf => <<"[unmapped]+0x0">>, locations => [3, 2]}], Samples).

%% Samples with labels (the process of a site's blocks, Erlang context on):
%% each sample carries its own, the strings interned once; a site without
%% labels carries none.
profile_labels_test() ->
    Data = (tiny())#{sites => [{2, 64, 2, 64, [1], [{<<"pid">>, <<"<0.90.0>">>},
                                                     {<<"process">>, <<"conn_a">>}]},
                               {1, 32, 1, 32, [1], [{<<"pid">>, <<"<0.91.0>">>},
                                                    {<<"process">>, <<"conn_a">>}]},
                               {1, 8, 1, 8, [1], []},
                               {1, 4, [1]}]},
    P = mi_pprof_decode:profile(b(mallocinfo_trace_profile:encode(Data))),
    ?assertMatch([#{values := [2, 64, 2, 64], frames := [<<"f">>],
                    labels := [{<<"pid">>, <<"<0.90.0>">>}, {<<"process">>, <<"conn_a">>}]},
                  #{values := [1, 32, 1, 32],
                    labels := [{<<"pid">>, <<"<0.91.0>">>}, {<<"process">>, <<"conn_a">>}]},
                  #{values := [1, 8, 1, 8]},
                  #{values := [1, 4, 1, 4]}], maps:get(samples, P)),
    [_, _, S3, S4] = maps:get(samples, P),
    ?assertNot(is_map_key(labels, S3)),
    ?assertNot(is_map_key(labels, S4)),
    Strings = maps:get(strings, P),
    ?assertEqual(1, length([X || X <- Strings, X =:= <<"conn_a">>])),
    ?assertEqual(1, length([X || X <- Strings, X =:= <<"pid">>])),
    %% The folded stacks add a stack's samples up: one line.
    ?assertEqual(<<"f (x.so) 108\n">>, b(mallocinfo_trace_profile:folded(Data))),
    ?assertEqual(108, mallocinfo_trace_profile:folded_total(Data)).

mappings_test() ->
    Maps = <<"55d0c19f7000-55d0c1a5d000 r--p 00000000 fe:00 9953300  /usr/bin/beam.smp\n"
             "55d0c1a5d000-55d0c1b00000 r-xp 00066000 fe:00 9953300  /usr/bin/beam.smp\n"
             "7f0000000000-7f0000001000 r-xp 00000000 fe:00 12 /tmp/a b.so\n"
             "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]\n">>,
    ?assertEqual([{16#55d0c1a5d000, 16#55d0c1b00000, 16#66000, <<"/usr/bin/beam.smp">>},
                  {16#7f0000000000, 16#7f0000001000, 0, <<"/tmp/a b.so">>},
                  {16#ffffffffff600000, 16#ffffffffff601000, 0, <<"[vsyscall]">>}],
                 mallocinfo_trace_profile:mappings(Maps)).

%%% Collapsed stacks ---------------------------------------------------------------

folded_test() ->
    Data = #{sites => [{1, 100, [1, 2, 3]}, {2, 30, []}, {1, 0, [1]}, {4, 7, [4, 3]}],
             locations => [{1, <<"/lib/a.so">>, <<"leaf">>, 1},
                           {2, <<"/lib/a.so">>, <<"mid">>, 2},
                           {3, <<"/bin/x">>, <<"main">>, 3},
                           {4, <<"/lib/b.so">>, <<"odd;name">>, 4}]},
    Text = b(mallocinfo_trace_profile:folded(Data)),
    %% Root first, `function (object)', zero-byte sites left out, `;' in a
    %% name replaced (it separates frames).
    ?assertEqual(<<"main (x);mid (a.so);leaf (a.so) 100\n"
                   "[no stack recorded] 30\n"
                   "main (x);odd:name (b.so) 7\n">>, Text),
    ?assertEqual(137, mallocinfo_trace_profile:folded_total(Data)).

flamegraph_page_escapes_test() ->
    Page = b(mallocinfo_http_flamegraph:page(<<"a<b>&c (x) 1\n">>, "t</title>")),
    ?assertMatch({_, _}, binary:match(Page, <<"a&lt;b&gt;&amp;c (x) 1\n</textarea>">>)),
    ?assertEqual(nomatch, binary:match(Page, <<"t</title></title>">>)),
    %% Nothing fetched from anywhere.
    ?assertEqual(nomatch, re:run(Page, "(src|href)=|https?://|fetch\\(")).

%%% Allocation figures (issue 26) --------------------------------------------------

%% Sites with churn carry their alloc_* apart from their inuse_*; an allocs
%% profile names alloc_space its default.
alloc_values_test() ->
    Data = (tiny_alloc())#{default_sample => alloc_space},
    P = mi_pprof_decode:profile(b(mallocinfo_trace_profile:encode(Data))),
    ?assertEqual(<<"alloc_space">>, maps:get(default_sample_type, P)),
    ?assertEqual([[100, 6400, 1, 64], [2, 20, 2, 20]],
                 [V || #{values := V} <- maps:get(samples, P)]),
    %% folded: live bytes only, as before.
    ?assertEqual(84, mallocinfo_trace_profile:folded_total(Data)).

tiny_alloc() ->
    #{sites => [{1, 64, 100, 6400, [1]}, {2, 20, [2]}],
      locations => [{16#401000, <<"/bin/x">>, <<"churn">>, 16#1000},
                    {16#401100, <<"/bin/x">>, <<"keep">>, 16#1100}],
      mode => full, sample_bytes => 0, maps => <<>>, exe => <<"/bin/x">>,
      time_nanos => 0, duration_nanos => 0, comments => []}.

%% Go's ?seconds=N: the new profile minus the old one, sites matched by
%% their frames (not by location ids, which each profile numbers its own
%% way), all-zero sites dropped, negative values kept.
delta_test() ->
    Old = #{sites => [{1, 64, 100, 6400, [1]}, {2, 20, 2, 20, [2]}, {5, 50, 5, 50, [3]}],
            locations => [{16#401000, <<"/bin/x">>, <<"churn">>, 16#1000},
                          {16#401100, <<"/bin/x">>, <<"keep">>, 16#1100},
                          {16#401200, <<"/bin/x">>, <<"gone">>, 16#1200}]},
    New0 = tiny_alloc(),
    %% The new profile numbers the same frames the other way round, and
    %% has a site the old one had not.
    New = New0#{sites => [{0, 0, 150, 9600, [2]}, {2, 20, 2, 20, [1]}, {1, 8, 1, 8, [3]}],
                locations => [{16#401100, <<"/bin/x">>, <<"keep">>, 16#1100},
                              {16#401000, <<"/bin/x">>, <<"churn">>, 16#1000},
                              {16#401300, <<"/bin/x">>, <<"new">>, 16#1300}]},
    #{sites := Sites, locations := Locs} = mallocinfo_trace_profile:delta(Old, New),
    ByName = maps:from_list([{[element(3, lists:nth(I, Locs)) || I <- S], {C, B, AC, AB}}
                             || {C, B, AC, AB, S, []} <- Sites]),
    ?assertEqual(#{[<<"churn">>] => {-1, -64, 50, 3200},
                   [<<"gone">>] => {-5, -50, -5, -50},
                   [<<"new">>] => {1, 8, 1, 8}}, ByName),
    ?assertEqual(3, length(Sites)),
    %% The old profile's frames the new one lacks are added to its locations.
    ?assertEqual(4, length(Locs)).

%% Rows split by process: a process that freed its 10 blocks in the window
%% shows -10 live, never a negative allocation; the stack's allocations in
%% the window (3 more blocks, all another process's) are on its unlabelled
%% row; a process matched by pid though its name changed, named as the new
%% profile names it.
delta_labels_test() ->
    L1 = [{<<"pid">>, <<"<0.1.0>">>}, {<<"process">>, <<"a">>}],
    L2old = [{<<"pid">>, <<"<0.2.0>">>}],
    L2new = [{<<"pid">>, <<"<0.2.0>">>}, {<<"process">>, <<"b">>}],
    Locs = [{16#401000, <<"/bin/x">>, <<"f">>, 16#1000}],
    Old = #{sites => [{10, 100, 10, 100, [1], L1}, {1, 10, 1, 10, [1], L2old},
                      {0, 0, 5, 50, [1], []}],
            locations => Locs},
    New = (tiny_alloc())#{sites => [{4, 40, 4, 40, [1], L2new}, {0, 0, 15, 150, [1], []}],
                          locations => Locs},
    #{sites := Sites} = mallocinfo_trace_profile:delta(Old, New),
    ?assertEqual(lists:sort([{-10, -100, 0, 0, [1], L1},
                             {3, 30, 0, 0, [1], L2new},
                             %% Allocations: 19 now, 16 before.
                             {0, 0, 3, 30, [1], []}]), lists:sort(Sites)).
