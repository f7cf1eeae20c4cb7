%% The demo workload: reproduces the classic memory problems of a BEAM
%% node, so that `mallocinfo:report()' has something real to find (`make
%% run' starts it; `make demo' builds it into _build/demo, outside the
%% application: it is never shipped):
%% <ul>
%% <li>a NIF that leaks from one named call site, `demo_cache_insert' in
%%     `mallocinfo_demo_nif.so';</li>
%% <li>a fragmenting pattern: four threads, so four glibc arenas, each
%%     allocating many small blocks and freeing most of them in an
%%     interleaved pattern, which leaves the free memory pinned between the
%%     survivors;</li>
%% <li>`enif_alloc' blocks, tagged with the NIF module as their origin;</li>
%% <li>a process with a bloated heap (`mallocinfo_demo_hoarder'): it built
%%     a large list, kept a few elements, and now waits without collecting
%%     its garbage.</li>
%% </ul>
%% Never run it on a node you care about: it holds a few hundred MB on
%% purpose until {@link stop/0}.
-module(mallocinfo_demo).

-export([run/0, run/1, stop/0, make_run/1]).

-define(HOARDER, mallocinfo_demo_hoarder).
-define(DEFAULTS, #{leak_blocks => 160000, leak_size => 256,
                    threads => 4, fragment_blocks => 96000, fragment_size => 320,
                    keep_every => 12,
                    enif_blocks => 64, enif_size => 131072,
                    hoard_terms => 600000}).

