%% The tracker's limits live in c_src/common/mi_limits.h; the Erlang side's
%% copy (mallocinfo_trace:knobs/0) must agree with it, and both option
%% checks (preload_env/1, attach/1) must accept exactly those ranges.
-module(mallocinfo_limits_tests).
-include_lib("eunit/include/eunit.hrl").

header_knobs() ->
    Src = proplists:get_value(source, ?MODULE:module_info(compile)),
    Header = filename:join([filename:dirname(Src), "..", "c_src", "common", "mi_limits.h"]),
    {ok, Text} = file:read_file(Header),
    {match, Rows} = re:run(Text, "constexpr Knob k\\w+\\{\"(\\w+)\", \"(\\w+)\", (\\d+), (\\d+), (\\d+)\\};",
                           [global, {capture, all_but_first, list}]),
    [#{env => Env, option => list_to_atom(Opt), min => list_to_integer(Min),
       max => list_to_integer(Max), default => list_to_integer(Def)}
     || [Env, Opt, Min, Max, Def] <- Rows].

same_table_test() ->
    C = header_knobs(),
    ?assertEqual(4, length(C)),
    ?assertEqual(lists:sort(C), lists:sort(mallocinfo_trace:knobs())).

max_stack_depth_test() ->
    Src = proplists:get_value(source, ?MODULE:module_info(compile)),
    {ok, Text} = file:read_file(filename:join([filename:dirname(Src), "..", "c_src", "common",
                                               "mi_limits.h"])),
    {match, [Max]} = re:run(Text, "kMaxStackDepth = (\\d+);", [{capture, all_but_first, list}]),
    [#{max := Depth}] = [K || #{option := stack_depth} = K <- mallocinfo_trace:knobs()],
    ?assertEqual(list_to_integer(Max), Depth).

%% Each end of each range is accepted, one past it refused, by both the
%% environment builder and attach/1 (whose accepted values are never
%% passed: that would attach this VM).
ranges_test_() ->
    [{atom_to_list(K), fun() ->
          ?assertEqual({Env, integer_to_list(Min)},
                       lists:keyfind(Env, 1, mallocinfo_trace:preload_env(#{K => Min}))),
          ?assertEqual({Env, integer_to_list(Max)},
                       lists:keyfind(Env, 1, mallocinfo_trace:preload_env(#{K => Max}))),
          ?assertError(badarg, mallocinfo_trace:preload_env(#{K => Min - 1})),
          ?assertError(badarg, mallocinfo_trace:preload_env(#{K => Max + 1})),
          ?assertError(badarg, mallocinfo_trace:attach(#{K => Min - 1})),
          ?assertError(badarg, mallocinfo_trace:attach(#{K => Max + 1}))
      end}
     || #{option := K, env := Env, min := Min, max := Max} <- header_knobs()].

%% The NIF checks the ranges again, so a direct call of the stub with a
%% size of 0 is refused before anything is loaded.
nif_checks_test() ->
    ?assertError(badarg, mallocinfo_nif:trace_attach(full, 524288, 0, 65536, 32)),
    ?assertError(badarg, mallocinfo_nif:trace_attach(full, 524288, 2097152, 65536, 129)),
    ?assertError(badarg, mallocinfo_nif:trace_attach(full, 0, 2097152, 65536, 32)).
