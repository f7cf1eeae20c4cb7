%% @private Writing files from Erlang the way every mallocinfo writer does
%% (the rule of the NIF's writers, c_src/glibc/atomic_file.h): only a
%% missing name or a regular file is replaced, a symbolic link is never
%% followed, and content is written to a temporary name, synced and then
%% renamed, so a crash or a failed write never leaves a partial file under
%% a final name.
%%
%% The functions that write throw `{posix, Posix}' rather than return it:
%% a writer (the heap map's PNG encoder) calls them from deep inside a
%% loop, and {@link write_all/3} catches them once for a whole set of
%% files and cleans up.
%%
%% Also the one home of where temporary files go ({@link tmp_dir/1}) and
%% of the private directory rule ({@link private_dir/3}), for the
%% profilers' files and the NIF sent to another node.
-module(mallocinfo_file).

-include_lib("kernel/include/file.hrl").

-export([write_all/3, check_target/1, ensure_dir/1, open_temp/1, write/2, sync/1,
         write_file/2]).
-export([tmp_dir/0, tmp_dir/1, private_dir/3]).

%% Random names private_dir/3 tries before it gives up: one is taken only
%% when something made it meanwhile (or planted it).
-define(PRIVATE_DIR_TRIES, 3).

%% The directory temporary files go under on this node: {@link tmp_dir/1}
%% of its `TMPDIR'.
-spec tmp_dir() -> file:filename().
tmp_dir() ->
    tmp_dir(os:getenv("TMPDIR")).

%% The directory temporary files go under, from the value of `TMPDIR'
%% (`os:getenv/1''s answer, on this node or another): that value when set
%% and not empty, else `/tmp'.
-spec tmp_dir(string() | false) -> file:filename().
tmp_dir(Dir) when is_list(Dir), Dir =/= [] -> Dir;
tmp_dir(_) -> "/tmp".

%% A fresh private directory under `Parent' (mkdtemp's rule): a random
%% name `Prefix' + 16 hex digits made with make_dir, which fails on
%% anything that exists, links included (so nothing planted in advance is
%% used), then mode 0700 before anything is put in it (so no one else can
%% plant a link in it); removed again when the mode cannot be set.
%% `File(Function, Args)' runs the file module's calls: `apply(file, ...)'
%% for this node, an erpc call to make one on another node (its
%% exceptions are raised as they come). `{error, {make_dir | chmod, Dir,
%% Posix}}' says which step failed; `eexist' after 3 names taken.
-spec private_dir(file:filename(), string(), fun((atom(), [term()]) -> term())) ->
          {ok, file:filename()} | {error, {make_dir | chmod, file:filename(), term()}}.
private_dir(Parent, Prefix, File) ->
    private_dir(Parent, Prefix, File, ?PRIVATE_DIR_TRIES).

