%% Stubs for mi_pprof_nif.c (built by mallocinfo_pprof_SUITE).
-module(mi_pprof_nif).
-export([leak/2, window/2, spread/2, release/0]).
-nifs([leak/2, window/2, spread/2, release/0]).
-on_load(init/0).

init() ->
    erlang:load_nif(filename:join(filename:dirname(code:which(?MODULE)), "mi_pprof_nif"), 0).

leak(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
window(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
spread(_N, _Size) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
