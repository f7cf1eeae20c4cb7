%% mallocinfo_watch_capture's pure parts: the mark from a cgroup v2 tree
%% (a fake one in a scratch directory), the crossing and its hysteresis,
%% the rate limit, the files' names, writing never over an existing file,
%% the directory check.
-module(mallocinfo_watch_capture_tests).
-include_lib("eunit/include/eunit.hrl").

-define(MiB, (1 bsl 20)).

scratch() ->
    Dir = string:trim(os:cmd("mktemp -d")),
    true = filelib:is_dir(Dir),
    Dir.

rm(Dir) ->
    "" = os:cmd("rm -r -- '" ++ Dir ++ "'").

put_file(Root, Rel, Text) ->
    File = filename:join(Root, Rel),
    ok = filelib:ensure_dir(File),
    ok = file:write_file(File, Text).

%% The lowest memory.high or memory.max of the cgroup and its ancestors;
%% "max" is no limit; no 0:: line or no file at all: no_limit.
cgroup_limit_test() ->
    Root = scratch(),
    try
        Sys = filename:join(Root, "sys"),
        Proc = filename:join(Root, "cgroup"),
        ok = file:write_file(Proc, "12:memory:/v1/path\n0::/a/b\n"),
        ?assertEqual({error, no_limit}, mallocinfo_watch_capture:cgroup_limit(Proc, Sys)),
        put_file(Sys, "a/b/memory.max", "max\n"),
        put_file(Sys, "a/b/memory.high", "max\n"),
        ?assertEqual({error, no_limit}, mallocinfo_watch_capture:cgroup_limit(Proc, Sys)),
        put_file(Sys, "a/memory.max", "1073741824\n"),
        ?assertEqual({ok, 1073741824}, mallocinfo_watch_capture:cgroup_limit(Proc, Sys)),
        put_file(Sys, "a/b/memory.high", "536870912\n"),
        ?assertEqual({ok, 536870912}, mallocinfo_watch_capture:cgroup_limit(Proc, Sys)),
        put_file(Sys, "memory.max", "1048576\n"),
        ?assertEqual({ok, 1048576}, mallocinfo_watch_capture:cgroup_limit(Proc, Sys)),
        %% The root cgroup (a container's namespace): its own files only.
        ok = file:write_file(Proc, "0::/\n"),
        ?assertEqual({ok, 1048576}, mallocinfo_watch_capture:cgroup_limit(Proc, Sys)),
        %% cgroup v1 only: no 0:: line.
        ok = file:write_file(Proc, "4:memory:/x\n"),
        ?assertEqual({error, no_limit}, mallocinfo_watch_capture:cgroup_limit(Proc, Sys)),
        ?assertEqual({error, no_limit},
                     mallocinfo_watch_capture:cgroup_limit(filename:join(Root, "none"), Sys))
    after
        rm(Root)
    end.

mark_test() ->
    NoLimit = fun() -> {error, no_limit} end,
    Limit = fun() -> {ok, 1000 * ?MiB} end,
    ?assertEqual({ok, 123}, mallocinfo_watch_capture:mark(123, NoLimit)),
    ?assertEqual({ok, 800 * ?MiB}, mallocinfo_watch_capture:mark({fraction, 0.8}, Limit)),
    ?assertEqual({ok, 1000 * ?MiB}, mallocinfo_watch_capture:mark({fraction, 1}, Limit)),
    ?assertEqual({error, no_limit}, mallocinfo_watch_capture:mark({fraction, 0.5}, NoLimit)).

state(Mark, Min) ->
    #{mark => Mark, min_interval => Min, armed => true, last => undefined}.

%% Once per crossing: above the mark it captures once, stays quiet while
%% the RSS stays above or hovers just under the mark, and is armed again
%% only 5% (at least 1 MiB) below it.
step_once_per_crossing_test() ->
    Mark = 100 * ?MiB,
    Run = fun(Rsses, S0) ->
                  lists:mapfoldl(fun({Rss, Now}, S) ->
                                         mallocinfo_watch_capture:step(Rss, Now, S)
                                 end, S0, Rsses)
          end,
    {Actions, _} = Run([{50 * ?MiB, 0}, {Mark, 1}, {Mark + 1, 2}, {200 * ?MiB, 3},
                        {Mark - 1, 4}, {Mark + 1, 5}, {95 * ?MiB, 6}, {Mark + 1, 7},
                        {95 * ?MiB - 1, 8}, {Mark + 1, 9}, {Mark + 1, 10}],
                       state(Mark, 0)),
    ?assertEqual([none, none, capture, none, none, none, none, none, none, capture, none],
                 Actions).

%% Rate limit: a crossing within min_interval of the last capture waits,
%% armed, and is captured when the interval has passed if still above.
step_rate_limit_test() ->
    S0 = state(10 * ?MiB, 60000),
    {capture, S1} = mallocinfo_watch_capture:step(11 * ?MiB, 1000, S0),
    {none, S2} = mallocinfo_watch_capture:step(1 * ?MiB, 2000, S1),
    ?assertMatch(#{armed := true}, S2),
    {wait, S3} = mallocinfo_watch_capture:step(11 * ?MiB, 3000, S2),
    {wait, S4} = mallocinfo_watch_capture:step(11 * ?MiB, 60999, S3),
    ?assertMatch({capture, #{armed := false, last := 61000}},
                 mallocinfo_watch_capture:step(11 * ?MiB, 61000, S4)),
    %% Fallen back below in the meantime: that crossing is not captured.
    ?assertMatch({none, #{armed := true}},
                 mallocinfo_watch_capture:step(1 * ?MiB, 61000, S4)).

names_test() ->
    %% 2026-11-26 13:53:09.005 UTC (date -u -d ... +%s)
    Ms = 1795701189005,
    ?assertEqual("20261126T135309.005Z", mallocinfo_watch_capture:stamp(Ms)),
    ?assertEqual("mallocinfo-20261126T135309.005Z-top.txt",
                 mallocinfo_watch_capture:file_name(mallocinfo_watch_capture:stamp(Ms),
                                                    "top.txt")),
    %% Names sort as times do.
    Stamps = [mallocinfo_watch_capture:stamp(T) || T <- [0, 999, 1000, 86400000, Ms]],
    ?assertEqual(Stamps, lists:sort(Stamps)).

%% Written whole under its name, never over an existing file, no
%% temporary file left either way.
write_new_test() ->
    Dir = scratch(),
    try
        ok = mallocinfo_watch_capture:write_new(Dir, "a.txt", [<<"new">>, $\n]),
        ?assertEqual({ok, <<"new\n">>}, file:read_file(filename:join(Dir, "a.txt"))),
        ok = file:write_file(filename:join(Dir, "b.txt"), <<"the operator's">>),
        ?assertEqual({error, eexist}, mallocinfo_watch_capture:write_new(Dir, "b.txt", <<"x">>)),
        ?assertEqual({error, eexist}, mallocinfo_watch_capture:write_new(Dir, "a.txt", <<"x">>)),
        ?assertEqual({ok, <<"the operator's">>}, file:read_file(filename:join(Dir, "b.txt"))),
        ?assertEqual({ok, <<"new\n">>}, file:read_file(filename:join(Dir, "a.txt"))),
        ?assertEqual(["a.txt", "b.txt"], lists:sort(element(2, file:list_dir(Dir)))),
        ?assertEqual({error, enoent},
                     mallocinfo_watch_capture:write_new(filename:join(Dir, "no"), "c", <<>>))
    after
        rm(Dir)
    end.

check_dir_test() ->
    Dir = scratch(),
    try
        ?assertEqual(ok, mallocinfo_watch_capture:check_dir(Dir)),
        ?assertEqual({ok, []}, file:list_dir(Dir)),
        ?assertEqual({error, enoent},
                     mallocinfo_watch_capture:check_dir(filename:join(Dir, "missing"))),
        File = filename:join(Dir, "file"),
        ok = file:write_file(File, <<>>),
        ?assertEqual({error, enotdir}, mallocinfo_watch_capture:check_dir(File)),
        ?assertEqual({error, enotdir}, mallocinfo_watch_capture:check_dir(filename:join(File, "x")))
    after
        rm(Dir)
    end.
