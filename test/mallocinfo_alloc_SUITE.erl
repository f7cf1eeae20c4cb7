%% Other allocators, end to end: peer nodes started with jemalloc, tcmalloc
%% or mimalloc preloaded (and jemalloc behind mallocinfo's interposer), a
%% test NIF that allocates from a named function, and the profiles checked
%% with the allocators' own tools (jeprof, google-pprof) and with a parser.
-module(mallocinfo_alloc_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2,
         end_per_testcase/2]).
-export([jemalloc_detected/1, jemalloc_stats_json/1, jemalloc_summary_fresh/1,
         jemalloc_profile_names_function/1, jemalloc_concurrent_dumps/1,
         jemalloc_dump_errors/1, jemalloc_profiling_disabled/1,
         tcmalloc_detected_and_stats/1, tcmalloc_heap_profiler/1,
         tcmalloc_minimal_no_profiler/1, mimalloc_detected/1, both_interposers/1,
         late_dlopen_global/1]).

-define(LIB, "/usr/lib/x86_64-linux-gnu/").
-define(JEMALLOC, ?LIB "libjemalloc.so.2").
-define(TCMALLOC, ?LIB "libtcmalloc.so.4").
-define(TCMALLOC_MINIMAL, ?LIB "libtcmalloc_minimal.so.4").
%% libmimalloc.so.2 up to Debian 12, libmimalloc.so.3 after.
-define(MIMALLOC, hd([L || L <- [?LIB "libmimalloc.so.2", ?LIB "libmimalloc.so.3"],
                          filelib:is_regular(L)] ++ [?LIB "libmimalloc.so.2"])).
-define(PROF_CONF, "prof:true,prof_active:false,lg_prof_sample:0").
-define(SITE, <<"mi_alloc_test_site">>).
-define(MiB, (1024 * 1024)).

all() ->
    [jemalloc_detected, jemalloc_stats_json, jemalloc_summary_fresh,
     jemalloc_profile_names_function, jemalloc_concurrent_dumps, jemalloc_dump_errors,
     jemalloc_profiling_disabled, tcmalloc_detected_and_stats, tcmalloc_heap_profiler,
     tcmalloc_minimal_no_profiler, mimalloc_detected, both_interposers, late_dlopen_global].

init_per_suite(Config) ->
    %% Built with -g: jeprof and google-pprof name the function from the
    %% symbol table.
    ok = mi_ct:build_nif(Config, "mi_alloc_nif"),
    [true = filelib:is_regular(F) || F <- [?JEMALLOC, ?TCMALLOC, ?TCMALLOC_MINIMAL, ?MIMALLOC]],
    Config.

end_per_suite(_Config) ->
    ok.

%% The allocator each case's peer starts with, and its MALLOC_CONF.
peer_env(jemalloc_profiling_disabled) -> [{"LD_PRELOAD", ?JEMALLOC}];
peer_env(tcmalloc_detected_and_stats) -> [{"LD_PRELOAD", ?TCMALLOC}];
peer_env(tcmalloc_heap_profiler) -> [{"LD_PRELOAD", ?TCMALLOC}];
peer_env(tcmalloc_minimal_no_profiler) -> [{"LD_PRELOAD", ?TCMALLOC_MINIMAL}];
peer_env(mimalloc_detected) -> [{"LD_PRELOAD", ?MIMALLOC}];
peer_env(both_interposers) ->
    [{"LD_PRELOAD", mallocinfo_trace:preload_path() ++ " " ++ ?JEMALLOC}];
%% jemalloc uses initial-exec TLS: a late dlopen needs static TLS room.
peer_env(late_dlopen_global) -> [{"GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=16384"}];
peer_env(_Jemalloc) -> [{"LD_PRELOAD", ?JEMALLOC}, {"MALLOC_CONF", ?PROF_CONF}].

