%% Set-up shared by the Common Test suites: test NIFs built from a suite's
%% data directory, peer nodes (with or without the interposer) that see
%% mallocinfo and the suite's priv_dir, and a distributed CT node.
-module(mi_ct).
-export([caught/1, chromium/2, body_attrs/1, pprof/0, ensure_distributed/0, build_nif/2, build_nif/3, build_nif/4, init_tracker_suite/2,
         compile_module/2, compile_module/3, include_dir/1, start_peer/2, start_peer/3, stop_peer/1, call/4,
         project_root/0, tarball/0, demo_dir/0, ok_call/4]).

-include_lib("common_test/include/ct.hrl").

%% Makes this CT node a distributed node, if it is not one yet: peers
%% started with a name, erpc and mallocinfo:report(Nodes) need it.
%% net_kernel:start/1 does not start epmd (erl -sname does), and on a
%% fresh CI machine no epmd is running yet, so start one first;
%% `epmd -daemon' returns at once when one already listens.
ensure_distributed() ->
    case node() of
        nonode@nohost ->
            _ = os:cmd("epmd -daemon"),
            %% epmd -daemon returns before it listens: on a machine where
            %% no epmd ran yet, net_kernel would find none (nodistribution).
            ok = epmd_listening(200),
            Name = list_to_atom("mi_ct_" ++ os:getpid()),
            {ok, _} = net_kernel:start([Name, shortnames]),
            ok;
        _ ->
            ok
    end.

epmd_listening(0) ->
    {error, epmd_not_listening};
epmd_listening(Tries) ->
    case erl_epmd:names() of
        {ok, _} ->
            ok;
        {error, _} ->
            timer:sleep(50),
            epmd_listening(Tries - 1)
    end.

%% @equiv build_nif(Config, Name, "")
build_nif(Config, Name) ->
    build_nif(Config, Name, "").

%% @equiv build_nif(Config, Name, Name, CFlags)
build_nif(Config, Name, CFlags) ->
    build_nif(Config, Name, Name, CFlags).

%% Builds a test NIF of the suite: data_dir's Source.c into priv_dir's
%% Name.so (with symbols, so stacks name its functions; CFlags added, e.g.
%% -D options; include_dir/1's mi_test_nif.h on the include path) and its
%% stub module, if there is one, into priv_dir: data_dir's Source.erl with
%% the macro MI_MODULE set to Name (so one stub source serves several
%% builds of one NIF, `-module(?MI_MODULE).'), else Name.erl. Fails the
%% suite on any compiler output.
build_nif(Config, Source, Name, CFlags) ->
    Data = ?config(data_dir, Config),
    Erts = filename:join([code:root_dir(), "erts-" ++ erlang:system_info(version), "include"]),
    So = filename:join(?config(priv_dir, Config), Name ++ ".so"),
    Cmd = io_lib:format("cc -O1 -g -fPIC -shared -pthread -I~ts -I~ts ~s -o ~ts ~ts 2>&1",
                        [Erts, include_dir(Config), CFlags, So,
                         filename:join(Data, Source ++ ".c")]),
    "" = os:cmd(lists:flatten(Cmd)),
    Stubs = [F || F <- [Source ++ ".erl", Name ++ ".erl"],
                  filelib:is_regular(filename:join(Data, F))],
    case Stubs of
        [Stub | _] -> compile_module(Config, Stub, [{d, 'MI_MODULE', list_to_atom(Name)}]);
        [] -> ok
    end.

%% The set-up of a suite that runs its NIF under the tracker: the NIF built
%% (build_nif/2), and the interposer there to preload (a clear failure here
%% rather than one per case). Returns Config.
init_tracker_suite(Config, Nif) ->
    ok = build_nif(Config, Nif),
    true = filelib:is_regular(mallocinfo_trace:preload_path()),
    Config.

%% @equiv compile_module(Config, File, [])
compile_module(Config, File) ->
    compile_module(Config, File, []).

