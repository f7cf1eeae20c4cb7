%% @private NIF stubs for priv/mallocinfo_demo_nif.so, the demo workload of
%% {@link mallocinfo_demo}. No logic lives here.
-module(mallocinfo_demo_nif).

-nifs([cache_insert/2, fragment/4, enif_keep/2, release/0, held/0]).
-on_load(init/0).

-export([cache_insert/2, fragment/4, enif_keep/2, release/0, held/0]).

-define(LIB, "mallocinfo_demo_nif").

%% The demo's shared object sits beside mallocinfo_nif.so, wherever that
%% was found.
init() ->
    erlang:load_nif(filename:join(filename:dirname(mallocinfo_nif:so_path()), ?LIB), 0).

cache_insert(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
fragment(_Threads, _Blocks, _Size, _KeepEvery) -> erlang:nif_error(nif_not_loaded).
enif_keep(_Count, _Size) -> erlang:nif_error(nif_not_loaded).
release() -> erlang:nif_error(nif_not_loaded).
held() -> erlang:nif_error(nif_not_loaded).
