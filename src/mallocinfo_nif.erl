%% @private NIF stubs for priv/mallocinfo_nif.so. No logic lives here: the
%% public API is in {@link mallocinfo}. Every stub is replaced when the
%% shared object loads; if it does not, calls fail with `nif_not_loaded'.
-module(mallocinfo_nif).

-nifs([info_file/1, info_xml/0, malloc_stats/0, stats_text/0, mallinfo/0,
       trim/1, mallopt/2, rss/0, version/0, libc_version/0,
       trace_status/0, trace_set_mode/1, trace_reset/0, trace_reclaim/0, trace_olds/5,
       trace_sites/2, trace_profile/0, trace_pprof/2, trace_now/0, trace_symbolize/2, trace_attach/5, trace_detach/0,
       trace_symbolizer_stats/0, trace_snapshot/2, trace_regions/1, heap_dump/4,
       allocator/0, jemalloc_stats/0, jemalloc_summary/0, jemalloc_profile_status/0,
       jemalloc_profile_active/1, jemalloc_profile_dump/1, tcmalloc_stats/0,
       tcmalloc_profile_start/1, tcmalloc_profile_dump/0, tcmalloc_profile_stop/0,
       tcmalloc_profile_running/0,
       ectx_probe/1, ectx_probe_dirty/1, ectx_enable/1, code_names/2, atom_terms/2]).
-on_load(init/0).

-export([info_file/1, info_xml/0, malloc_stats/0, stats_text/0, mallinfo/0,
         trim/1, mallopt/2, rss/0, version/0, libc_version/0,
         trace_status/0, trace_set_mode/1, trace_reset/0, trace_reclaim/0, trace_olds/5,
         trace_sites/2, trace_profile/0, trace_pprof/2, trace_now/0, trace_symbolize/2, trace_attach/5, trace_detach/0,
         trace_symbolizer_stats/0, trace_snapshot/2, trace_regions/1, heap_dump/4,
         allocator/0, jemalloc_stats/0, jemalloc_summary/0, jemalloc_profile_status/0,
         jemalloc_profile_active/1, jemalloc_profile_dump/1, tcmalloc_stats/0,
         tcmalloc_profile_start/1, tcmalloc_profile_dump/0, tcmalloc_profile_stop/0,
         tcmalloc_profile_running/0,
         ectx_probe/1, ectx_probe_dirty/1, ectx_enable/1, code_names/2, atom_terms/2]).
-export([so_path/0]).

-define(LIB, "mallocinfo_nif").

init() ->
    erlang:load_nif(so_path(), 0).

%% @doc Path of the shared object without its extension. The directory in
%% the `mallocinfo' application environment key `nif_dir' when set (this is
%% how `mallocinfo_report:collect/1' loads the NIF into a node that lacks
%% it: during on_load the code server does not know this module's file
%% yet), else the application's priv dir when the code server knows it,
%% else the `priv' directory beside this module's `ebin', so an unpacked
%% tarball works from any directory.
-spec so_path() -> file:filename().
so_path() ->
    Candidates =
        case application:get_env(mallocinfo, nif_dir) of
            {ok, NifDir} when is_list(NifDir) -> [NifDir];
            _ -> []
        end ++
        case code:priv_dir(mallocinfo) of
            {error, _} -> [];
            Dir -> [Dir]
        end ++ [beside_ebin()],
    Found = [D || D <- Candidates, filelib:is_regular(filename:join(D, ?LIB ".so"))],
    filename:join(hd(Found ++ Candidates), ?LIB).

beside_ebin() ->
    case code:which(?MODULE) of
        File when is_list(File) ->
            filename:join(filename:dirname(filename:dirname(File)), "priv");
        _ ->
            "priv"
    end.

info_file(_Path) -> erlang:nif_error(nif_not_loaded).
info_xml() -> erlang:nif_error(nif_not_loaded).
malloc_stats() -> erlang:nif_error(nif_not_loaded).
stats_text() -> erlang:nif_error(nif_not_loaded).
mallinfo() -> erlang:nif_error(nif_not_loaded).
trim(_Pad) -> erlang:nif_error(nif_not_loaded).
mallopt(_Param, _Value) -> erlang:nif_error(nif_not_loaded).
rss() -> erlang:nif_error(nif_not_loaded).
version() -> erlang:nif_error(nif_not_loaded).
libc_version() -> erlang:nif_error(nif_not_loaded).
trace_status() -> erlang:nif_error(nif_not_loaded).
trace_set_mode(_Mode) -> erlang:nif_error(nif_not_loaded).
trace_reset() -> erlang:nif_error(nif_not_loaded).
trace_reclaim() -> erlang:nif_error(nif_not_loaded).
trace_olds(_N, _MinAgeMs, _MinSize, _Demangle, _MaxAgeMs) -> erlang:nif_error(nif_not_loaded).
trace_regions(_Demangle) -> erlang:nif_error(nif_not_loaded).
trace_sites(_N, _Demangle) -> erlang:nif_error(nif_not_loaded).
trace_profile() -> erlang:nif_error(nif_not_loaded).
trace_pprof(_Demangle, _SinceNs) -> erlang:nif_error(nif_not_loaded).
trace_now() -> erlang:nif_error(nif_not_loaded).
trace_symbolize(_Addresses, _Demangle) -> erlang:nif_error(nif_not_loaded).
trace_attach(_Mode, _SampleBytes, _TableSize, _StackTableSize, _StackDepth) ->
    erlang:nif_error(nif_not_loaded).
trace_detach() -> erlang:nif_error(nif_not_loaded).
trace_symbolizer_stats() -> erlang:nif_error(nif_not_loaded).
trace_snapshot(_OldsN, _MaxAgeMs) -> erlang:nif_error(nif_not_loaded).
heap_dump(_Path, _MaxSites, _TimeoutMs, _WantXml) -> erlang:nif_error(nif_not_loaded).
allocator() -> erlang:nif_error(nif_not_loaded).
jemalloc_stats() -> erlang:nif_error(nif_not_loaded).
jemalloc_summary() -> erlang:nif_error(nif_not_loaded).
jemalloc_profile_status() -> erlang:nif_error(nif_not_loaded).
jemalloc_profile_active(_On) -> erlang:nif_error(nif_not_loaded).
jemalloc_profile_dump(_TmpDir) -> erlang:nif_error(nif_not_loaded).
tcmalloc_stats() -> erlang:nif_error(nif_not_loaded).
tcmalloc_profile_start(_Prefix) -> erlang:nif_error(nif_not_loaded).
tcmalloc_profile_dump() -> erlang:nif_error(nif_not_loaded).
tcmalloc_profile_stop() -> erlang:nif_error(nif_not_loaded).
tcmalloc_profile_running() -> erlang:nif_error(nif_not_loaded).
ectx_probe(_Tuple) -> erlang:nif_error(nif_not_loaded).
ectx_probe_dirty(_Tuple) -> erlang:nif_error(nif_not_loaded).
ectx_enable(_Layout) -> erlang:nif_error(nif_not_loaded).
code_names(_Addresses, _AtomCount) -> erlang:nif_error(nif_not_loaded).
atom_terms(_Mfas, _AtomCount) -> erlang:nif_error(nif_not_loaded).
