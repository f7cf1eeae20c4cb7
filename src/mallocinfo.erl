%% @doc Where did my memory go? glibc malloc introspection for a running node.
%%
%% Every function is safe to call from a remote console on a live node: the
%% ones that lock malloc arenas, fork or touch files run on dirty schedulers.
%% Wrong argument types raise `badarg'; a call that can fail at run time
%% returns `{ok, Value}' (or `ok') or `{error, Reason}', Reason a POSIX
%% atom (`enoent', `eacces', ...) or `{wrong_allocator, Which}' (README,
%% "Results and errors").
%%
%% {@link allocator/0} says which allocator serves `malloc' in this process.
%% The glibc calls below describe glibc's heap only: while another allocator
%% is active (jemalloc or tcmalloc preloaded, say) they return
%% `{error, {wrong_allocator, Which}}' instead of figures about an idle glibc
%% heap; see {@link mallocinfo_jemalloc} and {@link mallocinfo_tcmalloc}.
%%
%% Loading this module (`l(mallocinfo).') also loads every other module of
%% the application, so the whole API works in releases running in embedded
%% code-loading mode, where nothing is loaded on first call.
%%
%% This module is the front door: the glibc calls are done in the internal
%% `mallocinfo_glibc' (which the rest of the application calls), the report
%% in {@link mallocinfo_report}.
-module(mallocinfo).

-on_load(load_siblings/0).

-export([allocator/0, info/0, info/1, heaps/0, stats/0, summary/0, log_stats/0,
         mallinfo/0, trim/0, trim/1, mallopt/2, version/0, rss/0, libc_version/0]).
%% The report (mallocinfo_report): printed, for this node or a cluster.
-export([report/0, report/1, report/2]).
%% The timeline (mallocinfo_watch): every layer over time.
-export([watch/0, watch/1, unwatch/0, history/0]).
%% Capture under pressure (mallocinfo_watch_capture).
-export([capture_on/1, capture_off/0]).

-export_type([posix/0, mallopt_param/0, allocator/0, wrong_allocator/0]).

-type posix() :: mallocinfo_glibc:posix().
-type allocator() :: mallocinfo_glibc:allocator().
-type wrong_allocator() :: mallocinfo_glibc:wrong_allocator().
-type mallopt_param() :: mallocinfo_glibc:mallopt_param().

%% @doc Which allocator serves `malloc' in this process: `glibc',
%% `jemalloc', `tcmalloc' (gperftools), `mimalloc', or `unknown' (another
%% one). It is the shared object whose `malloc' the process calls, looking
%% through mallocinfo's own interposer to the allocator it forwards to, and
%% recognised by its own exports (`mallctl'; `MallocExtension_GetStats' or
%% `tc_version'; `mi_version'). A jemalloc that a library `dlopen'ed later,
%% or carries privately, does not serve `malloc' and does not count. The
%% answer is settled when the process starts, so the first call finds it
%% and later calls read it.
-spec allocator() -> allocator().
allocator() ->
    mallocinfo_glibc:allocator().

%% @doc glibc's `malloc_info(0, ...)' XML written to `Path'. The document is
%% written to a temporary file in the same directory, synced and renamed
%% into place, so a reader never sees half of it. Only a missing name or a
%% regular file is replaced. Errors are POSIX atoms: `enoent' (missing
%% directory), `eacces', `enotdir', `eisdir' (Path is a directory),
%% `eexist' (Path is a symbolic link, never followed, a device, a FIFO or a
%% socket: refused and left untouched), `enospc', ...
-spec info(Path :: file:name_all()) -> ok | {error, posix() | wrong_allocator()}.
info(Path) ->
    mallocinfo_glibc:info(Path).

%% @doc The same XML in memory, without a temporary file.
-spec info() -> {ok, Xml :: binary()} | {error, posix() | wrong_allocator()}.
info() ->
    mallocinfo_glibc:info().

%% @doc `malloc_info' parsed into terms with xmerl: per heap (arena) the
%% free-chunk size classes, `fast'/`rest' free totals, `system' current/max
%% and `aspace'; then the totals, including `mmap' (`fast' is zero from
%% glibc 2.43, which has no fastbins and leaves it out). `free_bytes' and
%% `in_use_bytes' are derived (`in_use = system current - fast - rest').
%% If the running release lacks xmerl it is loaded from the OTP installation
%% when one can be found, else `{error, {missing_application, xmerl}}'.
-spec heaps() -> {ok, mallocinfo_glibc_parse:heaps()}
               | {error, {missing_application, xmerl} | posix() | wrong_allocator()}.
heaps() ->
    mallocinfo_glibc:heaps().

%% @doc glibc's `malloc_stats()', exactly: its text goes to the node's
%% standard error (often lost in a release; see {@link log_stats/0}).
-spec stats() -> ok | {error, wrong_allocator()}.
stats() ->
    mallocinfo_glibc:stats().

