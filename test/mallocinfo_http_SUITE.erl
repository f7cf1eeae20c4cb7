%% The HTTP endpoint over real sockets (httpc), on this node (glibc) and on
%% peer nodes started with the tracker, jemalloc (with and without
%% profiling) and tcmalloc preloaded. Profiles are checked with a reader of
%% their formats (mi_heap_profile) and with the real tools: jeprof and
%% google-pprof must name the allocating function of a test NIF.
-module(mallocinfo_http_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, init_per_suite/1, end_per_suite/1, init_per_group/2,
         end_per_group/2, init_per_testcase/2, end_per_testcase/2]).
-export([start_stop/1, stop_all/1, loopback_only/1, glibc_endpoints/1, bad_requests/1,
         methods/1, tracker_endpoints/1, tracker_profile/1, tracker_active/1,
         jemalloc_endpoints/1, jemalloc_profile/1, concurrent_dumps/1,
         jemalloc_profiling_disabled/1, tcmalloc_endpoints/1]).

-define(HTTPC, mallocinfo_http_SUITE).
-define(JEMALLOC, "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2").
-define(TCMALLOC, "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4").
-define(PROF_CONF, "prof:true,prof_active:false,lg_prof_sample:0").
-define(ENDPOINTS, ["/", "/memory.json", "/mallocinfo.xml", "/heap_profile", "/metrics"]).

all() ->
    [{group, glibc}, {group, tracker}, {group, jemalloc}, {group, jemalloc_no_prof},
     {group, tcmalloc}].

groups() ->
    [{glibc, [], [start_stop, stop_all, loopback_only, glibc_endpoints, bad_requests, methods]},
     {tracker, [], [tracker_endpoints, tracker_profile, tracker_active]},
     {jemalloc, [], [jemalloc_endpoints, jemalloc_profile, concurrent_dumps]},
     {jemalloc_no_prof, [], [jemalloc_profiling_disabled]},
     {tcmalloc, [], [tcmalloc_endpoints]}].

init_per_suite(Config) ->
    Priv = ?config(priv_dir, Config),
    Data = ?config(data_dir, Config),
    Erts = filename:join([code:root_dir(), "erts-" ++ erlang:system_info(version), "include"]),
    So = filename:join(Priv, "mi_prof_nif.so"),
    Cmd = io_lib:format("cc -O1 -g -fPIC -shared -pthread -I~ts -o ~ts ~ts 2>&1",
                        [Erts, So, filename:join(Data, "mi_prof_nif.c")]),
    "" = os:cmd(lists:flatten(Cmd)),
    {ok, mi_prof_nif} = compile:file(filename:join(Data, "mi_prof_nif.erl"), [{outdir, Priv}]),
    {ok, _} = application:ensure_all_started(inets),
    {ok, _} = inets:start(httpc, [{profile, ?HTTPC}]),
    %% One connection per request, as many at once as asked for.
    ok = httpc:set_options([{max_sessions, 64}, {max_keep_alive_length, 0},
                            {keep_alive_timeout, 0}], ?HTTPC),
    Beam = filename:join([code:root_dir(), "erts-" ++ erlang:system_info(version), "bin",
                          "beam.smp"]),
    [true = filelib:is_regular(F) || F <- [Beam, ?JEMALLOC, ?TCMALLOC]],
    [{beam, Beam} | Config].

end_per_suite(_Config) ->
    ok = inets:stop(httpc, ?HTTPC).

%% The glibc group serves from this node, a server per test case; the other
%% groups from one peer node each, whose temporary directory is the
%% group's own (so a test can see that nothing is left in it).
init_per_group(glibc, Config) ->
    Config;