%% Compiles data_dir's File (a module of the suite's, e.g. a NIF's stub),
%% with include_dir/1 on the include path and Opts added, into priv_dir as
%% <its module>.beam (which need not be File's name).
compile_module(Config, File, Opts) ->
    {ok, Mod, Beam} = compile:file(filename:join(?config(data_dir, Config), File),
                                   [binary, {i, include_dir(Config)}, report, warnings_as_errors
                                    | Opts]),
    ok = file:write_file(filename:join(?config(priv_dir, Config), atom_to_list(Mod) ++ ".beam"),
                         Beam).

%% test/include of the tree the suite runs from (the parent of every
%% data_dir): mi_test_nif.h for the test NIFs, mi_test_nif.hrl for their
%% stub modules.
include_dir(Config) ->
    Data = filename:absname(?config(data_dir, Config)),
    filename:join(filename:dirname(string:trim(Data, trailing, "/")), "include").

%% @equiv start_peer(Config, Env, [])
start_peer(Config, Env) ->
    start_peer(Config, Env, []).

%% A peer linked to the test case, over standard_io (no distribution
%% needed), with the environment `Env' (mallocinfo_trace:preload_env/1 for
%% the interposer; [] inherits this node's, which has none), mallocinfo's
%% ebin and the suite's priv_dir on its path, then `Args'; mallocinfo is
%% loaded there. Returns Config with `{peer, Peer}'.
start_peer(Config, Env, Args) ->
    Ebin = filename:dirname(code:which(mallocinfo)),
    {ok, Peer, _Node} =
        peer:start_link(#{connection => standard_io, env => Env,
                          args => ["-pa", Ebin, "-pa", ?config(priv_dir, Config) | Args]}),
    {module, mallocinfo} = peer:call(Peer, code, ensure_loaded, [mallocinfo]),
    [{peer, Peer} | Config].

%% Stops the case's peer, if it has one.
stop_peer(Config) ->
    case ?config(peer, Config) of
        undefined -> ok;
        Peer -> peer:stop(Peer)
    end.

%% M:F(A...) on the case's peer, up to 2 minutes (a loaded CI machine).
call(Config, M, F, A) ->
    peer:call(?config(peer, Config), M, F, A, 120000).

%% call/4 of a call that must succeed: its value, out of {ok, Value} (a
%% badmatch with the error otherwise).
ok_call(Config, M, F, A) ->
    {ok, Value} = call(Config, M, F, A),
    Value.

%% The project's top directory (the one with the Makefile and c_src/),
%% found upwards from mallocinfo's build directory.
project_root() ->
    project_root(filename:absname(code:lib_dir(mallocinfo))).

project_root("/") -> ct:fail(no_project_root);
project_root(Dir) ->
    case filelib:is_regular(filename:join(Dir, "Makefile"))
        andalso filelib:is_dir(filename:join(Dir, "c_src")) of
        true -> Dir;
        false -> project_root(filename:dirname(Dir))
    end.

%% The directory `make demo' builds make run's workload into (the demo's
%% beams and its NIF, outside the application), built now if it is not
%% there. Works from EUnit too.
demo_dir() ->
    Root = project_root(),
    Dir = filename:join([Root, "_build", "demo"]),
    case filelib:is_regular(filename:join(Dir, "mallocinfo_demo_nif.so")) andalso
        filelib:is_regular(filename:join(Dir, "mallocinfo_demo.beam")) of
        true ->
            Dir;
        false ->
            Out = os:cmd("make -s -C '" ++ Root ++ "' demo 2>&1; echo \"rc=$?\""),
            case lists:suffix("rc=0\n", Out) of
                true -> Dir;
                false -> erlang:error({make_demo, Out})
            end
    end.

%% The operator's tarball `make tarball' built (make ct exports its path),
%% else built now.
tarball() ->
    case os:getenv("MALLOCINFO_TARBALL") of
        Path when is_list(Path), Path =/= "" ->
            true = filelib:is_regular(Path),
            Path;
        _ ->
            Root = project_root(),
            Out = os:cmd("make -s -C '" ++ Root ++ "' tarball 2>&1; echo \"rc=$?\""),
            case lists:suffix("rc=0\n", Out) of
                true -> filename:join(Root, "mallocinfo.tar.gz");
                false -> ct:fail({make_tarball, Out})
            end
    end.

%% What `catch F()' gave, without it (deprecated in OTP 29): the value, a
%% thrown term, {'EXIT', {Reason, Stack}} for an error, {'EXIT', Reason}
%% for an exit.
-spec caught(fun(() -> term())) -> term().
caught(F) ->
    try F()
    catch
        throw:T -> T;
        error:R:S -> {'EXIT', {R, S}};
        exit:R -> {'EXIT', R}
    end.

%% The reader of gperftools' heap profiles: google-pprof, or where the
%% release has none (gperftools 2.18, Debian unstable, dropped it) jeprof,
%% jemalloc's fork of the same script, which reads that format too.
-spec pprof() -> string().
pprof() ->
    case os:find_executable("google-pprof") of
        false -> "jeprof";
        _ -> "google-pprof"
    end.

%% Headless Chromium on Args (e.g. "--dump-dom", a URL), its profile in the
%% case's priv_dir; what it printed. Fails the case when Chromium is not
%% installed (make deps installs it: docker/packages.txt).
chromium(Config, Args) ->
    Exe = case os:find_executable("chromium") of
              false -> ct:fail("chromium is not installed: make deps installs it "
                               "(docker/packages.txt)");
              Path -> Path
          end,
    Dir = filename:join(?config(priv_dir, Config), "chromium"),
    ok = filelib:ensure_path(Dir),
    Cmd = lists:flatten(lists:join(" ", ["timeout", "120", Exe, "--headless=new",
                                         "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                                         "--user-data-dir=" ++ Dir
                                         | ["'" ++ A ++ "'" || A <- Args]]
                                   ++ ["2>/dev/null"])),
    unicode:characters_to_binary(os:cmd(Cmd)).

%% The <body ...> attributes of a DOM Chromium dumped: the pages report
%% their state there (data-ok, data-errors).
body_attrs(Dom) ->
    {match, [Body]} = re:run(Dom, "<body([^>]*)>", [{capture, all_but_first, binary}]),
    maps:from_list([{K, V} || [K, V] <- element(2, re:run(Body, "([a-z-]+)=\"([^\"]*)\"",
                                                          [global, {capture, all_but_first,
                                                                    binary}]))]).
