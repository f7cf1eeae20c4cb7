%% Canned input for the report's EUnit tests (mallocinfo_report_smaps_tests,
%% mallocinfo_report_tests, mallocinfo_report_verdicts_tests): /proc/self/smaps
%% text as the kernel prints it, and a finished report in which no verdict
%% rule has evidence, for the rules and the text to be tried on.
-module(mi_report_data).

-export([vma/6, vma/7, smaps/0]).
-export([quiet/0, frame/2, site/4, with_site/1]).

-include("mi_report_data.hrl").

%% One mapping as the kernel prints it (a subset of the fields). Pss is
%% Rss (pages mapped once) unless given.
vma(Start, Stop, Perms, Path, RssKb, Flags) ->
    vma(Start, Stop, Perms, Path, RssKb, RssKb, Flags).

vma(Start, Stop, Perms, Path, RssKb, PssKb, Flags) ->
    io_lib:format("~.16b-~.16b ~s 00000000 00:00 0                          ~s~n"
                  "Size:           ~8b kB~n"
                  "KernelPageSize:        4 kB~n"
                  "Rss:            ~8b kB~n"
                  "Pss:            ~8b kB~n"
                  "Anonymous:      ~8b kB~n"
                  "Swap:                  0 kB~n"
                  "THPeligible:    0~n"
                  "VmFlags: ~s~n",
                  [Start, Stop, Perms, Path, (Stop - Start) div 1024, RssKb, PssKb,
                   case Path of "" -> RssKb; _ -> 0 end, Flags]).

