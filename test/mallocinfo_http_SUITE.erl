%% The HTTP endpoint over real sockets (httpc), on this node (glibc) and on
%% peer nodes started with the tracker, jemalloc (with and without
%% profiling) and tcmalloc preloaded. Profiles are checked with a reader of
%% their formats (mi_heap_profile) and with the real tools: jeprof and
%% google-pprof must name the allocating function of a test NIF.
%%
%% The limits and the methods are driven over raw gen_tcp sockets on
%% loopback, to send what httpc never would (half a request line, a
%% trickle, HTTP/1.0) and to see exactly when the server answers or closes.
%% Nothing waits for a time to pass and then asserts: every test waits for
%% an event (a response, a close) that can only come from the limit under
%% test, with the other limits set out of its way.
-module(mallocinfo_http_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, init_per_suite/1, end_per_suite/1, init_per_group/2,
         end_per_group/2, init_per_testcase/2, end_per_testcase/2]).
-export([start_stop/1, stop_all/1, loopback_only/1, glibc_endpoints/1, bad_requests/1,
         methods/1, uri_limit/1, header_limit/1, body_limit/1, max_clients/1,
         requests_per_connection/1, keep_alive_timeout/1, minimum_rate/1, inets_errors/1,
         tracker_endpoints/1, tracker_profile/1, tracker_active/1,
         jemalloc_endpoints/1, jemalloc_profile/1, concurrent_dumps/1,
         jemalloc_profiling_disabled/1, tcmalloc_endpoints/1]).

-define(HTTPC, mallocinfo_http_SUITE).
-define(JEMALLOC, "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2").
-define(TCMALLOC, "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4").
-define(PROF_CONF, "prof:true,prof_active:false,lg_prof_sample:0").
-define(ENDPOINTS, ["/", "/memory.json", "/mallocinfo.xml", "/heap_profile", "/metrics"]).
%% How long a raw-socket test waits for the response or close it expects:
%% only a failure ever waits this long.
-define(WAIT, 60000).

all() ->
    [{group, glibc}, {group, tracker}, {group, jemalloc}, {group, jemalloc_no_prof},
     {group, tcmalloc}].

groups() ->
    [{glibc, [], [start_stop, stop_all, loopback_only, glibc_endpoints, bad_requests, methods,
                  uri_limit, header_limit, body_limit, max_clients, requests_per_connection,
                  keep_alive_timeout, minimum_rate, inets_errors]},
     {tracker, [], [tracker_endpoints, tracker_profile, tracker_active]},
     {jemalloc, [], [jemalloc_endpoints, jemalloc_profile, concurrent_dumps]},
     {jemalloc_no_prof, [], [jemalloc_profiling_disabled]},
     {tcmalloc, [], [tcmalloc_endpoints]}].

