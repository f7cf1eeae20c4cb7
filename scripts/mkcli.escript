#!/usr/bin/env escript
%% Builds priv/mallocinfo-heapmap, the offline heap map renderer: one file
%% holding the modules it needs (debug info stripped), runnable by
%% `escript' on any machine with OTP 25 or newer.
%%
%% Run by rebar3's compile post_hook, in mallocinfo's own directory, with
%% rebar3's hook environment. The beams are read from wherever that build
%% wrote them, which depends on who drives rebar3 (see ebin/0); run by hand
%% with no such environment, it reads `_build/default/lib/mallocinfo/ebin'.
-mode(compile).

-include_lib("kernel/include/file.hrl").

%% Everything mallocinfo_heapmap_cli reaches: the heap map family (none of
%% it needs the NIF) and the leaves it calls.
-define(MODULES, [mallocinfo_heapmap_cli, mallocinfo_heapmap, mallocinfo_heapmap_read,
                  mallocinfo_heapmap_draw, mallocinfo_heapmap_html, mallocinfo_heapmap_summary,
                  mallocinfo_file, mallocinfo_lib, mallocinfo_png, mallocinfo_text,
                  mallocinfo_units]).

main([]) ->
    Ebin = ebin(),
    Files = [beam(Ebin, M) || M <- ?MODULES],
    Out = "priv/mallocinfo-heapmap",
    Tmp = Out ++ ".tmp",
    ok = filelib:ensure_dir(Out),
    ok = escript:create(Tmp, [shebang,
                              {comment, "mallocinfo-heapmap DUMP OUTDIR: heap dump to PNG heap maps and index.html"},
                              {emu_args, "-escript main mallocinfo_heapmap_cli"},
                              {archive, Files, []}]),
    ok = file:change_mode(Tmp, 8#755),
    ok = file:rename(Tmp, Out).

%% The application's ebin, as the running build chose it:
%% - `rebar3 bare compile' (what Mix runs for a `manager: :rebar3'
%%   dependency) writes to $REBAR_BARE_COMPILER_OUTPUT_DIR/ebin, e.g. the
%%   Mix project's _build/prod/lib/mallocinfo/ebin, far from this directory;
%% - otherwise rebar3 writes to <lib>/mallocinfo/ebin (lib_dir/0).
ebin() ->
    case env("REBAR_BARE_COMPILER_OUTPUT_DIR") of
        false -> filename:join([lib_dir(), "mallocinfo", "ebin"]);
        Out -> filename:join(Out, "ebin")
    end.

%% An app in _checkouts is written under $REBAR_CHECKOUTS_OUT_DIR; the
%% top-level app, an umbrella app or a rebar3 dependency under
%% $REBAR_DEPS_DIR, the profile's lib directory.
lib_dir() ->
    InCheckouts = case env("REBAR_CHECKOUTS_DIR") of
                      false -> false;
                      Checkouts -> same_dir(filename:join(Checkouts, "mallocinfo"), ".")
                  end,
    case {InCheckouts, env("REBAR_CHECKOUTS_OUT_DIR"), env("REBAR_DEPS_DIR")} of
        {true, CheckoutsOut, _} when CheckoutsOut =/= false -> CheckoutsOut;
        {_, _, Deps} when Deps =/= false -> Deps;
        _ -> "_build/default/lib"
    end.

env(Name) ->
    case os:getenv(Name) of
        "" -> false;
        Value -> Value
    end.

%% By identity, not by name: _checkouts/mallocinfo is usually a symlink, and
%% the hook's working directory is its target.
same_dir(A, B) ->
    case {file:read_file_info(A), file:read_file_info(B)} of
        {{ok, #file_info{major_device = D, inode = I}}, {ok, #file_info{major_device = D, inode = I}}} -> true;
        _ -> false
    end.

beam(Ebin, M) ->
    Path = filename:join(Ebin, atom_to_list(M) ++ ".beam"),
    case file:read_file(Path) of
        {ok, Full} ->
            {ok, {M, Beam}} = beam_lib:strip(Full),
            {atom_to_list(M) ++ ".beam", Beam};
        {error, Why} ->
            io:format(standard_error, "mkcli: cannot read ~ts: ~ts~n", [Path, file:format_error(Why)]),
            halt(1)
    end.
