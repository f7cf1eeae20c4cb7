%% @private NIF stubs for priv/mallocinfo_nif.so. No logic lives here: the
%% public API is in {@link mallocinfo}. Every stub is replaced when the
%% shared object loads; if it does not, calls fail with `nif_not_loaded'.
-module(mallocinfo_nif).

%% The stubs, once: every one is a NIF (-nifs) and exported.
-define(NIFS,
        [info_file/1, info_xml/0, malloc_stats/0, stats_text/0, mallinfo/0,
         trim/1, mallopt/2, rss/0, version/0, libc_version/0,
         trace_status/0, trace_set_mode/1, trace_reset/0, trace_reclaim/0, trace_olds/5,
         trace_sites/2, trace_profile/0, trace_pprof/2, trace_churn/0, trace_now/0, trace_symbolize/2,
         trace_attach/5, trace_detach/0, trace_symbolizer_stats/0, trace_snapshot/2,
         trace_regions/1, heap_dump/4,
         allocator/0, jemalloc_stats/0, jemalloc_summary/0, jemalloc_profile_status/0,
         jemalloc_profile_active/1, jemalloc_profile_dump/1, tcmalloc_stats/0,
         tcmalloc_profile_start/1, tcmalloc_profile_dump/0, tcmalloc_profile_stop/0,
         tcmalloc_profile_running/0,
         ectx_probe/1, ectx_probe_dirty/1, ectx_enable/1, ectx_atoms/1, code_names/2,
         atom_terms/2, trace_by_context/2, trace_symbolize_stacks/2]).
-nifs(?NIFS).
-on_load(init/0).

-export(?NIFS).
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

%%% The stubs. Each -spec is the NIF's contract as c_src/nif/ keeps it;
%%% arguments are checked by the callers (a wrong type raises badarg in the
%%% NIF too). Every NIF may also answer {error, enomem} (nif/term.h
%%% guarded<>: std::bad_alloc), which is left out of the specs below.

-type posix() :: file:posix() | atom().
%% A jemalloc or tcmalloc call under another allocator.
-type wrong_allocator() :: {wrong_allocator, mallocinfo_glibc:allocator()}.
%% The tracker's queries without a tracker that records.
-type no_tracker() :: not_preloaded | not_recording.
%% A raw site of a snapshot: {Count, Bytes, Estimated, PackedFrames}.
-type raw_site() :: {non_neg_integer(), non_neg_integer(), boolean(), binary()}.
%% {AllocatedCount, AllocatedBytes, FreedCount, FreedBytes, TemporaryCount,
%%  Lifetimes (a tuple of MI_LIFETIME_BUCKETS counts), Estimated, Frames}
-type raw_churn() :: {non_neg_integer(), non_neg_integer(), non_neg_integer(),
                      non_neg_integer(), non_neg_integer(), tuple(), boolean(), binary()}.
%% A raw old block: {Address, Size, AgeMs, Estimated, PackedFrames}.
-type raw_old() :: {non_neg_integer(), non_neg_integer(), non_neg_integer(), boolean(), binary()}.

%% glibc (called only while glibc serves malloc: mallocinfo_glibc).
-spec info_file(Path :: binary()) -> ok | {error, posix()}.
info_file(_Path) -> erlang:nif_error(nif_not_loaded).
-spec info_xml() -> {ok, binary()} | {error, posix()}.
info_xml() -> erlang:nif_error(nif_not_loaded).
-spec malloc_stats() -> ok.
malloc_stats() -> erlang:nif_error(nif_not_loaded).
-spec stats_text() -> {ok, binary()} | {error, posix()}.
stats_text() -> erlang:nif_error(nif_not_loaded).
-spec mallinfo() -> mallocinfo_glibc:mallinfo().
mallinfo() -> erlang:nif_error(nif_not_loaded).
-spec trim(Pad :: non_neg_integer()) -> {ok, mallocinfo_glibc:trimmed()}.
trim(_Pad) -> erlang:nif_error(nif_not_loaded).
-spec mallopt(mallocinfo_glibc:mallopt_param(), integer()) -> ok | {error, posix()}.
mallopt(_Param, _Value) -> erlang:nif_error(nif_not_loaded).
-spec rss() -> non_neg_integer() | undefined.
rss() -> erlang:nif_error(nif_not_loaded).
-spec version() -> binary().
version() -> erlang:nif_error(nif_not_loaded).
-spec libc_version() -> binary().
libc_version() -> erlang:nif_error(nif_not_loaded).
-spec allocator() -> mallocinfo_glibc:allocator().
allocator() -> erlang:nif_error(nif_not_loaded).

%% The tracker, over the interposer's ABI.
-spec trace_status() -> #{preloaded := boolean(), recording := boolean(),
                          mode := mallocinfo_trace:mode(), atom() => term()}.
trace_status() -> erlang:nif_error(nif_not_loaded).
-spec trace_set_mode(mallocinfo_trace:mode()) -> ok | {error, no_tracker()}.
trace_set_mode(_Mode) -> erlang:nif_error(nif_not_loaded).
-spec trace_reset() -> {ok, non_neg_integer()} | {error, no_tracker()}.
trace_reset() -> erlang:nif_error(nif_not_loaded).
-spec trace_reclaim() -> {ok, non_neg_integer()} | {error, no_tracker() | enotsup}.
trace_reclaim() -> erlang:nif_error(nif_not_loaded).
-spec trace_olds(N :: non_neg_integer(), MinAgeMs :: non_neg_integer(),
                 MinSize :: non_neg_integer(), Demangle :: boolean(),
                 MaxAgeMs :: non_neg_integer()) ->
          {ok, [mallocinfo_trace:old()]} | {error, no_tracker() | eagain}.
trace_olds(_N, _MinAgeMs, _MinSize, _Demangle, _MaxAgeMs) -> erlang:nif_error(nif_not_loaded).
-spec trace_sites(N :: non_neg_integer(), Demangle :: boolean()) ->
          {ok, [mallocinfo_trace:site()]} | {error, no_tracker() | eagain}.
trace_sites(_N, _Demangle) -> erlang:nif_error(nif_not_loaded).
-spec trace_profile() ->
          {ok, [mallocinfo_trace_pprof:site()]} | {error, no_tracker() | eagain}.
trace_profile() -> erlang:nif_error(nif_not_loaded).
-spec trace_pprof(Demangle :: boolean(), SinceNs :: non_neg_integer()) ->
          {ok, map()} | {error, no_tracker() | eagain}.
trace_pprof(_Demangle, _SinceNs) -> erlang:nif_error(nif_not_loaded).
-spec trace_churn() ->
          {ok, mallocinfo_trace:mode(), ElapsedMs :: non_neg_integer(), [raw_churn()]}
          | {error, no_tracker() | eagain | enotsup}.
trace_churn() -> erlang:nif_error(nif_not_loaded).
-spec trace_now() -> {ok, non_neg_integer()} | {error, no_tracker()}.
trace_now() -> erlang:nif_error(nif_not_loaded).
-spec trace_symbolize([non_neg_integer()], Demangle :: boolean()) -> [mallocinfo_trace:frame()].
trace_symbolize(_Addresses, _Demangle) -> erlang:nif_error(nif_not_loaded).
-spec trace_snapshot(OldsN :: non_neg_integer(), MaxAgeMs :: non_neg_integer()) ->
          {ok, {mallocinfo_trace:mode(), non_neg_integer(), [raw_site()], [raw_old()]}}
          | {error, no_tracker() | eagain}.
trace_snapshot(_OldsN, _MaxAgeMs) -> erlang:nif_error(nif_not_loaded).
-spec trace_regions(Demangle :: boolean()) -> {ok, [map()]} | {error, no_tracker() | enotsup}.
trace_regions(_Demangle) -> erlang:nif_error(nif_not_loaded).
-spec trace_attach(Mode :: full | sample | counters, SampleBytes :: pos_integer(),
                   TableSize :: pos_integer(), StackTableSize :: pos_integer(),
                   StackDepth :: pos_integer()) -> ok | {error, term()}.
trace_attach(_Mode, _SampleBytes, _TableSize, _StackTableSize, _StackDepth) ->
    erlang:nif_error(nif_not_loaded).
-spec trace_detach() -> ok | {error, not_attached}.
trace_detach() -> erlang:nif_error(nif_not_loaded).
-spec trace_symbolizer_stats() -> map().
trace_symbolizer_stats() -> erlang:nif_error(nif_not_loaded).

%% The heap map's walker.
-spec heap_dump(Path :: binary(), MaxSites :: 0..65534, TimeoutMs :: pos_integer(),
                WantXml :: boolean()) -> {ok, map()} | {error, mallocinfo_heap:dump_error()}.
heap_dump(_Path, _MaxSites, _TimeoutMs, _WantXml) -> erlang:nif_error(nif_not_loaded).

%% jemalloc and tcmalloc, through dlsym on the allocator that serves malloc.
-spec jemalloc_stats() -> {ok, binary()} | {error, wrong_allocator() | posix()}.
jemalloc_stats() -> erlang:nif_error(nif_not_loaded).
-spec jemalloc_summary() ->
          {ok, #{atom() => non_neg_integer()}}
          | {error, wrong_allocator() | stats_disabled | posix()}.
jemalloc_summary() -> erlang:nif_error(nif_not_loaded).
-spec jemalloc_profile_status() ->
          #{prof := boolean(), active := boolean(), thread_active_init := boolean(),
            lg_sample := integer()}
          | {error, wrong_allocator() | profiling_unsupported | posix()}.
jemalloc_profile_status() -> erlang:nif_error(nif_not_loaded).
-spec jemalloc_profile_active(boolean()) ->
          ok | {error, wrong_allocator() | profiling_disabled | posix()}.
jemalloc_profile_active(_On) -> erlang:nif_error(nif_not_loaded).
-spec jemalloc_profile_dump(TmpDir :: binary()) ->
          {ok, binary()} | {error, wrong_allocator() | profiling_disabled | posix()}.
jemalloc_profile_dump(_TmpDir) -> erlang:nif_error(nif_not_loaded).
-spec tcmalloc_stats() -> {ok, binary()} | {error, wrong_allocator() | posix()}.
tcmalloc_stats() -> erlang:nif_error(nif_not_loaded).
-spec tcmalloc_profile_start(Prefix :: binary()) ->
          ok | {error, wrong_allocator() | profiler_not_loaded | already_running}.
tcmalloc_profile_start(_Prefix) -> erlang:nif_error(nif_not_loaded).
-spec tcmalloc_profile_dump() ->
          {ok, binary()} | {error, wrong_allocator() | profiler_not_loaded | not_running}.
tcmalloc_profile_dump() -> erlang:nif_error(nif_not_loaded).
-spec tcmalloc_profile_stop() ->
          ok | {error, wrong_allocator() | profiler_not_loaded | not_running}.
tcmalloc_profile_stop() -> erlang:nif_error(nif_not_loaded).
-spec tcmalloc_profile_running() ->
          boolean() | {error, wrong_allocator() | profiler_not_loaded}.
tcmalloc_profile_running() -> erlang:nif_error(nif_not_loaded).

%% The Erlang context of native allocations, learned from the NIF's own
%% calls (mallocinfo_trace_context): the probe on a normal and on a dirty
%% scheduler, the layout handed to the tracker, recorded words as terms.
-type probe() :: #{pid := pid(), candidates := [#{atom() => term()}]}.
-spec ectx_probe(tuple()) -> {ok, probe()} | {error, not_found | no_process}.
ectx_probe(_Tuple) -> erlang:nif_error(nif_not_loaded).
-spec ectx_probe_dirty(tuple()) -> {ok, probe()} | {error, not_found | no_process}.
ectx_probe_dirty(_Tuple) -> erlang:nif_error(nif_not_loaded).
-spec ectx_enable(#{atom() => term()}) -> ok | {error, not_preloaded | refused}.
ectx_enable(_Layout) -> erlang:nif_error(nif_not_loaded).
-spec ectx_atoms(AtomCount :: non_neg_integer()) -> ok.
ectx_atoms(_AtomCount) -> erlang:nif_error(nif_not_loaded).
-spec trace_by_context(N :: non_neg_integer(), process | erlang_function | site_process) ->
          {ok, [{pid() | mfa(), non_neg_integer(), non_neg_integer(), boolean()}
                | {binary(), pid(), non_neg_integer(), non_neg_integer(), boolean()}],
           {non_neg_integer(), non_neg_integer()}}
          | {error, no_tracker() | eagain}.
trace_by_context(_N, _By) -> erlang:nif_error(nif_not_loaded).
-spec trace_symbolize_stacks([binary()], Demangle :: boolean()) ->
          [{[mallocinfo_trace:frame()], [#{module := atom(), function := atom(),
                                           arity := arity()}], binary() | undefined}].
trace_symbolize_stacks(_Packed, _Demangle) -> erlang:nif_error(nif_not_loaded).
-spec code_names([non_neg_integer()], AtomCount :: non_neg_integer()) -> [mfa() | none].
code_names(_Addresses, _AtomCount) -> erlang:nif_error(nif_not_loaded).
-spec atom_terms([{non_neg_integer(), non_neg_integer(), non_neg_integer()}],
                 AtomCount :: non_neg_integer()) -> [mfa() | none].
atom_terms(_Mfas, _AtomCount) -> erlang:nif_error(nif_not_loaded).