%% A process's smaps with every kind of mapping the grouping tells apart,
%% and the shapes it must not be fooled by (see the comments).
smaps() ->
    iolist_to_binary(
      [vma(16#55d000000000, 16#55d000100000, "r-xp", "/usr/lib/erlang/erts-13.1.5/bin/beam.smp",
           1024, "rd ex mr mw me"),
       vma(16#55d000100000, 16#55d000180000, "r--p", "/usr/lib/erlang/erts-13.1.5/bin/beam.smp",
           512, "rd mr mw me"),
       vma(16#55d000200000, 16#55d000600000, "rw-p", "[heap]", 3000, "rd wr mr mw me ac"),
       %% A non-main heap: 16 MiB in use, PROT_NONE to the end of its 64 MiB.
       vma(?H + 1 * ?W, ?H + 1 * ?W + 16 * ?MiB, "rw-p", "", 12000, "rd wr mr mw me nr"),
       vma(?H + 1 * ?W + 16 * ?MiB, ?H + 2 * ?W, "---p", "", 0, "mr mw me nr"),
       %% Two heaps that filled up and merged into one mapping.
       vma(?H + 2 * ?W, ?H + 4 * ?W, "rw-p", "", 100000, "rd wr mr mw me nr"),
       %% A decoy: a NORESERVE mapping (the tracker's table) that spans an
       %% aligned window but does not start on it.
       vma(?H + 5 * ?W - 16 * ?MiB, ?H + 6 * ?W + 4 * ?MiB, "rw-p", "", 50000,
           "rd wr mr mw me nr"),
       %% A heap whose PROT_NONE tail runs on into a reservation.
       vma(?H + 8 * ?W, ?H + 8 * ?W + 4 * ?MiB, "rw-p", "", 4000, "rd wr mr mw me nr"),
       vma(?H + 8 * ?W + 4 * ?MiB, ?H + 10 * ?W, "---p", "", 0, "mr mw me nr"),
       %% Aligned NORESERVE but continued by an accountable mapping: not a heap.
       vma(?H + 12 * ?W, ?H + 12 * ?W + 32 * ?MiB, "rw-p", "", 2048, "rd wr mr mw me nr"),
       vma(?H + 12 * ?W + 32 * ?MiB, ?H + 13 * ?W, "rw-p", "", 1000, "rd wr mr mw me ac"),
       %% A thread stack: a 4 KiB guard, then the stack.
       vma(?H + 14 * ?W, ?H + 14 * ?W + 4096, "---p", "", 0, "mr mw me nh"),
       vma(?H + 14 * ?W + 4096, ?H + 14 * ?W + 4096 + ?MiB, "rw-p", "", 64, "rd wr mr mw me ac nh"),
       %% The JIT's two views of its code: 4000 KiB resident, mapped in both
       %% (so each view's Pss is half its Rss), and 100 KiB only the
       %% writable view has touched.
       vma(?H + 15 * ?W, ?H + 15 * ?W + 8 * ?MiB, "rw-s", "/memfd:vmem (deleted)", 4100, 2100,
           "rd wr sh mr mw me ms"),
       vma(?H + 15 * ?W + 8 * ?MiB, ?H + 15 * ?W + 16 * ?MiB, "r-xs", "/memfd:vmem (deleted)", 4000,
           2000, "rd ex sh mr mw me ms"),
       %% ERTS carriers and the like: plain anonymous memory.
       vma(?H + 16 * ?W, ?H + 16 * ?W + 16 * ?MiB, "rw-p", "", 16384, "rd wr mr mw me ac"),
       vma(?H + 17 * ?W, ?H + 17 * ?W + ?MiB, "rw-p", "[anon:named]", 256, "rd wr mr mw me ac"),
       vma(16#7ffc00000000, 16#7ffc00021000, "rw-p", "[stack]", 132, "rd wr mr mw me gd ac"),
       vma(16#7ffc00100000, 16#7ffc00102000, "r-xp", "[vdso]", 4, "rd ex mr mw me de")]).

%%% A finished report ---------------------------------------------------------

%% A symbolized stack frame, as the tracker's sites carry them.
frame(Object, Symbol) ->
    #{address => 16#7f0000001000, object => Object, symbol => Symbol, offset => 16}.

%% A report in which no rule has evidence: 1 GiB RSS, every part small.
quiet() ->
    #{node => 'q@host', allocator => glibc,
      resident => #{rss => 1024 * ?MiB, anon_top => [],
                    groups => maps:from_list(
                                [{K, #{rss => B, size => B, count => 1}}
                                 || {K, B} <- [{main_heap, 100 * ?MiB}, {arenas, 300 * ?MiB},
                                               {stacks, ?MiB}, {jit, 8 * ?MiB},
                                               {noreserve, 0}, {anon, 500 * ?MiB},
                                               {files, 115 * ?MiB}, {special, 0}]])},
      erts => #{memory => #{total => 500 * ?MiB, binary => 10 * ?MiB, ets => 10 * ?MiB},
                allocated => 500 * ?MiB, used => 450 * ?MiB, mmap_bytes => 500 * ?MiB,
                mseg_cache_bytes => ?MiB, sys_alloc_bytes => 0,
                carriers => {unavailable, {missing_application, tools}, <<"add tools">>},
                allocations => [],
                allocators => [#{name => eheap_alloc, allocated => 500 * ?MiB, used => 450 * ?MiB,
                                 sys_alloc => 0, mseg => 499 * ?MiB}],
                processes => [#{pid => list_to_pid("<0.90.0>"), name => my_server,
                                value => 4 * ?MiB, by => memory}],
                ets => [#{table => sessions, bytes => 9 * ?MiB, objects => 1000}]},
      libc => #{mallinfo => #{arena => 400 * ?MiB, uordblks => 385 * ?MiB, fordblks => 15 * ?MiB,
                              hblkhd => 0, hblks => 0, fsmblks => 0, keepcost => 0},
                arena_count => 2,
                arenas => [#{arena => 0, system_bytes => 100 * ?MiB, in_use_bytes => 95 * ?MiB,
                             free_bytes => 5 * ?MiB},
                           #{arena => 1, system_bytes => 300 * ?MiB, in_use_bytes => 290 * ?MiB,
                             free_bytes => 10 * ?MiB}],
                arena_max => #{value => 16, source => default},
                heap_map => {unavailable, x, <<>>}},
      native => #{mode => full, live_bytes => 10 * ?MiB, live_entries => 1000,
                  table_bytes => 64 * ?MiB, stack_bytes => 16 * ?MiB,
                  sites => [site(2 * ?MiB, 100, 10000,
                                 [frame(<<"/opt/app/priv/foo_nif.so">>, <<"foo_cache_insert">>)])],
                  olds => []},
      other_allocator => none,
      attributed => [{tracker_tables, 0}],
      unaccounted_bytes => 10 * ?MiB, unaccounted_percent => 1.0}.

%% A tracker call site (mallocinfo_trace:sites/1's shape).
site(Bytes, Count, AgeMs, Stack) ->
    #{bytes => Bytes, count => Count, oldest_age_ms => AgeMs, estimated => false, stack => Stack}.

%% quiet/0 with that one site as the tracker's largest.
with_site(Site) ->
    R = quiet(),
    R#{native := (maps:get(native, R))#{sites := [Site]}}.
