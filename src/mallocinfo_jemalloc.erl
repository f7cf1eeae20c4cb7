%% @doc jemalloc's own statistics and heap profiler, for a node started with
%% jemalloc as its allocator (`LD_PRELOAD=.../libjemalloc.so.2').
%%
%% Nothing here links jemalloc: every call finds the allocator that serves
%% `malloc' at call time (see {@link mallocinfo:allocator/0}) and takes
%% jemalloc's functions from that shared object. When it is not jemalloc
%% every call returns `{error, {wrong_allocator, Which}}'.
%%
%% Profiling must be enabled when the process starts, for example with
%% `MALLOC_CONF=prof:true,prof_active:false' (ready, not sampling);
%% {@link profile_active/1} then switches sampling on and off at run time
%% and {@link profile_dump/0} returns a profile for `jeprof'. Without
%% `prof:true' those return `{error, profiling_disabled}' (not a misleading
%% `enoent'). See doc/allocators.md.
-module(mallocinfo_jemalloc).

-export([stats/0, summary/0, profile_status/0, profile_active/1, profile_dump/0]).

-export_type([error_reason/0]).

-type error_reason() :: mallocinfo:wrong_allocator() | profiling_disabled
                      | profiling_unsupported | stats_disabled | mallocinfo:posix().

%% @doc jemalloc's complete statistics as JSON, exactly as
%% `malloc_stats_print(..., "J")' writes them (merged and per-arena figures,
%% bins, extents, mutexes). Run on a dirty scheduler; jemalloc refreshes the
%% figures itself before printing.
-spec stats() -> {ok, Json :: binary()} | {error, error_reason()}.
stats() ->
    mallocinfo_nif:jemalloc_stats().

%% @doc The headline figures in bytes, read with `mallctl' right after
%% advancing `epoch' (so they are fresh, not those of the last refresh):
%% `allocated' (by the application), `active' (in active pages), `resident',
%% `mapped', `retained' (unmapped but kept virtual), `metadata'.
%% `{error, stats_disabled}' for a jemalloc built without statistics.
-spec summary() -> {ok, #{allocated := non_neg_integer(), active := non_neg_integer(),
                          resident := non_neg_integer(), mapped := non_neg_integer(),
                          retained := non_neg_integer(), metadata := non_neg_integer()}}
                 | {error, error_reason()}.
summary() ->
    mallocinfo_nif:jemalloc_summary().

%% @doc `{ok, State}', heap profiling's state: `prof' (`opt.prof': enabled at start),
%% `active' (`prof.active': sampling now), `thread_active_init'
%% (`prof.thread_active_init': whether new threads sample), `lg_sample'
%% (log2 of the mean bytes between samples). `{error, profiling_unsupported}'
%% for a jemalloc built without profiling support.
-spec profile_status() -> {ok, #{prof := boolean(), active := boolean(),
                                 thread_active_init := boolean(), lg_sample := integer()}}
                        | {error, error_reason()}.
profile_status() ->
    case mallocinfo_nif:jemalloc_profile_status() of
        #{} = State -> {ok, State};
        {error, _} = E -> E
    end.

%% @doc Switches sampling on (`true') or off (`false') at run time
%% (`prof.active'). `{error, profiling_disabled}' when the process did not
%% start with `MALLOC_CONF=prof:true'. Anything but a boolean raises
%% `badarg'.
-spec profile_active(boolean()) -> ok | {error, profiling_disabled | error_reason()}.
profile_active(On) when is_boolean(On) ->
    mallocinfo_nif:jemalloc_profile_active(On);
profile_active(On) ->
    erlang:error(badarg, [On]).

%% @doc A heap profile in jemalloc's format, for `jeprof --text' (or
%% `--svg', ...). `prof.dump' writes it into a fresh private directory
%% (`mkdtemp', mode 0700, under `$TMPDIR' or `/tmp'), which is read back and
%% removed before this returns, whatever happens: no predictable name, no
%% file left behind, and concurrent callers each get their own complete
%% dump. `{error, profiling_disabled}' without `prof:true'; `{error, efault}'
%% when jemalloc could not write the dump; other POSIX atoms when the temp
%% directory cannot be made (`enoent', `eacces', ...).
-spec profile_dump() -> {ok, Profile :: binary()}
                      | {error, profiling_disabled | error_reason()}.
profile_dump() ->
    mallocinfo_nif:jemalloc_profile_dump(tmp_dir()).

%% The directory under which the private one is made, as the NIF wants it:
%% a binary in the file name encoding, without NUL.
tmp_dir() ->
    Bin = unicode:characters_to_binary(mallocinfo_file:tmp_dir(), unicode,
                                       file:native_name_encoding()),
    case is_binary(Bin) andalso binary:match(Bin, <<0>>) =:= nomatch of
        true -> Bin;
        false -> <<"/tmp">>
    end.