%% Each case gets its own peer and its own empty TMPDIR, so that what a
%% case leaves behind there is seen.
init_per_testcase(Case, Config) ->
    Tmp = filename:join(?config(priv_dir, Config), "tmp_" ++ atom_to_list(Case)),
    ok = file:make_dir(Tmp),
    Config1 = mi_ct:start_peer(Config, [{"TMPDIR", Tmp} | peer_env(Case)]),
    {module, mi_alloc_nif} = mi_ct:call(Config1, code, ensure_loaded, [mi_alloc_nif]),
    [{tmp, Tmp} | Config1].

end_per_testcase(_, Config) ->
    mi_ct:stop_peer(Config).

call(Config, M, F, A) ->
    mi_ct:call(Config, M, F, A).

ok_call(Config, M, F, A) ->
    mi_ct:ok_call(Config, M, F, A).

%% Every glibc call of mallocinfo, with arguments of the right types.
glibc_calls(Config) ->
    Path = filename:join(?config(tmp, Config), "never.xml"),
    [{info, []}, {info, [Path]}, {heaps, []}, {stats, []}, {summary, []}, {log_stats, []},
     {mallinfo, []}, {trim, []}, {trim, [0]}, {mallopt, [perturb, 0]}].

assert_wrong_allocator(Config, Which) ->
    Wrong = {error, {wrong_allocator, Which}},
    [?assertEqual({F, A, Wrong}, {F, A, call(Config, mallocinfo, F, A)})
     || {F, A} <- glibc_calls(Config)],
    [?assertEqual({M, F, Wrong}, {M, F, call(Config, M, F, A)})
     || {M, F, A} <- [{mallocinfo_jemalloc, stats, []}, {mallocinfo_jemalloc, summary, []},
                      {mallocinfo_jemalloc, profile_status, []},
                      {mallocinfo_jemalloc, profile_active, [true]},
                      {mallocinfo_jemalloc, profile_dump, []},
                      {mallocinfo_tcmalloc, stats, []},
                      {mallocinfo_tcmalloc, profile_start, [?config(tmp, Config) ++ "/p"]},
                      {mallocinfo_tcmalloc, profile_dump, []},
                      {mallocinfo_tcmalloc, profile_stop, []},
                      {mallocinfo_tcmalloc, profile_running, []}],
        M =/= module_of(Which)],
    %% Nothing was written, and misuse still raises.
    ?assertEqual({ok, []}, file:list_dir(?config(tmp, Config))),
    ?assertMatch({'EXIT', {badarg, _}}, mi_ct:caught(fun() -> call(Config, mallocinfo, trim, [-1]) end)),
    ?assertMatch({'EXIT', {badarg, _}}, mi_ct:caught(fun() -> call(Config, mallocinfo, mallopt, [bogus, 1]) end)).

module_of(jemalloc) -> mallocinfo_jemalloc;
module_of(tcmalloc) -> mallocinfo_tcmalloc;
module_of(_) -> none.

%%% jemalloc ------------------------------------------------------------------

