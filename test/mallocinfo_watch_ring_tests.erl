%% The sampler's ring (mallocinfo_watch_ring, pure): two tiers of fixed
%% size, samples back in order, the window, and the memory a full ring
%% takes at the default period (doc/report.md states it).
-module(mallocinfo_watch_ring_tests).
-include_lib("eunit/include/eunit.hrl").

sample(T, Keys) ->
    #{t => T, time => 1000000 + T, layers => maps:from_list([{K, T + I} || {I, K} <- lists:enumerate(Keys)])}.

push_all(Ring, Ts, Keys) ->
    lists:foldl(fun(T, R) -> mallocinfo_watch_ring:push(R, sample(T, Keys)) end, Ring, Ts).

tiers_test() ->
    Keys = [rss, {memory, total}],
    R0 = mallocinfo_watch_ring:new(Keys, 10000),
    ?assertEqual({360, 1440}, mallocinfo_watch_ring:capacity(R0)),
    ?assertEqual(none, mallocinfo_watch_ring:latest(R0)),
    ?assertEqual([], mallocinfo_watch_ring:samples(R0)),
    %% Two hours at 10 s: the fine tier keeps the last hour, the coarse
    %% tier one a minute before it.
    Ts = lists:seq(0, 7200000 - 10000, 10000),
    R = push_all(R0, Ts, Keys),
    Samples = mallocinfo_watch_ring:samples(R),
    Times = [T || #{t := T} <- Samples],
    ?assertEqual(lists:sort(Times), Times),
    Fine = lists:nthtail(length(Ts) - 360, Ts),
    ?assertEqual(Fine, lists:nthtail(length(Times) - 360, Times)),
    Coarse = lists:sublist(Times, length(Times) - 360),
    ?assertEqual([T || T <- lists:seq(0, hd(Fine) - 1, 60000)], Coarse),
    #{layers := L} = mallocinfo_watch_ring:latest(R),
    ?assertEqual(#{rss => 7190001, {memory, total} => 7190002}, L).

undefined_and_unknown_layers_test() ->
    R = mallocinfo_watch_ring:push(mallocinfo_watch_ring:new([rss, native], 1000),
                                   #{t => 0, time => 0, layers => #{rss => 5, other => 1}}),
    ?assertEqual(#{rss => 5, native => undefined}, maps:get(layers, mallocinfo_watch_ring:latest(R))).

window_keeps_at_least_three_test() ->
    R = push_all(mallocinfo_watch_ring:new([rss], 10000), lists:seq(0, 100000, 10000), [rss]),
    ?assertEqual([80000, 90000, 100000],
                 [T || #{t := T} <- mallocinfo_watch_ring:window(R, 1000)]),
    ?assertEqual(lists:seq(40000, 100000, 10000),
                 [T || #{t := T} <- mallocinfo_watch_ring:window(R, 60000)]).

%% Full at the default period with the layers of this node: its memory
%% stops growing, and stays under 1.5 MB.
memory_is_fixed_when_full_test() ->
    Keys = mallocinfo_layers:keys(),
    R0 = mallocinfo_watch_ring:new(Keys, 10000),
    Day = lists:seq(0, 86400000, 10000),
    Full = push_all(R0, Day, Keys),
    More = push_all(Full, lists:seq(86410000, 90000000, 10000), Keys),
    Bytes = mallocinfo_watch_ring:memory_bytes(Full),
    ?debugFmt("ring of ~b layers, full at 10 s: ~b bytes", [length(Keys), Bytes]),
    ?assertEqual(Bytes, mallocinfo_watch_ring:memory_bytes(More)),
    ?assert(Bytes < 1500000).
