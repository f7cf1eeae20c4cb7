%% Loader for mi_mmap_nif.so (test helper of mallocinfo_report_SUITE).
-module(mi_mmap_nif).
-export([map/1, unmap/0]).
-nifs([map/1, unmap/0]).
-on_load(init/0).

init() ->
    erlang:load_nif(filename:join(filename:dirname(code:which(?MODULE)), "mi_mmap_nif"), 0).

map(_Bytes) -> erlang:nif_error(nif_not_loaded).
unmap() -> erlang:nif_error(nif_not_loaded).
