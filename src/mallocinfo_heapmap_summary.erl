%% @private One arena's figures and their totals: the one definition both
%% summaries share, the live one (`mallocinfo_heap:summary/0', from the
%% walker) and a dump file's (`mallocinfo_heapmap_read', offline), so the
%% two cannot drift. Pure, below both: it calls no other module of the
%% application. `mallocinfo_heap' exports `totals/1' and these types under
%% its own name.
-module(mallocinfo_heapmap_summary).

-export([totals/1]).

-export_type([arena_summary/0, totals/0, by_kind/0]).

%% Bytes of chunks of each kind.
-type by_kind() :: #{in_use := non_neg_integer(), free := non_neg_integer(),
                     fast := non_neg_integer(), tcache := non_neg_integer(),
                     top := non_neg_integer(), meta := non_neg_integer()}.
%% One arena's figures (doc/heapmap.md says what each means). The one
%% definition: a dump file's summary (mallocinfo_heapmap:read_summary/1)
%% has exactly these keys too. `live_bytes', `live_chunks' and
%% `unrecorded_bytes' are there only with tracker data.
-type arena_summary() :: #{arena := non_neg_integer(),
                           address := non_neg_integer(),
                           system_bytes := non_neg_integer(),
                           in_use_bytes := non_neg_integer(),
                           free_bytes := non_neg_integer(),
                           by_kind := by_kind(),
                           chunks := non_neg_integer(),
                           free_chunks := non_neg_integer(),
                           largest_free := non_neg_integer(),
                           resident_bytes := non_neg_integer(),
                           trimmable_bytes := non_neg_integer(),
                           pinned_bytes := non_neg_integer(),
                           segments := non_neg_integer(),
                           live_bytes => non_neg_integer(),
                           live_chunks => non_neg_integer(),
                           unrecorded_bytes => non_neg_integer()}.
%% The arenas summed by totals/1 (every counter summed, `largest_free' the
%% largest, `arena_count'), and in a summary what only the whole heap has:
%% `tracked_mmap_bytes' and `tracked_mmap_chunks', the mmapped blocks the
%% walker found through the tracker (in the live summary and a dump's);
%% `mmap_bytes' and `mmap_chunks', glibc's own count of its mmapped blocks
%% (mallinfo2 `hblkhd', `hblks'; only in the live summary: a dump does not
%% hold it).
-type totals() :: #{system_bytes := non_neg_integer(),
                    in_use_bytes := non_neg_integer(),
                    free_bytes := non_neg_integer(),
                    by_kind := by_kind(),
                    chunks := non_neg_integer(),
                    free_chunks := non_neg_integer(),
                    largest_free := non_neg_integer(),
                    resident_bytes := non_neg_integer(),
                    trimmable_bytes := non_neg_integer(),
                    pinned_bytes := non_neg_integer(),
                    segments := non_neg_integer(),
                    arena_count := non_neg_integer(),
                    tracked_mmap_bytes => non_neg_integer(),
                    tracked_mmap_chunks => non_neg_integer(),
                    mmap_bytes => non_neg_integer(),
                    mmap_chunks => non_neg_integer(),
                    live_bytes => non_neg_integer(),
                    live_chunks => non_neg_integer(),
                    unrecorded_bytes => non_neg_integer()}.

-define(COUNTERS, [system_bytes, in_use_bytes, free_bytes, chunks, free_chunks, resident_bytes,
                   trimmable_bytes, pinned_bytes, segments]).
-define(KINDS, [in_use, free, fast, tcache, top, meta]).
-define(TRACKER_COUNTERS, [live_bytes, live_chunks, unrecorded_bytes]).

%% Sums per-arena summaries into the `total' map: every counter summed,
%% `largest_free' the maximum, plus `arena_count'. Pure; the live summary
%% and a dump file's (mallocinfo_heapmap:read_summary/1) are both summed
%% here. Raises `badarg' unless `Arenas' is a list of arena summaries (maps
%% with every counter above as a non-negative integer, the tracker's three
%% in all or none).
-spec totals([arena_summary()]) -> totals().
totals(Arenas) ->
    arenas(Arenas) orelse erlang:error(badarg, [Arenas]),
    Sum = fun(K) -> lists:sum([maps:get(K, A, 0) || A <- Arenas]) end,
    Base = maps:from_list([{K, Sum(K)} || K <- ?COUNTERS]),
    ByKind = maps:from_list([{K, lists:sum([maps:get(K, maps:get(by_kind, A)) || A <- Arenas])}
                             || K <- ?KINDS]),
    Tracker = case Arenas of
                  [#{live_bytes := _} | _] ->
                      maps:from_list([{K, Sum(K)} || K <- ?TRACKER_COUNTERS]);
                  _ ->
                      #{}
              end,
    maps:merge(Base#{by_kind => ByKind,
                     largest_free => lists:max([0 | [maps:get(largest_free, A) || A <- Arenas]]),
                     arena_count => length(Arenas)},
               Tracker).

arenas(Arenas) ->
    Tracker = case Arenas of
                  [#{live_bytes := _} | _] -> ?TRACKER_COUNTERS;
                  _ -> []
              end,
    proper_list(Arenas) andalso
        lists:all(fun(#{by_kind := K} = A) ->
                          counters(A, [largest_free | ?COUNTERS ++ Tracker]) andalso
                              counters(K, ?KINDS);
                     (_) ->
                          false
                  end, Arenas).

counters(M, Keys) ->
    is_map(M) andalso
        lists:all(fun(K) ->
                          case M of
                              #{K := V} -> is_integer(V) andalso V >= 0;
                              #{} -> false
                          end
                  end, Keys).

proper_list([]) -> true;
proper_list([_ | T]) -> proper_list(T);
proper_list(_) -> false.
