%% Loader for mi_growth_nif.so (test helper of mallocinfo_growth_SUITE).
-module(mi_growth_nif).
-define(NIFS, [leak/2, via/3, dup/2, cache_fill/2, cache_drain/0, release/0]).
-include("mi_test_nif.hrl").

leak(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
via(_Which, _Count, _Size) -> erlang:nif_error(nif_not_loaded).
dup(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
cache_fill(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
cache_drain() -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
