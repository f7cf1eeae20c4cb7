%% Loader for mi_stress_nif.so (test helper of mallocinfo_stress_SUITE).
-module(mi_stress_nif).
-define(NIFS, [start/3, progress/0, stop/0]).
-include("mi_test_nif.hrl").

%% start(SiteThreads, PhdrThreads, TargetLibrary) -> ok | {error, already_started}
start(_Sites, _Phdr, _Target) -> erlang:nif_error(nif_not_loaded).
%% progress() -> [{Kind, Count}], one per thread, in start order.
progress() -> erlang:nif_error(nif_not_loaded).
%% stop() -> [{Kind, Count}] once every thread has ended.
stop() -> erlang:nif_error(nif_not_loaded).
