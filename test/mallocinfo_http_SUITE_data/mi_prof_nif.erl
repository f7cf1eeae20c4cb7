%% Loader for mi_prof_nif.so (test helper of mallocinfo_http_SUITE).
-module(mi_prof_nif).
-define(NIFS, [alloc/2, mark/3, release/0]).
-include("mi_test_nif.hrl").

alloc(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
mark(_Depth, _Count, _Size) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