%% @doc `{ok, Figures}': the figures `malloc_stats()' prints, as terms: per arena
%% `system_bytes' and `in_use_bytes', their sums under the same names (the
%% arenas only, as in {@link heaps/0} and the heap map), and
%% malloc_stats()'s totals, which add the mmapped blocks, as
%% `system_incl_mmap_bytes' and `in_use_incl_mmap_bytes'. Taken from one frozen copy of the heap: a short-lived child
%% process (fork) runs `malloc_stats()' and `mallinfo2()' on the copy, so the
%% numbers are consistent with each other even while the node allocates.
%% Returns `{error, enomem | eagain}' if the node cannot fork.
-spec summary() -> {ok, mallocinfo_glibc_parse:summary()} | {error, posix() | wrong_allocator()}.
summary() ->
    mallocinfo_glibc:summary().

%% @doc The lines of `malloc_stats()' sent to `logger' at `info' level, one
%% event per line, with metadata `#{domain => [mallocinfo]}'. The default
%% logger primary level is `notice': raise it to `info' to see them.
-spec log_stats() -> ok | {error, posix() | wrong_allocator()}.
log_stats() ->
    mallocinfo_glibc:log_stats().

%% @doc `{ok, Fields}': every `mallinfo2()' field, as unbounded integers
%% (no 32-bit wrap).
-spec mallinfo() -> {ok, mallocinfo_glibc:mallinfo()} | {error, wrong_allocator()}.
mallinfo() ->
    mallocinfo_glibc:mallinfo().

%% @equiv trim(0)
-spec trim() -> {ok, mallocinfo_glibc:trimmed()} | {error, wrong_allocator()}.
trim() ->
    mallocinfo_glibc:trim(0).

%% @doc `malloc_trim(Pad)': return free memory at the top of the heap and
%% free whole pages inside every arena to the system. `rss_before' and
%% `rss_after' are the resident set size in bytes (`/proc/self/statm').
-spec trim(Pad :: non_neg_integer()) ->
          {ok, mallocinfo_glibc:trimmed()} | {error, wrong_allocator()}.
trim(Pad) ->
    mallocinfo_glibc:trim(Pad).

%% @doc `mallopt(3)'. An unknown parameter or a non-integer value raises
%% `badarg'; a value glibc would ignore or refuse returns `{error, einval}'
%% (`arena_max'/`arena_test' =&lt; 0, `mmap_threshold' outside 0..32 MiB,
%% negative `mmap_max'/`top_pad', `trim_threshold' &lt; -1, anything outside a
%% C int).
-spec mallopt(mallopt_param(), integer()) -> ok | {error, einval | wrong_allocator()}.
mallopt(Param, Value) ->
    mallocinfo_glibc:mallopt(Param, Value).

%% @doc The version of the loaded shared object.
-spec version() -> binary().
version() ->
    mallocinfo_glibc:version().

%% @doc This process's resident set size in bytes (`/proc/self/statm'),
%% `undefined' when it cannot be read. One small file read: cheap enough
%% for a dashboard.
-spec rss() -> non_neg_integer() | undefined.
rss() ->
    mallocinfo_glibc:rss().

%% @doc The C library's version as it reports it at run time
%% (`gnu_get_libc_version()', e.g. `<<"2.36">>'), whichever allocator
%% serves `malloc'.
-spec libc_version() -> binary().
libc_version() ->
    mallocinfo_glibc:libc_version().

%%% ---------------------------------------------------------------------------
%%% Internals

%% Loads the other modules of the application. In embedded mode the code
%% server loads nothing on first call, so without this `l(mallocinfo).'
%% would leave mallocinfo_nif (and the rest) undefined.
load_siblings() ->
    %% code:ensure_modules_loaded/1 refuses in embedded mode; load_file/1
    %% (what l/1 does) works in both modes. mallocinfo_lib knows the
    %% application's modules: it goes first.
    _ = code:is_loaded(mallocinfo_lib) =:= false andalso code:load_file(mallocinfo_lib),
    Mods = try mallocinfo_lib:app_modules() catch error:undef -> [] end,
    Loaded = code:is_loaded(mallocinfo_nif) =/= false,
    Failed = [{M, Why} || M <- Mods -- [?MODULE],
                          code:is_loaded(M) =:= false,
                          {error, Why} <- [code:load_file(M)]],
    case {Failed, Mods} of
        {[], [_ | _]} -> ok;
        %% Loaded from a binary by mallocinfo_report:collect/1, which loads
        %% the siblings first: nothing is missing then.
        {[], []} when Loaded -> ok;
        {[], []} -> logger:error("mallocinfo: no modules found beside mallocinfo.beam");
        _ -> logger:error("mallocinfo: could not load ~p", [Failed])
    end,
    ok.

