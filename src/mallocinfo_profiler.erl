%% @doc Heap profiling switched on and off and dumped, whichever profiler
%% this node has: jemalloc's or tcmalloc's own when that allocator serves
%% `malloc', else mallocinfo's tracker (when preloaded or attached). What
%% `GET /heap_profile' of {@link mallocinfo_http} does, from a console:
%%
%% ```
%% 1> mallocinfo_profiler:status().
%% #{profiler => tracker, allocator => glibc, active => true, tracker => #{...}}
%% 2> mallocinfo_profiler:stop().         % the tracker: counters mode
%% ok
%% 3> {ok, Profile} = mallocinfo_profiler:dump().
%% '''
%%
%% The profile is jemalloc's own (`prof.dump'), tcmalloc's
%% (`GetHeapProfile') or the tracker's ({@link mallocinfo_trace:heap_profile/0}),
%% all three in the legacy gperftools text format that `jeprof --text' and
%% `google-pprof --text' read (give them the emulator, `beam.smp', as the
%% program). doc/http.md ("Heap profiles") says what each profiler keeps.
-module(mallocinfo_profiler).

-export([profiler/0, status/0, start/0, stop/0, dump/0]).

-export_type([profiler/0, status/0]).

-type profiler() :: jemalloc | tcmalloc | tracker.
-type status() :: #{profiler := profiler(),
                    allocator := mallocinfo:allocator(),
                    active := boolean(),
                    jemalloc => #{prof := boolean(), active := boolean(),
                                  thread_active_init := boolean(), lg_sample := integer()},
                    tracker => map(),
                    error => term()}.

%% @doc Who profiles on this node: `jemalloc' or `tcmalloc' when that
%% allocator serves `malloc' (their profilers are their own), else
%% `tracker' (glibc keeps no allocation stacks, nor does an allocator
%% mallocinfo has no profiler for). Settled when the process starts.
-spec profiler() -> profiler().
profiler() ->
    case mallocinfo_glibc:allocator() of
        jemalloc -> jemalloc;
        tcmalloc -> tcmalloc;
        _ -> tracker
    end.

