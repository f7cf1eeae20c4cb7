%% @doc The heap map: a chunk-by-chunk dump of every glibc arena of the
%% running node, a summary of where the free memory sits, and (through
%% {@link render/2}) a picture of it.
%%
%% The node forks; the child walks its copy-on-write image of the heap, in
%% which glibc's fork handlers have left every arena consistent, and writes
%% the dump while the node goes on allocating. The calling process waits on
%% a dirty I/O scheduler; the node's schedulers are held for no longer than
%% the fork itself. No debug symbols are needed; the glibc version and the
%% structure layout are checked before anything is trusted. The dump format
%% is documented in doc/heapmap.md and in c_src/heapwalk/dump_format.h.
-module(mallocinfo_heap).

-export([dump/1, dump/2, summary/0, summary/1, render/2, totals/1]).

-export_type([summary/0, arena_summary/0, totals/0, by_kind/0, dump_error/0]).

%% One arena's figures, the arenas summed by totals/1 (with what only the
%% whole heap has) and bytes of chunks of each kind: the one definition,
%% which a dump file's summary (mallocinfo_heapmap:read_summary/1) shares;
%% doc/heapmap.md says what each figure means.
-type arena_summary() :: mallocinfo_heapmap_summary:arena_summary().
-type totals() :: mallocinfo_heapmap_summary:totals().
-type by_kind() :: mallocinfo_heapmap_summary:by_kind().
-type summary() :: #{arenas := [arena_summary()],
                     total := totals(),
                     mallinfo := map(),
                     sites := [#{id := pos_integer(), live_bytes := non_neg_integer(),
                                 count := non_neg_integer(), label := binary()}],
                     tracker := boolean(),
                     chunks := non_neg_integer(),
                     segments := non_neg_integer(),
                     mmap_chunks := non_neg_integer(),
                     mmap_bytes := non_neg_integer(),
                     tracked_mmap_chunks := non_neg_integer(),
                     tracked_mmap_bytes := non_neg_integer(),
                     file_bytes := non_neg_integer(),
                     walk_ms := non_neg_integer(),
                     fork_us := non_neg_integer(),
                     info_xml => binary()}.
-type dump_error() :: file:posix()
                    | timeout
                    | {unsupported_glibc, Version :: binary()}
                    | {walk_failed, Where :: atom()}
                    | {wrong_allocator, atom()}.
-type opts() :: #{max_sites => 0..65534, timeout => pos_integer(), info_xml => boolean()}.

-define(DEFAULT_TIMEOUT, 120000).
-define(DEFAULT_SITES, 1000).

%% @equiv dump(Path, #{})
-spec dump(file:name_all()) -> {ok, summary()} | {error, dump_error()}.
dump(Path) ->
    dump(Path, #{}).

%% @doc Writes the heap dump to `Path' (atomically: a temporary file beside
%% it, synced and renamed when complete; only a missing name or a regular
%% file is replaced) and returns the summary of the same snapshot.
%% Options: `max_sites' (tracker sites numbered in the dump, default 1000),
%% `timeout' (ms, default 120000: the child is killed after it),
%% `info_xml' (also return glibc's malloc_info XML taken in the child right
%% after the walk: the same snapshot, for cross-checking); any other key
%% raises `badarg'. In `total', `mmap_bytes' and `mmap_chunks' are glibc's
%% count of its mmapped blocks (mallinfo2 `hblkhd', `hblks'),
%% `tracked_mmap_bytes' and `tracked_mmap_chunks' those the walker found
%% through the tracker.
%% Errors: a POSIX atom for the file (`enoent', `eacces', `eisdir' for a
%% directory, `eexist' for a symbolic link, device, FIFO or socket, which
%% are left untouched and cost no walk, ...);
%% `timeout'; `{unsupported_glibc, Version}' when the glibc version (the
%% walker knows 2.35 to 2.43) or the layout found in memory is not one the
%% walker knows; `{walk_failed,
%% Where}' when the heap contradicts ptmalloc's invariants (corruption);
%% `{wrong_allocator, Which}' when malloc is not glibc's.
-spec dump(file:name_all(), opts()) -> {ok, summary()} | {error, dump_error()}.
dump(Path, Opts) when is_map(Opts) ->
    Bin = mallocinfo_lib:path_binary(Path, [Path, Opts]),
    case Bin of
        <<>> -> erlang:error(badarg, [Path, Opts]);
        _ -> run(Bin, Opts)
    end;
dump(Path, Opts) ->
    erlang:error(badarg, [Path, Opts]).

%% @equiv summary(#{})
-spec summary() -> {ok, summary()} | {error, dump_error()}.
summary() ->
    summary(#{}).

%% @doc The summary of {@link dump/2} without writing a file.
-spec summary(opts()) -> {ok, summary()} | {error, dump_error()}.
summary(Opts) when is_map(Opts) ->
    run(<<>>, Opts);
summary(Opts) ->
    erlang:error(badarg, [Opts]).

%% @doc Renders a dump file into `OutDir': `index.html' and PNG heap maps.
%% See {@link mallocinfo_heapmap:render/2}.
-spec render(file:name_all(), file:name_all()) -> {ok, [file:filename_all()]} | {error, term()}.
render(DumpPath, OutDir) ->
    mallocinfo_heapmap:render(DumpPath, OutDir).

%% @doc Sums per-arena summaries into the `total' map: every counter summed,
%% `largest_free' the maximum, plus `arena_count'. Pure; the live summary
%% and a dump file's (mallocinfo_heapmap:read_summary/1) are both summed
%% this way. Raises `badarg' unless `Arenas' is a list of arena summaries
%% (maps with every counter as a non-negative integer, the tracker's three
%% in all or none).
-spec totals([arena_summary()]) -> totals().
totals(Arenas) ->
    mallocinfo_heapmap_summary:totals(Arenas).

%% Internals

run(Path, Opts) ->
    maps:keys(Opts) -- [max_sites, timeout, info_xml] =:= [] orelse erlang:error(badarg, [Opts]),
    MaxSites = opt(max_sites, Opts, ?DEFAULT_SITES,
                   fun(V) -> is_integer(V) andalso V >= 0 andalso V =< 65534 end),
    Timeout = opt(timeout, Opts, ?DEFAULT_TIMEOUT, fun(V) -> is_integer(V) andalso V > 0 andalso V < 1 bsl 31 end),
    Xml = opt(info_xml, Opts, false, fun is_boolean/1),
    case mallocinfo_glibc:allocator() of
        glibc ->
            case mallocinfo_nif:heap_dump(Path, MaxSites, Timeout, Xml) of
                {ok, #{arenas := Arenas} = S} ->
                    Total = maps:merge(mallocinfo_heapmap_summary:totals(Arenas),
                                       maps:with([mmap_bytes, mmap_chunks, tracked_mmap_bytes,
                                                  tracked_mmap_chunks], S)),
                    {ok, S#{total => Total}};
                {error, _} = E ->
                    E
            end;
        Other ->
            {error, {wrong_allocator, Other}}
    end.

opt(Key, Opts, Default, Valid) ->
    V = maps:get(Key, Opts, Default),
    case Valid(V) of
        true -> V;
        false -> erlang:error(badarg, [Opts])
    end.

