%% Stubs for mi_pprof_nif.c (built by mallocinfo_pprof_SUITE).
-module(mi_pprof_nif).
-define(NIFS, [leak/2, window/2, spread/2, churn/2, release/0]).
-include("mi_test_nif.hrl").

leak(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
window(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
spread(_N, _Size) -> erlang:nif_error(nif_not_loaded).
churn(_Total, _Size) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
