%% @doc gperftools tcmalloc's statistics and heap profiler, for a node
%% started with tcmalloc as its allocator
%% (`LD_PRELOAD=.../libtcmalloc.so.4').
%%
%% Nothing here links tcmalloc: every call finds the allocator that serves
%% `malloc' at call time (see {@link mallocinfo:allocator/0}) and takes
%% tcmalloc's functions from that shared object. When it is not tcmalloc
%% every call returns `{error, {wrong_allocator, Which}}'. The heap profiler
%% is part of `libtcmalloc.so' (and `libtcmalloc_and_profiler.so'), not of
%% `libtcmalloc_minimal.so': there the profiler calls return
%% `{error, profiler_not_loaded}'. See doc/allocators.md.
-module(mallocinfo_tcmalloc).

-include_lib("kernel/include/file.hrl").

-export([stats/0, profile_start/1, profile_dump/0, profile_stop/0, profile_running/0]).

-export_type([error_reason/0]).

-type error_reason() :: mallocinfo:wrong_allocator() | profiler_not_loaded
                      | mallocinfo:posix().

%% The dump file name tcmalloc builds from the prefix must fit its 1000-byte
%% buffer ("<prefix>.0001.heap").
-define(MAX_PREFIX, 980).

%% @doc tcmalloc's statistics text (`MallocExtension_GetStats'), whole:
%% the same report `MALLOCSTATS' prints at exit.
-spec stats() -> {ok, Text :: binary()} | {error, error_reason()}.
stats() ->
    mallocinfo_nif:tcmalloc_stats().

%% @doc Starts the heap profiler (`HeapProfilerStart(Prefix)'): from now on
%% every allocation is recorded with its stack. `Prefix' (a string or
%% binary) names the files tcmalloc itself writes, `Prefix.0001.heap' and
%% on, when `HEAP_PROFILE_ALLOCATION_INTERVAL' (1 GiB by default) and the
%% other `HEAP_PROFILE_*' thresholds are crossed; {@link profile_dump/0}
%% needs no file. Its directory must exist (`{error, enoent | enotdir}').
%% `{error, already_running}' when it runs already. A prefix that is not a
%% non-empty string or binary without NUL raises `badarg'.
-spec profile_start(Prefix :: file:name_all()) ->
          ok | {error, already_running | enametoolong | error_reason()}.
profile_start(Prefix) ->
    Bin = prefix_binary(Prefix),
    case byte_size(Bin) > ?MAX_PREFIX of
        true ->
            {error, enametoolong};
        false ->
            case file:read_file_info(filename:dirname(Bin)) of
                {ok, #file_info{type = directory}} ->
                    mallocinfo_nif:tcmalloc_profile_start(Bin);
                {ok, _} -> {error, enotdir};
                {error, _} = E -> E
            end
    end.

%% @doc The live heap as the profiler sees it now (`GetHeapProfile'), in
%% the legacy gperftools heap profile text format that `google-pprof' and
%% `jeprof' read: a `heap profile:' header, one line per allocation stack
%% (live count and bytes, total count and bytes, return addresses), then
%% `MAPPED_LIBRARIES:' (this process's `/proc/self/maps') for symbolization.
%% gperftools 2.10 builds it in a 1 MiB buffer: when the stacks do not all
%% fit, the smallest are left out (the header's totals still count them).
%% `{error, not_running}' when the profiler is not running.
-spec profile_dump() -> {ok, Profile :: binary()}
                      | {error, not_running | error_reason()}.
profile_dump() ->
    mallocinfo_nif:tcmalloc_profile_dump().

%% @doc Stops the heap profiler and forgets what it recorded
%% (`HeapProfilerStop'). `{error, not_running}' when it was not running.
-spec profile_stop() -> ok | {error, not_running | error_reason()}.
profile_stop() ->
    mallocinfo_nif:tcmalloc_profile_stop().

%% @doc `{ok, Running}': whether the heap profiler is running
%% (`IsHeapProfilerRunning').
-spec profile_running() -> {ok, boolean()} | {error, error_reason()}.
profile_running() ->
    case mallocinfo_nif:tcmalloc_profile_running() of
        Running when is_boolean(Running) -> {ok, Running};
        {error, _} = E -> E
    end.

prefix_binary(Prefix) ->
    case mallocinfo_lib:path_binary(Prefix, [Prefix]) of
        <<>> -> erlang:error(badarg, [Prefix]);
        Bin -> Bin
    end.
