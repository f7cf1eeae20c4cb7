%% @private glibc's malloc from Erlang, and what the process says about its
%% allocator: validate the arguments, call the NIF, shape the answer. The
%% lower floor of `mallocinfo': its public functions of the same names are
%% delegations here and carry the reference documentation; the report,
%% the tracker, the heap map, the HTTP endpoint and Prometheus call here,
%% never up into `mallocinfo' (which also holds the report's front door).
%%
%% The glibc calls describe glibc's heap only: while another allocator
%% serves `malloc' they return `{error, {wrong_allocator, Which}}'.
-module(mallocinfo_glibc).

-export([allocator/0, info/0, info/1, heaps/0, stats/0, summary/0, log_stats/0,
         mallinfo/0, trim/1, mallopt/2, version/0, rss/0, libc_version/0]).

-export_type([posix/0, mallopt_param/0, allocator/0, wrong_allocator/0, mallinfo/0,
              trimmed/0]).

-type posix() :: file:posix() | atom().
-type allocator() :: glibc | jemalloc | tcmalloc | mimalloc | unknown.
-type wrong_allocator() :: {wrong_allocator, allocator()}.
-type mallopt_param() :: arena_max | arena_test | mmap_threshold | mmap_max
                       | trim_threshold | top_pad | perturb.
-type mallinfo() :: #{arena | ordblks | smblks | hblks | hblkhd | usmblks | fsmblks
                      | uordblks | fordblks | keepcost => non_neg_integer()}.
-type trimmed() :: #{released := boolean(),
                     rss_before := non_neg_integer() | undefined,
                     rss_after := non_neg_integer() | undefined}.

-define(INT_MIN, -16#80000000).
-define(INT_MAX, 16#7fffffff).
-define(MALLOPT_PARAMS, [arena_max, arena_test, mmap_threshold, mmap_max, trim_threshold,
                         top_pad, perturb]).

%% Which allocator serves malloc (settled when the process starts).
-spec allocator() -> allocator().
allocator() ->
    mallocinfo_nif:allocator().

%% malloc_info's XML written to Path (atomically, by the NIF).
-spec info(Path :: file:name_all()) -> ok | {error, posix() | wrong_allocator()}.
info(Path) ->
    Bin = mallocinfo_lib:path_binary(Path, [Path]),
    glibc(fun() -> mallocinfo_nif:info_file(Bin) end).

%% malloc_info's XML in memory.
-spec info() -> {ok, Xml :: binary()} | {error, posix() | wrong_allocator()}.
info() ->
    glibc(fun mallocinfo_nif:info_xml/0).

%% malloc_info parsed with xmerl, loaded from the OTP installation when the
%% release lacks it.
-spec heaps() -> {ok, mallocinfo_glibc_parse:heaps()}
               | {error, {missing_application, xmerl} | posix() | wrong_allocator()}.
heaps() ->
    case mallocinfo_lib:ensure_xmerl() of
        ok ->
            case info() of
                {ok, Xml} -> {ok, mallocinfo_glibc_parse:heaps(Xml)};
                {error, _} = E -> E
            end;
        {error, _} = E ->
            E
    end.

%% malloc_stats() itself: its text goes to the node's standard error.
-spec stats() -> ok | {error, wrong_allocator()}.
stats() ->
    glibc(fun mallocinfo_nif:malloc_stats/0).

%% malloc_stats()'s figures as terms, from one forked copy of the heap.
-spec summary() -> {ok, mallocinfo_glibc_parse:summary()} | {error, posix() | wrong_allocator()}.
summary() ->
    case glibc(fun mallocinfo_nif:stats_text/0) of
        {ok, Text} -> {ok, mallocinfo_glibc_parse:stats(Text)};
        {error, _} = E -> E
    end.

%% malloc_stats()'s lines to logger, at info level.
-spec log_stats() -> ok | {error, posix() | wrong_allocator()}.
log_stats() ->
    case glibc(fun mallocinfo_nif:stats_text/0) of
        {ok, Text} ->
            Lines = binary:split(Text, <<"\n">>, [global, trim_all]),
            lists:foreach(
              fun(L) ->
                      logger:info("malloc_stats: ~ts", [L], #{domain => [mallocinfo]})
              end, Lines);
        {error, _} = E ->
            E
    end.

%% Every mallinfo2() field.
-spec mallinfo() -> {ok, mallinfo()} | {error, wrong_allocator()}.
mallinfo() ->
    glibc(fun() -> {ok, mallocinfo_nif:mallinfo()} end).

%% malloc_trim(Pad), with the resident set before and after.
-spec trim(Pad :: non_neg_integer()) -> {ok, trimmed()} | {error, wrong_allocator()}.
trim(Pad) when is_integer(Pad), Pad >= 0, Pad < 16#10000000000000000 ->
    glibc(fun() -> mallocinfo_nif:trim(Pad) end);
trim(Pad) ->
    erlang:error(badarg, [Pad]).

%% mallopt(3): an unknown parameter or a non-integer raises badarg, a
%% value outside a C int is einval here, the rest glibc's own checks.
-spec mallopt(mallopt_param(), integer()) -> ok | {error, einval | wrong_allocator()}.
mallopt(Param, Value) when is_integer(Value) ->
    case lists:member(Param, ?MALLOPT_PARAMS) of
        false -> erlang:error(badarg, [Param, Value]);
        true when Value < ?INT_MIN; Value > ?INT_MAX -> {error, einval};
        true -> glibc(fun() -> mallocinfo_nif:mallopt(Param, Value) end)
    end;
mallopt(Param, Value) ->
    erlang:error(badarg, [Param, Value]).

%% The version of the loaded shared object.
-spec version() -> binary().
version() ->
    mallocinfo_nif:version().

%% The resident set size in bytes (/proc/self/statm), undefined when
%% unreadable.
-spec rss() -> non_neg_integer() | undefined.
rss() ->
    mallocinfo_nif:rss().

%% gnu_get_libc_version().
-spec libc_version() -> binary().
libc_version() ->
    mallocinfo_nif:libc_version().

%% Runs a glibc call only while glibc serves malloc. Arguments are checked
%% before this (misuse raises whatever the allocator).
glibc(Call) ->
    case allocator() of
        glibc -> Call();
        Other -> {error, {wrong_allocator, Other}}
    end.
