%% Loader for mi_prof_nif.so (test helper of mallocinfo_http_SUITE).
-module(mi_prof_nif).
-export([alloc/2, mark/3, release/0]).
-nifs([alloc/2, mark/3, release/0]).
-on_load(init/0).

init() ->
    erlang:load_nif(filename:join(filename:dirname(code:which(?MODULE)), "mi_prof_nif"), 0).

alloc(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
mark(_Depth, _Count, _Size) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
