%% @doc An HTTP endpoint for operators and Prometheus, on OTP's own inets
%% httpd (no dependencies): allocator statistics as JSON, glibc's XML, heap
%% profiling switched on and off and dumped on demand, and metrics.
%%
%% ```
%% GET /                 what is served here
%% GET /memory.json      the active allocator's statistics as JSON
%% GET /mallocinfo.xml   glibc's malloc_info XML
%% GET /heap_profile     profiling status; ?active=true|false switches it,
%%                       ?trigger_dump=true returns a profile for jeprof/pprof
%% GET /metrics          Prometheus text exposition (mallocinfo_prom)
%% GET /debug/pprof/heap  the tracker's live heap as a gzipped pprof profile
%%                        (Go's path: go tool pprof, Pyroscope, Parca);
%%                        ?seconds=N (1..60) a delta over the next N seconds
%% GET /debug/pprof/allocs  the same profile, alloc_space its default sample
%%                        type (Go's path); ?seconds=N the difference of two
%%                        cumulative profiles N seconds apart
%% GET /heap.folded       the same as collapsed stacks (flamegraph.pl, speedscope)
%% GET /flamegraph.html   a self-contained flame graph page of the live heap
%%                        (?view=stack|function|object, ?search=Text)
%% GET /report.txt        mallocinfo:report()'s text
%% GET /timeline.json     the sampler's history (mallocinfo:watch/0): every
%%                        layer over time, what grows, its culprits
%% GET /timeline.html     the same as a self-contained page: RSS by layer
%%                        as a stacked chart, the verdicts, each part's rate
%% '''
%%
%% The server binds to 127.0.0.1 unless an address is given explicitly, and
%% answers GET only (other methods: 405 with `Allow: GET', over HTTP/1.0
%% as over 1.1). A parameter it does not know, or a value it does not take,
%% is a 400 with a one-line reason; a request the node cannot serve in its
%% present state (profiling not enabled, no tracker, another allocator than
%% glibc for the XML) is a 409 that says what to do; a failure is a 500.
%% Every response, inets' own error replies included, is
%% `Cache-Control: no-store': statistics are read when asked for.
%%
%% Requests are bounded before they cost anything: URI, headers and body
%% sizes, connections at once, requests per connection, the time a request
%% head may take and the rate a client must keep (see start/1).
%%
%% This module is also the httpd callback module (`do/1') and its
%% `customize' module (the default response headers); it keeps no state of
%% its own: the servers are inets' httpd instances, found again through
%% inets by their callback module.
-module(mallocinfo_http).

-behaviour(httpd_custom_api).

-include_lib("inets/include/httpd.hrl").

-export([start/0, start/1, stop/0, stop/1]).
-export([do/1]).
-export([response_default_headers/0, response_header/1, request_header/1]).

-export_type([opts/0]).

-type opts() :: #{port => inet:port_number(),
                  ip => inet:ip_address(),
                  max_clients => pos_integer(),
                  max_header_size => pos_integer(),
                  keep_alive_timeout => 1..86400,
                  max_requests_per_connection => pos_integer(),
                  minimum_bytes_per_second => pos_integer() | false}.

-define(LOOPBACK, {127, 0, 0, 1}).
%% The limits an operator may change, and their defaults (doc/http.md, "HTTP
%% endpoint", says why each).
-define(LIMITS, #{max_clients => 32,
                  max_header_size => 8192,
                  keep_alive_timeout => 10,
                  max_requests_per_connection => 100,
                  minimum_bytes_per_second => 100}).
%% Fixed: the longest fixed URI served is /heap_profile?trigger_dump=true
%% (a /flamegraph.html?search= text past ~1000 bytes gets the 414), and no
%% request needs a body.
-define(MAX_URI_SIZE, 1024).
-define(MAX_BODY_SIZE, 1024).
-define(TEXT, "text/plain; charset=utf-8").
%% The longest ?seconds= of /debug/pprof/heap: the request waits that long.
-define(MAX_DELTA_SECONDS, 60).
-define(MALLOC_CONF_HINT,
        "Restart the node with MALLOC_CONF=\"prof:true,prof_active:false\" in its environment "
        "(jemalloc reads it at start only), then GET /heap_profile?active=true.").

%% @equiv start(#{})
-spec start() -> {ok, #{port := inet:port_number(), ip := inet:ip_address()}}
               | {error, term()}.
start() ->
    start(#{}).

%% @doc Starts a server. `port' (default 0: the system picks a free one,
%% returned in the result) and `ip' (default `{127, 0, 0, 1}'; an IPv6
%% tuple binds an IPv6 socket). Binding to anything but a loopback address
%% exposes every endpoint, heap profiles included, to whoever can reach it:
%% it is never done unless asked for. Several servers may run on different
%% ports.
%%
%% Limits, each a positive integer: `max_clients' (32) connections at
%% once, the next one is answered 503; `max_header_size' (8192) bytes of
%% request headers, more is a 413; `keep_alive_timeout' (10, at most
%% 86400) seconds a connection may take to send a whole request head, and
%% may stay idle between requests (OTP 27's inets and later count the head
%% from each packet instead, and have no deadline before the first byte
%% without keep-alive: doc/http.md); `max_requests_per_connection' (100),
%% then the server closes it (1: no keep-alive); `minimum_bytes_per_second'
%% (100, or `false' for no minimum): a connection that sent fewer than 3
%% times that in its first 3 seconds, or fewer than that in any second
%% after, is closed (idle keep-alive connections included). The URI is
%% limited to 1024 bytes (414) and a request body to 1024 (413).
%%
%% Errors: `{error, eaddrinuse | eaddrnotavail | eacces | ...}' for the
%% socket, `{error, {missing_application, inets}}' when inets is neither in
%% the release nor in the OTP installation the node runs from. An unknown
%% option, or a value outside the types above, raises `badarg'.
-spec start(opts()) -> {ok, #{port := inet:port_number(), ip := inet:ip_address()}}
                     | {error, term()}.
start(Opts) when is_map(Opts) ->
    case maps:keys(Opts) -- [port, ip | maps:keys(?LIMITS)] of
        [] -> ok;
        _ -> erlang:error(badarg, [Opts])
    end,
    Port = maps:get(port, Opts, 0),
    Ip = maps:get(ip, Opts, ?LOOPBACK),
    Limits = maps:merge(?LIMITS, maps:with(maps:keys(?LIMITS), Opts)),
    is_integer(Port) andalso Port >= 0 andalso Port =< 65535 andalso inet:is_ip_address(Ip)
        andalso lists:all(fun valid_limit/1, maps:to_list(Limits))
        orelse erlang:error(badarg, [Opts]),
    case mallocinfo_lib:ensure_app(inets) of
        ok -> start_httpd(Port, Ip, Limits);
        {error, _} = E -> E
    end;
start(Opts) ->
    erlang:error(badarg, [Opts]).

valid_limit({minimum_bytes_per_second, false}) ->
    true;
%% inets arms a timer of this many seconds times 1000, which must fit in
%% erlang:send_after/3's 32 bits of milliseconds.
valid_limit({keep_alive_timeout, S}) ->
    is_integer(S) andalso S >= 1 andalso S =< 86400;
valid_limit({_, N}) ->
    is_integer(N) andalso N >= 1.

start_httpd(Port, Ip, Limits) ->
    %% httpd wants both roots to be existing directories; nothing is ever
    %% served from them (this module answers every request).
    Root = filename:dirname(mallocinfo_nif:so_path()),
    Conf = [{port, Port},
            {bind_address, Ip},
            {ipfamily, case tuple_size(Ip) of 4 -> inet; 8 -> inet6 end},
            {server_name, "mallocinfo"},
            {server_root, Root},
            {document_root, Root},
            {modules, [?MODULE]},
            %% inets' own replies (413, 414, 503, ...) get their default
            %% headers from response_default_headers/0.
            {customize, ?MODULE}
            | limits_conf(Limits)],
    case inets:start(httpd, Conf) of
        {ok, Pid} ->
            [{port, Actual}] = httpd:info(Pid, [port]),
            {ok, #{port => Actual, ip => Ip}};
        {error, {already_started, _}} ->
            %% An httpd instance holds this address and port already.
            {error, eaddrinuse};
        {error, Reason} ->
            %% A socket error comes back as {listen, Posix}, alone or deep
            %% in a supervisor's shutdown reason.
            case listen_error(Reason) of
                undefined -> {error, Reason};
                Posix -> {error, Posix}
            end
    end.

%% The limits as inets' httpd options.
limits_conf(Limits) ->
    limits_conf(Limits, request_timeout_option()).

limits_conf(#{max_clients := Clients, max_header_size := Header, keep_alive_timeout := Timeout,
              max_requests_per_connection := Requests, minimum_bytes_per_second := Rate},
            RequestTimeout) ->
    [%% inets stops reading a request line at this many URI bytes (414),
     %% headers at max_header_size (413), before the end of either: its
     %% parser keeps them as lists, 16 bytes a character, so without a
     %% limit a 1 MB query took 17 s and 340 MB of peak RSS.
     {max_uri_size, ?MAX_URI_SIZE},
     {max_header_size, Header},
     %% Only GET is served: a request body is never needed, and a larger
     %% one is refused (413) before it is read.
     {max_body_size, ?MAX_BODY_SIZE},
     {max_clients, Clients},
     {minimum_bytes_per_second, Rate}
     | timeouts_conf(Timeout, Requests, RequestTimeout)].

%% inets 8 (OTP 25) has one deadline, keep_alive_timeout: for a
%% request head, from the connection's start or the previous response;
%% data that trickles in does not move it. Later inets (9.3 on OTP 27,
%% 9.8 on OTP 29) split it: keep_alive_timeout until a request's first
%% byte, then request_timeout until its end, re-armed by every packet (a
%% trickle is ended by minimum_bytes_per_second alone), and it refuses a
%% keep_alive_timeout beside {keep_alive, false}: without keep-alive it
%% waits for the first byte with no deadline (minimum_bytes_per_second
%% closes a silent connection after 3 s).
timeouts_conf(Timeout, Requests, RequestTimeout) ->
    [{request_timeout, Timeout} || RequestTimeout]
    ++ case Requests of
           1 when RequestTimeout -> [{keep_alive, false}];
           1 -> [{keep_alive, false}, {keep_alive_timeout, Timeout}];
           %% inets counts the first request apart: its
           %% max_keep_alive_request N serves N + 1 requests.
           _ -> [{keep_alive, true}, {max_keep_alive_request, Requests - 1},
                 {keep_alive_timeout, Timeout}]
       end.

%% Whether this inets has request_timeout (the split deadlines above). Its
%% request handler's own function tells, with no version table to keep:
%% module_info lists local functions too.
request_timeout_option() ->
    _ = code:ensure_loaded(httpd_request_handler),
    lists:member({get_request_timeout, 1}, httpd_request_handler:module_info(functions)).

listen_error({listen, Posix}) when is_atom(Posix) ->
    Posix;
listen_error(T) when is_tuple(T) ->
    listen_error(tuple_to_list(T));
listen_error([H | T]) ->
    case listen_error(H) of
        undefined -> listen_error(T);
        Posix -> Posix
    end;
listen_error(_) ->
    undefined.

%% @doc Stops every mallocinfo HTTP server of this node. Always `ok'.
-spec stop() -> ok.
stop() ->
    lists:foreach(fun({Pid, _Port}) -> inets:stop(httpd, Pid) end, servers()).

