%% Loader for mi_ctx_nif.so (test helper of mallocinfo_context_SUITE).
-module(mi_ctx_nif).
-define(NIFS, [leak/2, leak_dirty/2, leak_thread/2, release/0]).
-include("mi_test_nif.hrl").

leak(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
leak_dirty(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
leak_thread(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
