%% Loader for mi_growth_nif.so (test helper of mallocinfo_growth_SUITE).
-module(mi_growth_nif).
-export([leak/2, via/3, dup/2, cache_fill/2, cache_drain/0, release/0]).
-nifs([leak/2, via/3, dup/2, cache_fill/2, cache_drain/0, release/0]).
-on_load(init/0).

init() ->
    erlang:load_nif(filename:join(filename:dirname(code:which(?MODULE)), "mi_growth_nif"), 0).

leak(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
via(_Which, _Count, _Size) -> erlang:nif_error(nif_not_loaded).
dup(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
cache_fill(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
cache_drain() -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
