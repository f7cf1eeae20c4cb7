%% @private Loading mallocinfo into another node over distribution: the
%% object code of modules this node has loaded, and, for the whole
%% application, the NIF's shared object through a private directory.
%%
%% Used by `mallocinfo_report:collect/1' (a node of the cluster without
%% mallocinfo gets all of it) and `mallocinfo_process' (a remote pid's
%% node gets that one pure module). Nothing is written on the target but
%% the shared objects, in a directory that is gone when the call returns.
%% erpc's own errors (`{erpc, noconnection}', `{erpc, timeout}', ...) are
%% raised as erpc raises them: the callers map them to their own shapes.
-module(mallocinfo_remote).

-export([ensure_app/2, load_modules/3]).

%% The NIF is sent; the interposer is not: it only works from LD_PRELOAD
%% at start or attach/0 on the node's own copy.
-define(SO_SENT, ["mallocinfo_nif.so"]).

%% `{ok, false}' when `Node' already has mallocinfo, `{ok, true}' when it
%% was loaded there now: every module of the application it lacks, sent
%% from this node, and the NIF's shared object written to a private
%% directory (mode 0700, random name, under the target's `TMPDIR' or
%% `/tmp'), loaded from there, and the directory removed. `{error, Why}'
%% says which step failed.
-spec ensure_app(node(), timeout()) -> {ok, boolean()} | {error, term()}.
ensure_app(Node, Timeout) ->
    case erpc:call(Node, code, ensure_loaded, [mallocinfo], Timeout) of
        {module, mallocinfo} ->
            {ok, false};
        {error, _} ->
            try inject(Node, Timeout) of
                ok -> {ok, true}
            catch throw:{inject, Why} -> {error, Why}
            end
    end.

%% Loads the object code of `Modules' (loaded or loadable on this node) on
%% `Node', in that order. `{error, {Module, Why}}' for the first that
%% could not be loaded (`no_object_code' when this node has none: checked
%% for every module before anything is sent).
-spec load_modules(node(), [module()], timeout()) -> ok | {error, {module(), term()}}.
load_modules(Node, Modules, Timeout) ->
    case object_code(Modules) of
        {ok, Objects} -> load_objects(Node, Objects, fun(_, File) -> File end, Timeout);
        {error, _} = E -> E
    end.

%% Every module's object code, before anything is loaded anywhere.
object_code(Modules) ->
    Objects = [{M, code:get_object_code(M)} || M <- Modules],
    case [M || {M, error} <- Objects] of
        [] -> {ok, [Object || {_, Object} <- Objects]};
        [M | _] -> {error, {M, no_object_code}}
    end.

%% Loads them on Node in order, each module's file name there given by
%% Name(Module, ItsFileHere).
load_objects(_Node, [], _Name, _Timeout) ->
    ok;
load_objects(Node, [{M, Bin, File} | Rest], Name, Timeout) ->
    case erpc:call(Node, code, load_binary, [M, Name(M, File), Bin], Timeout) of
        {module, M} -> load_objects(Node, Rest, Name, Timeout);
        {error, Why} -> {error, {M, Why}}
    end.

inject(Node, Timeout) ->
    Call = fun(M, F, A) -> erpc:call(Node, M, F, A, Timeout) end,
    Missing = [M || M <- mallocinfo_lib:app_modules(),
                    element(1, Call(code, ensure_loaded, [M])) =:= error],
    %% mallocinfo_nif first, mallocinfo last (its on_load loads its
    %% siblings); all the object code is in hand before the target changes.
    First = [M || M <- [mallocinfo_nif], lists:member(M, Missing)],
    Last = [M || M <- [mallocinfo], lists:member(M, Missing)],
    Objects = case object_code(First ++ ((Missing -- First) -- Last) ++ Last) of
                  {ok, Os} -> Os;
                  {error, {NoCode, no_object_code}} -> throw({inject, {no_object_code, NoCode}})
              end,
    Tmp = mallocinfo_file:tmp_dir(Call(os, getenv, ["TMPDIR"])),
    OnTarget = fun(F, A) -> Call(file, F, A) end,
    Dir = case mallocinfo_file:private_dir(Tmp, "mallocinfo-", OnTarget) of
              {ok, Made} -> Made;
              {error, {make_dir, _, eexist}} -> throw({inject, no_private_dir});
              {error, {make_dir, _, _} = NotMade} -> throw({inject, NotMade});
              {error, {chmod, NoMode, Posix}} -> throw({inject, {{chmod, NoMode}, {error, Posix}}})
          end,
    try
        Priv = filename:dirname(mallocinfo_nif:so_path()),
        [begin
             Bin = must(file:read_file(filename:join(Priv, So)), {read, So}),
             Target = filename:join(Dir, So),
             must(Call(file, write_file, [Target, Bin]), {write, Target}),
             must(Call(file, change_mode, [Target, 8#500]), {chmod, Target})
         end || So <- ?SO_SENT],
        %% mallocinfo_nif's on_load looks here first (see so_path/0).
        must(Call(application, set_env, [mallocinfo, nif_dir, Dir]), set_env),
        %% Each module's file name is where it would be in that directory:
        %% code:which/1 there names the directory it came from.
        InDir = fun(M, _) -> filename:join(Dir, atom_to_list(M) ++ ".beam") end,
        case load_objects(Node, Objects, InDir, Timeout) of
            ok -> ok;
            {error, {M, Why}} -> throw({inject, {load_failed, M, Why}})
        end,
        %% Nothing missing was found to send (an application list that
        %% named nothing, say): say so rather than claim it is there.
        case Call(code, ensure_loaded, [mallocinfo]) of
            {module, mallocinfo} -> ok;
            Other -> throw({inject, {not_loaded, Other}})
        end
    after
        %% A loaded shared object stays mapped after its file is gone:
        %% nothing is left on the target's disk.
        _ = Call(application, unset_env, [mallocinfo, nif_dir]),
        _ = Call(file, del_dir_r, [Dir])
    end.

%% ok and {ok, Value} pass (as ok and Value); anything else stops the
%% injection, saying which step failed.
must(ok, _) -> ok;
must({ok, Value}, _) -> Value;
must(Other, Step) -> throw({inject, {Step, Other}}).
