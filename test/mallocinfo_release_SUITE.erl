%% End-to-end: inject the tarball into a running release, as an operator.
%%
%% Builds a minimal release (test/mallocinfo_release_SUITE_data/fixture) with
%% `rebar3 release', starts it as a daemon (embedded code loading), unpacks
%% mallocinfo.tar.gz into a directory of its own, and types into the
%% release's own `remote_console', through a pty owned by tmux, what a person
%% types. Then checks the XML the node wrote against its mallinfo().
-module(mallocinfo_release_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").
-include_lib("xmerl/include/xmerl.hrl").
-import(mi_console, [sh/1, q/1, type/3]).

-export([all/0, init_per_suite/1, end_per_suite/1]).
-export([tarball_is_the_tool_only/1, inject_through_remote_console/1]).

-define(REL, "mi_fixture").

all() -> [tarball_is_the_tool_only, inject_through_remote_console].

init_per_suite(Config) ->
    %% rebar3 ct gives every suite of a run the same priv_dir: work in a
    %% directory of this suite's own (the Elixir suite has an operator_copy
    %% too).
    Priv = filename:join(?config(priv_dir, Config), ?MODULE_STRING),
    ok = file:make_dir(Priv),
    Data = ?config(data_dir, Config),
    Tarball = mi_ct:tarball(),
    Fixture = filename:join(Priv, "fixture"),
    sh("cp -r " ++ q(filename:join(Data, "fixture")) ++ " " ++ q(Fixture)),
    Node = "mi_fixture_" ++ integer_to_list(erlang:unique_integer([positive])),
    ok = file:write_file(filename:join([Fixture, "config", "vm.args"]),
                         ["-sname ", Node, "\n-setcookie mi_fixture_cookie\n"]),
    sh("cd " ++ q(Fixture) ++ " && rebar3 release"),
    Rel = filename:join([Fixture, "_build", "default", "rel", ?REL]),
    Inject = filename:join(Priv, "operator_copy"),
    ok = file:make_dir(Inject),
    sh("tar -C " ++ q(Inject) ++ " -xzf " ++ q(Tarball)),
    Script = filename:join([Rel, "bin", ?REL]),
    sh(q(Script) ++ " daemon"),
    ok = wait_ping(Script, 50),
    Sock = "mi_ct_" ++ integer_to_list(erlang:unique_integer([positive])),
    [{script, Script}, {inject, Inject}, {tmux, Sock} | Config].

end_per_suite(Config) ->
    ok = mi_console:kill_server(?config(tmux, Config)),
    os:cmd(q(?config(script, Config)) ++ " stop"),
    ok.

%% The operator's package holds the tool, not the demo (a NIF that leaks
%% on purpose), and its .app lists exactly the modules it holds (loading
%% mallocinfo loads every listed module).
tarball_is_the_tool_only(Config) ->
    Dir = filename:join(?config(inject, Config), "mallocinfo"),
    ?assertEqual([], filelib:wildcard("**/*demo*", Dir)),
    {ok, [{application, mallocinfo, Props}]} =
        file:consult(filename:join([Dir, "ebin", "mallocinfo.app"])),
    Beams = [list_to_atom(filename:basename(F, ".beam"))
             || F <- filelib:wildcard(filename:join([Dir, "ebin", "*.beam"]))],
    ?assertEqual(lists:sort(Beams), lists:sort(proplists:get_value(modules, Props))),
    ?assert(lists:member(mallocinfo_trace, Beams)).

