%% @private NIF stubs for priv/mallocinfo_demo_nif.so, the demo workload of
%% {@link mallocinfo_demo}. No logic lives here.
%%
%% No on_load on purpose: loading mallocinfo loads every module of the
%% application, and the demo's shared object has no business in a node
%% that does not run the demo. {@link mallocinfo_demo:run/1} calls load/0.
-module(mallocinfo_demo_nif).

-nifs([cache_insert/2, fragment/4, enif_keep/2, release/0, held/0]).

-export([load/0]).
-export([cache_insert/2, fragment/4, enif_keep/2, release/0, held/0]).

-define(LIB, "mallocinfo_demo_nif").

%% The demo's shared object sits beside mallocinfo_nif.so, wherever that
%% was found. Loading it twice is fine.
-spec load() -> ok | {error, term()}.
load() ->
    case erlang:load_nif(filename:join(filename:dirname(mallocinfo_nif:so_path()), ?LIB), 0) of
        ok -> ok;
        {error, {reload, _}} -> ok;
        {error, _} = E -> E
    end.

-spec cache_insert(non_neg_integer(), pos_integer()) -> ok | {error, enomem}.
cache_insert(_Count, _Size) -> erlang:nif_error(nif_not_loaded).

-spec fragment(pos_integer(), pos_integer(), pos_integer(), pos_integer()) ->
          {ok, KeptBytes :: non_neg_integer(), FreedBytes :: non_neg_integer()}
          | {error, enomem | eagain}.
fragment(_Threads, _Blocks, _Size, _KeepEvery) -> erlang:nif_error(nif_not_loaded).

-spec enif_keep(non_neg_integer(), pos_integer()) -> ok | {error, enomem}.
enif_keep(_Count, _Size) -> erlang:nif_error(nif_not_loaded).

-spec release() -> ok.
release() -> erlang:nif_error(nif_not_loaded).

%% {CacheBlocks, CacheBytes, FragmentBlocks, FragmentBytes, EnifBlocks, EnifBytes}
-spec held() -> {non_neg_integer(), non_neg_integer(), non_neg_integer(), non_neg_integer(),
                 non_neg_integer(), non_neg_integer()}.
held() -> erlang:nif_error(nif_not_loaded).
