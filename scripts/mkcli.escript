#!/usr/bin/env escript
%% Builds priv/mallocinfo-heapmap, the offline heap map renderer: one file
%% holding the three modules it needs (debug info stripped), runnable by
%% `escript' on any machine with OTP 25 or newer. Run by rebar3's compile
%% post_hook, which sets REBAR_DEPS_DIR to the profile's lib directory.
-mode(compile).

-define(MODULES, [mallocinfo_heapmap_cli, mallocinfo_heapmap, mallocinfo_png, mallocinfo_units]).

main([]) ->
    Lib = case os:getenv("REBAR_DEPS_DIR") of
              false -> "_build/default/lib";
              Dir -> Dir
          end,
    Ebin = filename:join([Lib, "mallocinfo", "ebin"]),
    Files = [begin
                 {ok, Full} = file:read_file(filename:join(Ebin, atom_to_list(M) ++ ".beam")),
                 {ok, {M, Beam}} = beam_lib:strip(Full),
                 {atom_to_list(M) ++ ".beam", Beam}
             end || M <- ?MODULES],
    Out = "priv/mallocinfo-heapmap",
    Tmp = Out ++ ".tmp",
    ok = filelib:ensure_dir(Out),
    ok = escript:create(Tmp, [shebang,
                              {comment, "mallocinfo-heapmap DUMP OUTDIR: heap dump to PNG heap maps and index.html"},
                              {emu_args, "-escript main mallocinfo_heapmap_cli"},
                              {archive, Files, []}]),
    ok = file:change_mode(Tmp, 8#755),
    ok = file:rename(Tmp, Out).
