%% Loader for mi_stress_nif.so (test helper of mallocinfo_stress_SUITE).
-module(mi_stress_nif).
-export([start/3, progress/0, stop/0]).
-nifs([start/3, progress/0, stop/0]).
-on_load(init/0).

init() ->
    erlang:load_nif(filename:join(filename:dirname(code:which(?MODULE)), "mi_stress_nif"), 0).

%% start(SiteThreads, PhdrThreads, TargetLibrary) -> ok | {error, already_started}
start(_Sites, _Phdr, _Target) -> erlang:nif_error(nif_not_loaded).
%% progress() -> [{Kind, Count}], one per thread, in start order.
progress() -> erlang:nif_error(nif_not_loaded).
%% stop() -> [{Kind, Count}] once every thread has ended.
stop() -> erlang:nif_error(nif_not_loaded).
