%% NIF stubs for mallocinfo_demo_nif.so (c_src/demo/), the demo workload
%% of {@link mallocinfo_demo}. No logic lives here.
%%
%% Not part of the application: `make demo' builds these beams and the
%% shared object into _build/demo, beside each other. No on_load: the test
%% suites load the module without wanting the NIF; {@link
%% mallocinfo_demo:run/1} calls load/0.
-module(mallocinfo_demo_nif).

-nifs([cache_insert/2, fragment/4, enif_keep/2, release/0, held/0]).

-export([load/0]).
-export([cache_insert/2, fragment/4, enif_keep/2, release/0, held/0]).

-define(LIB, "mallocinfo_demo_nif").

%% The demo's shared object sits beside this module's beam. Loading it
%% twice is fine.
-spec load() -> ok | {error, term()}.
load() ->
    Dir = case code:which(?MODULE) of
              File when is_list(File) -> filename:dirname(File);
              _ -> "."
          end,
    case erlang:load_nif(filename:join(Dir, ?LIB), 0) of
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