private_dir(Parent, Prefix, File, Tries) ->
    Name = Prefix ++ string:lowercase(binary_to_list(binary:encode_hex(rand:bytes(8)))),
    Dir = filename:join(Parent, Name),
    case File(make_dir, [Dir]) of
        ok ->
            case File(change_mode, [Dir, 8#700]) of
                ok ->
                    {ok, Dir};
                {error, Why} ->
                    _ = File(del_dir, [Dir]),
                    {error, {chmod, Dir, Why}}
            end;
        {error, eexist} when Tries > 1 ->
            private_dir(Parent, Prefix, File, Tries - 1);
        {error, Why} ->
            {error, {make_dir, Dir, Why}}
    end.

%% Writes the files `Names' into `Dir' all or nothing. Every name is
%% checked first ({@link check_target/1}): one that may not be replaced
%% gives its error and nothing is made. Then `Dir' is created with its
%% missing parents, `WriteAll(TempOf)' writes each name's content to
%% `TempOf(Name)' (a fresh name in `Dir', for {@link open_temp/1} or
%% {@link write_file/2}), and the temporaries are renamed into place in
%% the reverse order of `Names': when the first name is there, so are the
%% others. On any failure (a `{posix, Posix}' thrown by these helpers is
%% returned as `{error, Posix}'; other exceptions are re-raised) the
%% temporaries and the directories made are removed. Returns the paths
%% written, in the order of `Names'.
-spec write_all(file:filename_all(), [file:filename()],
                fun((fun((file:filename()) -> file:filename_all())) -> term())) ->
          {ok, [file:filename_all()]} | {error, file:posix()}.
write_all(Dir, Names, WriteAll) ->
    %% A target that will not be replaced costs no writing and leaves
    %% nothing behind.
    case first_error([check_target(filename:join(Dir, N)) || N <- Names]) of
        ok ->
            case ensure_dir(Dir) of
                {ok, Created} -> write_all(Dir, Names, WriteAll, Created);
                {error, _} = E -> E
            end;
        {error, _} = E ->
            E
    end.

write_all(Dir, Names, WriteAll, Created) ->
    %% Unique across nodes writing into the same directory too.
    Tag = os:getpid() ++ "-" ++ integer_to_list(erlang:unique_integer([positive])),
    Temp = fun(Name) -> filename:join(Dir, "." ++ Name ++ "." ++ Tag ++ ".tmp") end,
    try
        _ = WriteAll(Temp),
        [commit(Temp(N), filename:join(Dir, N)) || N <- lists:reverse(Names)],
        {ok, [filename:join(Dir, N) || N <- Names]}
    catch
        Class:Why:Stack ->
            _ = [file:delete(Temp(N)) || N <- Names],
            _ = [file:del_dir(D) || D <- Created],
            case {Class, Why} of
                {throw, {posix, Posix}} -> {error, Posix};
                _ -> erlang:raise(Class, Why, Stack)
            end
    end.

first_error(Results) ->
    case [E || {error, _} = E <- Results] of
        [] -> ok;
        [E | _] -> E
    end.

%% What a name may be to be written: missing, or a regular file (replaced
%% whole); `{ok, Exists}' then. A directory is `eisdir'; anything else, a
%% symbolic link (never followed), a device, a FIFO or a socket, is
%% `eexist' and left as it is.
-spec check_target(file:filename_all()) -> {ok, boolean()} | {error, file:posix()}.
check_target(Path) ->
    case file:read_link_info(Path, [raw]) of
        {ok, #file_info{type = regular}} -> {ok, true};
        {ok, #file_info{type = directory}} -> {error, eisdir};
        {ok, #file_info{}} -> {error, eexist};
        {error, enoent} -> {ok, false};
        {error, _} = E -> E
    end.

%% Creates `Dir' and its missing parents; returns those it created,
%% deepest first, so a failure can remove them again. `enotdir' when
%% `Dir' (or a parent) is not a directory.
-spec ensure_dir(file:filename_all()) -> {ok, [file:filename_all()]} | {error, file:posix()}.
ensure_dir(Dir) ->
    case file:read_file_info(Dir) of
        {ok, #file_info{type = directory}} -> {ok, []};
        {ok, _} -> {error, enotdir};
        {error, enoent} ->
            Parent = filename:dirname(Dir),
            case Parent =:= Dir of
                true -> {error, enoent};
                false ->
                    case ensure_dir(Parent) of
                        {ok, Made} ->
                            case file:make_dir(Dir) of
                                ok -> {ok, [Dir | Made]};
                                {error, eexist} -> {ok, Made};
                                {error, _} = E -> _ = [file:del_dir(D) || D <- Made], E
                            end;
                        {error, _} = E -> E
                    end
            end;
        {error, _} = E -> E
    end.

%% Opens a temporary file for writing. `exclusive' (O_CREAT|O_EXCL) never
%% opens an existing name, links included. Throws `{posix, Posix}'.
-spec open_temp(file:filename_all()) -> file:io_device().
open_temp(Path) ->
    case file:open(Path, [write, raw, binary, delayed_write, exclusive]) of
        {ok, Fd} -> Fd;
        {error, Posix} -> throw({posix, Posix})
    end.

%% Writes to a file opened by open_temp/1. Throws `{posix, Posix}'.
-spec write(file:io_device(), iodata()) -> ok.
write(Fd, Data) ->
    case file:write(Fd, Data) of
        ok -> ok;
        {error, Posix} -> throw({posix, Posix})
    end.

%% On disk before it is renamed into place: a crash never leaves an empty
%% file under a final name. (file:sync/1 writes out delayed_write's buffer
%% first, and reports a failed delayed write.) Throws `{posix, Posix}'.
-spec sync(file:io_device()) -> ok.
sync(Fd) ->
    case file:sync(Fd) of
        ok -> ok;
        {error, Posix} -> throw({posix, Posix})
    end.

%% A whole temporary file: opened, written, synced and closed. Throws
%% `{posix, Posix}'.
-spec write_file(file:filename_all(), iodata()) -> ok.
write_file(Path, Data) ->
    Fd = open_temp(Path),
    try
        write(Fd, Data),
        sync(Fd)
    after
        file:close(Fd)
    end.

%% Renames a finished temporary over Target after a second look at what
%% Target is now (write_all/3 checked it before writing; this narrows the
%% window to the moment between the look and the rename). A name that was
%% free is taken with a hard link, which, unlike rename, fails when
%% something took the name meanwhile; that something is then checked like
%% any target. A filesystem without hard links falls back to rename.
commit(Temp, Target) ->
    commit(Temp, Target, 4).

commit(_Temp, _Target, 0) ->
    throw({posix, eexist});
commit(Temp, Target, Rounds) ->
    case check_target(Target) of
        {ok, true} ->
            rename(Temp, Target);
        {ok, false} ->
            case file:make_link(Temp, Target) of
                ok -> _ = file:delete(Temp), ok;
                {error, eexist} -> commit(Temp, Target, Rounds - 1);
                {error, _} -> rename(Temp, Target)
            end;
        {error, Posix} ->
            throw({posix, Posix})
    end.

rename(From, To) ->
    case file:rename(From, To) of
        ok -> ok;
        {error, Posix} -> throw({posix, Posix})
    end.