init_per_group(Group, Config) ->
    Tmp = filename:join(?config(priv_dir, Config), "tmp-" ++ atom_to_list(Group)),
    ok = filelib:ensure_path(Tmp),
    Env = [{"TMPDIR", Tmp} | group_env(Group)],
    Ebin = filename:dirname(code:which(mallocinfo)),
    {ok, Peer, _Node} = peer:start(#{connection => standard_io, env => Env,
                                     args => ["-pa", Ebin, "-pa", ?config(priv_dir, Config)]}),
    {module, mallocinfo} = peer:call(Peer, code, ensure_loaded, [mallocinfo]),
    {ok, #{port := Port}} = peer:call(Peer, mallocinfo_http, start, [#{}]),
    [{peer, Peer}, {port, Port}, {tmp, Tmp} | Config].

group_env(tracker) -> mallocinfo_trace:preload_env();
group_env(jemalloc) -> [{"LD_PRELOAD", ?JEMALLOC}, {"MALLOC_CONF", ?PROF_CONF}];
group_env(jemalloc_no_prof) -> [{"LD_PRELOAD", ?JEMALLOC}];
group_env(tcmalloc) -> [{"LD_PRELOAD", ?TCMALLOC}].

end_per_group(glibc, _Config) ->
    ok;
end_per_group(_, Config) ->
    peer:stop(?config(peer, Config)).

init_per_testcase(_, Config) ->
    case ?config(peer, Config) of
        undefined ->
            {ok, #{port := Port, ip := {127, 0, 0, 1}}} = mallocinfo_http:start(#{}),
            [{port, Port} | Config];
        _ ->
            Config
    end.

end_per_testcase(_, Config) ->
    case ?config(peer, Config) of
        undefined -> mallocinfo_http:stop();
        _ -> ok
    end.

%%% Helpers ------------------------------------------------------------------

url(Config, Path) ->
    "http://127.0.0.1:" ++ integer_to_list(?config(port, Config)) ++ Path.

get(Config, Path) ->
    request(get, {url(Config, Path), []}).

request(Method, Request) ->
    {ok, {{_, Code, _}, Headers, Body}} =
        httpc:request(Method, Request, [{timeout, 120000}], [{body_format, binary}], ?HTTPC),
    {Code, Headers, Body}.

%% A 200 with the given content type and no caching.
ok_body(Config, Path, Type) ->
    {Code, Headers, Body} = get(Config, Path),
    ?assertEqual({200, Type}, {Code, header("content-type", Headers)}, {Path, Body}),
    ?assertEqual("no-store", header("cache-control", Headers)),
    Body.

header(Name, Headers) ->
    proplists:get_value(Name, Headers).

%% A refusal: the code, text/plain, and the body, which is returned.
status(Config, Path, Code) ->
    {Got, Headers, Body} = get(Config, Path),
    ?assertEqual(Code, Got, {Path, Body}),
    ?assertEqual("text/plain; charset=utf-8", header("content-type", Headers)),
    Body.

contains(Body, Text) ->
    ?assertNotEqual(nomatch, binary:match(Body, Text), {Text, Body}).

pcall(Config, M, F, A) ->
    peer:call(?config(peer, Config), M, F, A, 120000).

metrics(Config) ->
    Body = ok_body(Config, "/metrics", "text/plain; version=0.0.4; charset=utf-8"),
    Fams = mi_prom_parse:parse(Body),
    Names = [N || #{name := N} <- Fams],
    [?assertMatch(<<"mallocinfo_", _/binary>>, N) || N <- Names],
    Values = maps:from_list([{{N, L}, V} || #{samples := S} <- Fams,
                                           #{name := N, labels := L, value := V} <- S]),
    {Names, Values}.

has_prefix(Names, Prefix) ->
    lists:any(fun(N) -> binary:longest_common_prefix([N, Prefix]) =:= byte_size(Prefix) end, Names).

%% Writes the profile and runs `Tool --text --show_bytes' on it with the
%% emulator as the program; the function of the test NIF that allocated
%% must be named, holding `Bytes' (flat) when given.
named_by(Config, Tool, Name, Profile, Bytes) ->
    File = filename:join(?config(priv_dir, Config), Name),
    ok = file:write_file(File, Profile),
    Out = os:cmd(Tool ++ " --text --show_bytes " ++ ?config(beam, Config) ++ " " ++ File
                 ++ " 2>&1"),
    ct:pal("~ts --text --show_bytes ~ts:~n~ts", [Tool, Name, Out]),
    Lines = [string:lexemes(L, " ") || L <- string:split(Out, "\n", all)],
    case [Flat || [Flat | _] = L <- Lines, lists:last(L) =:= "mi_prof_alloc_here"] of
        [Flat] when Bytes =:= any -> ?assert(list_to_integer(Flat) > 0);
        [Flat] -> ?assertEqual(Bytes, list_to_integer(Flat));
        _ -> ct:fail({not_named, Tool, Out})
    end.

dump(Config) ->
    {200, Headers, Profile} = get(Config, "/heap_profile?trigger_dump=true"),
    ?assertEqual("application/octet-stream", header("content-type", Headers)),
    ?assertMatch("attachment; filename=\"heap_profile." ++ _, header("content-disposition", Headers)),
    Profile.

%% The record of a stack holding exactly N blocks and B bytes.
has_record(#{records := Records}, N, B) ->
    lists:any(fun({RN, RB, _}) -> {RN, RB} =:= {N, B} end, Records).

sums(#{records := Records}) ->
    {lists:sum([N || {N, _, _} <- Records]), lists:sum([B || {_, B, _} <- Records])}.

%%% glibc, on this node --------------------------------------------------------

start_stop(Config) ->
    Port = ?config(port, Config),
    {ok, #{port := Port2, ip := {127, 0, 0, 1}}} = mallocinfo_http:start(#{port => 0}),
    ?assertNotEqual(Port, Port2),
    {200, _, _} = request(get, {"http://127.0.0.1:" ++ integer_to_list(Port2) ++ "/", []}),
    ?assertEqual({error, eaddrinuse}, mallocinfo_http:start(#{port => Port})),
    ?assertEqual(ok, mallocinfo_http:stop(Port2)),
    ?assertEqual({error, not_found}, mallocinfo_http:stop(Port2)),
    ?assertMatch({error, E} when E =:= econnrefused; E =:= econnreset,
                 gen_tcp:connect({127, 0, 0, 1}, Port2, [], 5000)),
    %% A port something else listens on.
    {ok, L} = gen_tcp:listen(0, [{ip, {127, 0, 0, 1}}]),
    {ok, Taken} = inet:port(L),
    ?assertEqual({error, eaddrinuse}, mallocinfo_http:start(#{port => Taken})),
    ok = gen_tcp:close(L),
    %% The first server still answers.
    {200, _, _} = get(Config, "/"),
    Bad = [#{port => -1}, #{port => 65536}, #{port => "80"}, #{ip => "127.0.0.1"},
           #{ip => {127, 0, 0}}, #{ip => {256, 0, 0, 1}}, #{bogus => 1}, [{port, 0}], port],
    [?assertError(badarg, mallocinfo_http:start(B)) || B <- Bad],
    [?assertError(badarg, mallocinfo_http:stop(B)) || B <- [0, -1, 65536, "80"]].

stop_all(Config) ->
    {ok, #{port := P2}} = mallocinfo_http:start(#{}),
    {ok, #{port := P3}} = mallocinfo_http:start(#{}),
    %% An httpd of someone else's is left alone.
    {ok, Other} = inets:start(httpd, [{port, 0}, {bind_address, {127, 0, 0, 1}},
                                      {server_name, "other"},
                                      {server_root, ?config(priv_dir, Config)},
                                      {document_root, ?config(priv_dir, Config)}]),
    ?assertEqual(ok, mallocinfo_http:stop()),
    %% Refused; or reset, when the kernel had queued the handshake on the
    %% listening socket in the instant before its owner closed it.
    [?assertMatch({error, E} when E =:= econnrefused; E =:= econnreset,
                  gen_tcp:connect({127, 0, 0, 1}, P, [], 5000))
     || P <- [?config(port, Config), P2, P3]],
    [{port, OtherPort}] = httpd:info(Other, [port]),
    {ok, S} = gen_tcp:connect({127, 0, 0, 1}, OtherPort, [], 5000),
    ok = gen_tcp:close(S),
    ok = inets:stop(httpd, Other),
    ?assertEqual(ok, mallocinfo_http:stop()).

%% 127.0.0.1 only, unless another address is asked for. (All of 127/8
%% reaches the loopback interface, so 127.0.0.2 tells a socket bound to
%% 127.0.0.1 from one bound to every address.)
loopback_only(Config) ->
    Port = ?config(port, Config),
    {ok, S} = gen_tcp:connect({127, 0, 0, 1}, Port, [], 5000),
    ok = gen_tcp:close(S),
    ?assertEqual({error, econnrefused}, gen_tcp:connect({127, 0, 0, 2}, Port, [], 5000)),
    {ok, #{port := P2, ip := {127, 0, 0, 2}}} = mallocinfo_http:start(#{ip => {127, 0, 0, 2}}),
    {ok, S2} = gen_tcp:connect({127, 0, 0, 2}, P2, [], 5000),
    ok = gen_tcp:close(S2),
    ?assertEqual({error, econnrefused}, gen_tcp:connect({127, 0, 0, 1}, P2, [], 5000)).

glibc_endpoints(Config) ->
    Index = ok_body(Config, "/", "text/plain; charset=utf-8"),
    contains(Index, <<"allocator glibc">>),
    [contains(Index, list_to_binary(P)) || P <- tl(?ENDPOINTS)],

    Json = mi_json_decode:decode(ok_body(Config, "/memory.json", "application/json")),
    ?assertMatch(#{<<"allocator">> := <<"glibc">>,
                   <<"tracker">> := #{<<"preloaded">> := false},
                   <<"malloc_info">> := #{<<"heaps">> := [#{<<"nr">> := 0} | _]}}, Json),
    #{<<"mallinfo2">> := Mallinfo, <<"rss_bytes">> := Rss} = Json,
    ?assertEqual(lists:sort([<<"arena">>, <<"ordblks">>, <<"smblks">>, <<"hblks">>, <<"hblkhd">>,
                             <<"usmblks">>, <<"fsmblks">>, <<"uordblks">>, <<"fordblks">>,
                             <<"keepcost">>]), lists:sort(maps:keys(Mallinfo))),
    ?assert(is_integer(Rss) andalso Rss > 0),

    Xml = ok_body(Config, "/mallocinfo.xml", "application/xml"),
    ?assertMatch(<<"<malloc version=\"1\">", _/binary>>, Xml),
    ?assertMatch(#{heaps := [_ | _]}, mallocinfo_parse:heaps(Xml)),

    {Names, Values} = metrics(Config),
    ?assertEqual(1, maps:get({<<"mallocinfo_allocator_info">>, #{<<"allocator">> => <<"glibc">>}},
                             Values)),
    ?assert(maps:get({<<"mallocinfo_resident_bytes">>, #{}}, Values) > 0),
    ?assert(maps:get({<<"mallocinfo_mallinfo_arena_bytes">>, #{}}, Values) > 0),
    ?assert(maps:get({<<"mallocinfo_arena_system_bytes">>, #{<<"arena">> => <<"0">>}}, Values) > 0),
    ?assert(maps:is_key({<<"mallocinfo_arena_in_use_bytes">>, #{<<"arena">> => <<"0">>}}, Values)),
    ?assertNot(has_prefix(Names, <<"mallocinfo_tracker_">>)),
    ?assertNot(has_prefix(Names, <<"mallocinfo_jemalloc_">>)),

    Status = ok_body(Config, "/heap_profile", "text/plain; charset=utf-8"),
    contains(Status, <<"allocator: glibc\ntracker: not preloaded\n">>),
    contains(Status, <<"LD_PRELOAD=/">>),
    NoDump = status(Config, "/heap_profile?trigger_dump=true", 409),
    contains(NoDump, <<"tracker is not preloaded">>),
    contains(status(Config, "/heap_profile?active=true", 409), <<"LD_PRELOAD=">>).

%% Anything but the parameters documented: 400 and one line saying why.
bad_requests(Config) ->
    BadQueries = ["/heap_profile?active=yes", "/heap_profile?active=", "/heap_profile?active",
                  "/heap_profile?active=TRUE", "/heap_profile?trigger_dump=false",
                  "/heap_profile?trigger_dump=1", "/heap_profile?trigger_dump",
                  "/heap_profile?foo=bar", "/heap_profile?active=true&trigger_dump=true",
                  "/heap_profile?active=true&active=true", "/heap_profile?%ff=1",
                  "/metrics?x=1", "/memory.json?pretty=1", "/mallocinfo.xml?a", "/?x=y"],
    lists:foreach(
      fun(Path) ->
              Body = status(Config, Path, 400),
              ?assertMatch({match, _}, re:run(Body, "\\A[^\n]+\n\\z"), {Path, Body})
      end, BadQueries),
    contains(status(Config, "/heap_profile?activ=true", 400), <<"\"activ\"">>),
    [status(Config, P, 404) || P <- ["/nope", "/heap_profile/", "/metrics.txt", "/memory.json/x"]].

methods(Config) ->
    lists:foreach(
      fun(Path) ->
              Url = url(Config, Path),
              [begin
                   {Code, Headers, Body} = request(M, R),
                   ?assertEqual({405, "GET"}, {Code, header("allow", Headers)}, {M, Path, Body})
               end || {M, R} <- [{post, {Url, [], "text/plain", "x"}},
                                  {put, {Url, [], "text/plain", "x"}},
                                  {patch, {Url, [], "text/plain", "x"}},
                                  {delete, {Url, []}}, {head, {Url, []}}, {trace, {Url, []}}]],
              %% httpd itself refuses methods it does not know before any
              %% module sees the request.
              {501, _, _} = request(options, {Url, []})
      end, ?ENDPOINTS),
    %% The profile is not triggered by another method either.
    {405, _, _} = request(post, {url(Config, "/heap_profile?trigger_dump=true"), [],
                                 "text/plain", ""}).

%%% The tracker, on a peer --------------------------------------------------------

tracker_endpoints(Config) ->
    ok = pcall(Config, mi_prof_nif, alloc, [100, 1000]),
    Json = mi_json_decode:decode(ok_body(Config, "/memory.json", "application/json")),
    ?assertMatch(#{<<"allocator">> := <<"glibc">>,
                   <<"tracker">> := #{<<"preloaded">> := true, <<"recording">> := true,
                                      <<"mode">> := <<"full">>}}, Json),
    {Names, Values} = metrics(Config),
    ?assert(has_prefix(Names, <<"mallocinfo_mallinfo_">>)),
    ?assert(maps:get({<<"mallocinfo_tracker_calls_total">>, #{<<"function">> => <<"malloc">>}},
                     Values) > 0),
    ?assert(maps:get({<<"mallocinfo_tracker_live_bytes">>, #{}}, Values) >= 100000),
    ?assertEqual(1, maps:get({<<"mallocinfo_tracker_mode">>, #{<<"mode">> => <<"full">>}}, Values)),
    ?assertEqual(1, maps:get({<<"mallocinfo_tracker_recording">>, #{}}, Values)),
    Status = ok_body(Config, "/heap_profile", "text/plain; charset=utf-8"),
    contains(Status, <<"tracker: preloaded, recording\ntracker.mode: full\ntracker.active: true\n">>),
    ok = pcall(Config, mi_prof_nif, release, []).

%% The tracker's live sites in gperftools' format, which both tools read.
tracker_profile(Config) ->
    ok = pcall(Config, mi_prof_nif, alloc, [1000, 100]),
    Profile = dump(Config),
    P = mi_heap_profile:parse(Profile),
    ?assertMatch(#{format := legacy}, P),
    ?assertEqual(maps:get(total, P), sums(P)),
    ?assert(has_record(P, 1000, 100000)),
    named_by(Config, "jeprof", "tracker.heap", Profile, 100000),
    named_by(Config, "google-pprof", "tracker.heap", Profile, 100000),
    ok = pcall(Config, mi_prof_nif, release, []),
    ?assertNot(has_record(mi_heap_profile:parse(dump(Config)), 1000, 100000)).

%% active=false keeps what was recorded and records nothing new; true
%% records again.
tracker_active(Config) ->
    ok = pcall(Config, mi_prof_nif, mark, [1, 300, 100]),
    Off = ok_body(Config, "/heap_profile?active=false", "text/plain; charset=utf-8"),
    contains(Off, <<"tracker.mode: counters\ntracker.active: false\n">>),
    ?assertMatch(#{mode := counters}, pcall(Config, mallocinfo_trace, status, [])),
    ok = pcall(Config, mi_prof_nif, mark, [2, 500, 100]),
    P1 = mi_heap_profile:parse(dump(Config)),
    ?assert(has_record(P1, 300, 30000)),
    ?assertNot(has_record(P1, 500, 50000)),
    %% Twice is the same as once.
    _ = ok_body(Config, "/heap_profile?active=false", "text/plain; charset=utf-8"),
    On = ok_body(Config, "/heap_profile?active=true", "text/plain; charset=utf-8"),
    contains(On, <<"tracker.mode: full\ntracker.active: true\n">>),
    ok = pcall(Config, mi_prof_nif, mark, [3, 700, 100]),
    P2 = mi_heap_profile:parse(dump(Config)),
    ?assert(has_record(P2, 300, 30000)),
    ?assert(has_record(P2, 700, 70000)),
    ok = pcall(Config, mi_prof_nif, release, []).

%%% jemalloc, on a peer ------------------------------------------------------------

jemalloc_endpoints(Config) ->
    contains(ok_body(Config, "/", "text/plain; charset=utf-8"), <<"allocator jemalloc">>),
    %% jemalloc's own JSON, as it prints it. jemalloc 5.3 repeats a few
    %% names in one object (opt.stats_print, nactive_huge), which JSON
    %% allows; the decoder keeps the last value, as most do.
    Json = mi_json_decode:decode(ok_body(Config, "/memory.json", "application/json"),
                                 #{duplicate_keys => last}),
    ?assertMatch(#{<<"jemalloc">> := #{<<"version">> := <<"5.3.0", _/binary>>,
                                       <<"stats">> := #{<<"allocated">> := _}}}, Json),
    {Names, Values} = metrics(Config),
    ?assertEqual(1, maps:get({<<"mallocinfo_allocator_info">>,
                              #{<<"allocator">> => <<"jemalloc">>}}, Values)),
    [?assert(maps:get({<<"mallocinfo_jemalloc_", K/binary, "_bytes">>, #{}}, Values) > 0)
     || K <- [<<"allocated">>, <<"active">>, <<"resident">>, <<"mapped">>, <<"metadata">>]],
    ?assert(maps:is_key({<<"mallocinfo_jemalloc_retained_bytes">>, #{}}, Values)),
    ?assertNot(has_prefix(Names, <<"mallocinfo_mallinfo_">>)),
    ?assertNot(has_prefix(Names, <<"mallocinfo_arena_">>)),
    contains(status(Config, "/mallocinfo.xml", 409), <<"jemalloc; see /memory.json">>),
    Status = ok_body(Config, "/heap_profile", "text/plain; charset=utf-8"),
    contains(Status, <<"allocator: jemalloc\nopt.prof: true\nprof.active: false\n"
                       "prof.thread_active_init: true\nopt.lg_prof_sample: 0\n">>),
    ?assertEqual(nomatch, binary:match(Status, <<"MALLOC_CONF">>)).

jemalloc_profile(Config) ->
    On = ok_body(Config, "/heap_profile?active=true", "text/plain; charset=utf-8"),
    contains(On, <<"prof.active: true\n">>),
    ok = pcall(Config, mi_prof_nif, alloc, [1000, 100]),
    Profile = dump(Config),
    P = mi_heap_profile:parse(Profile),
    ?assertMatch(#{format := heap_v2}, P),
    ?assertEqual(maps:get(total, P), sums(P)),
    %% 100 bytes is jemalloc's 112-byte size class.
    ?assert(has_record(P, 1000, 112000)),
    named_by(Config, "jeprof", "jemalloc.heap", Profile, 112000),
    Off = ok_body(Config, "/heap_profile?active=false", "text/plain; charset=utf-8"),
    contains(Off, <<"prof.active: false\n">>),
    ok = pcall(Config, mi_prof_nif, release, []).

%% 50 requests at once: every one gets its own complete profile, taken after
%% it was sent. Client I first allocates I blocks of 4000 bytes (jemalloc's
%% 4096 class) from a stack of its own (I frames deeper), so its profile
%% must hold a record of exactly I blocks and 4096 * I bytes: no stale
%% profile and none taken for another client before I's blocks existed.
concurrent_dumps(Config) ->
    _ = ok_body(Config, "/heap_profile?active=true", "text/plain; charset=utf-8"),
    Self = self(),
    {Micros, Results} =
        timer:tc(fun() ->
                         Clients = [spawn_link(
                                      fun() ->
                                              ok = pcall(Config, mi_prof_nif, mark, [I, I, 4000]),
                                              Self ! {self(), I, get(Config, "/heap_profile?trigger_dump=true")}
                                      end) || I <- lists:seq(1, 50)],
                         [receive {C, I, R} -> {I, R} end || C <- Clients]
                 end),
    Profiles = lists:map(
                 fun({I, {Code, Headers, Body}}) ->
                         ?assertEqual({200, "application/octet-stream"},
                                      {Code, header("content-type", Headers)}, {I, Body}),
                         P = mi_heap_profile:parse(Body),
                         ?assertEqual(maps:get(total, P), sums(P), I),
                         ?assert(has_record(P, I, 4096 * I), I),
                         Body
                 end, Results),
    %% Reported, not asserted: two dumps of the same heap state are the
    %% same bytes, which says nothing about where they came from.
    ct:pal("50 concurrent dumps in ~p ms: ~p distinct bodies, sizes ~p..~p bytes",
           [Micros div 1000, length(lists:usort(Profiles)),
            lists:min([byte_size(B) || B <- Profiles]),
            lists:max([byte_size(B) || B <- Profiles])]),
    %% Each dump went through a private directory of its own, removed
    %% before the answer.
    ?assertEqual({ok, []}, file:list_dir(?config(tmp, Config))),
    named_by(Config, "jeprof", "concurrent.heap", hd(Profiles), any),
    _ = ok_body(Config, "/heap_profile?active=false", "text/plain; charset=utf-8"),
    ok = pcall(Config, mi_prof_nif, release, []).

%% jemalloc without prof:true: say so and how to fix it; never 200 for a
%% dump, never "No such file or directory".
jemalloc_profiling_disabled(Config) ->
    Status = ok_body(Config, "/heap_profile", "text/plain; charset=utf-8"),
    contains(Status, <<"allocator: jemalloc\nopt.prof: false\nprof.active: false\n">>),
    contains(Status, <<"MALLOC_CONF=\"prof:true,prof_active:false\"">>),
    Dump = status(Config, "/heap_profile?trigger_dump=true", 409),
    contains(Dump, <<"heap profiling is disabled">>),
    contains(Dump, <<"MALLOC_CONF=\"prof:true,prof_active:false\"">>),
    ?assertEqual(nomatch, binary:match(Dump, <<"No such file">>)),
    contains(status(Config, "/heap_profile?active=true", 409), <<"MALLOC_CONF">>),
    ?assertEqual({ok, []}, file:list_dir(?config(tmp, Config))).

%%% tcmalloc, on a peer ------------------------------------------------------------

tcmalloc_endpoints(Config) ->
    Json = mi_json_decode:decode(ok_body(Config, "/memory.json", "application/json")),
    ?assertMatch(#{<<"allocator">> := <<"tcmalloc">>, <<"tracker">> := #{<<"preloaded">> := false}},
                 Json),
    contains(maps:get(<<"tcmalloc_stats">>, Json), <<"MALLOC:">>),
    {Names, Values} = metrics(Config),
    ?assertEqual(1, maps:get({<<"mallocinfo_allocator_info">>,
                              #{<<"allocator">> => <<"tcmalloc">>}}, Values)),
    ?assertNot(has_prefix(Names, <<"mallocinfo_mallinfo_">>)),
    contains(status(Config, "/mallocinfo.xml", 409), <<"tcmalloc">>),
    contains(ok_body(Config, "/heap_profile", "text/plain; charset=utf-8"),
             <<"allocator: tcmalloc\nheap_profiler.running: false\n">>),
    contains(status(Config, "/heap_profile?trigger_dump=true", 409), <<"?active=true">>),

    On = ok_body(Config, "/heap_profile?active=true", "text/plain; charset=utf-8"),
    contains(On, <<"heap_profiler.running: true\n">>),
    %% The profiler's own files go to a fresh private directory.
    {ok, [Dir]} = file:list_dir(?config(tmp, Config)),
    {ok, Info} = file:read_file_info(filename:join(?config(tmp, Config), Dir)),
    ?assertEqual(8#700, element(8, Info) band 8#777),
    ok = pcall(Config, mi_prof_nif, alloc, [1000, 100]),
    Profile = dump(Config),
    P = mi_heap_profile:parse(Profile),
    ?assertMatch(#{format := legacy}, P),
    ?assert(has_record(P, 1000, 100000)),
    named_by(Config, "google-pprof", "tcmalloc.heap", Profile, 100000),
    Off = ok_body(Config, "/heap_profile?active=false", "text/plain; charset=utf-8"),
    contains(Off, <<"heap_profiler.running: false\n">>),
    ?assertEqual({ok, []}, file:list_dir(?config(tmp, Config))),
    ok = pcall(Config, mi_prof_nif, release, []).
