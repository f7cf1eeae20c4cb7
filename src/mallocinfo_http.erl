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
%% '''
%%
%% The server binds to 127.0.0.1 unless an address is given explicitly, and
%% answers GET only (other methods: 405 with `Allow: GET'). A parameter it
%% does not know, or a value it does not take, is a 400 with a one-line
%% reason; a request the node cannot serve in its present state (profiling
%% not enabled, no tracker, another allocator than glibc for the XML) is a
%% 409 that says what to do; a failure is a 500. Every response is
%% `Cache-Control: no-store': statistics are read when asked for.
%%
%% This module is also the httpd callback module (`do/1'); it keeps no
%% state of its own: the servers are inets' httpd instances, found again
%% through inets by their callback module.
-module(mallocinfo_http).

-include_lib("inets/include/httpd.hrl").

-export([start/0, start/1, stop/0, stop/1]).
-export([do/1]).

-export_type([opts/0]).

-type opts() :: #{port => inet:port_number(), ip => inet:ip_address()}.

-define(LOOPBACK, {127, 0, 0, 1}).
-define(TEXT, "text/plain; charset=utf-8").
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
%% ports. Errors: `{error, eaddrinuse | eaddrnotavail | eacces | ...}' for
%% the socket, `{error, {missing_application, inets}}' when inets is
%% neither in the release nor in the OTP installation the node runs from.
%% Options that are not a port number or an IP address tuple raise
%% `badarg'.
-spec start(opts()) -> {ok, #{port := inet:port_number(), ip := inet:ip_address()}}
                     | {error, term()}.
start(Opts) when is_map(Opts) ->
    case maps:keys(Opts) -- [port, ip] of
        [] -> ok;
        _ -> erlang:error(badarg, [Opts])
    end,
    Port = maps:get(port, Opts, 0),
    Ip = maps:get(ip, Opts, ?LOOPBACK),
    is_integer(Port) andalso Port >= 0 andalso Port =< 65535 andalso inet:is_ip_address(Ip)
        orelse erlang:error(badarg, [Opts]),
    case ensure_inets() of
        ok -> start_httpd(Port, Ip);
        {error, _} = E -> E
    end;
start(Opts) ->
    erlang:error(badarg, [Opts]).

start_httpd(Port, Ip) ->
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
            %% Only GET is served: a request body is never needed, and a
            %% large one is refused (413) before it is read.
            {max_body_size, 4096}],
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
                Info <- [catch httpd:info(Pid, [modules, port])],
                is_list(Info), proplists:get_value(modules, Info) =:= [?MODULE]];
        {error, _} ->
            []
    end.

%% inets is part of OTP but not of every release: when the release lacks
%% it, load it from the OTP installation the emulator runs from, every
%% module at once (embedded mode loads nothing on first call).
ensure_inets() ->
    case application:ensure_all_started(inets) of
        {ok, _} ->
            ok;
        {error, _} ->
            Dirs = mallocinfo:lib_candidates(inets, mallocinfo:otp_roots()),
            load_inets(Dirs)
    end.

load_inets([]) ->
    {error, {missing_application, inets}};
load_inets([Dir | Rest]) ->
    Mods = [list_to_atom(filename:basename(F, ".beam"))
            || F <- filelib:wildcard(filename:join(Dir, "*.beam"))],
    _ = code:add_pathz(Dir),
    case code:ensure_modules_loaded(Mods) =:= ok
        andalso application:ensure_all_started(inets) of
        {ok, _} ->
            ok;
        _ ->
            _ = code:del_path(Dir),
            load_inets(Rest)
    end.

%%% ---------------------------------------------------------------------------
%%% The httpd callback

%% @private Every request arrives here (httpd's `mod' interface). Never
%% raises: a failure while answering is logged and answered with a 500.
-spec do(#mod{}) -> {proceed, list()}.
do(#mod{method = Method, request_uri = Uri}) ->
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
    Head = [{code, Code}, {content_length, integer_to_list(byte_size(Body))},
            {cache_control, "no-store"} | Headers],
    {proceed, [{response, {response, Head, Body}}]};
do(Other) ->
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
                    {405, [{"allow", "GET"}, {content_type, ?TEXT}],
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
    text(200, ["mallocinfo ", mallocinfo:version(), ", allocator ",
               atom_to_list(mallocinfo:allocator()), "\n\n"
               "GET /memory.json      the allocator's statistics as JSON\n"
               "GET /mallocinfo.xml   glibc's malloc_info XML\n"
               "GET /heap_profile     heap profiling status\n"
               "    ?active=true|false  start or stop recording allocations\n"
               "    ?trigger_dump=true  the heap profile, for jeprof --text / google-pprof --text\n"
               "GET /metrics          Prometheus text exposition\n"]);
index(Params) ->
    no_params(Params).

%% jemalloc's own JSON; for any other allocator a document built from terms
%% (glibc: mallinfo2, malloc_info parsed, the tracker; tcmalloc: its text
%% statistics), so it is valid JSON by construction.
memory_json([]) ->
    case mallocinfo:allocator() of
        jemalloc ->
            case mallocinfo_jemalloc:stats() of
                {ok, Json} -> {200, [{content_type, "application/json"}], Json};
                {error, Reason} -> failure("jemalloc malloc_stats_print", Reason)
            end;
        Allocator ->
            Doc = memory_document(Allocator),
            {200, [{content_type, "application/json"}], [mallocinfo_json:encode(Doc), $\n]}
    end;
memory_json(Params) ->
    no_params(Params).

memory_document(Allocator) ->
    Tracker = mallocinfo_trace:status(),
    Base = #{allocator => Allocator,
             rss_bytes => mallocinfo_nif:rss(),
             tracker => Tracker},
    case Allocator of
        glibc ->
            Base#{mallinfo2 => mallocinfo:mallinfo(),
                  malloc_info => case mallocinfo:heaps() of
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
    case mallocinfo:allocator() of
        glibc ->
            case mallocinfo:info() of
                {ok, Xml} -> {200, [{content_type, "application/xml"}], Xml};
                {error, Reason} -> failure("malloc_info", Reason)
            end;
        Other ->
            text(409, ["glibc's malloc_info describes glibc's heap, but this node allocates "
                       "with ", atom_to_list(Other), "; see /memory.json\n"])
    end;
mallocinfo_xml(Params) ->
    no_params(Params).

metrics([]) ->
    {200, [{content_type, "text/plain; version=0.0.4; charset=utf-8"}], mallocinfo_prom:metrics()};
metrics(Params) ->
    no_params(Params).

no_params(_) ->
    text(400, "this endpoint takes no parameters\n").

%%% /heap_profile ----------------------------------------------------------------

%% Who profiles: jemalloc and tcmalloc themselves; under glibc (or an
%% allocator without a profiler) the tracker, when preloaded.
profiler() ->
    case mallocinfo:allocator() of
        jemalloc -> jemalloc;
        tcmalloc -> tcmalloc;
        _ -> tracker
    end.

heap_profile([]) ->
    text(200, status_text(profiler()));
heap_profile([{"active", Value}]) when Value =:= "true"; Value =:= "false" ->
    Profiler = profiler(),
    case set_active(Profiler, Value =:= "true") of
        ok -> text(200, status_text(Profiler));
        {error, Reason} -> refusal(Profiler, Reason)
    end;
heap_profile([{"active", _}]) ->
    text(400, "active takes true or false\n");
heap_profile([{"trigger_dump", "true"}]) ->
    Profiler = profiler(),
    case dump(Profiler) of
        {ok, Profile} ->
            Name = io_lib:format("heap_profile.~ts.~ts.heap", [os:getpid(), Profiler]),
            {200, [{content_type, "application/octet-stream"},
                   {"content-disposition", lists:flatten(["attachment; filename=\"", Name, "\""])}],
             Profile};
        {error, Reason} ->
            refusal(Profiler, Reason)
    end;
heap_profile([{"trigger_dump", _}]) ->
    text(400, "trigger_dump takes only true\n");
heap_profile([{Name, _}]) ->
    text(400, ["unknown parameter ", printable(Name),
               "; /heap_profile takes active=true|false or trigger_dump=true\n"]);
heap_profile([_, _ | _]) ->
    text(400, "one parameter at a time: active=true|false or trigger_dump=true\n").

set_active(jemalloc, Active) ->
    mallocinfo_jemalloc:profile_active(Active);
set_active(tcmalloc, true) ->
    case mallocinfo_tcmalloc:profile_running() of
        true -> ok;
        false -> start_tcmalloc_profiler();
        {error, _} = E -> E
    end;
set_active(tcmalloc, false) ->
    case mallocinfo_tcmalloc:profile_running() of
        true ->
            %% not_running: another request stopped it first.
            Result = case mallocinfo_tcmalloc:profile_stop() of
                         {error, not_running} -> ok;
                         Other -> Other
                     end,
            remove_tcmalloc_dir(),
            Result;
        false -> ok;
        {error, _} = E -> E
    end;
set_active(tracker, Active) ->
    case {mallocinfo_trace:status(), Active} of
        {#{preloaded := false}, _} -> {error, not_preloaded};
        {#{recording := false}, _} -> {error, not_recording};
        {#{mode := M}, true} when M =:= full; M =:= sample -> ok;
        {#{}, true} -> mallocinfo_trace:set_mode(resume_mode());
        %% counters, not off: the blocks recorded so far stay in the table
        %% (and leave it when freed), as jemalloc keeps its samples while
        %% prof.active is false.
        {#{mode := M}, false} when M =:= full; M =:= sample -> mallocinfo_trace:set_mode(counters);
        {#{}, false} -> ok
    end.

%% tcmalloc's profiler also writes files of its own, `<prefix>.0001.heap'
%% and on, each time the HEAP_PROFILE_* thresholds are crossed (every GiB
%% allocated by default). The prefix points into a directory made fresh for
%% it (make_dir fails on a name that exists, so nothing planted in advance
%% is used) with mode 0700, so no one else can plant a symlink in it; the
%% directory goes when the profiler is stopped here.
start_tcmalloc_profiler() ->
    Dir = filename:join(tmp_dir(), io_lib:format("mallocinfo-tcmalloc.~ts.~b",
                                                 [os:getpid(), rand:uniform(1 bsl 62)])),
    case make_private_dir(Dir) of
        ok ->
            case mallocinfo_tcmalloc:profile_start(filename:join(Dir, "heap")) of
                ok ->
                    persistent_term:put({?MODULE, tcmalloc_dir}, Dir),
                    ok;
                {error, already_running} ->
                    %% Another request started it first: what was asked
                    %% for is done, with that request's directory.
                    _ = file:del_dir(Dir),
                    ok;
                {error, _} = E ->
                    _ = file:del_dir(Dir),
                    E
            end;
        {error, _} = E ->
            E
    end.

%% The directory, mode 0700 before anything is put in it; nothing left
%% behind when the mode cannot be set.
make_private_dir(Dir) ->
    case file:make_dir(Dir) of
        ok ->
            case file:change_mode(Dir, 8#700) of
                ok -> ok;
                {error, _} = E -> _ = file:del_dir(Dir), E
            end;
        {error, _} = E ->
            E
    end.

remove_tcmalloc_dir() ->
    case persistent_term:get({?MODULE, tcmalloc_dir}, undefined) of
        undefined ->
            ok;
        Dir ->
            _ = file:del_dir_r(Dir),
            _ = persistent_term:erase({?MODULE, tcmalloc_dir}),
            ok
    end.

tmp_dir() ->
    case os:getenv("TMPDIR") of
        false -> "/tmp";
        "" -> "/tmp";
        Dir -> Dir
    end.

%% Back to the mode the node was started with, when it recorded blocks.
resume_mode() ->
    case os:getenv("MALLOCINFO_TRACE") of
        "sample" -> sample;
        _ -> full
    end.

dump(jemalloc) -> mallocinfo_jemalloc:profile_dump();
dump(tcmalloc) -> mallocinfo_tcmalloc:profile_dump();
dump(tracker) -> mallocinfo_trace:heap_profile().

%% A request the node cannot serve in its present state: 409 and what to do.
refusal(jemalloc, profiling_disabled) ->
    text(409, ["heap profiling is disabled in this node's jemalloc\n", ?MALLOC_CONF_HINT, "\n"]);
refusal(tracker, not_preloaded) ->
    text(409, ["no heap profile: glibc keeps no allocation stacks and the tracker is not "
               "preloaded\n", tracker_hint(), "\n"]);
refusal(tracker, not_recording) ->
    text(409, "no heap profile: the tracker is preloaded but does not record in this "
              "executable (MALLOCINFO_TRACE_EXE)\n");
refusal(tcmalloc, not_running) ->
    text(409, "tcmalloc's heap profiler is not running; GET /heap_profile?active=true "
              "starts it\n");
refusal(tcmalloc, profiler_not_loaded) ->
    text(409, "tcmalloc's heap profiler is not in this process: it is part of "
              "libtcmalloc.so.4, not of libtcmalloc_minimal.so.4\n");
refusal(Profiler, Reason) ->
    failure(atom_to_list(Profiler) ++ " heap profile", Reason).

tracker_hint() ->
    ["Restart the node with LD_PRELOAD=", filename:absname(mallocinfo_trace:preload_path()),
     " (mallocinfo_trace:preload_env/0), or with LD_PRELOAD=libjemalloc.so.2 and "
     "MALLOC_CONF=\"prof:true,prof_active:false\"."].

%% The status as libmtev shows it: `key: value' lines, then what to do.
status_text(jemalloc) ->
    case mallocinfo_jemalloc:profile_status() of
        #{prof := Prof, active := Active, thread_active_init := Init, lg_sample := Lg} ->
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
        {error, Reason} ->
            ["allocator: jemalloc\nprofiling status unavailable: ", reason_text(Reason), "\n"]
    end;
status_text(tcmalloc) ->
    case mallocinfo_tcmalloc:profile_running() of
        Running when is_boolean(Running) ->
            ["allocator: tcmalloc\n",
             "heap_profiler.running: ", atom_to_list(Running), "\n",
             "\nGET /heap_profile?active=true        start tcmalloc's heap profiler\n"
             "GET /heap_profile?active=false       stop it (what it recorded is forgotten)\n"
             "GET /heap_profile?trigger_dump=true  the profile: google-pprof --text "
             "<beam.smp> <file>\n"];
        {error, profiler_not_loaded} ->
            ["allocator: tcmalloc\nheap_profiler: not loaded (libtcmalloc_minimal has none; "
             "preload libtcmalloc.so.4 to profile)\n"];
        {error, Reason} ->
            ["allocator: tcmalloc\nheap profiler status unavailable: ", reason_text(Reason), "\n"]
    end;
status_text(tracker) ->
    Allocator = atom_to_list(mallocinfo:allocator()),
    case mallocinfo_trace:status() of
        #{preloaded := false} ->
            ["allocator: ", Allocator, "\ntracker: not preloaded\n\n"
             "No heap profile: the allocator keeps no allocation stacks.\n", tracker_hint(), "\n"];
        #{recording := false} ->
            ["allocator: ", Allocator, "\ntracker: preloaded, not recording in this executable "
             "(MALLOCINFO_TRACE_EXE)\n"];
        #{mode := Mode, live_entries := Live, live_bytes := Bytes, dropped := Dropped} ->
            ["allocator: ", Allocator, "\ntracker: preloaded, recording\n",
             "tracker.mode: ", atom_to_list(Mode), "\n",
             "tracker.active: ", atom_to_list(Mode =:= full orelse Mode =:= sample), "\n",
             "tracker.live_blocks: ", integer_to_list(Live), "\n",
             "tracker.live_bytes: ", integer_to_list(Bytes), "\n",
             "tracker.dropped: ", integer_to_list(Dropped), "\n",
             usage()]
    end.

usage() ->
    "\nGET /heap_profile?active=true        record allocations\n"
    "GET /heap_profile?active=false       stop recording (what was recorded stays)\n"
    "GET /heap_profile?trigger_dump=true  the profile: jeprof --text <beam.smp> <file>\n".

failure(What, Reason) ->
    logger:warning("mallocinfo_http: ~ts failed: ~p", [What, Reason], #{domain => [mallocinfo]}),
    text(500, [What, " failed: ", reason_text(Reason), "\n"]).

text(Code, Body) ->
    {Code, [{content_type, ?TEXT}], Body}.

reason_text(Reason) ->
    iolist_to_binary(io_lib:format("~0tp", [Reason])).

%% A parameter name echoed back: letters, digits and _.- only, at most 40.
printable(Name) ->
    Safe = [C || C <- Name, C >= $a andalso C =< $z orelse C >= $A andalso C =< $Z
                     orelse C >= $0 andalso C =< $9 orelse C =:= $_ orelse C =:= $.
                     orelse C =:= $-],
    [$", lists:sublist(Safe, 40), $"].