init_per_suite(Config) ->
    ok = mi_ct:build_nif(Config, "mi_prof_nif"),
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
    {ok, #{port := Port}} = peer:call(Peer, mallocinfo_http, start, [group_http_opts(Group)]),
    [{peer, Peer}, {port, Port}, {tmp, Tmp} | Config].

group_env(tracker) -> mallocinfo_trace:preload_env();
group_env(jemalloc) -> [{"LD_PRELOAD", ?JEMALLOC}, {"MALLOC_CONF", ?PROF_CONF}];
group_env(jemalloc_no_prof) -> [{"LD_PRELOAD", ?JEMALLOC}];
group_env(tcmalloc) -> [{"LD_PRELOAD", ?TCMALLOC}].

%% concurrent_dumps sends 50 requests at once: more than the default 32
%% connections.
group_http_opts(jemalloc) -> #{max_clients => 64};
group_http_opts(_) -> #{}.

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

%% Raw HTTP over gen_tcp on loopback.
connect(Config) ->
    connect(Config, []).

connect(Config, Opts) ->
    {ok, S} = gen_tcp:connect({127, 0, 0, 1}, ?config(port, Config),
                              [binary, {active, false}, {packet, raw} | Opts], 5000),
    S.

%% A request as text; Host for HTTP/1.1, Content-Length when there is a body.
request(Method, Path, Version, Headers, Body) ->
    Host = [{"Host", "127.0.0.1"} || Version =:= "HTTP/1.1"],
    Length = [{"Content-Length", integer_to_list(iolist_size(Body))} || Body =/= ""],
    [Method, $\s, Path, $\s, Version, "\r\n",
     [[Name, ": ", Value, "\r\n"] || {Name, Value} <- Host ++ Headers ++ Length], "\r\n", Body].

%% One request on a connection of its own: the response.
raw(Config, Request) ->
    S = connect(Config),
    Response = exchange(S, Request),
    ok = gen_tcp:close(S),
    Response.

exchange(S, Request) ->
    ok = gen_tcp:send(S, Request),
    case response(S) of
        closed -> ct:fail({closed_without_response, iolist_to_binary(Request)});
        Response -> Response
    end.

%% The next response on S, `{Code, Headers, Body}' with lower-case header
%% names, or `closed' when the server closes the connection instead.
response(S) ->
    ok = inet:setopts(S, [{packet, http_bin}]),
    case gen_tcp:recv(S, 0, ?WAIT) of
        {ok, {http_response, _, Code, _}} ->
            Headers = response_headers(S, []),
            ok = inet:setopts(S, [{packet, raw}]),
            Body = case list_to_integer(proplists:get_value("content-length", Headers, "0")) of
                       0 -> <<>>;
                       Length -> {ok, B} = gen_tcp:recv(S, Length, ?WAIT), B
                   end,
            {Code, Headers, Body};
        {error, closed} ->
            closed;
        Other ->
            ct:fail({no_response, Other})
    end.

response_headers(S, Acc) ->
    case gen_tcp:recv(S, 0, ?WAIT) of
        {ok, {http_header, _, Field, _, Value}} ->
            Name = string:lowercase(case Field of
                                        F when is_atom(F) -> atom_to_list(F);
                                        F -> binary_to_list(F)
                                    end),
            response_headers(S, [{Name, binary_to_list(Value)} | Acc]);
        {ok, http_eoh} ->
            lists:reverse(Acc)
    end.

%% Exactly one Cache-Control, no-store.
no_store(Headers) ->
    ?assertEqual(["no-store"], [V || {"cache-control", V} <- Headers], Headers).

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
           #{ip => {127, 0, 0}}, #{ip => {256, 0, 0, 1}}, #{bogus => 1}, [{port, 0}], port,
           #{max_clients => 0}, #{max_clients => -1}, #{max_clients => 1.0},
           #{max_header_size => "8k"}, #{max_header_size => 0},
           #{keep_alive_timeout => 0}, #{keep_alive_timeout => 86401},
           #{keep_alive_timeout => 1.5}, #{keep_alive_timeout => infinity},
           #{max_requests_per_connection => 0}, #{max_requests_per_connection => infinity},
           #{minimum_bytes_per_second => 0}, #{minimum_bytes_per_second => true},
           #{max_uri_size => 4096}, #{max_body_size => 1}],
    [?assertError(badarg, mallocinfo_http:start(B)) || B <- Bad],
    %% Every limit at its smallest and largest accepted value.
    {ok, #{port := P3}} = mallocinfo_http:start(#{max_clients => 1, max_header_size => 1,
                                                  keep_alive_timeout => 86400,
                                                  max_requests_per_connection => 1,
                                                  minimum_bytes_per_second => false}),
    ok = mallocinfo_http:stop(P3),
    {ok, #{port := P4}} = mallocinfo_http:start(#{keep_alive_timeout => 1,
                                                  minimum_bytes_per_second => 1}),
    ok = mallocinfo_http:stop(P4),
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
    ?assertMatch(#{heaps := [_ | _]}, mallocinfo_glibc_parse:heaps(Xml)),

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

%% Every method but GET, over HTTP/1.0 as over HTTP/1.1: 405 with
%% `Allow: GET' and no body for HEAD. (inets rewrote a 405 to an HTTP/1.0
%% request into 403 Forbidden.) Methods inets does not take are refused by
%% inets before any module sees them: 501, still with no-store. TRACE is
%% one of those over HTTP/1.0, which has no TRACE, and OPTIONS up to OTP
%% 27's inets (OTP 29's passes it on, so it gets the 405): which methods
%% inets takes is asked of its own request validator.
methods(Config) ->
    WithBody = ["POST", "PUT", "PATCH"],
    lists:foreach(
      fun({Path, Version}) ->
              {Allowed, Refused} =
                  lists:partition(fun(M) -> inets_takes(M, Version) end,
                                  ["POST", "PUT", "PATCH", "DELETE", "HEAD", "TRACE", "OPTIONS",
                                   "CONNECT", "FOO"]),
              %% What every inets takes, and what none does.
              ?assertEqual([], ["POST", "PUT", "PATCH", "DELETE", "HEAD"] -- Allowed),
              ?assertEqual([], ["CONNECT", "FOO"] -- Refused),
              ?assertEqual(Version =:= "HTTP/1.1", lists:member("TRACE", Allowed)),
              [begin
                   Body = case lists:member(M, WithBody) of
                              true -> "x";
                              false -> ""
                          end,
                   {Code, Headers, Got} = raw(Config, request(M, Path, Version, [], Body)),
                   ?assertEqual({405, "GET"}, {Code, header("allow", Headers)},
                                {M, Path, Version, Got}),
                   no_store(Headers),
                   case M of
                       "HEAD" -> ?assertEqual(<<>>, Got);
                       _ -> contains(Got, <<"GET only">>)
                   end
               end || M <- Allowed],
              [begin
                   {Code, Headers, _} = raw(Config, request(M, Path, Version, [], "")),
                   ?assertEqual(501, Code, {M, Path, Version}),
                   no_store(Headers)
               end || M <- Refused],
              %% And GET is served over both.
              {200, _, _} = raw(Config, request("GET", "/", Version, [], ""))
      end, [{P, V} || P <- ?ENDPOINTS, V <- ["HTTP/1.0", "HTTP/1.1"]]),
    %% The profile is not triggered by another method either.
    {405, _, _} = request(post, {url(Config, "/heap_profile?trigger_dump=true"), [],
                                 "text/plain", ""}).

%% The request line is cut at 1024 bytes of URI: one more and the answer
%% is 414 without waiting for the line to end, so a 1 MB query costs the
%% server 1 KB, not the 280 MB and 22 s it took inets without a limit.
uri_limit(Config) ->
    %% At the limit: parsed and routed (no such endpoint).
    AtLimit = "/" ++ lists:duplicate(1023, $a),
    {404, H1, _} = raw(Config, request("GET", AtLimit, "HTTP/1.1", [], "")),
    no_store(H1),
    %% One byte over, and nothing after it: answered at once.
    S = connect(Config),
    ok = gen_tcp:send(S, ["GET /", lists:duplicate(1024, $a)]),
    {414, H2, _} = response(S),
    no_store(H2),
    ?assertEqual(closed, response(S)),
    %% A 1 MB query sent as fast as the socket takes it, with a small send
    %% buffer so that the kernel holds little of it: the server answers
    %% (as above) and closes, which fails the client's sends long before
    %% the megabyte is out. (The 414 is not read here: the reset that
    %% follows the close may discard it in the client's socket.)
    Q = connect(Config, [{sndbuf, 16384}]),
    ok = gen_tcp:send(Q, "GET /?"),
    Sent = send_until_closed(Q, 1 bsl 20, 0),
    ct:pal("1 MB query: the server closed after the client had sent ~b bytes", [Sent]),
    ?assert(Sent < 1 bsl 20),
    _ = gen_tcp:close(Q).

%% Up to 1 MiB in 8 KiB pieces; the bytes sent before the socket failed.
send_until_closed(_S, Left, Sent) when Left =< 0 ->
    Sent;
send_until_closed(S, Left, Sent) ->
    case gen_tcp:send(S, binary:copy(<<"a">>, 8192)) of
        ok -> send_until_closed(S, Left - 8192, Sent + 8192);
        {error, _} -> Sent
    end.

%% Headers are cut at max_header_size (8192 by default): 413 before the
%% head ends. Over HTTP/1.0 inets sends its own 413 as 403 (it maps every
%% 4xx above 404 to 403 for HTTP/1.0, and this reply is not ours to write).
%% A server started with a larger limit takes the larger headers.
header_limit(Config) ->
    Big = fun(N) -> [{"X-Big", lists:duplicate(N, $a)}] end,
    {200, _, _} = raw(Config, request("GET", "/", "HTTP/1.1", Big(4000), "")),
    [begin
         S = connect(Config),
         ok = gen_tcp:send(S, ["GET / ", Version, "\r\nHost: x\r\nX-Big: ",
                               lists:duplicate(8200, $a)]),
         {Code, Headers, _} = response(S),
         ?assertEqual(Expected, Code, Version),
         no_store(Headers),
         ?assertEqual(closed, response(S))
     end || {Version, Expected} <- [{"HTTP/1.1", 413}, {"HTTP/1.0", 403}]],
    {ok, #{port := Port}} = mallocinfo_http:start(#{max_header_size => 16384}),
    {200, _, _} = raw([{port, Port}], request("GET", "/", "HTTP/1.1", Big(12000), "")),
    {413, _, _} = raw([{port, Port}], request("GET", "/", "HTTP/1.1", Big(17000), "")).

%% No endpoint takes a body: one over 1024 bytes is refused (413) on its
%% Content-Length alone, before it is sent; a small one is read and the
%% method refused.
body_limit(Config) ->
    S = connect(Config),
    ok = gen_tcp:send(S, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1025\r\n\r\n"),
    {413, H1, _} = response(S),
    no_store(H1),
    ?assertEqual(closed, response(S)),
    {405, _, _} = raw(Config, request("POST", "/", "HTTP/1.1", [],
                                      lists:duplicate(1024, $x))).

%% max_clients connections at once: the next one is answered 503 (with
%% no-store) while those already open are still served; when one closes,
%% a new connection is served again.
max_clients(_Config) ->
    {ok, #{port := Port}} = mallocinfo_http:start(#{max_clients => 2,
                                                    keep_alive_timeout => 3600,
                                                    minimum_bytes_per_second => false}),
    C = [{port, Port}],
    %% Two connections, each holding its slot (a served request proves
    %% its handler exists).
    [A, B] = [connect(C) || _ <- [1, 2]],
    [{200, _, _} = exchange(S, request("GET", "/", "HTTP/1.1", [], "")) || S <- [A, B]],
    Third = connect(C),
    {503, H, _} = exchange(Third, request("GET", "/", "HTTP/1.1", [], "")),
    no_store(H),
    ?assertEqual(closed, response(Third)),
    [{200, _, _} = exchange(S, request("GET", "/", "HTTP/1.1", [], "")) || S <- [A, B]],
    %% A slot frees when its connection's handler has gone, which follows
    %% the close by a moment: retry until served.
    ok = gen_tcp:close(A),
    ?assertEqual(200, served_again(C, 500)),
    ok = gen_tcp:close(B).

served_again(C, 0) ->
    element(1, raw(C, request("GET", "/", "HTTP/1.1", [], "")));
served_again(C, Tries) ->
    case raw(C, request("GET", "/", "HTTP/1.1", [], "")) of
        {503, _, _} -> timer:sleep(10), served_again(C, Tries - 1);
        {Code, _, _} -> Code
    end.

%% max_requests_per_connection requests on one connection, then the server
%% closes it: 100 by default (inets' own max_keep_alive_request N would
%% serve N + 1); 1 means no keep-alive, said with `Connection: close'.
requests_per_connection(_Config) ->
    lists:foreach(
      fun({Opts, N}) ->
              {ok, #{port := Port}} =
                  mallocinfo_http:start(Opts#{minimum_bytes_per_second => false}),
              S = connect([{port, Port}]),
              %% Without keep-alive every response says it closes; with
              %% it, none does (inets decides after the response).
              Connection = case N of
                               1 -> "close";
                               _ -> undefined
                           end,
              [begin
                   {404, H, _} = exchange(S, request("GET", "/x", "HTTP/1.1", [], "")),
                   ?assertEqual(Connection, header("connection", H), I)
               end || I <- lists:seq(1, N)],
              ?assertEqual(closed, response(S)),
              ok = mallocinfo_http:stop(Port)
      end, [{#{}, 100}, {#{max_requests_per_connection => 3}, 3},
            {#{max_requests_per_connection => 1}, 1}]).

%% keep_alive_timeout: an idle connection is closed after it, and a
%% request head must be complete within it: one left unfinished is
%% answered 408 at the deadline. On inets 8 (OTP 25) data that
%% trickles in (a byte every 100 ms, a header that would take minutes to
%% end) does not move the deadline either; later inets re-arms it at every
%% packet, so there only minimum_bytes_per_second ends a trickle (off
%% here: with a 3 s deadline the connection is still open after 6 s).
keep_alive_timeout(_Config) ->
    {ok, #{port := Port}} = mallocinfo_http:start(#{keep_alive_timeout => 1,
                                                    minimum_bytes_per_second => false}),
    C = [{port, Port}],
    Idle = connect(C),
    {200, _, _} = exchange(Idle, request("GET", "/", "HTTP/1.1", [], "")),
    ?assertEqual(closed, response(Idle)),
    Partial = connect(C),
    ok = gen_tcp:send(Partial, "GET / HTTP/1.1\r\nHost: x\r\n"),
    {408, H1, _} = response(Partial),
    no_store(H1),
    ?assertEqual(closed, response(Partial)),
    case split_deadlines() of
        false ->
            Slow = connect(C),
            ok = gen_tcp:send(Slow, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "),
            Trickle = spawn_link(fun() -> trickle(Slow, 100) end),
            {408, H2, _} = response(Slow),
            no_store(H2),
            unlink(Trickle),
            exit(Trickle, kill),
            ok = gen_tcp:close(Slow);
        true ->
            %% A deadline of 3 s against a byte every 100 ms: the trickle
            %% would have to stall for 3 s to be cut, on a busy machine too.
            {ok, #{port := Port3}} =
                mallocinfo_http:start(#{keep_alive_timeout => 3, minimum_bytes_per_second => false}),
            Slow = connect([{port, Port3}]),
            ok = gen_tcp:send(Slow, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "),
            Trickle = spawn_link(fun() -> trickle(Slow, 100) end),
            ?assertEqual({error, timeout}, gen_tcp:recv(Slow, 0, 6000)),
            unlink(Trickle),
            exit(Trickle, kill),
            ok = gen_tcp:close(Slow),
            ok = mallocinfo_http:stop(Port3)
    end.

%% minimum_bytes_per_second: a client sending slower than that is
%% disconnected (OTP 25's inets 8 closes without a reply, later ones answer
%% 408 first), here with keep_alive_timeout an hour away so that only the
%% rate can end it. A client at full speed on the same server is served.
minimum_rate(_Config) ->
    {ok, #{port := Port}} = mallocinfo_http:start(#{minimum_bytes_per_second => 1000,
                                                    keep_alive_timeout => 3600}),
    C = [{port, Port}],
    {200, _, _} = raw(C, request("GET", "/", "HTTP/1.1", [], "")),
    Slow = connect(C),
    ok = gen_tcp:send(Slow, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "),
    %% 10 bytes a second, for an hour if need be.
    Trickle = spawn_link(fun() -> trickle(Slow, 100) end),
    case split_deadlines() of
        false -> ok;
        true -> {408, _, _} = response(Slow)
    end,
    ?assertEqual(closed, response(Slow)),
    unlink(Trickle),
    exit(Trickle, kill),
    ok = gen_tcp:close(Slow).

%% Whether this inets has request_timeout, which mallocinfo_http sets
%% beside keep_alive_timeout (it tells the same way).
split_deadlines() ->
    {module, _} = code:ensure_loaded(httpd_request_handler),
    lists:member({get_request_timeout, 1}, httpd_request_handler:module_info(functions)).

%% Whether inets passes a request with this method on to the modules.
inets_takes(Method, Version) ->
    case httpd_request:validate(Method, "/", Version) of
        {ok, _} -> true;
        {error, {not_supported, _}} -> false
    end.

%% A byte every Ms until the socket fails.
trickle(S, Ms) ->
    timer:sleep(Ms),
    case gen_tcp:send(S, "a") of
        ok -> trickle(S, Ms);
        {error, _} -> ok
    end.

%% inets' own replies to requests it refuses before any module sees them
%% carry no-store too (the customize callback's default headers).
inets_errors(Config) ->
    lists:foreach(
      fun({Request, Code}) ->
              {Got, Headers, _} = raw(Config, Request),
              ?assertEqual(Code, Got, Request),
              no_store(Headers)
      end,
      [{"GET / HTTP/1.1\r\n\r\n", 400},               % no Host
       {"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 400},    % a version it does not speak
       {"GET /\r\n\r\n", 505},                        % HTTP/0.9
       %% OPTIONS reaches the modules from OTP 29's inets on, and * is no
       %% endpoint of ours.
       {"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
        case inets_takes("OPTIONS", "HTTP/1.1") of true -> 404; false -> 501 end},
       {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501}]).

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
    named_by(Config, mi_ct:pprof(), "tracker.heap", Profile, 100000),
    ok = pcall(Config, mi_prof_nif, release, []),
    ?assertNot(has_record(mi_heap_profile:parse(dump(Config)), 1000, 100000)).

%% active=false is counters mode: it forgets what was recorded (counters
%% mode keeps no table, so it could not see those blocks freed) and records
%% nothing new; true records again, from an empty table.
tracker_active(Config) ->
    ok = pcall(Config, mi_prof_nif, mark, [1, 300, 100]),
    Off = ok_body(Config, "/heap_profile?active=false", "text/plain; charset=utf-8"),
    contains(Off, <<"tracker.mode: counters\ntracker.active: false\n">>),
    ?assertMatch(#{mode := counters}, pcall(Config, mallocinfo_trace, status, [])),
    ok = pcall(Config, mi_prof_nif, mark, [2, 500, 100]),
    P1 = mi_heap_profile:parse(dump(Config)),
    ?assertNot(has_record(P1, 300, 30000)),
    ?assertNot(has_record(P1, 500, 50000)),
    %% Twice is the same as once.
    _ = ok_body(Config, "/heap_profile?active=false", "text/plain; charset=utf-8"),
    On = ok_body(Config, "/heap_profile?active=true", "text/plain; charset=utf-8"),
    contains(On, <<"tracker.mode: full\ntracker.active: true\n">>),
    ok = pcall(Config, mi_prof_nif, mark, [3, 700, 100]),
    P2 = mi_heap_profile:parse(dump(Config)),
    ?assertNot(has_record(P2, 300, 30000)),
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
    %% Its version as jemalloc prints it ("5.3.0-0-g54eaed1d..." on Debian
    %% 12 and 13, "5.3.1-..." on unstable).
    #{<<"jemalloc">> := #{<<"version">> := Version, <<"stats">> := #{<<"allocated">> := _}}} = Json,
    ?assertMatch({match, _}, re:run(Version, "\\A5\\.[0-9]+\\.[0-9]+-[0-9]+-g[0-9a-f]{40}\\z"), Version),
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
    named_by(Config, mi_ct:pprof(), "tcmalloc.heap", Profile, 100000),
    Off = ok_body(Config, "/heap_profile?active=false", "text/plain; charset=utf-8"),
    contains(Off, <<"heap_profiler.running: false\n">>),
    ?assertEqual({ok, []}, file:list_dir(?config(tmp, Config))),
    ok = pcall(Config, mi_prof_nif, release, []).
