%% @private Library loading and what the public modules share: the
%% application's own modules (mallocinfo's on_load loads them all),
%% finding OTP applications a release may lack (xmerl for
%% mallocinfo:heaps/0, inets for mallocinfo_http) in the OTP installation
%% the emulator runs from, and file names as the NIFs and the file module
%% take them.
-module(mallocinfo_lib).

-export([path_binary/2, path_name/2, app_modules/0, ensure_app/1, ensure_xmerl/0, load_xmerl/1,
         xmerl_candidates/1, lib_candidates/2, otp_roots/0]).

%% A file name as the NIFs take it: a binary in the native
%% encoding without NUL bytes; badarg with `Args' otherwise.
-spec path_binary(term(), [term()]) -> binary().
path_binary(Path, Args) when is_binary(Path) ->
    check_nul(Path, Args);
path_binary(Path, Args) when is_list(Path); is_atom(Path) ->
    try unicode:characters_to_binary(flat_name(Path), unicode, file:native_name_encoding()) of
        Bin when is_binary(Bin) -> check_nul(Bin, Args);
        _ -> erlang:error(badarg, Args)
    catch
        error:_ -> erlang:error(badarg, Args)
    end;
path_binary(_, Args) ->
    erlang:error(badarg, Args).

%% A file name as the file module takes it, validated and flattened:
%% a binary as it is (raw names allowed), atoms and deep lists of
%% characters, atoms and binaries as one string (so names built from it
%% with filename:join/2 are strings too). badarg with `Args' for anything
%% else, or a NUL.
-spec path_name(term(), [term()]) -> file:filename_all().
path_name(Path, Args) when is_binary(Path) ->
    check_nul(Path, Args);
path_name(Path, Args) when is_list(Path); is_atom(Path) ->
    try unicode:characters_to_list(flat_name(Path)) of
        Chars when is_list(Chars) ->
            lists:member(0, Chars) andalso erlang:error(badarg, Args),
            Chars;
        _ ->
            erlang:error(badarg, Args)
    catch
        error:_ -> erlang:error(badarg, Args)
    end;
path_name(_, Args) ->
    erlang:error(badarg, Args).

