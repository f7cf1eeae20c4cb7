%% Set-up shared by the Common Test suites.
-module(mi_ct).
-export([ensure_distributed/0]).

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
