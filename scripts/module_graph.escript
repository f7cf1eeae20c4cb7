#!/usr/bin/env escript
%% make lint's module graph check: the call graph between the
%% application's modules, computed by xref from the compiled beams, must
%% have no circle (no module calls, directly or through others, a module
%% that calls it). A circle is printed with the calls that make it, and
%% the check fails.
%%
%% Usage: escript scripts/module_graph.escript EbinDir
-mode(compile).

main([Ebin]) ->
    {ok, _} = xref:start(?MODULE, [{xref_mode, functions}]),
    ok = xref:set_default(?MODULE, [{warnings, false}, {verbose, false}]),
    {ok, Modules} = xref:add_directory(?MODULE, Ebin),
    %% ME: the module call graph; components: its strongly connected
    %% components, of which every one with two modules or more is a circle.
    {ok, Components} = xref:q(?MODULE, "components ME"),
    {ok, Calls} = xref:q(?MODULE, "ME"),
    Edges = [{A, B} || {A, B} <- Calls, A =/= B, lists:member(A, Modules),
                       lists:member(B, Modules)],
    case [lists:sort(C) || C <- Components, length(C) > 1] of
        [] ->
            io:format("module graph: ~b modules, ~b calls between them, no circle~n",
                      [length(Modules), length(Edges)]);
        Circles ->
            lists:foreach(
              fun(Circle) ->
                      io:format("module graph: a circle of ~b modules: ~ts~n",
                                [length(Circle), lists:join(", ", [atom_to_list(M) || M <- Circle])]),
                      [io:format("    ~ts -> ~ts~n", [A, B])
                       || {A, B} <- lists:sort(Edges),
                          lists:member(A, Circle), lists:member(B, Circle)]
              end, Circles),
            halt(1)
    end;
main(_) ->
    io:format(standard_error, "usage: escript scripts/module_graph.escript EbinDir~n", []),
    halt(2).
