%% Loader for mi_attach_a.so (mi_attach_nif.c built by mallocinfo_attach_SUITE).
-module(mi_attach_a).
-export([leak/2, release/0, churn_start/1, churn_stop/0]).
-nifs([leak/2, release/0, churn_start/1, churn_stop/0]).
-on_load(init/0).

init() ->
    erlang:load_nif(filename:join(filename:dirname(code:which(?MODULE)), "mi_attach_a"), 0).

leak(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
churn_start(_Threads) -> erlang:nif_error(nif_not_loaded).
churn_stop() -> erlang:nif_error(nif_not_loaded).
