%% Loader for mi_attach_a.so and mi_attach_b.so, the two builds of
%% mi_attach_nif.c by mallocinfo_attach_SUITE: mi_ct:build_nif/4 compiles
%% this once for each, MI_MODULE naming the module (and so its .so).
-module(?MI_MODULE).
-define(NIFS, [leak/2, release/0, churn_start/1, churn_stop/0]).
-include("mi_test_nif.hrl").

leak(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
churn_start(_Threads) -> erlang:nif_error(nif_not_loaded).
churn_stop() -> erlang:nif_error(nif_not_loaded).
