%% Loader for mi_mmap_nif.so (test helper of mallocinfo_report_SUITE).
-module(mi_mmap_nif).
-define(NIFS, [map/1, unmap/0, reserve/1, unreserve/0]).
-include("mi_test_nif.hrl").

map(_Bytes) -> erlang:nif_error(nif_not_loaded).
unmap() -> erlang:nif_error(nif_not_loaded).
reserve(_Bytes) -> erlang:nif_error(nif_not_loaded).
unreserve() -> erlang:nif_error(nif_not_loaded).