%% @equiv run(#{})
-spec run() -> map() | {error, term()}.
run() ->
    run(#{}).

%% @doc Starts the workload and returns what it holds. Defaults (about
%% 40 MiB leaked, 110 MiB freed but pinned, 8 MiB from `enif_alloc', a
%% 30-60 MiB process heap): `leak_blocks' (160,000) of `leak_size' (256
%% bytes); `threads' (4) each allocating `fragment_blocks' (96,000) of
%% `fragment_size' (320 bytes) and keeping one in `keep_every' (12);
%% `enif_blocks' (64) of `enif_size' (128 KiB); `hoard_terms' (600,000
%% two-tuples built by the hoarder). Raises `badarg' on an unknown option
%% or a value that is not a positive integer. Returns
%% `#{leaked_bytes, leaked_blocks, fragment_kept_bytes,
%% fragment_freed_bytes, enif_bytes, hoarder}' or, when the workload could
%% not be started, `{error, Reason}'.
-spec run(#{atom() => pos_integer()}) -> map() | {error, term()}.
run(Opts) when is_map(Opts) ->
    case maps:keys(Opts) -- maps:keys(?DEFAULTS) of
        [] -> ok;
        _ -> erlang:error(badarg, [Opts])
    end,
    O = maps:merge(?DEFAULTS, Opts),
    maps:foreach(fun(_, V) when is_integer(V), V > 0 -> ok;
                    (_, _) -> erlang:error(badarg, [Opts])
                 end, O),
    #{leak_blocks := LB, leak_size := LS, threads := T, fragment_blocks := FB,
      fragment_size := FS, keep_every := K, enif_blocks := EB, enif_size := ES,
      hoard_terms := H} = O,
    Steps = [fun mallocinfo_demo_nif:load/0,
             fun() -> mallocinfo_demo_nif:cache_insert(LB, LS) end,
             fun() -> mallocinfo_demo_nif:enif_keep(EB, ES) end,
             fun() -> mallocinfo_demo_nif:fragment(T, FB, FS, K) end],
    case lists:foldl(fun(Step, ok) -> Step(); (_, Stop) -> Stop end, ok, Steps) of
        {ok, Kept, Freed} ->
            #{leaked_bytes => LB * LS, leaked_blocks => LB,
              fragment_kept_bytes => Kept, fragment_freed_bytes => Freed,
              enif_bytes => EB * ES, hoarder => hoarder(H)};
        {error, _} = E ->
            E
    end;
run(Opts) ->
    erlang:error(badarg, [Opts]).

%% @doc Frees everything the demo holds and stops the hoarder.
-spec stop() -> ok.
stop() ->
    case whereis(?HOARDER) of
        undefined -> ok;
        Pid -> exit(Pid, kill)
    end,
    case mallocinfo_demo_nif:load() of
        ok -> mallocinfo_demo_nif:release();
        {error, _} -> ok
    end.

%% @doc What `make run' does once the node is up: runs the demo, prints
%% `mallocinfo:report()', and writes `malloc_info.xml' (and, when
%% `mallocinfo_heap' is in the build, the heap map) into `Dir'.
-spec make_run(file:filename()) -> ok.
make_run(Dir) ->
    %% badarg before anything runs for what is not a file name.
    _ = mallocinfo_lib:path_binary(Dir, [Dir]),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    case mallocinfo_trace:status() of
        #{recording := true} -> ok;
        _ -> io:format("(the interposer is not preloaded: no native call sites)~n")
    end,
    case run() of
        #{} = Demo ->
            B = fun(K) -> mallocinfo_units:bytes(maps:get(K, Demo)) end,
            io:format("demo workload: leaked ~ts in ~ts blocks from demo_cache_insert;~n"
                      "  ~b threads freed ~ts and kept ~ts in their arenas;~n"
                      "  ~ts from enif_alloc; ~p (~s) hoards its heap~n~n",
                      [B(leaked_bytes), mallocinfo_units:count(maps:get(leaked_blocks, Demo)),
                       maps:get(threads, ?DEFAULTS), B(fragment_freed_bytes),
                       B(fragment_kept_bytes), B(enif_bytes), maps:get(hoarder, Demo), ?HOARDER]);
        {error, Why} ->
            io:format("the demo workload could not start: ~p~n~n", [Why])
    end,
    ok = mallocinfo:report(),
    Xml = filename:join(Dir, "malloc_info.xml"),
    io:format("~nwritten: ~ts (~p)~n", [Xml, mallocinfo:info(Xml)]),
    heap_map(Dir),
    io:format("explore: mallocinfo:report().  mallocinfo_trace:sites(5).~n"
              "  mallocinfo_process:print(whereis(~s)).~n"
              "  mallocinfo:trim().  mallocinfo_demo:stop().  mallocinfo:report().~n", [?HOARDER]),
    %% The shell printed its prompt before all this (erl -eval runs once
    %% the shell has started).
    case init:get_argument(noshell) of
        {ok, _} -> ok;
        error -> io:format("(press Enter for a prompt)~n")
    end.

%% The heap map: the dump, then its picture (index.html and PNGs) in
%% Dir/heapmap.
heap_map(Dir) ->
    Dump = filename:join(Dir, "heap.heapdump"),
    Out = filename:join(Dir, "heapmap"),
    case mallocinfo_heap:dump(Dump) of
        {ok, #{total := T}} ->
            io:format("heap map: ~ts (~ts of free chunks, ~ts pinned, ~ts trimmable)~n",
                      [Dump, mallocinfo_units:bytes(maps:get(free_bytes, T)),
                       mallocinfo_units:bytes(maps:get(pinned_bytes, T)),
                       mallocinfo_units:bytes(maps:get(trimmable_bytes, T))]),
            case mallocinfo_heap:render(Dump, Out) of
                {ok, _Files} -> io:format("          ~ts~n", [filename:join(Out, "index.html")]);
                {error, Why} -> io:format("heap map picture: ~0tp~n", [Why])
            end;
        {error, Why} ->
            io:format("heap map: ~0tp~n", [Why])
    end.

%% A process that built a large list, kept 100 elements and waits: its
%% heap keeps the whole list's space until its next garbage collection,
%% which an idle process never has.
hoarder(N) ->
    case whereis(?HOARDER) of
        undefined -> ok;
        Old -> exit(Old, kill)
    end,
    Parent = self(),
    Pid = spawn(fun() ->
                        L = [{I, I} || I <- lists:seq(1, N)],
                        Kept = lists:sublist(L, 100),
                        Parent ! {?HOARDER, self()},
                        receive stop -> length(Kept) end
                end),
    receive {?HOARDER, Pid} -> ok end,
    true = register(?HOARDER, Pid),
    Pid.
