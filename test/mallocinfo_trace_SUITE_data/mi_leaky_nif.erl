%% Loader for mi_leaky_nif.so (test helper of mallocinfo_trace_SUITE).
-module(mi_leaky_nif).
-define(NIFS, [leak/2, paths_jit/4, paths/4, race_paths/4, regions/1, release/0]).
-include("mi_test_nif.hrl").

leak(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
paths_jit(_First, _Count, _PerPath, _Size) -> erlang:nif_error(nif_not_loaded).
paths(_First, _Count, _PerPath, _Size) -> erlang:nif_error(nif_not_loaded).
race_paths(_Threads, _Count, _PerPath, _Size) -> erlang:nif_error(nif_not_loaded).
regions(_N) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
