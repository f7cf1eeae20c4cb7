%% Loader for mi_leaky_nif.so (test helper of mallocinfo_trace_SUITE).
-module(mi_leaky_nif).
-export([leak/2, release/0]).
-nifs([leak/2, release/0]).
-on_load(init/0).

init() ->
    erlang:load_nif(filename:join(filename:dirname(code:which(?MODULE)), "mi_leaky_nif"), 0).

leak(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