%%% ---------------------------------------------------------------------------
%%% The report (see mallocinfo_report)

%% @doc Prints the report of this node (80 columns): where the resident set
%% is (mappings by kind), the ERTS, libc and native layers, what nothing
%% accounts for, and a verdict. See doc/report.md.
-spec report() -> ok.
report() ->
    io:put_chars(mallocinfo_report:format(mallocinfo_report:collect())).

%% @doc With a list: prints the report of every node in `Nodes' (collected
%% in parallel with `erpc'; mallocinfo is loaded over distribution where
%% it is missing): a comparison table, one row per node, then each node's
%% verdicts. Unreachable or failing nodes get a row saying why.
%% With a map: the report of this node with options, `interval => Ms'
%% (the tracker looks three times over `Ms' and the native verdict says
%% what grew in every sample, at what rate: "a leak", or "stable") and
%% `startup_blocks => true' (see {@link mallocinfo_report:collect/1}).
-spec report([node()] | #{interval => pos_integer(), startup_blocks => boolean()}) -> ok.
report(Opts) when is_map(Opts) ->
    io:put_chars(mallocinfo_report:format(mallocinfo_report:collect(Opts)));
report(Nodes) ->
    %% collect/1 raises badarg for anything but a proper list of node names.
    io:put_chars(mallocinfo_report:format_cluster(mallocinfo_report:collect(Nodes))).

%% @doc {@link report/1} with options: `attach => true' first attaches the
%% tracker ({@link mallocinfo_trace:attach/0}) on every node that is not
%% tracking, and each row says so (`attached now', `attached',
%% `preloaded', `attach failed' with the reason below the table);
%% `timeout' (ms); `interval' and `startup_blocks' as for one node. See
%% {@link mallocinfo_report:collect/2}.
-spec report([node()], #{attach => boolean(), timeout => pos_integer(),
                         interval => pos_integer(), startup_blocks => boolean()}) -> ok.
report(Nodes, Opts) ->
    %% collect/2 raises badarg for a bad node list or bad options.
    io:put_chars(mallocinfo_report:format_cluster(mallocinfo_report:collect(Nodes, Opts))).

%%% ---------------------------------------------------------------------------
%%% The timeline (see mallocinfo_watch)

%% @doc Starts the sampler with the default period (10 s): {@link watch/1}.
-spec watch() -> ok | {error, term()}.
watch() ->
    mallocinfo_watch:watch().

%% @doc Starts a supervised sampler that reads every layer of the node's
%% memory every `period' ms (1000 to 3600000, default 10000) into a ring
%% of fixed size (an hour at the period, then a day at one sample a
%% minute), and names what grows and who holds it ({@link history/0},
%% `/timeline.html'). `ok', or `{error, {already_watching, #{period =>
%% P}}}' when it runs with another period, `{error, {start_failed, Why}}'.
%% Starts mallocinfo's application if it does not run. A wrong option
%% raises `badarg'. See doc/report.md, "The timeline".
-spec watch(#{period => pos_integer()}) -> ok | {error, term()}.
watch(Opts) ->
    mallocinfo_watch:watch(Opts).

%% @doc Stops the sampler; its history is gone. Always `ok'.
-spec unwatch() -> ok.
unwatch() ->
    mallocinfo_watch:unwatch().

%% @doc `{ok, History}': the sampler's samples, oldest first, what grew
%% over the last minute (`verdicts', each with its rate and culprit), each
%% part's rate, the latest culprits per layer, the ring's size and the
%% samples' cost; `{error, not_watching}'. See
%% {@link mallocinfo_watch:history/0}.
-spec history() -> {ok, map()} | {error, not_watching}.
history() ->
    mallocinfo_watch:history().

%%% Capture under pressure (see mallocinfo_watch_capture)

%% @doc When the node's RSS crosses `rss_above' (bytes, or `{fraction, F}'
%% of its cgroup v2 `memory.high'/`memory.max'), writes the report, the
%% tracker's pprof and folded stacks, the timeline and the top processes
%% into `dir', once per crossing, never over an existing file, bounded and
%% rate-limited: {@link mallocinfo_watch_capture:capture_on/1}. `ok' or
%% `{error, Posix | no_limit | already_capturing | {start_failed, R}}'.
-spec capture_on(mallocinfo_watch_capture:opts()) -> ok | {error, term()}.
capture_on(Opts) ->
    mallocinfo_watch_capture:capture_on(Opts).

%% @doc Stops the capture: {@link mallocinfo_watch_capture:capture_off/0}.
-spec capture_off() -> ok.
capture_off() ->
    mallocinfo_watch_capture:capture_off().