inject_through_remote_console(Config) ->
    Script = ?config(script, Config),
    Ebin = filename:join([?config(inject, Config), "mallocinfo", "ebin"]),
    Xml = filename:join(?config(priv_dir, Config), "x.xml"),
    Console = mi_console:open(?config(tmux, Config), "console", q(Script) ++ " remote_console",
                              "\\(mi_fixture_[0-9]+@[^)]+\\)1> $"),
    %% A release started as a daemon loads code in embedded mode.
    type(Console, "code:get_mode().", "^embedded$"),
    type(Console, "code:add_path(\"" ++ Ebin ++ "\").", "^true$"),
    type(Console, "l(mallocinfo).", "^\\{module,mallocinfo\\}$"),
    ok = xml_matches_mallinfo(Console, Xml, 5),
    %% xmerl is not part of the release: heaps/0 loads it from OTP.
    type(Console, "element(1, mallocinfo:heaps()).", "^ok$"),
    type(Console, "maps:is_key(in_use_bytes, element(2, mallocinfo:summary())).", "^true$"),
    type(Console, "mallocinfo:info(\"/nonexistent/x.xml\").", "^\\{error,enoent\\}$"),
    type(Console, "catch mallocinfo:info(42).", "badarg"),
    %% The release was started without LD_PRELOAD: attach the tracker from
    %% the console, leak from the demo NIF (loaded after attach), and the
    %% site is named with its exact count.
    type(Console, "mallocinfo_trace:attach().", "^ok$"),
    %% The demo is not in the tarball: the test brings `make demo''s
    %% directory as a workload of its own (its beams and, beside them, its
    %% NIF), copied, and loaded by hand as embedded mode wants.
    DemoEbin = filename:join(?config(inject, Config), "demo_ebin"),
    ok = file:make_dir(DemoEbin),
    Demo = mi_ct:demo_dir(),
    [{ok, _} = file:copy(filename:join(Demo, F), filename:join(DemoEbin, F))
     || F <- ["mallocinfo_demo.beam", "mallocinfo_demo_nif.beam", "mallocinfo_demo_nif.so"]],
    type(Console, "code:add_path(\"" ++ DemoEbin ++ "\").", "^true$"),
    type(Console, "[l(M) || M <- [mallocinfo_demo, mallocinfo_demo_nif]].",
         "^\\[\\{module,mallocinfo_demo\\},\\{module,mallocinfo_demo_nif\\}\\]$"),
    type(Console, "is_map(mallocinfo_demo:run(#{leak_blocks => 1000, threads => 1, "
                  "fragment_blocks => 100, enif_blocks => 1, hoard_terms => 100})).",
         "^true$"),
    type(Console, "io:format(\"MI_LEAK=~p~n\", [[C || #{count := C, stack := [#{symbol := "
                  "<<\"demo_cache_insert\">>} | _]} <- element(2, mallocinfo_trace:sites(50))]]).",
         "^MI_LEAK=\\[1000\\]$"),
    type(Console, "mallocinfo_demo:stop().", "^ok$"),
    type(Console, "mallocinfo_trace:detach().", "^ok$"),
    %% Leave the console the way a person does (^G q), not with q(), which
    %% would stop the release.
    mi_console:leave(Console),
    %% The release survived all of this and stops cleanly.
    "pong\n" = os:cmd(q(Script) ++ " ping"),
    sh(q(Script) ++ " stop"),
    ok = wait_down(Script, 50).

%% The XML's `system current' total is the bytes in all arenas, which is
%% mallinfo2().arena. Both are read from the live node; if the heap grew
%% between the two reads (the node is idle, but not frozen) read again.
xml_matches_mallinfo(_Console, _Xml, 0) ->
    ct:fail(xml_never_matched_mallinfo);
xml_matches_mallinfo(Console, Xml, Tries) ->
    type(Console, "mallocinfo:info(\"" ++ Xml ++ "\").", "^ok$"),
    Out = type(Console, "io:format(\"MI_ARENA=~p~n\", "
                        "[maps:get(arena, element(2, mallocinfo:mallinfo()))]).",
               "^MI_ARENA=[0-9]+$"),
    {match, [Arena]} = re:run(Out, "^MI_ARENA=([0-9]+)$", [multiline, {capture, all_but_first, list}]),
    {Doc, _} = xmerl_scan:file(Xml, [{quiet, true}]),
    #xmlElement{name = malloc, content = Content} = Doc,
    [Current] = [list_to_integer(V)
                 || #xmlElement{name = system, attributes = As} <- Content,
                    {"current", V} <- [{attr(type, As), attr(size, As)}]],
    ct:pal("XML system current ~p, mallinfo arena ~s", [Current, Arena]),
    case integer_to_list(Current) of
        Arena -> ok;
        _ -> xml_matches_mallinfo(Console, Xml, Tries - 1)
    end.

attr(Name, Attrs) ->
    hd([V || #xmlAttribute{name = N, value = V} <- Attrs, N =:= Name]).

%%% Helpers ------------------------------------------------------------------

wait_ping(_Script, 0) -> {error, release_did_not_start};
wait_ping(Script, N) ->
    case os:cmd(q(Script) ++ " ping") of
        "pong\n" -> ok;
        _ -> timer:sleep(200), wait_ping(Script, N - 1)
    end.

wait_down(_Script, 0) -> {error, release_did_not_stop};
wait_down(Script, N) ->
    case os:cmd(q(Script) ++ " ping") of
        "pong\n" -> timer:sleep(200), wait_down(Script, N - 1);
        _ -> ok
    end.
