%% Stub of mi_names_nif.so (mallocinfo_report_SUITE:odd_names), loaded
%% explicitly from a path given as bytes (load/1), not from beside the
%% beam: the library's own file name is not text.
-module(mi_names_nif).
-export([load/1, hold/2]).
-nifs([hold/2]).

load(Path) -> erlang:load_nif(Path, 0).

hold(_Blocks, _Bytes) -> erlang:nif_error(nif_not_loaded).