%% A file name as chardata: characters, atoms, binaries and deep lists of
%% them, as the file module takes them. Unlike filename:flatten/1 it
%% refuses an improper list (`[a | b]' would otherwise name the file "ab"):
%% the comprehension raises.
flat_name(A) when is_atom(A) -> atom_to_list(A);
flat_name(B) when is_binary(B) -> B;
flat_name(L) when is_list(L) -> [case E of
                                     C when is_integer(C) -> C;
                                     _ -> flat_name(E)
                                 end || E <- L].

check_nul(Bin, Args) ->
    case binary:match(Bin, <<0>>) of
        nomatch -> Bin;
        _ -> erlang:error(badarg, Args)
    end.

%% The application's modules: the `modules' of mallocinfo.app beside
%% mallocinfo.beam, else the mallocinfo*.beam files there, else (loaded
%% from binaries over distribution: no files, or files that are gone) the
%% loaded mallocinfo* modules. Called from mallocinfo's on_load, while the code server has
%% not recorded that module yet: code:which/1 then searches the path, and
%% mallocinfo.app is found the same way.
-spec app_modules() -> [module()].
app_modules() ->
    Ebin = case code:which(mallocinfo) of
               File when is_list(File) -> filename:dirname(File);
               _ ->
                   case code:where_is_file("mallocinfo.app") of
                       non_existing -> undefined;
                       App -> filename:dirname(App)
                   end
           end,
    Consulted = case Ebin of
                    undefined -> none;
                    _ -> file:consult(filename:join(Ebin, "mallocinfo.app"))
                end,
    Beams = case Ebin of
                undefined -> [];
                _ -> filelib:wildcard(filename:join(Ebin, "mallocinfo*.beam"))
            end,
    case {Consulted, Beams} of
        {{ok, [{application, mallocinfo, Props}]}, _} ->
            proplists:get_value(modules, Props, []);
        {_, [_ | _]} ->
            [list_to_atom(filename:basename(F, ".beam")) || F <- Beams];
        _ ->
            %% Loaded over distribution (mallocinfo_remote): the file names
            %% are those of a directory that is gone. make run's demo is
            %% not part of the application.
            lists:usort([M || {M, _} <- code:all_loaded(),
                              lists:prefix("mallocinfo", atom_to_list(M)),
                              not lists:prefix("mallocinfo_demo", atom_to_list(M))])
    end.

%% xmerl (mallocinfo:heaps/0) and inets (mallocinfo_http) are part of OTP
%% but not of every release. When the release lacks one, it is looked for
%% in the OTP installation the emulator runs from and every module of it
%% is loaded (embedded mode loads nothing lazily). ok when it is usable:
%% xmerl loaded, inets started.
-spec ensure_app(xmerl | inets) -> ok | {error, {missing_application, xmerl | inets}}.
ensure_app(App) when App =:= xmerl; App =:= inets ->
    case usable(App) of
        true ->
            ok;
        false ->
            Dirs = case code:lib_dir(App) of
                       {error, _} -> [];
                       D -> [filename:join(D, "ebin")]
                   end ++ lib_candidates(App, otp_roots()),
            load_app(App, Dirs)
    end;
ensure_app(App) ->
    erlang:error(badarg, [App]).

%% @equiv ensure_app(xmerl)
-spec ensure_xmerl() -> ok | {error, {missing_application, xmerl}}.
ensure_xmerl() ->
    ensure_app(xmerl).

%% Loads xmerl from the first directory that has it.
-spec load_xmerl([file:filename()]) -> ok | {error, {missing_application, xmerl}}.
load_xmerl(Dirs) ->
    filenames(Dirs) orelse erlang:error(badarg, [Dirs]),
    load_app(xmerl, Dirs).

%% Loads App from the first of Dirs that holds its modules and where it
%% becomes usable; a directory that fails leaves the code path as it was.
load_app(App, []) ->
    {error, {missing_application, App}};
load_app(App, [Dir | Rest]) ->
    Mods = [list_to_atom(filename:basename(F, ".beam"))
            || F <- filelib:wildcard(filename:join(Dir, "*.beam"))],
    case lists:all(fun(M) -> lists:member(M, Mods) end, needed(App)) of
        false ->
            load_app(App, Rest);
        true ->
            Added = not lists:member(Dir, code:get_path()) andalso code:add_pathz(Dir) =:= true,
            case code:ensure_modules_loaded(Mods) =:= ok andalso usable(App) of
                true ->
                    ok;
                false ->
                    _ = Added andalso code:del_path(Dir),
                    load_app(App, Rest)
            end
    end.

%% The modules that tell an application's ebin directory.
needed(xmerl) -> [xmerl_scan, xmerl_lib, xmerl_ucs];
needed(inets) -> [inets, httpd].

%% xmerl is a library (loaded is usable); httpd runs in inets' processes.
usable(xmerl) -> code:is_loaded(xmerl_scan) =/= false;
usable(inets) -> element(1, application:ensure_all_started(inets)) =:= ok.

%% Candidate xmerl ebin directories under the given OTP roots,
%% newest version first.
-spec xmerl_candidates([file:filename()]) -> [file:filename()].
xmerl_candidates(Roots) ->
    lib_candidates(xmerl, Roots).

%% Candidate ebin directories of the OTP application `App' under
%% the given OTP roots, newest version first: for the applications a
%% release may lack (xmerl here, inets for mallocinfo_http).
-spec lib_candidates(atom(), [file:filename()]) -> [file:filename()].
lib_candidates(App, Roots) ->
    is_atom(App) andalso filenames(Roots) orelse erlang:error(badarg, [App, Roots]),
    Pattern = atom_to_list(App) ++ "-*",
    lists:append(
      [lists:reverse(lists:sort(filelib:wildcard(filename:join([R, "lib", Pattern, "ebin"]))))
       || R <- lists:usort(Roots)]).

%% A proper list of flat file names (strings).
filenames([]) -> true;
filenames([F | Rest]) -> F =/= [] andalso io_lib:char_list(F) andalso filenames(Rest);
filenames(_) -> false.

%% The OTP installations to look in: the code server's root and
%% the one the running emulator comes from.
-spec otp_roots() -> [file:filename()].
otp_roots() ->
    %% BINDIR is <otp>/erts-<vsn>/bin for the emulator actually running.
    FromBindir = case os:getenv("BINDIR") of
                     false -> [];
                     Bindir -> [filename:dirname(filename:dirname(Bindir))]
                 end,
    [code:root_dir() | FromBindir].