jemalloc_detected(Config) ->
    ?assertEqual(jemalloc, call(Config, mallocinfo, allocator, [])),
    assert_wrong_allocator(Config, jemalloc),
    ?assertMatch(#{preloaded := false}, call(Config, mallocinfo_trace, status, [])).

%% The JSON parses (with a strict parser, below) and carries the figures.
jemalloc_stats_json(Config) ->
    {ok, Json} = call(Config, mallocinfo_jemalloc, stats, []),
    ct:pal("stats: ~p bytes", [byte_size(Json)]),
    #{<<"jemalloc">> := Je} = json(Json),
    #{<<"version">> := <<"5.", _/binary>>, <<"stats">> := Stats} = Je,
    #{<<"allocated">> := Allocated, <<"resident">> := Resident, <<"mapped">> := Mapped} = Stats,
    ?assert(is_integer(Allocated) andalso Allocated > 0),
    ?assert(Resident > 0 andalso Mapped >= Allocated),
    ?assertMatch(#{<<"opt">> := #{<<"prof">> := true}}, Je).

%% summary/0 advances the epoch: an allocation made just before it shows.
jemalloc_summary_fresh(Config) ->
    {ok, S0} = call(Config, mallocinfo_jemalloc, summary, []),
    ?assertEqual([active, allocated, mapped, metadata, resident, retained],
                 lists:sort(maps:keys(S0))),
    ok = call(Config, mi_alloc_nif, hold, [64, ?MiB]),
    {ok, S1} = call(Config, mallocinfo_jemalloc, summary, []),
    ok = call(Config, mi_alloc_nif, release, []),
    {ok, S2} = call(Config, mallocinfo_jemalloc, summary, []),
    ct:pal("before ~p~nholding 64 MiB ~p~nreleased ~p", [S0, S1, S2]),
    %% The rest of the node allocates and frees meanwhile: allow it 4 MiB.
    ?assert(maps:get(allocated, S1) - maps:get(allocated, S0) >= 60 * ?MiB),
    ?assert(maps:get(resident, S1) - maps:get(resident, S0) >= 60 * ?MiB),
    ?assert(maps:get(allocated, S1) - maps:get(allocated, S2) >= 60 * ?MiB),
    [?assert(A =< Act andalso Act =< M)
     || #{allocated := A, active := Act, mapped := M} <- [S0, S1, S2]].

jemalloc_profile_names_function(Config) ->
    ?assertEqual(#{prof => true, active => false, thread_active_init => true, lg_sample => 0},
                 ok_call(Config, mallocinfo_jemalloc, profile_status, [])),
    %% Not sampling yet: these blocks must not be in the profile.
    ok = call(Config, mi_alloc_nif, hold, [7, 100000]),
    ok = call(Config, mallocinfo_jemalloc, profile_active, [true]),
    ?assertMatch(#{active := true}, ok_call(Config, mallocinfo_jemalloc, profile_status, [])),
    ok = call(Config, mi_alloc_nif, hold, [10, 300000]),
    {ok, Dump} = call(Config, mallocinfo_jemalloc, profile_dump, []),
    ok = call(Config, mallocinfo_jemalloc, profile_active, [false]),
    ?assertMatch(#{active := false}, ok_call(Config, mallocinfo_jemalloc, profile_status, [])),
    ok = call(Config, mi_alloc_nif, release, []),
    ?assertMatch(<<"heap_v2/", _/binary>>, Dump),
    %% lg_prof_sample:0 samples every allocation: exactly the 10 blocks made
    %% while active are live at the site (300000 is rounded up to jemalloc's
    %% 327680 size class).
    ?assertEqual({10, 10 * 327680}, site_totals(Config, je_records(Dump))),
    tool_names_site(Config, "jeprof", "jemalloc.heap", Dump),
    ?assertEqual({ok, []}, file:list_dir(?config(tmp, Config))).

%% 20 callers dump at once. Caller I first allocates a block of 64 bsl I
%% bytes at the site (powers of two are size classes, so the live bytes at
%% the site are a sum of distinct powers of two whose bits say exactly which
%% blocks a dump saw): each caller's dump must be complete and contain its
%% own block, i.e. be taken after it, in its own file, not a neighbour's.
jemalloc_concurrent_dumps(Config) ->
    ok = call(Config, mallocinfo_jemalloc, profile_active, [true]),
    N = 20,
    Calls = [{mi_alloc_nif, alloc_then, [64 bsl I, {mallocinfo_jemalloc, profile_dump, []}]}
             || I <- lists:seq(0, N - 1)],
    Results = call(Config, mi_alloc_nif, parallel, [Calls]),
    ok = call(Config, mallocinfo_jemalloc, profile_active, [false]),
    [ok = call(Config, mi_alloc_nif, free, [Addr]) || {Addr, _} <- Results],
    Dumps = [D || {_, {ok, D}} <- Results],
    ?assertEqual(N, length(Dumps)),
    lists:foreach(
      fun({I, Dump}) ->
              ?assertMatch(<<"heap_v2/", _/binary>>, Dump),
              ?assertNotEqual(nomatch, binary:match(Dump, <<"\nMAPPED_LIBRARIES:\n">>)),
              ?assertEqual($\n, binary:last(Dump)),
              {_, Bytes} = site_totals(Config, je_records(Dump)),
              ?assertEqual({I, 64 bsl I}, {I, Bytes band (64 bsl I)})
      end, lists:zip(lists:seq(0, N - 1), Dumps)),
    ct:pal("~p dumps, ~p distinct, sizes ~p", [N, length(lists:usort(Dumps)),
                                                [byte_size(D) || D <- Dumps]]),
    ?assertEqual({ok, []}, file:list_dir(?config(tmp, Config))).

jemalloc_dump_errors(Config) ->
    true = call(Config, os, putenv, ["TMPDIR", "/nonexistent/mallocinfo"]),
    ?assertEqual({error, enoent}, call(Config, mallocinfo_jemalloc, profile_dump, [])),
    File = filename:join(?config(priv_dir, Config), "plain_file"),
    ok = file:write_file(File, <<"x">>),
    true = call(Config, os, putenv, ["TMPDIR", File]),
    ?assertEqual({error, enotdir}, call(Config, mallocinfo_jemalloc, profile_dump, [])),
    true = call(Config, os, putenv, ["TMPDIR", ?config(tmp, Config)]),
    ?assertMatch({ok, <<"heap_v2/", _/binary>>},
                 call(Config, mallocinfo_jemalloc, profile_dump, [])),
    ?assertMatch({'EXIT', {badarg, _}},
                 mi_ct:caught(fun() -> call(Config, mallocinfo_jemalloc, profile_active, [on]) end)),
    ?assertEqual({ok, []}, file:list_dir(?config(tmp, Config))).

%% The same jemalloc without prof:true: a clear profiling_disabled, never
%% enoent, and no file anywhere.
jemalloc_profiling_disabled(Config) ->
    ?assertEqual(jemalloc, call(Config, mallocinfo, allocator, [])),
    ?assertMatch(#{prof := false, active := false},
                 ok_call(Config, mallocinfo_jemalloc, profile_status, [])),
    ?assertEqual({error, profiling_disabled},
                 call(Config, mallocinfo_jemalloc, profile_active, [true])),
    ?assertEqual({error, profiling_disabled},
                 call(Config, mallocinfo_jemalloc, profile_active, [false])),
    ?assertEqual({error, profiling_disabled}, call(Config, mallocinfo_jemalloc, profile_dump, [])),
    ?assertMatch({ok, #{allocated := _}}, call(Config, mallocinfo_jemalloc, summary, [])),
    ?assertMatch({ok, <<"{", _/binary>>}, call(Config, mallocinfo_jemalloc, stats, [])),
    ?assertEqual({ok, []}, file:list_dir(?config(tmp, Config))).

%%% tcmalloc -------------------------------------------------------------------

tcmalloc_detected_and_stats(Config) ->
    ?assertEqual(tcmalloc, call(Config, mallocinfo, allocator, [])),
    assert_wrong_allocator(Config, tcmalloc),
    {ok, T0} = call(Config, mallocinfo_tcmalloc, stats, []),
    ok = call(Config, mi_alloc_nif, hold, [64, ?MiB]),
    {ok, T1} = call(Config, mallocinfo_tcmalloc, stats, []),
    ok = call(Config, mi_alloc_nif, release, []),
    ct:pal("tcmalloc stats:~n~ts", [T1]),
    ?assert(in_use(T1) - in_use(T0) >= 64 * ?MiB),
    ?assertEqual(false, ok_call(Config, mallocinfo_tcmalloc, profile_running, [])).

%% "MALLOC:     1234 (    0.0 MiB) Bytes in use by application"
in_use(Text) ->
    {match, [N]} = re:run(Text, "^MALLOC: +([0-9]+) \\( *[0-9.]+ MiB\\) Bytes in use by application$",
                          [multiline, {capture, all_but_first, binary}]),
    binary_to_integer(N).

tcmalloc_heap_profiler(Config) ->
    Prefix = filename:join(?config(tmp, Config), "heap"),
    ?assertEqual(false, ok_call(Config, mallocinfo_tcmalloc, profile_running, [])),
    ?assertEqual({error, not_running}, call(Config, mallocinfo_tcmalloc, profile_dump, [])),
    ?assertEqual({error, not_running}, call(Config, mallocinfo_tcmalloc, profile_stop, [])),
    %% Allocated before the start: not in the profile.
    ok = call(Config, mi_alloc_nif, hold, [5, 200000]),
    ?assertEqual(ok, call(Config, mallocinfo_tcmalloc, profile_start, [Prefix])),
    ?assertEqual({error, already_running},
                 call(Config, mallocinfo_tcmalloc, profile_start, [Prefix])),
    ?assertEqual(true, ok_call(Config, mallocinfo_tcmalloc, profile_running, [])),
    ok = call(Config, mi_alloc_nif, hold, [100, 100000]),
    {ok, Dump} = call(Config, mallocinfo_tcmalloc, profile_dump, []),
    ?assertEqual(ok, call(Config, mallocinfo_tcmalloc, profile_stop, [])),
    ?assertEqual(false, ok_call(Config, mallocinfo_tcmalloc, profile_running, [])),
    ?assertEqual({error, not_running}, call(Config, mallocinfo_tcmalloc, profile_dump, [])),
    ok = call(Config, mi_alloc_nif, release, []),
    ?assertMatch(<<"heap profile: ", _/binary>>, Dump),
    ?assertNotEqual(nomatch, binary:match(Dump, <<"\nMAPPED_LIBRARIES:\n">>)),
    %% The heap profiler records every allocation: exactly the 100 blocks
    %% made while it ran.
    ?assertEqual({100, 100 * 100000}, site_totals(Config, tc_records(Dump))),
    tool_names_site(Config, mi_ct:pprof(), "tcmalloc.heap", Dump),
    %% No automatic dump was due (1 GiB interval), so no file either.
    ?assertEqual({ok, []}, file:list_dir(?config(tmp, Config))).

tcmalloc_minimal_no_profiler(Config) ->
    ?assertEqual(tcmalloc, call(Config, mallocinfo, allocator, [])),
    ?assertMatch({ok, <<"---", _/binary>>}, call(Config, mallocinfo_tcmalloc, stats, [])),
    Prefix = filename:join(?config(tmp, Config), "heap"),
    [?assertEqual({F, {error, profiler_not_loaded}},
                  {F, call(Config, mallocinfo_tcmalloc, F, A)})
     || {F, A} <- [{profile_start, [Prefix]}, {profile_dump, []}, {profile_stop, []},
                   {profile_running, []}]].

%%% mimalloc, both interposers, late dlopen ----------------------------------

mimalloc_detected(Config) ->
    ?assertEqual(mimalloc, call(Config, mallocinfo, allocator, [])),
    assert_wrong_allocator(Config, mimalloc).

%% mallocinfo's interposer in front of jemalloc: the tracker records the
%% blocks jemalloc serves, the detection looks through the interposer.
both_interposers(Config) ->
    ?assertMatch(#{preloaded := true, recording := true},
                 call(Config, mallocinfo_trace, status, [])),
    ?assertEqual(jemalloc, call(Config, mallocinfo, allocator, [])),
    assert_wrong_allocator(Config, jemalloc),
    {ok, _} = call(Config, mallocinfo_trace, reset, []),
    {ok, #{allocated := A0}} = call(Config, mallocinfo_jemalloc, summary, []),
    ok = call(Config, mi_alloc_nif, hold, [1000, 100000]),
    {ok, #{allocated := A1}} = call(Config, mallocinfo_jemalloc, summary, []),
    ?assert(A1 - A0 >= 1000 * 100000),
    Sites = ok_call(Config, mallocinfo_trace, sites, [10]),
    [Site] = [S || #{stack := [#{symbol := ?SITE} | _]} = S <- Sites],
    ?assertMatch(#{count := 1000, bytes := 100000000, estimated := false}, Site),
    ?assertMatch(#{mallinfo := {error, {wrong_allocator, jemalloc}}},
                 ok_call(Config, mallocinfo_trace, stats, [])),
    ok = call(Config, mi_alloc_nif, release, []),
    ?assertEqual([], [S || #{stack := [#{symbol := ?SITE} | _]} = S
                               <- ok_call(Config, mallocinfo_trace, sites, [10])]),
    ?assertMatch({ok, <<"{", _/binary>>}, call(Config, mallocinfo_jemalloc, stats, [])).

%% A glibc node that dlopen()s jemalloc into the global scope late: mallctl
%% is now visible to dlsym(RTLD_DEFAULT), but glibc still serves malloc.
late_dlopen_global(Config) ->
    ?assertEqual(glibc, call(Config, mallocinfo, allocator, [])),
    ok = call(Config, mi_alloc_nif, dlopen_global, [?JEMALLOC]),
    ?assertEqual(glibc, call(Config, mallocinfo, allocator, [])),
    ?assertMatch({ok, #{arena := _}}, call(Config, mallocinfo, mallinfo, [])),
    ?assertEqual({error, {wrong_allocator, glibc}},
                 call(Config, mallocinfo_jemalloc, summary, [])).

%%% Profiles --------------------------------------------------------------------

%% jemalloc heap_v2 records: "@ 0x.. 0x.." then "  t*: Objs: Bytes [..]".
je_records(Dump) ->
    Lines = binary:split(Dump, <<"\n">>, [global]),
    je_records(Lines, []).

je_records([<<"@ ", Stack/binary>>, <<"  t*: ", Counts/binary>> | Rest], Acc) ->
    [Objs, Bytes | _] = binary:split(Counts, [<<": ">>, <<" ">>], [global, trim_all]),
    je_records(Rest, [{addresses(Stack), binary_to_integer(Objs), binary_to_integer(Bytes)}
                      | Acc]);
je_records([_ | Rest], Acc) ->
    je_records(Rest, Acc);
je_records([], Acc) ->
    Acc.

%% Legacy gperftools records: "Objs: Bytes [ Objs: Bytes] @ 0x.. 0x..".
tc_records(Dump) ->
    [Header | Lines] = binary:split(Dump, <<"\n">>, [global]),
    <<"heap profile:", _/binary>> = Header,
    [{addresses(Stack), binary_to_integer(O), binary_to_integer(B)}
     || L <- Lines,
        {match, [O, B, Stack]} <-
            [re:run(L, "^ *([0-9]+): +([0-9]+) \\[ *[0-9]+: +[0-9]+\\] @ (.*)$",
                    [{capture, all_but_first, binary}])]].

addresses(Stack) ->
    [binary_to_integer(A, 16) || <<"0x", A/binary>> <- binary:split(Stack, <<" ">>, [global, trim_all])].

%% {Objects, Bytes} live in the records whose stack passes through the test
%% site, symbolized on the peer by mallocinfo's own symbolizer.
site_totals(Config, Records) ->
    Addrs = lists:usort(lists:append([A || {A, _, _} <- Records])),
    Frames = call(Config, mallocinfo_nif, trace_symbolize, [Addrs, false]),
    Site = maps:from_list([{A, S =:= ?SITE} || {A, #{symbol := S}} <- lists:zip(Addrs, Frames)]),
    lists:foldl(
      fun({Stack, O, B}, {AccO, AccB}) ->
              case lists:any(fun(A) -> maps:get(A, Site) end, Stack) of
                  true -> {AccO + O, AccB + B};
                  false -> {AccO, AccB}
              end
      end, {0, 0}, Records).

%% `Tool --text <beam.smp> File', as an operator would run it.
run_tool(Config, Tool, File) ->
    Exe = os:find_executable(Tool),
    ?assertNotEqual(false, Exe),
    Beam = filename:join(call(Config, os, getenv, ["BINDIR"]), "beam.smp"),
    os:cmd(lists:flatten(io_lib:format("~ts --text ~ts ~ts 2>&1", [Exe, Beam, File]))).

%% The profile Dump, saved in priv_dir as Name: `Tool --text' (jeprof or
%% google-pprof) lists mi_alloc_test_site with its share.
tool_names_site(Config, Tool, Name, Dump) ->
    File = filename:join(?config(priv_dir, Config), Name),
    ok = file:write_file(File, Dump),
    Out = run_tool(Config, Tool, File),
    ct:pal("~ts --text:~n~ts", [Tool, Out]),
    ?assertMatch({match, _}, re:run(Out, "^\\s*[0-9.]+\\s+[0-9.]+%.*mi_alloc_test_site$",
                                    [multiline])).

%%% A strict JSON parser (RFC 8259), enough to prove the document is valid.
%%% Names may repeat (RFC 8259 says they SHOULD be unique, not MUST): jemalloc
%%% 5.3 repeats a few (opt.stats_print, stats_print_opts, hpa nactive_huge).
%%% The last one wins, as in most parsers; the repeats are logged.

json(Bin) ->
    {Value, Rest} = value(ws(Bin)),
    <<>> = ws(Rest),
    Value.

ws(<<C, R/binary>>) when C =:= $\s; C =:= $\t; C =:= $\n; C =:= $\r -> ws(R);
ws(B) -> B.

value(<<${, R/binary>>) -> object(ws(R), #{});
value(<<$[, R/binary>>) -> array(ws(R), []);
value(<<$", R/binary>>) -> string(R, <<>>);
value(<<"true", R/binary>>) -> {true, R};
value(<<"false", R/binary>>) -> {false, R};
value(<<"null", R/binary>>) -> {null, R};
value(B) -> number(B).

object(<<$}, R/binary>>, M) when map_size(M) =:= 0 -> {M, R};
object(<<$", R/binary>>, M) ->
    {K, R1} = string(R, <<>>),
    <<$:, R2/binary>> = ws(R1),
    {V, R3} = value(ws(R2)),
    _ = maps:is_key(K, M) andalso ct:log("JSON name repeated: ~ts", [K]),
    case ws(R3) of
        <<$,, R4/binary>> -> object(ws(R4), M#{K => V});
        <<$}, R4/binary>> -> {M#{K => V}, R4}
    end.

array(<<$], R/binary>>, []) -> {[], R};
array(B, Acc) ->
    {V, R} = value(B),
    case ws(R) of
        <<$,, R1/binary>> -> array(ws(R1), [V | Acc]);
        <<$], R1/binary>> -> {lists:reverse([V | Acc]), R1}
    end.

string(<<$", R/binary>>, Acc) -> {Acc, R};
string(<<$\\, $u, H:4/binary, R/binary>>, Acc) ->
    _ = binary_to_integer(H, 16),
    string(R, <<Acc/binary, "\\u", H/binary>>);
string(<<$\\, C, R/binary>>, Acc) ->
    true = lists:member(C, [$", $\\, $/, $b, $f, $n, $r, $t]),
    string(R, <<Acc/binary, $\\, C>>);
string(<<C, R/binary>>, Acc) when C >= 16#20 -> string(R, <<Acc/binary, C>>).

number(B) ->
    {match, [{0, Len}]} = re:run(B, "^-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?",
                                 [{capture, first}]),
    <<N:Len/binary, R/binary>> = B,
    Value = case re:run(N, "[.eE]") of
                nomatch -> binary_to_integer(N);
                _ -> N
            end,
    {Value, R}.
