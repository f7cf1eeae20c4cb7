%% A process holding a binary of a given size (its pages touched), for
%% tests that need the node's RSS to cross a mark and fall back.
-module(mi_hog).
-export([start/1, stop/1]).

-spec start(pos_integer()) -> pid().
start(Bytes) ->
    Parent = self(),
    Pid = spawn(fun() ->
                        B = binary:copy(<<1>>, Bytes),
                        Parent ! {self(), held},
                        receive stop -> byte_size(B) end
                end),
    receive {Pid, held} -> Pid end.

%% Returns when the process (and with it the binary) is gone.
-spec stop(pid()) -> ok.
stop(Pid) ->
    Ref = monitor(process, Pid),
    Pid ! stop,
    receive {'DOWN', Ref, process, Pid, _} -> ok end,
    erlang:garbage_collect(),
    ok.
