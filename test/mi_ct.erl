%% Set-up shared by the Common Test suites: test NIFs built from a suite's
%% data directory, peer nodes (with or without the interposer) that see
%% mallocinfo and the suite's priv_dir, and a distributed CT node.
-module(mi_ct).
-export([ensure_distributed/0, build_nif/2, build_nif/3, build_nif/4, start_peer/2, start_peer/3,
         stop_peer/1, call/4, project_root/0, tarball/0, demo_dir/0]).

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
            Name = list_to_atom("mi_ct_" ++ os:getpid()),
            {ok, _} = net_kernel:start([Name, shortnames]),
            ok;
        _ ->
            ok
    end.

%% @equiv build_nif(Config, Name, "")
build_nif(Config, Name) ->
    build_nif(Config, Name, "").

%% @equiv build_nif(Config, Name, Name, CFlags)
build_nif(Config, Name, CFlags) ->
    build_nif(Config, Name, Name, CFlags).

%% Builds a test NIF of the suite: data_dir's Source.c into priv_dir's
%% Name.so (with symbols, so stacks name its functions; CFlags added, e.g.
%% -D options) and data_dir's Name.erl, its stub module, if there is one,
%% into priv_dir. Fails the suite on any compiler output.
build_nif(Config, Source, Name, CFlags) ->
    Priv = ?config(priv_dir, Config),
    Data = ?config(data_dir, Config),
    Erts = filename:join([code:root_dir(), "erts-" ++ erlang:system_info(version), "include"]),
    So = filename:join(Priv, Name ++ ".so"),
    Cmd = io_lib:format("cc -O1 -g -fPIC -shared -pthread -I~ts ~s -o ~ts ~ts 2>&1",
                        [Erts, CFlags, So, filename:join(Data, Source ++ ".c")]),
    "" = os:cmd(lists:flatten(Cmd)),
    Erl = filename:join(Data, Name ++ ".erl"),
    case filelib:is_regular(Erl) of
        true -> {ok, _} = compile:file(Erl, [{outdir, Priv}]), ok;
        false -> ok
    end.

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
