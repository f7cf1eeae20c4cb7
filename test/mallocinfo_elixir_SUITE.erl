%% mallocinfo for Elixir users, end to end, offline, as doc/elixir.md tells
%% them to use it.
%%
%% A scratch Mix project (test/mallocinfo_elixir_SUITE_data/mi_elixir_app)
%% depends on a copy of mallocinfo's sources made like a fresh clone
%% (`{:mallocinfo, path: "../mallocinfo", manager: :rebar3}'), built by the
%% system rebar3 through MIX_REBAR3 with a fresh HOME and every proxy
%% pointing at a closed port, so hex or any download fails. Its
%% `mix release' starts as a daemon with the tracker preloaded by the
%% rel/env.sh.eex line of doc/elixir.md; through `bin/<app> rpc' a NIF of
%% the application that leaks from a named function is found by
%% :mallocinfo_trace.sites/1 with exact count and bytes, and
%% :mallocinfo.info/1 writes XML that agrees with mallinfo(); the everyday
%% calls are typed into `bin/<app> remote' (iex) through a tmux pty; the
%% release stops by its own `bin/<app> stop'. Last, the tarball is loaded
%% from the remote iex of a release that does not depend on mallocinfo.
%%
%% Everything is written under this suite's priv_dir. Node and tmux socket
%% names carry the OS pid of this node and a unique integer. A missing
%% `mix' fails the suite (`make deps' installs Debian's elixir): nothing
%% here is skipped.
-module(mallocinfo_elixir_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("kernel/include/file.hrl").
-include_lib("stdlib/include/assert.hrl").
-include_lib("xmerl/include/xmerl.hrl").
-import(mi_console, [executable/1, run/4, sh/1, q/1, type/3]).

-export([all/0, groups/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([mix_dependency_builds/1, release_ships_priv/1, release_starts_preloaded/1,
         rpc_names_the_leak/1, info_writes_xml/1, optional_applications/1, remote_iex_session/1,
         release_stops_cleanly/1,
         tarball_in_plain_release/1, rebar3_checkout_builds/1, docs_show_the_tested_lines/1]).

-define(APP, "mi_elixir_app").
-define(PLAIN, "mi_elixir_plain").
%% What the remote iex session and rpc_names_the_leak leak: sizes no other
%% allocation site of an idle node shares.
-define(RPC_BLOCKS, 1234).
-define(RPC_SIZE, 257).
-define(IEX_BLOCKS, 2048).
-define(IEX_SIZE, 8192).

suite() -> [{timetrap, {minutes, 20}}].

all() -> [{group, elixir}, docs_show_the_tested_lines].

%% In order, each needing the one before: a failure skips the rest, with
%% the reason in the log.
groups() ->
    [{elixir, [sequence],
      [mix_dependency_builds, release_ships_priv, release_starts_preloaded, rpc_names_the_leak,
       info_writes_xml, optional_applications, remote_iex_session, release_stops_cleanly,
       tarball_in_plain_release, rebar3_checkout_builds]}].

init_per_suite(Config) ->
    Mix = executable("mix"),
    Rebar3 = executable("rebar3"),
    executable("tmux"),
    executable("cc"),
    Priv = ?config(priv_dir, Config),
    Root = mi_ct:project_root(),
    Home = filename:join(Priv, "home"),
    ok = file:make_dir(Home),
    Tag = os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive])),
    [{mix, Mix}, {rebar3, Rebar3}, {root, Root}, {home, Home},
     {node, "mi_elixir_" ++ Tag}, {plain_node, "mi_plain_" ++ Tag},
     {tmux, "mi_elixir_ct_" ++ Tag} | Config].

%% Whatever a failed case left running: the tmux server on our own socket,
%% and each release by its own `stop', then by the pid it reported.
end_per_suite(Config) ->
    ok = mi_console:kill_server(?config(tmux, Config)),
    [stop_leftover(Config, App, Node)
     || {App, Node} <- [{?APP, ?config(node, Config)}, {?PLAIN, ?config(plain_node, Config)}]],
    ok.

%%% Cases --------------------------------------------------------------------

%% `mix compile' of the path dependency, from sources without priv/ files or
%% objects, with no hex and no network: the NIF, the preload library and
%% the heap map escript all land in the dependency's priv/, the same set as
%% under rebar3; make run's demo workload is not part of it.
mix_dependency_builds(Config) ->
    Priv = ?config(priv_dir, Config),
    copy_sources(?config(root, Config), filename:join(Priv, "mallocinfo")),
    App = app_dir(Config, ?APP),
    copy_project(Config, ?APP),
    {T, _} = timer:tc(fun() -> mix(Config, App, ["compile"]) end),
    ct:pal("mix compile (mallocinfo as a path dependency, native code from scratch): ~.1f s",
           [T / 1.0e6]),
    Lib = filename:join([App, "_build", "prod", "lib", "mallocinfo"]),
    Built = lists:sort(filelib:wildcard("*", filename:join(Lib, "priv"))),
    ct:pal("priv/ built under Mix: ~p", [Built]),
    Rebar3Built = lists:sort(filelib:wildcard("*", code:priv_dir(mallocinfo))),
    ?assertEqual(Rebar3Built, Built),
    [?assert(filelib:is_regular(filename:join([Lib, "priv", F])))
     || F <- ["mallocinfo_nif.so", "libmallocinfo_preload.so", "mallocinfo-heapmap"]],
    %% make run's demo workload is not the tool: never in a dependency.
    ?assertEqual([], [F || F <- Built, string:find(F, "demo") =/= nomatch]),
    ?assertEqual([], filelib:wildcard("*demo*", filename:join(Lib, "ebin"))),
    ?assert(filelib:is_regular(filename:join([Lib, "ebin", "mallocinfo.beam"]))),
    %% The escript was made from the beams Mix's build wrote, and runs.
    Usage = run(executable("escript"), [filename:join([Lib, "priv", "mallocinfo-heapmap"]), "--help"],
                [], Priv),
    ?assertMatch(<<"usage: mallocinfo-heapmap DUMP OUTDIR", _/binary>>, Usage),
    offline_checks(Config).

%% `mix release' copies priv/ whole, as files, not as links to the build.
release_ships_priv(Config) ->
    App = app_dir(Config, ?APP),
    compile_leak_nif(Config, App),
    {T, _} = timer:tc(fun() -> mix(Config, App, ["release"]) end),
    ct:pal("mix release: ~.1f s", [T / 1.0e6]),
    Rel = rel_dir(Config, ?APP),
    [LibDir] = filelib:wildcard(filename:join([Rel, "lib", "mallocinfo-*"])),
    ?assertEqual("mallocinfo-" ++ vsn(), filename:basename(LibDir)),
    Built = filename:join([App, "_build", "prod", "lib", "mallocinfo", "priv"]),
    [begin
         Shipped = filename:join([LibDir, "priv", F]),
         {ok, #file_info{type = regular}} = file:read_link_info(Shipped),
         ?assertEqual(file_bytes(filename:join(Built, F)), file_bytes(Shipped))
     end || F <- ["mallocinfo_nif.so", "libmallocinfo_preload.so", "mallocinfo-heapmap"]],
    ?assert(filelib:is_regular(filename:join([Rel, "lib", ?APP ++ "-0.1.0", "priv", "mi_elixir_leak.so"]))),
    offline_checks(Config).

%% `bin/<app> daemon' with rel/env.sh.eex: the emulator runs with the
%% release's own copy of the interposer, recording.
release_starts_preloaded(Config) ->
    Script = script(Config, ?APP),
    {T, Pid} = timer:tc(fun() ->
                                rel(Config, ?APP, ["daemon"]),
                                wait_pid(Config, ?APP, 120)
                        end),
    ct:pal("release started in ~.1f s, os pid ~s", [T / 1.0e6, Pid]),
    ok = file:write_file(pid_file(Config, ?APP), Pid),
    Shipped = filename:join([rel_dir(Config, ?APP), "lib", "mallocinfo-" ++ vsn(), "priv",
                             "libmallocinfo_preload.so"]),
    {ok, Environ} = file:read_file("/proc/" ++ Pid ++ "/environ"),
    [Preload] = [V || <<"LD_PRELOAD=", V/binary>> <- binary:split(Environ, <<0>>, [global])],
    ct:pal("LD_PRELOAD of the release's emulator: ~ts", [Preload]),
    ?assert(same_file(binary_to_list(Preload), Shipped)),
    {ok, Maps} = file:read_file("/proc/" ++ Pid ++ "/maps"),
    ?assertNotEqual(nomatch, binary:match(Maps, Preload)),
    ?assertMatch(#{preloaded := true, recording := true, mode := full},
                 rpc_term(Config, ?APP, ":mallocinfo_trace.status()")),
    %% The script's other commands run their short-lived nodes without it.
    Eval = rel(Config, ?APP, ["eval", "IO.puts(\"MI_PRELOAD=\" <> (System.get_env(\"LD_PRELOAD\") || \"none\"))"]),
    ?assertMatch({match, _}, re:run(Eval, "^MI_PRELOAD=none$", [multiline])),
    ?assert(filelib:is_regular(Script)).

%% The leak of a NIF of the Elixir application, named with exact figures.
%% Every site is asked for, so the answer does not hang on the leak's rank.
rpc_names_the_leak(Config) ->
    Sites = rpc_term(Config, ?APP,
                     io_lib:format("{:ok, _} = :mallocinfo_trace.reset(); "
                                   ":ok = MiElixirApp.Leak.leak(~b, ~b); "
                                   "{:ok, sites} = :mallocinfo_trace.sites(100000); sites",
                                   [?RPC_BLOCKS, ?RPC_SIZE])),
    [Site] = leak_sites(Sites),
    ct:pal("leak site: ~p", [Site]),
    ?assertMatch(#{count := ?RPC_BLOCKS, bytes := ?RPC_BLOCKS * ?RPC_SIZE, estimated := false}, Site),
    #{stack := [#{object := Object} | _]} = Site,
    ?assertEqual(<<"mi_elixir_leak.so">>, filename:basename(Object)),
    After = rpc_term(Config, ?APP, ":ok = MiElixirApp.Leak.release(); "
                                   "{:ok, sites} = :mallocinfo_trace.sites(100000); sites"),
    ?assertEqual([], leak_sites(After)).

%% :mallocinfo.info/1 takes an Elixir string (a binary) and a charlist; the
%% XML parses and its arenas' total is mallinfo()'s (read again if the heap
%% moved between the two reads).
info_writes_xml(Config) ->
    Priv = ?config(priv_dir, Config),
    ok = xml_matches_mallinfo(Config, filename:join(Priv, "binary path.xml"), "\"~ts\"", 5),
    ok = xml_matches_mallinfo(Config, filename:join(Priv, "charlist path.xml"), "~~c\"~ts\"", 5),
    ?assertEqual({error, enoent},
                 rpc_term(Config, ?APP, ":mallocinfo.info(\"/nonexistent/x.xml\")")),
    ?assertEqual(badarg,
                 rpc_term(Config, ?APP,
                          "try do :mallocinfo.info(42) rescue ArgumentError -> :badarg end")).

%% xmerl, inets and tools, which a Mix release lacks unless asked for
%% (`releases: [app: [applications: [xmerl: :load, ...]]]'): heaps/0 parses,
%% the HTTP endpoint serves, the report has instrument's figures. The
%% endpoint is asked over a plain socket: OTP 27's httpc needs public_key
%% even for http://, which the release (rightly) does not ship.
optional_applications(Config) ->
    ?assertEqual(ok, rpc_term(Config, ?APP, ":mallocinfo.heaps() |> elem(0)")),
    ?assertEqual({200, <<"{">>},
                 rpc_term(Config, ?APP,
                          "{:ok, %{port: p}} = :mallocinfo_http.start(); "
                          "{:ok, s} = "
                          ":gen_tcp.connect({127, 0, 0, 1}, p, [:binary, active: false]); "
                          ":ok = :gen_tcp.send(s, \"GET /memory.json HTTP/1.0\\r\\n\\r\\n\"); "
                          "reply = Stream.repeatedly(fn -> :gen_tcp.recv(s, 0, 60000) end) "
                          "|> Enum.take_while(&match?({:ok, _}, &1)) "
                          "|> Enum.map_join(&elem(&1, 1)); "
                          ":ok = :mallocinfo_http.stop(p); "
                          "[head, body] = String.split(reply, \"\\r\\n\\r\\n\", parts: 2); "
                          "{head |> String.slice(9, 3) |> String.to_integer(), "
                          "String.first(body)}")),
    ?assertEqual(ok, rpc_term(Config, ?APP, ":instrument.carriers() |> elem(0)")).

%% What an operator types into `bin/<app> remote'.
remote_iex_session(Config) ->
    Node = ?config(node, Config),
    Xml = filename:join(?config(priv_dir, Config), "iex.xml"),
    Console = open_console(Config, ?APP, Node),
    type(Console, ":code.get_mode()", "^:embedded$"),
    type(Console, ":mallocinfo_trace.status() |> Map.take([:preloaded, :recording, :mode])",
         map_regex([{"mode", ":full"}, {"preloaded", "true"}, {"recording", "true"}])),
    type(Console, io_lib:format("MiElixirApp.Leak.leak(~b, ~b)", [?IEX_BLOCKS, ?IEX_SIZE]), "^:ok$"),
    type(Console, ":mallocinfo_trace.sites(5) |> elem(1) |> Enum.find(&match?(%{stack: [%{symbol: "
         "\"mi_elixir_leak_here\"} | _]}, &1)) |> Map.take([:count, :bytes])",
         map_regex([{"bytes", integer_to_list(?IEX_BLOCKS * ?IEX_SIZE)},
                    {"count", integer_to_list(?IEX_BLOCKS)}])),
    Report = type(Console, ":mallocinfo.report()", "^:ok$"),
    ?assertMatch({match, _}, re:run(Report, "^== mallocinfo report: " ++ Node ++ "@", [multiline])),
    ?assertMatch({match, _}, re:run(Report, "mi_elixir_leak_here \\(mi_elixir_leak.so\\)")),
    type(Console, "MiElixirApp.Leak.release()", "^:ok$"),
    type(Console, ":mallocinfo.info(~c\"" ++ Xml ++ "\")", "^:ok$"),
    {#xmlElement{name = malloc}, _} = xmerl_scan:file(Xml, [{quiet, true}]),
    mi_console:leave(Console),
    %% Leaving the console left the release running.
    Pid = wait_pid(Config, ?APP, 10),
    ?assertEqual({ok, list_to_binary(Pid)}, file:read_file(pid_file(Config, ?APP))).

release_stops_cleanly(Config) ->
    {ok, Pid} = file:read_file(pid_file(Config, ?APP)),
    stop_release(Config, ?APP, binary_to_list(Pid)).

%% The tarball route in an Elixir release that does not ship mallocinfo:
%% add the path, `l :mallocinfo' (code:load_file/1) loads the application,
%% and the calls work (the tracker, not preloaded here, says so).
tarball_in_plain_release(Config) ->
    Priv = ?config(priv_dir, Config),
    Inject = filename:join(Priv, "operator_copy"),
    ok = file:make_dir(Inject),
    run(executable("tar"), ["-C", Inject, "-xzf", mi_ct:tarball()], [], Priv),
    Ebin = filename:join([Inject, "mallocinfo", "ebin"]),
    copy_project(Config, ?PLAIN),
    mix(Config, app_dir(Config, ?PLAIN), ["release"]),
    ?assertEqual([], filelib:wildcard(filename:join([rel_dir(Config, ?PLAIN), "lib", "mallocinfo-*"]))),
    rel(Config, ?PLAIN, ["daemon"]),
    Pid = wait_pid(Config, ?PLAIN, 120),
    ok = file:write_file(pid_file(Config, ?PLAIN), Pid),
    Node = ?config(plain_node, Config),
    Xml = filename:join(Priv, "plain.xml"),
    Console = open_console(Config, ?PLAIN, Node),
    type(Console, ":code.get_mode()", "^:embedded$"),
    type(Console, ":code.add_path(~c\"" ++ Ebin ++ "\")", "^true$"),
    type(Console, "l :mallocinfo", "^\\{:module, :mallocinfo\\}$"),
    type(Console, ":mallocinfo.info(\"" ++ Xml ++ "\")", "^:ok$"),
    {#xmlElement{name = malloc}, _} = xmerl_scan:file(Xml, [{quiet, true}]),
    %% Loaded with mallocinfo, in embedded mode too.
    type(Console, ":mallocinfo_trace.sites(5)", "^\\{:error, :not_preloaded\\}$"),
    Report = type(Console, ":mallocinfo.report()", "^:ok$"),
    ?assertMatch({match, _}, re:run(Report, "^== mallocinfo report: " ++ Node ++ "@", [multiline])),
    mi_console:leave(Console),
    stop_release(Config, ?PLAIN, Pid).

%% The same sources in an Erlang project's _checkouts/: rebar3 writes the
%% beams under _build/default/checkouts/, and the heap map escript is made
%% from them. (The native code is already built: make has nothing to do.)
rebar3_checkout_builds(Config) ->
    Priv = ?config(priv_dir, Config),
    Sources = filename:join(Priv, "mallocinfo"),
    Cli = filename:join([Sources, "priv", "mallocinfo-heapmap"]),
    ok = file:delete(Cli),
    copy_project(Config, "mi_rebar3_app"),
    App = app_dir(Config, "mi_rebar3_app"),
    ok = file:make_dir(filename:join(App, "_checkouts")),
    ok = file:make_symlink(Sources, filename:join([App, "_checkouts", "mallocinfo"])),
    run(?config(rebar3, Config), ["compile"], env(Config), App),
    Build = filename:join([App, "_build", "default"]),
    ?assert(filelib:is_regular(filename:join([Build, "checkouts", "mallocinfo", "ebin", "mallocinfo.beam"]))),
    ?assertNot(filelib:is_dir(filename:join([Build, "lib", "mallocinfo"]))),
    Usage = run(executable("escript"), [Cli, "--help"], [], Priv),
    ?assertMatch(<<"usage: mallocinfo-heapmap DUMP OUTDIR", _/binary>>, Usage).

%% The lines doc/elixir.md gives are the ones this suite runs.
docs_show_the_tested_lines(Config) ->
    {ok, Doc} = file:read_file(filename:join([?config(root, Config), "doc", "elixir.md"])),
    Data = ?config(data_dir, Config),
    {ok, Env} = file:read_file(filename:join([Data, ?APP, "rel", "env.sh.eex"])),
    [Line] = [L || <<"case ", _/binary>> = L <- binary:split(Env, <<"\n">>, [global])],
    ?assertNotEqual(nomatch, binary:match(Doc, Line)),
    {ok, MixExs} = file:read_file(filename:join([Data, ?APP, "mix.exs"])),
    {match, [Dep]} = re:run(MixExs, "\\{:mallocinfo, [^}]*\\}", [{capture, first, binary}]),
    ?assertNotEqual(nomatch, binary:match(Doc, Dep)),
    {match, [Apps]} = re:run(MixExs, "applications: \\[xmerl[^]]*\\]", [{capture, first, binary}]),
    ?assertNotEqual(nomatch, binary:match(Doc, Apps)).

%%% Mix and the releases ------------------------------------------------------

%% The environment every Mix and release command runs in: a fresh HOME (no
%% ~/.mix, no ~/.hex), the system rebar3, no way out to the network, and
%% nothing inherited from the rebar3 and make that run this suite.
env(Config) ->
    Home = ?config(home, Config),
    Closed = "http://127.0.0.1:9",
    Set = [{"HOME", Home}, {"MIX_HOME", filename:join(Home, ".mix")},
           {"HEX_HOME", filename:join(Home, ".hex")}, {"MIX_REBAR3", ?config(rebar3, Config)},
           {"HEX_OFFLINE", "1"}, {"MIX_ENV", "prod"},
           {"http_proxy", Closed}, {"https_proxy", Closed},
           {"HTTP_PROXY", Closed}, {"HTTPS_PROXY", Closed}],
    Inherited = [Name || Var <- os:getenv(), [Name | _] <- [string:split(Var, "=")],
                         lists:any(fun(P) -> lists:prefix(P, Name) end,
                                   ["REBAR", "ERL_", "MIX_", "HEX_", "RELEASE_", "ELIXIR_", "MAKE",
                                    "MFLAGS", "LD_PRELOAD", "MALLOCINFO_"])],
    [{Name, false} || Name <- Inherited, not lists:keymember(Name, 1, Set)] ++ Set.

mix(Config, Dir, Args) ->
    run(?config(mix, Config), Args, env(Config), Dir).

%% Mix downloaded nothing: neither hex nor a rebar3 of its own is installed.
offline_checks(Config) ->
    Home = ?config(home, Config),
    ?assertEqual([], filelib:wildcard("**/{hex,rebar,rebar3}*", Home)),
    ?assertEqual([], filelib:wildcard("**/archives", Home)).

rel(Config, App, Args) ->
    run(script(Config, App), Args, [{"RELEASE_NODE", node_name(Config, App)} | env(Config)],
        rel_dir(Config, App)).

node_name(Config, ?APP) -> ?config(node, Config);
node_name(Config, ?PLAIN) -> ?config(plain_node, Config).

%% Evaluates Expr on the release through `bin/<app> rpc' and returns its
%% value, printed by the release as an Erlang term.
rpc_term(Config, App, Expr) ->
    Out = rel(Config, App, ["rpc", lists:flatten(["value = (", Expr, "); "
                                                  ":io.format(~c\"MI_TERM ~w.~n\", [value])"])]),
    [Text] = [T || <<"MI_TERM ", T/binary>> <- binary:split(Out, <<"\n">>, [global])],
    {ok, Tokens, _} = erl_scan:string(binary_to_list(Text)),
    {ok, Term} = erl_parse:parse_term(Tokens),
    Term.

%% The OS pid the release reports (`bin/<app> pid'), once it answers.
wait_pid(_Config, App, 0) ->
    ct:fail({release_did_not_answer, App});
wait_pid(Config, App, N) ->
    try rel(Config, App, ["pid"]) of
        Out -> string:trim(binary_to_list(Out))
    catch
        exit:{test_case_failed, _} -> timer:sleep(500), wait_pid(Config, App, N - 1)
    end.

stop_release(Config, App, Pid) ->
    {T, _} = timer:tc(fun() ->
                              rel(Config, App, ["stop"]),
                              ok = wait_gone(Pid, 300)
                      end),
    ct:pal("~s stopped in ~.1f s", [App, T / 1.0e6]),
    Rel = rel_dir(Config, App),
    ?assertEqual([], filelib:wildcard("**/erl_crash.dump", Rel)),
    %% The daemon's console log says nothing but run_erl's banners.
    Logs = [file_bytes(L) || L <- filelib:wildcard(filename:join([Rel, "tmp", "log", "erlang.log.*"]))],
    [?assertEqual(nomatch, re:run(L, "error|crash|CRASH", [caseless])) || L <- Logs],
    ok = file:delete(pid_file(Config, App)).

wait_gone(_Pid, 0) -> {error, still_running};
wait_gone(Pid, N) ->
    case filelib:is_dir("/proc/" ++ Pid) of
        true -> timer:sleep(100), wait_gone(Pid, N - 1);
        false -> ok
    end.

stop_leftover(Config, App, Node) ->
    case file:read_file(pid_file(Config, App)) of
        {ok, Pid} ->
            _ = mi_ct:caught(fun() -> rel(Config, App, ["stop"]) end),
            case wait_gone(binary_to_list(Pid), 100) of
                ok -> ok;
                {error, still_running} -> kill_if_ours(binary_to_list(Pid), Node)
            end;
        {error, enoent} ->
            ok
    end.

%% Only the emulator that runs our node, by pid.
kill_if_ours(Pid, Node) ->
    case file:read_file("/proc/" ++ Pid ++ "/cmdline") of
        {ok, Cmd} ->
            case binary:match(Cmd, list_to_binary(Node)) of
                nomatch -> ok;
                _ -> os:cmd("kill -9 " ++ Pid), ok
            end;
        {error, _} ->
            ok
    end.

pid_file(Config, App) -> filename:join(?config(priv_dir, Config), App ++ ".pid").

app_dir(Config, App) -> filename:join(?config(priv_dir, Config), App).

rel_dir(Config, App) -> filename:join([app_dir(Config, App), "_build", "prod", "rel", App]).

script(Config, App) -> filename:join([rel_dir(Config, App), "bin", App]).

vsn() ->
    case application:load(mallocinfo) of
        ok -> ok;
        {error, {already_loaded, mallocinfo}} -> ok
    end,
    {ok, V} = application:get_key(mallocinfo, vsn),
    V.

leak_sites(Sites) ->
    [S || #{stack := [#{symbol := <<"mi_elixir_leak_here">>} | _]} = S <- Sites].

xml_matches_mallinfo(_Config, _Xml, _Form, 0) ->
    ct:fail(xml_never_matched_mallinfo);
xml_matches_mallinfo(Config, Xml, Form, Tries) ->
    Arena = rpc_term(Config, ?APP,
                     io_lib:format(":ok = :mallocinfo.info(" ++ Form ++ "); "
                                   "{:ok, m} = :mallocinfo.mallinfo(); m.arena", [Xml])),
    {Doc, _} = xmerl_scan:file(Xml, [{quiet, true}]),
    #xmlElement{name = malloc, content = Content} = Doc,
    [Current] = [list_to_integer(V)
                 || #xmlElement{name = system, attributes = As} <- Content,
                    {"current", V} <- [{attr(type, As), attr(size, As)}]],
    ct:pal("~ts: system current ~p, mallinfo arena ~p", [Xml, Current, Arena]),
    case Current of
        Arena -> ok;
        _ -> xml_matches_mallinfo(Config, Xml, Form, Tries - 1)
    end.

attr(Name, Attrs) ->
    hd([V || #xmlAttribute{name = N, value = V} <- Attrs, N =:= Name]).

%%% Sources and the test NIF --------------------------------------------------

%% mallocinfo's build inputs as a clone has them: sources and the tracked
%% priv/.gitkeep; no objects, shared objects, escript or _build, and no
%% empty directory (git keeps none, and a missing priv/ is what broke the
%% build of a git dependency under Mix).
copy_sources(Root, Dest) ->
    ok = file:make_dir(Dest),
    Inputs = [F || F <- ["rebar.config", "rebar.lock", "src", "scripts", "c_src", "priv"],
                   filelib:is_file(filename:join(Root, F))],
    sh(io_lib:format("tar -C ~ts --exclude=c_src/build --exclude='priv/*.so' "
                     "--exclude='priv/mallocinfo-heapmap*' -cf - ~ts | tar -C ~ts -xf - && "
                     "find ~ts -type d -empty -delete",
                     [q(Root), lists:join(" ", Inputs), q(Dest), q(Dest)])),
    ?assertEqual([], filelib:wildcard("priv/*.so", Dest)),
    ?assertEqual([], filelib:wildcard("c_src/build", Dest)).

copy_project(Config, App) ->
    Src = filename:join(?config(data_dir, Config), App),
    sh(io_lib:format("cp -r ~ts ~ts", [q(Src), q(app_dir(Config, App))])).

%% priv/mi_elixir_leak.so of the application, before `mix release' packs it
%% (mi_test_nif.h from the suites' include directory, as for every test NIF).
compile_leak_nif(Config, App) ->
    Erts = filename:join([code:root_dir(), "erts-" ++ erlang:system_info(version), "include"]),
    PrivDir = filename:join(App, "priv"),
    ok = filelib:ensure_dir(filename:join(PrivDir, "x")),
    run(executable("cc"), ["-O1", "-g", "-fPIC", "-shared", "-I" ++ Erts,
                           "-I" ++ mi_ct:include_dir(Config), "-o",
                           filename:join(PrivDir, "mi_elixir_leak.so"),
                           filename:join([App, "c_src", "mi_elixir_leak.c"])],
        [], ?config(priv_dir, Config)).

%%% The remote console through tmux ------------------------------------------

%% A regular expression for a line that is an iex map of exactly these keys
%% (atoms) and values, in any order: iex prints a map's keys in the VM's
%% order, alphabetical on OTP 25 but not from OTP 26 on (Elixir 1.18 on
%% OTP 27 printed `%{count: 2048, bytes: 16777216}').
map_regex(Pairs) ->
    Orders = [lists:join(", ", [[K, ": ", V] || {K, V} <- P]) || P <- permutations(Pairs)],
    lists:flatten(["^%\\{(", lists:join("|", Orders), ")\\}$"]).

permutations([]) -> [[]];
permutations(L) -> [[H | T] || H <- L, T <- permutations(L -- [H])].

%% `bin/<app> remote' in a tmux session named after the application.
open_console(Config, App, Node) ->
    %% tmux passes its own server's environment to the session's command:
    %% the command sets what the release needs itself.
    Env = [case V of
               false -> ["-u ", K];
               _ -> [K, "=", q(V)]
           end || {K, V} <- env(Config)],
    Cmd = ["env ", lists:join(" ", Env), " RELEASE_NODE=", Node, " ", q(script(Config, App)),
           " remote"],
    mi_console:open(?config(tmux, Config), App, Cmd, "iex\\(" ++ Node ++ "@[^)]+\\)1> $").

%%% Files ---------------------------------------------------------------------

file_bytes(Path) ->
    {ok, B} = file:read_file(Path),
    B.

same_file(A, B) ->
    case {file:read_file_info(A), file:read_file_info(B)} of
        {{ok, #file_info{major_device = D, inode = I}}, {ok, #file_info{major_device = D, inode = I}}} -> true;
        _ -> false
    end.