%% @doc What the profiler is doing. Always succeeds: `profiler' (see
%% {@link profiler/0}), `allocator' ({@link mallocinfo:allocator/0}),
%% `active' (recording allocations now); then per profiler: `jemalloc'
%% ({@link mallocinfo_jemalloc:profile_status/0}'s figures), `tracker'
%% ({@link mallocinfo_trace:status/0}). `error' says why there is nothing
%% to record with: `not_preloaded' (no tracker), `not_recording' (the
%% tracker is detached, or preloaded in an executable
%% `MALLOCINFO_TRACE_EXE' does not match), `profiler_not_loaded'
%% (`libtcmalloc_minimal' has no profiler), or the failed call's reason.
-spec status() -> status().
status() ->
    Profiler = profiler(),
    Base = #{profiler => Profiler, allocator => mallocinfo_glibc:allocator()},
    maps:merge(Base, status(Profiler)).

status(jemalloc) ->
    case mallocinfo_jemalloc:profile_status() of
        {ok, #{active := Active} = S} -> #{active => Active, jemalloc => S};
        {error, Reason} -> #{active => false, error => Reason}
    end;
status(tcmalloc) ->
    case mallocinfo_tcmalloc:profile_running() of
        {ok, Running} -> #{active => Running};
        {error, Reason} -> #{active => false, error => Reason}
    end;
status(tracker) ->
    case mallocinfo_trace:status() of
        #{preloaded := false, attached_at := undefined} = S ->
            #{active => false, tracker => S, error => not_preloaded};
        #{recording := false} = S ->
            #{active => false, tracker => S, error => not_recording};
        #{mode := Mode} = S ->
            #{active => Mode =:= full orelse Mode =:= sample, tracker => S}
    end.

%% @doc Starts recording. jemalloc: `prof.active' true (`{error,
%% profiling_disabled}' unless the node started with
%% `MALLOC_CONF=prof:true'); tcmalloc: its heap profiler started, with its
%% own files (`<prefix>.0001.heap' and on, each time the `HEAP_PROFILE_*'
%% thresholds are crossed) in a fresh private directory (mode 0700, under
%% `$TMPDIR' or `/tmp') that {@link stop/0} removes; the tracker: back to
%% the mode the node started with (`full', or `sample' when
%% `MALLOCINFO_TRACE=sample'), `{error, not_preloaded | not_recording}'
%% without a tracker that records. `ok' when it records already.
-spec start() -> ok | {error, term()}.
start() ->
    set_active(profiler(), true).

%% @doc Stops recording. jemalloc: `prof.active' false (its samples so far
%% are kept); tcmalloc: the profiler stopped (what it recorded is
%% forgotten) and its directory removed; the tracker: `counters' mode, so
%% the blocks recorded so far stay in the table (and leave it when freed),
%% as jemalloc keeps its samples. `ok' when it is stopped already.
-spec stop() -> ok | {error, term()}.
stop() ->
    set_active(profiler(), false).

%% @doc The heap profile now, in the legacy gperftools text format:
%% {@link mallocinfo_jemalloc:profile_dump/0},
%% {@link mallocinfo_tcmalloc:profile_dump/0} or
%% {@link mallocinfo_trace:heap_profile/0}, with their errors
%% (`profiling_disabled', `not_running', `not_preloaded', ...).
-spec dump() -> {ok, Profile :: binary()} | {error, term()}.
dump() ->
    case profiler() of
        jemalloc -> mallocinfo_jemalloc:profile_dump();
        tcmalloc -> mallocinfo_tcmalloc:profile_dump();
        tracker -> mallocinfo_trace:heap_profile()
    end.

%%% ---------------------------------------------------------------------------

set_active(jemalloc, Active) ->
    mallocinfo_jemalloc:profile_active(Active);
set_active(tcmalloc, true) ->
    case mallocinfo_tcmalloc:profile_running() of
        {ok, true} -> ok;
        {ok, false} -> start_tcmalloc_profiler();
        {error, _} = E -> E
    end;
set_active(tcmalloc, false) ->
    case mallocinfo_tcmalloc:profile_running() of
        {ok, true} ->
            %% not_running: another caller stopped it first.
            Result = case mallocinfo_tcmalloc:profile_stop() of
                         {error, not_running} -> ok;
                         Other -> Other
                     end,
            remove_tcmalloc_dir(),
            Result;
        {ok, false} -> ok;
        {error, _} = E -> E
    end;
set_active(tracker, Active) ->
    case {mallocinfo_trace:status(), Active} of
        {#{preloaded := false, attached_at := undefined}, _} -> {error, not_preloaded};
        {#{recording := false}, _} -> {error, not_recording};
        {#{mode := M}, true} when M =:= full; M =:= sample -> ok;
        {#{}, true} -> mallocinfo_trace:set_mode(resume_mode());
        %% counters, not off: the blocks recorded so far stay in the table
        %% (and leave it when freed), as jemalloc keeps its samples while
        %% prof.active is false.
        {#{mode := M}, false} when M =:= full; M =:= sample -> mallocinfo_trace:set_mode(counters);
        {#{}, false} -> ok
    end.

%% tcmalloc's own files go to a directory made fresh for them, private
%% (mallocinfo_file:private_dir/3: nothing planted in advance is used, no
%% one else can plant a symlink in it); it goes when the profiler is
%% stopped here.
start_tcmalloc_profiler() ->
    case mallocinfo_file:private_dir(mallocinfo_file:tmp_dir(), "mallocinfo-tcmalloc-",
                                     fun(F, A) -> apply(file, F, A) end) of
        {ok, Dir} ->
            case mallocinfo_tcmalloc:profile_start(filename:join(Dir, "heap")) of
                ok ->
                    persistent_term:put({?MODULE, tcmalloc_dir}, Dir),
                    ok;
                {error, already_running} ->
                    %% Another caller started it first: what was asked for
                    %% is done, with that caller's directory.
                    _ = file:del_dir(Dir),
                    ok;
                {error, _} = E ->
                    _ = file:del_dir(Dir),
                    E
            end;
        {error, {_Step, _Dir, Posix}} ->
            {error, Posix}
    end.

remove_tcmalloc_dir() ->
    case persistent_term:get({?MODULE, tcmalloc_dir}, undefined) of
        undefined ->
            ok;
        Dir ->
            _ = file:del_dir_r(Dir),
            _ = persistent_term:erase({?MODULE, tcmalloc_dir}),
            ok
    end.

%% Back to the mode the node was started with, when it recorded blocks.
resume_mode() ->
    case os:getenv("MALLOCINFO_TRACE") of
        "sample" -> sample;
        _ -> full
    end.