%% @doc Stops the mallocinfo HTTP server on `Port'; `{error, not_found}'
%% when there is none.
-spec stop(inet:port_number()) -> ok | {error, not_found}.
stop(Port) when is_integer(Port), Port > 0, Port =< 65535 ->
    case [Pid || {Pid, P} <- servers(), P =:= Port] of
        [] -> {error, not_found};
        Pids -> lists:foreach(fun(Pid) -> inets:stop(httpd, Pid) end, Pids)
    end;
stop(Port) ->
    erlang:error(badarg, [Port]).

%% httpd instances whose only module is this one, with their ports.
servers() ->
    case inets:services_info() of
        Services when is_list(Services) ->
            [{Pid, proplists:get_value(port, Info)}
             || {httpd, Pid, _} <- Services,
                Info <- [httpd_info(Pid)],
                is_list(Info), proplists:get_value(modules, Info) =:= [?MODULE]];
        {error, _} ->
            []
    end.

%% A server that stops meanwhile answers nothing.
httpd_info(Pid) ->
    try httpd:info(Pid, [modules, port]) catch _:_ -> [] end.

%%% ---------------------------------------------------------------------------
%%% The httpd callback

%% @private Every request arrives here (httpd's `mod' interface). Never
%% raises: a failure while answering is logged and answered with a 500.
-spec do(#mod{}) -> {proceed, list()}.
do(#mod{method = Method, request_uri = Uri} = Mod) ->
    {Code, Headers, Body0} =
        try
            route(Method, Uri)
        catch
            Class:Reason:Stack ->
                logger:error("mallocinfo_http: ~ts ~ts failed: ~p",
                             [Method, Uri, {Class, Reason, Stack}],
                             #{domain => [mallocinfo]}),
                text(500, "internal error, see the node's log\n")
        end,
    %% A response to HEAD has no body (it is a 405 anyway).
    Body = case Method of
               "HEAD" -> <<>>;
               _ -> iolist_to_binary(Body0)
           end,
    send(Mod, Code, Headers, Body),
    {proceed, [{response, {already_sent, Code, byte_size(Body)}}]};
do(Other) ->
    erlang:error(badarg, [Other]).

%% The response is written here rather than handed back to httpd as
%% `{response, Head, Body}': httpd_response rewrites the status of a reply
%% to an HTTP/1.0 request (every 4xx above 404 and 5xx above 503 becomes
%% 403), so a 405 or a 409 reached HTTP/1.0 clients as 403 Forbidden. A
%% write that fails closes the socket (httpd_socket:deliver/3), and httpd
%% then ends the connection.
send(#mod{socket_type = Type, socket = Socket, http_version = Version, connection = KeepAlive},
     Code, Headers, Body) ->
    Fields = [{"Date", httpd_util:rfc1123_date()},
              {"Content-Length", integer_to_list(byte_size(Body))},
              {"Cache-Control", "no-store"}
              | Headers]
        ++ [{"Connection", "close"} || KeepAlive =/= true],
    Head = [Version, $\s, integer_to_list(Code), $\s, httpd_util:reason_phrase(Code), "\r\n",
            [[Name, ": ", Value, "\r\n"] || {Name, Value} <- Fields],
            "\r\n"],
    _ = httpd_socket:deliver(Type, Socket, [Head, Body]),
    ok.

%% @private httpd's `customize' callback: headers every reply gets unless
%% it sets them itself, inets' own error replies (400, 408, 413, 414, 501,
%% 503, ...) included.
-spec response_default_headers() -> [{string(), string()}].
response_default_headers() ->
    [{"cache-control", "no-store"}].

%% @private httpd's `customize' callback: response headers are kept as they
%% are. (Without it inets calls the missing function for every header and
%% catches the undef.)
-spec response_header({string(), string()}) -> {true, {string(), string()}}.
response_header({_, _} = Header) ->
    {true, Header};
response_header(Other) ->
    erlang:error(badarg, [Other]).

%% @private httpd's `customize' callback: request headers are kept as they
%% are.
-spec request_header({string(), string()}) -> {true, {string(), string()}}.
request_header({_, _} = Header) ->
    {true, Header};
request_header(Other) ->
    erlang:error(badarg, [Other]).

route(Method, Uri) ->
    case uri_string:parse(Uri) of
        #{path := Path} = Parsed ->
            case {endpoint(Path), Method} of
                {undefined, _} ->
                    text(404, "not found; GET / lists the endpoints\n");
                {Handler, "GET"} ->
                    case params(Parsed) of
                        {ok, Params} -> Handler(Params);
                        error -> text(400, "malformed query string\n")
                    end;
                {_, _} ->
                    {405, [{"Allow", "GET"}, {"Content-Type", ?TEXT}],
                     "method not allowed: this endpoint answers GET only\n"}
            end;
        _ ->
            text(400, "malformed request URI\n")
    end.

endpoint("/") -> fun index/1;
endpoint("/memory.json") -> fun memory_json/1;
endpoint("/mallocinfo.xml") -> fun mallocinfo_xml/1;
endpoint("/heap_profile") -> fun heap_profile/1;
endpoint("/metrics") -> fun metrics/1;
endpoint("/debug/pprof/heap") -> fun pprof_heap/1;
endpoint("/debug/pprof/allocs") -> fun pprof_allocs/1;
endpoint("/heap.folded") -> fun heap_folded/1;
endpoint("/flamegraph.html") -> fun flamegraph/1;
endpoint("/report.txt") -> fun report_txt/1;
endpoint("/timeline.json") -> fun timeline_json/1;
endpoint("/timeline.html") -> fun timeline_html/1;
endpoint(_) -> undefined.

params(#{query := Query}) ->
    case uri_string:dissect_query(Query) of
        Params when is_list(Params) -> {ok, Params};
        _ -> error
    end;
params(#{}) ->
    {ok, []}.

%%% Endpoints ------------------------------------------------------------------

index([]) ->
    text(200, ["mallocinfo ", mallocinfo_glibc:version(), ", allocator ",
               atom_to_list(mallocinfo_glibc:allocator()), "\n\n"
               "GET /memory.json      the allocator's statistics as JSON\n"
               "GET /mallocinfo.xml   glibc's malloc_info XML\n"
               "GET /heap_profile     heap profiling status\n"
               "    ?active=true|false  start or stop recording allocations\n"
               "    ?trigger_dump=true  the heap profile, for jeprof --text / google-pprof --text\n"
               "GET /metrics          Prometheus text exposition\n"
               "GET /debug/pprof/heap  the tracker's live heap, gzipped pprof protobuf\n"
               "    ?seconds=N          what was allocated in the next N (1..60) seconds\n"
               "                        and is still live\n"
               "GET /debug/pprof/allocs  the same, alloc_space first: what each call site\n"
               "                        allocated since start or reset\n"
               "    ?seconds=N          what was allocated in the next N (1..60) seconds\n"
               "GET /heap.folded      the same as collapsed stacks (flamegraph.pl)\n"
               "GET /flamegraph.html  the live heap as a flame graph "
               "(?view=stack|function|object)\n"
               "GET /report.txt       mallocinfo:report()'s text\n"
               "GET /timeline.json    every layer over time (mallocinfo:watch/0), as JSON\n"
               "GET /timeline.html    the same as a page: RSS by layer, what grows, rates\n"]);
index(Params) ->
    no_params(Params).

%% jemalloc's own JSON; for any other allocator a document built from terms
%% (glibc: mallinfo2, malloc_info parsed, the tracker; tcmalloc: its text
%% statistics), so it is valid JSON by construction.
memory_json([]) ->
    case mallocinfo_glibc:allocator() of
        jemalloc ->
            case mallocinfo_jemalloc:stats() of
                {ok, Json} -> {200, [{"Content-Type", "application/json"}], Json};
                {error, Reason} -> failure("jemalloc malloc_stats_print", Reason)
            end;
        Allocator ->
            Doc = memory_document(Allocator),
            {200, [{"Content-Type", "application/json"}], [mallocinfo_json:encode(Doc), $\n]}
    end;
memory_json(Params) ->
    no_params(Params).

memory_document(Allocator) ->
    Tracker = mallocinfo_trace:status(),
    Base = #{allocator => Allocator,
             rss_bytes => mallocinfo_glibc:rss(),
             tracker => Tracker},
    case Allocator of
        glibc ->
            Base#{mallinfo2 => case mallocinfo_glibc:mallinfo() of
                                   {ok, Mallinfo} -> Mallinfo;
                                   {error, Reason} -> #{error => reason_text(Reason)}
                               end,
                  malloc_info => case mallocinfo_glibc:heaps() of
                                     {ok, Heaps} -> Heaps;
                                     {error, Reason} -> #{error => reason_text(Reason)}
                                 end};
        tcmalloc ->
            Base#{tcmalloc_stats => case mallocinfo_tcmalloc:stats() of
                                        {ok, Text} -> Text;
                                        {error, Reason} -> #{error => reason_text(Reason)}
                                    end};
        _ ->
            Base
    end.

mallocinfo_xml([]) ->
    case mallocinfo_glibc:allocator() of
        glibc ->
            case mallocinfo_glibc:info() of
                {ok, Xml} -> {200, [{"Content-Type", "application/xml"}], Xml};
                {error, Reason} -> failure("malloc_info", Reason)
            end;
        Other ->
            text(409, ["glibc's malloc_info describes glibc's heap, but this node allocates "
                       "with ", atom_to_list(Other), "; see /memory.json\n"])
    end;
mallocinfo_xml(Params) ->
    no_params(Params).

metrics([]) ->
    {200, [{"Content-Type", "text/plain; version=0.0.4; charset=utf-8"}], mallocinfo_prom:metrics()};
metrics(Params) ->
    no_params(Params).

no_params(_) ->
    text(400, "this endpoint takes no parameters\n").

%%% /report.txt, /timeline.json, /timeline.html -----------------------------------

report_txt([]) ->
    text(200, mallocinfo_report:format(mallocinfo_report:collect()));
report_txt(Params) ->
    no_params(Params).

timeline_json([]) ->
    timeline(fun(H, Who) ->
                     {200, [{"Content-Type", "application/json"}],
                      [mallocinfo_http_timeline:json(H, Who), $\n]}
             end);
timeline_json(Params) ->
    no_params(Params).

timeline_html([]) ->
    timeline(fun(H, Who) ->
                     {200, [{"Content-Type", "text/html; charset=utf-8"}],
                      mallocinfo_http_timeline:page(H, Who)}
             end);
timeline_html(Params) ->
    no_params(Params).

%% The sampler is the operator's to start: a GET does not start one.
timeline(Respond) ->
    case mallocinfo_watch:history() of
        {ok, H} -> Respond(H, #{node => node(), os_pid => os:getpid()});
        {error, not_watching} ->
            text(409, "no timeline: the sampler does not run; mallocinfo:watch() starts it "
                      "(a sample every 10 s), mallocinfo:unwatch() stops it\n")
    end.

%%% /debug/pprof/heap, /heap.folded, /flamegraph.html ---------------------------

%% The tracker's profiles, whatever the allocator: under jemalloc or
%% tcmalloc they need the tracker preloaded (or attached) in front of it;
%% those allocators' own profiles are served by /heap_profile.
pprof_heap(Params) ->
    pprof_profile(heap, Params).

%% Go's /debug/pprof/allocs: the heap profile with alloc_space as its
%% default sample type; its ?seconds=N is the difference of two cumulative
%% profiles (mallocinfo_trace_profile:delta/2).
pprof_allocs(Params) ->
    pprof_profile(allocs, Params).

pprof_profile(Which, Params) ->
    case pprof_params(Params, #{}) of
        {ok, Opts} ->
            case mallocinfo_trace:pprof(Opts#{profile => Which}) of
                {ok, Profile} ->
                    File = ["attachment; filename=\"", atom_to_list(Which), ".pb.gz\""],
                    {200, [{"Content-Type", "application/octet-stream"},
                           {"Content-Disposition", lists:flatten(File)}],
                     Profile};
                {error, Reason} ->
                    profile_refusal(Reason)
            end;
        {error, Why} ->
            text(400, Why)
    end.

%% Go's handler takes seconds and gc (gc=1 runs Go's collector first:
%% there is nothing of the kind to run here, so any value is accepted and
%% ignored, and a scraper that sends it is served).
pprof_params([], Opts) ->
    {ok, Opts};
pprof_params([{"seconds", Value} | Rest], Opts) when not is_map_key(seconds, Opts) ->
    case string:to_integer(Value) of
        {N, ""} when N >= 1, N =< ?MAX_DELTA_SECONDS -> pprof_params(Rest, Opts#{seconds => N});
        _ -> {error, "seconds takes an integer from 1 to 60\n"}
    end;
pprof_params([{"gc", _} | Rest], Opts) ->
    pprof_params(Rest, Opts);
pprof_params([{Name, _} | _], _) ->
    {error, ["unknown parameter ", printable(Name),
             "; /debug/pprof/heap and /debug/pprof/allocs take seconds=N (once) and gc\n"]}.

heap_folded([]) ->
    case mallocinfo_trace:profile_data(#{}) of
        {ok, Data} ->
            %% The total the lines sum to, from the same snapshot.
            Total = mallocinfo_trace_profile:folded_total(Data),
            {200, [{"Content-Type", ?TEXT}, {"X-Live-Bytes", integer_to_list(Total)}],
             mallocinfo_trace_profile:folded(Data)};
        {error, Reason} ->
            profile_refusal(Reason)
    end;
heap_folded(Params) ->
    no_params(Params).

%% The page reads view and search itself (they only choose what it shows
%% first); they are checked here like any parameter.
flamegraph(Params) ->
    Known = [P || {K, V} = P <- Params,
                  K =:= "view" andalso lists:member(V, ["stack", "function", "object"])
                      orelse K =:= "search"],
    case length(Known) =:= length(Params)
        andalso length(lists:ukeysort(1, Params)) =:= length(Params) of
        true ->
            case mallocinfo_trace:folded() of
                {ok, Folded} ->
                    Title = ["live heap of ", atom_to_list(node()), " (os pid ", os:getpid(), ")"],
                    Coverage = mallocinfo_http_flamegraph:coverage(mallocinfo_trace:status(),
                                                                   mallocinfo_glibc:rss()),
                    {200, [{"Content-Type", "text/html; charset=utf-8"}],
                     mallocinfo_http_flamegraph:page(Folded, Title, Coverage)};
                {error, Reason} ->
                    profile_refusal(Reason)
            end;
        false ->
            text(400, "/flamegraph.html takes view=stack|function|object and search=Text, "
                      "each at most once\n")
    end.

profile_refusal(not_preloaded) ->
    Own = case mallocinfo_glibc:allocator() of
              glibc -> "";
              Other -> ["This node's ", atom_to_list(Other), " serves its own heap profile at "
                        "/heap_profile?trigger_dump=true (jeprof / google-pprof text format).\n"]
          end,
    text(409, ["no heap profile: the tracker is not preloaded or attached\n", Own,
               tracker_hint(), "\n"]);
profile_refusal(Reason) ->
    refusal(tracker, Reason).

%%% /heap_profile ----------------------------------------------------------------

%% The profiler's control is mallocinfo_profiler's; here, its HTTP face.
heap_profile([]) ->
    text(200, status_text(mallocinfo_profiler:status()));
heap_profile([{"active", Value}]) when Value =:= "true"; Value =:= "false" ->
    Result = case Value of
                 "true" -> mallocinfo_profiler:start();
                 "false" -> mallocinfo_profiler:stop()
             end,
    case Result of
        ok -> text(200, status_text(mallocinfo_profiler:status()));
        {error, Reason} -> refusal(mallocinfo_profiler:profiler(), Reason)
    end;
heap_profile([{"active", _}]) ->
    text(400, "active takes true or false\n");
heap_profile([{"trigger_dump", "true"}]) ->
    case mallocinfo_profiler:dump() of
        {ok, Profile} ->
            Name = io_lib:format("heap_profile.~ts.~ts.heap",
                                 [os:getpid(), mallocinfo_profiler:profiler()]),
            {200, [{"Content-Type", "application/octet-stream"},
                   {"Content-Disposition", ["attachment; filename=\"", Name, "\""]}],
             Profile};
        {error, Reason} ->
            refusal(mallocinfo_profiler:profiler(), Reason)
    end;
heap_profile([{"trigger_dump", _}]) ->
    text(400, "trigger_dump takes only true\n");
heap_profile([{Name, _}]) ->
    text(400, ["unknown parameter ", printable(Name),
               "; /heap_profile takes active=true|false or trigger_dump=true\n"]);
heap_profile([_, _ | _]) ->
    text(400, "one parameter at a time: active=true|false or trigger_dump=true\n").

%% Why a tracker that is there records nothing: detached, or preloaded in
%% an executable MALLOCINFO_TRACE_EXE does not match.
not_recording_text(#{preloaded := false, attached := false, attached_at := At})
  when is_integer(At) ->
    ["the tracker was detached (attached at ", mallocinfo_units:utc(At),
     "), so it records nothing; mallocinfo_trace:attach() records again"];
not_recording_text(_) ->
    "the tracker is preloaded but does not record in this executable (MALLOCINFO_TRACE_EXE)".

%% A request the node cannot serve in its present state: 409 and what to do.
refusal(jemalloc, profiling_disabled) ->
    text(409, ["heap profiling is disabled in this node's jemalloc\n", ?MALLOC_CONF_HINT, "\n"]);
refusal(tracker, not_preloaded) ->
    text(409, ["no heap profile: glibc keeps no allocation stacks and the tracker is not "
               "preloaded\n", tracker_hint(), "\n"]);
refusal(tracker, not_recording) ->
    text(409, ["no heap profile: ", not_recording_text(mallocinfo_trace:status()), "\n"]);
refusal(tcmalloc, not_running) ->
    text(409, "tcmalloc's heap profiler is not running; GET /heap_profile?active=true "
              "starts it\n");
refusal(tcmalloc, profiler_not_loaded) ->
    text(409, "tcmalloc's heap profiler is not in this process: it is part of "
              "libtcmalloc.so.4, not of libtcmalloc_minimal.so.4\n");
refusal(Profiler, Reason) ->
    failure(atom_to_list(Profiler) ++ " heap profile", Reason).

%% "preloaded", or when mallocinfo_trace:attach/0 brought the tracker in,
%% since when (blocks from before are not seen).
tracker_origin(#{preloaded := true}) ->
    "preloaded";
tracker_origin(#{attached_at := At}) ->
    ["attached at ", calendar:system_time_to_rfc3339(At, [{unit, millisecond}, {offset, "Z"}]),
     " (blocks allocated before are not seen)"].

tracker_hint() ->
    ["Run mallocinfo_trace:attach() on the node (no restart; doc/attach.md), "
     "or restart it with LD_PRELOAD=", filename:absname(mallocinfo_trace:preload_path()),
     " (mallocinfo_trace:preload_env/0), or with LD_PRELOAD=libjemalloc.so.2 and "
     "MALLOC_CONF=\"prof:true,prof_active:false\"."].

%% The status as libmtev shows it: `key: value' lines, then what to do.
status_text(#{profiler := jemalloc, jemalloc := #{prof := Prof, active := Active,
                                                  thread_active_init := Init,
                                                  lg_sample := Lg}}) ->
    ["allocator: jemalloc\n",
     "opt.prof: ", atom_to_list(Prof), "\n",
     "prof.active: ", atom_to_list(Active), "\n",
     "prof.thread_active_init: ", atom_to_list(Init), "\n",
     "opt.lg_prof_sample: ", integer_to_list(Lg), "\n",
     case Prof of
         true -> usage();
         false -> ["\nHeap profiling was not enabled when the node started.\n",
                   ?MALLOC_CONF_HINT, "\n"]
     end];
status_text(#{profiler := jemalloc, error := Reason}) ->
    ["allocator: jemalloc\nprofiling status unavailable: ", reason_text(Reason), "\n"];
status_text(#{profiler := tcmalloc, error := profiler_not_loaded}) ->
    ["allocator: tcmalloc\nheap_profiler: not loaded (libtcmalloc_minimal has none; "
     "preload libtcmalloc.so.4 to profile)\n"];
status_text(#{profiler := tcmalloc, error := Reason}) ->
    ["allocator: tcmalloc\nheap profiler status unavailable: ", reason_text(Reason), "\n"];
status_text(#{profiler := tcmalloc, active := Running}) ->
    ["allocator: tcmalloc\n",
     "heap_profiler.running: ", atom_to_list(Running), "\n",
     "\nGET /heap_profile?active=true        start tcmalloc's heap profiler\n"
     "GET /heap_profile?active=false       stop it (what it recorded is forgotten)\n"
     "GET /heap_profile?trigger_dump=true  the profile: google-pprof --text "
     "<beam.smp> <file>\n"];
status_text(#{profiler := tracker, allocator := Allocator, error := not_preloaded}) ->
    ["allocator: ", atom_to_list(Allocator), "\ntracker: not preloaded\n\n"
     "No heap profile: the allocator keeps no allocation stacks.\n", tracker_hint(), "\n"];
status_text(#{profiler := tracker, allocator := Allocator, error := not_recording,
              tracker := S}) ->
    ["allocator: ", atom_to_list(Allocator), "\ntracker: ", not_recording_text(S), "\n"];
status_text(#{profiler := tracker, allocator := Allocator, active := Active,
              tracker := #{mode := Mode, live_entries := Live, live_bytes := Bytes,
                           dropped := Dropped} = S}) ->
    ["allocator: ", atom_to_list(Allocator), "\ntracker: ", tracker_origin(S), ", recording\n",
     "tracker.mode: ", atom_to_list(Mode), "\n",
     "tracker.active: ", atom_to_list(Active), "\n",
     "tracker.live_blocks: ", integer_to_list(Live), "\n",
     "tracker.live_bytes: ", integer_to_list(Bytes), "\n",
     "tracker.dropped: ", integer_to_list(Dropped), "\n",
     usage()].

usage() ->
    "\nGET /heap_profile?active=true        record allocations\n"
    "GET /heap_profile?active=false       stop recording (what was recorded stays)\n"
    "GET /heap_profile?trigger_dump=true  the profile: jeprof --text <beam.smp> <file>\n".

failure(What, Reason) ->
    logger:warning("mallocinfo_http: ~ts failed: ~p", [What, Reason], #{domain => [mallocinfo]}),
    text(500, [What, " failed: ", reason_text(Reason), "\n"]).

text(Code, Body) ->
    {Code, [{"Content-Type", ?TEXT}], Body}.

reason_text(Reason) ->
    iolist_to_binary(io_lib:format("~0tp", [Reason])).

%% A parameter name echoed back: letters, digits and _.- only, at most 40.
printable(Name) ->
    Safe = [C || C <- Name, C >= $a andalso C =< $z orelse C >= $A andalso C =< $Z
                     orelse C >= $0 andalso C =< $9 orelse C =:= $_ orelse C =:= $.
                     orelse C =:= $-],
    [$", lists:sublist(Safe, 40), $"].
