%% Every exported function of every public module raises `badarg' (an
%% `error:badarg' exception) for every wrong argument: wrong types, improper
%% lists, tuples, negative numbers, maps with unknown keys or wrong values,
%% binaries where lists belong. Runtime conditions are `{error, Reason}' and
%% are tested elsewhere.
%%
%% The exports are enumerated with `Mod:module_info(exports)' over the
%% modules listed in mallocinfo.app, so a new export (or a new module)
%% without a case here fails `every_export_has_a_case_test'. Functions that
%% take no arguments need none; the few that take any term in some
%% position, and the modules left out, are listed with the reason.
%%
%% Each case gives, per argument, a valid value and the wrong ones; every
%% wrong value is tried in its position with the valid values elsewhere, so
%% each argument's check is exercised on its own. Valid values are harmless:
%% functions with side effects (an HTTP server, trim, mallopt, set_mode)
%% are only ever called with one argument wrong, and file names point
%% into a scratch directory the test makes (and is the working directory
%% while the calls run).
-module(mallocinfo_badarg_tests).
-include_lib("eunit/include/eunit.hrl").

%%% What is not checked, and why ---------------------------------------------

%% Modules of the application left out entirely.
excluded_modules() ->
    [{mallocinfo_nif, "the NIF stubs: internal, called only by the modules below with arguments "
                      "they checked; the NIFs decode with guarded<>, which raises badarg too"},
     {mallocinfo_heapmap_cli, "main/1 is the escript's entry point: it answers a usage error with "
                              "exit status 2 (and halts the VM), tested by mallocinfo_heapmap_SUITE"},
     {mallocinfo_report_build, "@private: the report's pure internals, exported for their EUnit "
                               "tests; mallocinfo_report:collect/0 is their only caller"},
     {mallocinfo_report_smaps, "@private: /proc text parsed and grouped for the report, "
                               "exported for its EUnit tests; mallocinfo_report and "
                               "mallocinfo_report_build call it with text they read and "
                               "mappings it parsed"},
     {mallocinfo_report_verdicts, "@private: the report's verdict rules, exported for their "
                                  "EUnit tests; mallocinfo_report_build and "
                                  "mallocinfo_report_text call them with the report they built"},
     {mallocinfo_protobuf, "@private wire-format encoder: mallocinfo_trace_profile is its only "
                           "caller, with values it made; EUnit in mallocinfo_trace_profile_tests"},
     {mallocinfo_trace_profile, "@private: the profiles' pure internals, fed only by "
                                "mallocinfo_trace with the NIF's snapshot; EUnit in "
                                "mallocinfo_trace_profile_tests"},
     {mallocinfo_http_flamegraph, "@private: the flame graph page, made only by mallocinfo_http "
                                  "from mallocinfo_trace:folded/0's text"},
     {mallocinfo_remote, "@private: loads mallocinfo over distribution for mallocinfo_report "
                         "and mallocinfo_process, which checked the node and timeout first"},
     {mallocinfo_heapmap_read, "@private: the dump reader; mallocinfo_heapmap checks the path "
                               "and is its only caller (with the drawer, on what it read); EUnit "
                               "in mallocinfo_heapmap_read_tests"},
     {mallocinfo_heapmap_draw, "@private: the PNGs, fed only by mallocinfo_heapmap with a dump "
                               "the reader accepted; EUnit in mallocinfo_heapmap_draw_tests"},
     {mallocinfo_heapmap_html, "@private: index.html, made only by mallocinfo_heapmap from what "
                               "the reader and the drawer made"},
     {mallocinfo_file, "@private: the heap map's file writing; its callers pass names they "
                       "checked; EUnit in mallocinfo_files_tests"},
     {mallocinfo_trace_churn, "@private: churn rows from the NIF's raw rows and the lifetime "
                              "histogram's figures; mallocinfo_trace checks churn/2's "
                              "arguments, mallocinfo_report_build feeds it churn/2's rows; "
                              "EUnit in mallocinfo_trace_tests"},
     {mallocinfo_trace_culprits, "@private: the culprit engine and the roll-ups; "
                                 "mallocinfo_trace checks every argument before calling it"},
     {mallocinfo_trace_context, "@private: the Erlang context's learner and the readers of "
                                "recorded words; mallocinfo_trace and mallocinfo_process call it "
                                "with what the NIF gave them; tested by mallocinfo_context_SUITE"},
     {mallocinfo_trace_growth, "@private: the pure parts of growth and roll-ups, exported for "
                               "their EUnit tests; mallocinfo_trace and mallocinfo_report check "
                               "arguments before calling them"},
     {mallocinfo_layers, "@private: every layer sampled, for mallocinfo_report (which checked "
                         "its options) with options it builds itself"},
     {mallocinfo_layers_growth, "@private: the growth of every layer, pure, fed only with "
                                "mallocinfo_layers' samples; EUnit in "
                                "mallocinfo_layers_growth_tests"},
     {mallocinfo_app, "@private: the application callback and supervisors, called by OTP's "
                      "application and supervisor modules"},
     {mallocinfo_watch_server, "@private: the sampler's gen_server callbacks, started by "
                               "mallocinfo_app with options mallocinfo_watch checked"},
     {mallocinfo_watch_capture_server, "@private: the capture's gen_server callbacks, started "
                                       "by mallocinfo_app with options "
                                       "mallocinfo_watch_capture:capture_on/1 checked"},
     {mallocinfo_watch_ring, "@private: the sampler's ring, pure, fed only by "
                             "mallocinfo_watch_server; EUnit in mallocinfo_watch_ring_tests"},
     {mallocinfo_http_timeline, "@private: the timeline's JSON and page, made only by "
                                "mallocinfo_http from mallocinfo_watch:history/0"}].

%% {Module, Function, Arity, Position, Reason}: a position that accepts any
%% term. Every other position of that function is still checked.
any_term() ->
    [{mallocinfo_lib, path_binary, 2, 2, "the arguments to put in the badarg it raises"},
     {mallocinfo_lib, path_name, 2, 2, "the arguments to put in the badarg it raises"},
     {mallocinfo_process, in_process, 3, 1, "the inspected process's OTP state: any term"},
     {mallocinfo_process, in_process, 3, 3, "the reply alias: unused but passed through"},
     {mallocinfo_process, name_text, 1, 1, "a process name (registered, label or initial "
                                          "call): any term prints"}].

%%% The cases -------------------------------------------------------------------

%% Values that are wrong for almost everything.
junk() ->
    [junk, [a | b], {a, b}, -1, 1.5, <<"junk">>, #{junk => 1}, "junk", self(), make_ref(),
     fun() -> ok end].

%% Wrong file names: a file name is a string, an atom, a binary, or a deep
%% list of characters, atoms and binaries (as the file module takes them),
%% without NUL.
not_a_path() ->
    [[a | b], "x" ++ y, {a, b}, -1, 1.5, #{junk => 1}, self(), make_ref(), "a\0b", <<"a", 0, "b">>,
     [1.5], [[a | b]], [<<"a", 0>>], [-1], [<<1:1>>]].

%% Option maps: anything that is not a map, and maps with an unknown key.
not_opts() ->
    [junk, [a | b], {a, b}, -1, <<"junk">>, "junk", [{junk, 1}], #{junk => 1}].

%% {Module, Function, [{Valid, [Wrong]}]} for every export with arguments.
cases(S) ->
    Path = filename:join(S, "out"),
    Dump = filename:join(S, "valid.heapdump"),
    HeapOpts = not_opts() ++ [#{max_sites => -1}, #{max_sites => 65535}, #{max_sites => many},
                              #{timeout => 0}, #{timeout => -5}, #{timeout => 1 bsl 31},
                              #{timeout => 1.5}, #{info_xml => yes}],
    ProcOpts = not_opts() ++ [#{max_terms => 0}, #{max_words => -1}, #{size_budget => -1},
                              #{timeout => 1.5}, #{max_heap_words => junk}, #{sys => 1},
                              #{sys => yes}],
    TraceOpts = [junk, [a | b], {a, b}, -1, <<"junk">>, [junk], [{demangle, yes}],
                 #{junk => 1}, #{demangle => 1}],
    OldsOpts = TraceOpts ++ [#{min_size => -1}, #{min_age_ms => 1.5}, [{min_size, junk}],
                             #{min_size => 1 bsl 64}, #{max_age_ms => -1}, #{max_age_ms => x}],
    ByOpts = [#{by => junk}, #{by => "function"}, [{by, junk}], [{by, stack}, {by, object}],
              #{by => function, snapshot => junk}, #{by => object, demangle => 1},
              #{by => function, min_age_ms => 1}],
    %% A snapshot as mallocinfo_trace:snapshot/0 makes it (this node is not
    %% tracked: an empty one).
    Snap = mallocinfo_trace_growth:snapshot(full, {0, []}, #{node => node(), os_pid => "1",
                                                       time_ms => 0, monotonic_ms => 0}),
    %% Forged: the shape of a snapshot, with what diff/2, growth_of/1 and
    %% sites/2 compute with made wrong (issue 28: badmatch and badarith).
    Site = <<16#400000:64/native>>,
    Forged = [Snap#{sites => #{<<1, 2, 3>> => {1, 8, false}}},
              Snap#{sites => #{frames => {1, 8, false}}},
              Snap#{sites => #{Site => {1, 8}}},
              Snap#{sites => #{Site => [1, 8, false]}},
              Snap#{sites => #{Site => {-1, 8, false}}},
              Snap#{sites => #{Site => {1, x, false}}},
              Snap#{sites => #{Site => {1, 8.0, false}}},
              Snap#{sites => #{Site => {1, 8, 'maybe'}}},
              Snap#{monotonic_ms => later},
              Snap#{monotonic_ms => 1.5}],
    NotSnap = junk() ++ [maps:remove(sites, Snap), Snap#{sites => junk},
                         Snap#{mallocinfo_snapshot => 2}] ++ Forged,
    Snaps = [junk, [a | b], [Snap], [], [Snap | b], [Snap, junk], {Snap, Snap}, Snap]
        ++ [[Snap, F] || F <- Forged] ++ [[F, Snap] || F <- Forged],
    SnapOpts = [#{by => B, snapshot => F} || B <- [function, object], F <- Forged],
    GrowthOpts = not_opts() ++ [#{limit => -1}, #{limit => junk}, #{demangle => 1},
                                #{min_age_ms => 1}],
    WatchOpts = not_opts() ++ [#{junk => 1}, #{period => 999}, #{period => 3600001},
                                #{period => 1.5e3}, #{period => "1000"}, #{period => 1000, junk => 1}],
    Capture = #{rss_above => 1 bsl 60, dir => S},
    CaptureOpts = not_opts() ++ [maps:remove(dir, Capture), maps:remove(rss_above, Capture),
                                 Capture#{junk => 1}, Capture#{rss_above => 0},
                                 Capture#{rss_above => -1}, Capture#{rss_above => 1.5},
                                 Capture#{rss_above => {fraction, 0}},
                                 Capture#{rss_above => {fraction, 1.5}},
                                 Capture#{rss_above => {fraction, "0.5"}},
                                 Capture#{rss_above => {fractions, 0.5}},
                                 Capture#{dir => ""}, Capture#{period => 99},
                                 Capture#{period => 60001}, Capture#{min_interval => -1},
                                 Capture#{keep => 0}, Capture#{keep => 1001},
                                 Capture#{max_file_bytes => 4095}, Capture#{keep => 1.5}]
        ++ [Capture#{dir => D} || D <- not_a_path()],
    CaptureState = #{mark => 1, min_interval => 0, armed => true, last => undefined},
    ReportOpts = [#{junk => 1}, #{interval => 0}, #{interval => 1.5}, #{interval => 1 bsl 32},
                  #{interval => junk}, #{startup_blocks => 1}],
    Count = [junk, -1, 1.5, [a | b], <<"1">>, "1", {1}, 1 bsl 64],
    ProfileOpts = not_opts() ++ [[], [{seconds, 1}], #{seconds => 0}, #{seconds => 301},
                                 #{seconds => 1.5}, #{seconds => junk}, #{demangle => 1},
                                 #{seconds => 1, junk => 1}, #{profile => junk}, #{profile => inuse}],
    Arenas = [junk, [a | b], {a, b}, #{}, [junk], [#{}], [(arena())#{system_bytes => -1}],
              [(arena())#{by_kind => #{}}], [maps:remove(pinned_bytes, arena())],
              [arena() | junk], [arena(), (arena())#{in_use_bytes => <<"1">>}]],
    Summary = #{arenas => [(arena())#{arena => 0}],
                total => (arena())#{arena_count => 1, chunks => 1}},
    Header = #{pid => 1, time_ms => 0, glibc => <<"2.36">>, page_size => 4096, heap_max => 1,
               tracker => false},
    Report = mallocinfo_report:collect(),
    Png = #{width => 1, height => 1, format => rgb},
    {ok, Image} = mallocinfo_png:decode(iolist_to_binary(
                                          mallocinfo_png:encode(Png, #{pixels => <<1, 2, 3>>}))),
    Family = #{name => <<"x">>, type => gauge, help => <<"h">>, samples => [{[], 1}]},
    HttpOpts = not_opts() ++ [#{port => -1}, #{port => 65536}, #{port => "80"},
                              #{ip => junk}, #{ip => {1, 2, 3}}, #{ip => "127.0.0.1"}],
    Cases =
    [%% mallocinfo
     {mallocinfo, info, [{Path, not_a_path()}]},
     {mallocinfo, trim, [{0, Count}]},
     {mallocinfo, mallopt, [{arena_max, [junk, "arena_max", <<"arena_max">>, 1, [a | b], {a}]},
                            {0, [1.5, junk, "1", <<"1">>, [a | b]]}]},
     {mallocinfo, report, [{[], [junk, [a | b], [junk | b], {a, b}, <<"n">>, ["node"], [1],
                                 -1] ++ ReportOpts}]},
     {mallocinfo, watch, [{#{period => 1000}, WatchOpts}]},
     {mallocinfo_watch, watch, [{#{period => 1000}, WatchOpts}]},
     {mallocinfo, capture_on, [{Capture, CaptureOpts}]},
     %% mallocinfo_watch_capture
     {mallocinfo_watch_capture, capture_on, [{Capture, CaptureOpts}]},
     {mallocinfo_watch_capture, cgroup_limit, [{Path, not_a_path()}, {S, not_a_path()}]},
     {mallocinfo_watch_capture, mark, [{1, junk() ++ [0, {fraction, 0}, {fraction, 2}]},
                                       {fun() -> {error, no_limit} end,
                                        [junk, fun(_) -> 1 end, {a, b}]}]},
     {mallocinfo_watch_capture, step, [{0, [junk, -1, 1.5, "1", <<"1">>]},
                                       {0, [junk, 1.5, "1", <<"1">>, [a | b]]},
                                       {CaptureState,
                                        junk() ++ [#{}, CaptureState#{mark => 0},
                                                   CaptureState#{armed => 1},
                                                   CaptureState#{last => junk},
                                                   CaptureState#{min_interval => -1},
                                                   maps:remove(last, CaptureState)]}]},
     {mallocinfo_watch_capture, rearm, [{1, [0, -1, 1.5, junk, "1", <<"1">>, [a | b]]}]},
     {mallocinfo_watch_capture, stamp, [{0, [-1, 1.5, junk, "1", <<"1">>, [a | b]]}]},
     {mallocinfo_watch_capture, file_name, [{"s", [junk, [a | b], <<"s">>, [-1], {a}, 1]},
                                            {"k", [junk, [a | b], <<"k">>, [-1], {a}, 1]}]},
     {mallocinfo_watch_capture, write_new, [{S, not_a_path()}, {"valid-new.txt", not_a_path()},
                                            {<<"x">>, [junk, [a | b], [-1], 1, self(), [256],
                                                       {a}]}]},
     {mallocinfo_watch_capture, check_dir, [{S, not_a_path()}]},
     {mallocinfo_lib, path_binary, [{Path, not_a_path()}, {[], []}]},
     {mallocinfo_lib, path_name, [{Path, not_a_path()}, {[], []}]},
     {mallocinfo_lib, xmerl_candidates, [{[], [junk, [a | b], ["ok" | b], [junk], [<<"bin">>], {a},
                                          <<"junk">>, [""]]}]},
     {mallocinfo_lib, load_xmerl, [{[], [junk, [a | b], ["ok" | b], [junk], [-1], {a}, <<"x">>]}]},
     {mallocinfo_lib, ensure_app, [{xmerl, [junk, tools, "xmerl", <<"inets">>, 1, {a}, [a | b]]}]},
     {mallocinfo_lib, lib_candidates, [{xmerl, ["xmerl", <<"xmerl">>, 1, {a}]},
                                   {[], [junk, [a | b], [junk], {a}]}]},
     %% mallocinfo_heap
     {mallocinfo_heap, dump, [{Path, not_a_path() ++ ["", <<>>]}]},
     {mallocinfo_heap, dump, [{Path, not_a_path() ++ ["", <<>>]}, {#{}, HeapOpts}]},
     {mallocinfo_heap, summary, [{#{}, HeapOpts}]},
     {mallocinfo_heap, render, [{Dump, not_a_path()}, {Path, not_a_path()}]},
     {mallocinfo_heap, totals, [{[arena()], Arenas}]},
     %% mallocinfo_heapmap
     {mallocinfo_heapmap, read_summary, [{Dump, not_a_path()}]},
     {mallocinfo_heapmap, render, [{Dump, not_a_path()}, {Path, not_a_path()}]},
     {mallocinfo_heapmap, render_report, [{Dump, not_a_path()}, {Path, not_a_path()}]},
     {mallocinfo_heapmap, format_summary,
      [{Summary, junk() ++ [#{}, Summary#{arenas => junk}, Summary#{arenas => [a | b]},
                            Summary#{arenas => [#{}]}, Summary#{total => #{}},
                            Summary#{total => (maps:get(total, Summary))#{live_bytes => 1}},
                            Summary#{total => (maps:get(total, Summary))#{free_chunks => -1}}]}]},
     {mallocinfo_heapmap, format_header,
      [{Header, junk() ++ [#{}, Header#{pid => -1}, Header#{tracker => 1},
                           Header#{glibc => 2.36}, Header#{glibc => [a | b]},
                           Header#{page_size => 0}, maps:remove(time_ms, Header)]}]},
     %% mallocinfo_http: valid options would start a server; only wrong
     %% ones are ever passed.
     {mallocinfo_http, start, [{#{}, HttpOpts}]},
     {mallocinfo_http, stop, [{1, [junk, -1, 0, 65536, 1.5, "80", <<"80">>, [a | b], {80}]}]},
     {mallocinfo_http, do, [{valid_mod, junk() ++ [{mod}, {mod, a, b}]}]},
     {mallocinfo_http, request_header, [{{"a", "b"}, [junk, {a}, {a, b, c}, [a | b], -1]}]},
     {mallocinfo_http, response_header, [{{"a", "b"}, [junk, {a}, {a, b, c}, [a | b], -1]}]},
     %% mallocinfo_trace:attach/1: valid options would attach this node;
     %% only wrong ones are ever passed.
     {mallocinfo_trace, attach, [{#{}, not_opts() ++ [#{mode => off}, #{mode => junk},
                                                      #{table_size => 0}, #{stack_depth => 129},
                                                      #{sample_bytes => 0}, #{mode => "full"},
                                                      #{stack_table_size => 1.5}]}]},
     {mallocinfo, report, [{[], [junk, [a | b], [junk | b], {a, b}, <<"n">>, ["node"], [1]]},
                           {#{}, not_opts() ++ [#{attach => yes}, #{timeout => 0}]
                            ++ ReportOpts}]},
     {mallocinfo_process, binaries, [{[], [junk, [a | b], {a, b}, -1, [{1, -1, 1}], [{1, 2}],
                                        [{1, 2, three}], [junk]]}]},
     %% mallocinfo_jemalloc
     {mallocinfo_jemalloc, profile_active, [{false, [junk, 1, 0, "true", <<"true">>, [true | b],
                                                     {true}, [true]]}]},
     %% mallocinfo_json
     {mallocinfo_json, encode, [{#{a => [1, <<"b">>]},
                                 [{a, b}, [a | b], [1 | 2], self(), make_ref(), fun() -> ok end,
                                  <<255>>, #{1 => 2}, #{{a} => 1}, [{a, b}], #{a => {b}},
                                  <<1:1>>]}]},
     %% mallocinfo_glibc_parse
     {mallocinfo_glibc_parse, stats, [{<<"">>, [junk, "text", [a | b], {a, b}, -1, #{}]}]},
     {mallocinfo_glibc_parse, heaps, [{<<"<malloc version=\"1\"></malloc>">>,
                                 [junk, "<malloc/>", [a | b], {a, b}, -1, #{}]}]},
     %% mallocinfo_png
     {mallocinfo_png, open, [{Png, junk() ++ [Png#{width => 0}, Png#{height => -1},
                                               Png#{width => 1.5}, Png#{format => junk},
                                               Png#{format => {palette, []}},
                                               Png#{format => {palette, [junk]}},
                                               Png#{format => {palette, [{256, 0, 0}]}},
                                               Png#{format => {palette, [{0, 0, 0} | b]}},
                                               maps:remove(format, Png)]}]},
     {mallocinfo_png, write, [{writer, junk() ++ [{png_writer, junk}]},
                              {[], [junk, [a | b], {a, b}, -1, 1.5, #{}, [256], [-1]]}]},
     {mallocinfo_png, close, [{writer, junk() ++ [{png_writer, junk}]}]},
     {mallocinfo_png, encode, [{Png, junk() ++ [Png#{width => 0}, Png#{format => junk}]},
                               {#{pixels => <<1, 2, 3>>},
                                junk() ++ [#{}, #{pixels => <<1, 2>>}, #{pixels => "abc"},
                                           #{pixels => <<1, 2, 3>>, filter => junk},
                                           #{pixels => <<1, 2, 3>>, junk => 1}]}]},
     {mallocinfo_png, decode, [{<<>>, [junk, [a | b], {a, b}, -1, 1.5, #{}, "\x89PNG", [<<>>]]}]},
     {mallocinfo_png, pixel, [{Image, junk() ++ [#{}, Image#{pixels => <<>>},
                                                 Image#{color_type => junk}]},
                              {0, [junk, -1, 1, 1.5, [a | b], <<0>>]},
                              {0, [junk, -1, 1, 1.5, [a | b], <<0>>]}]},
     %% mallocinfo_trace_pprof
     {mallocinfo_trace_pprof, heap_profile,
      [{[{1, 8, [16#1000]}], [junk, [a | b], [{1, 8, [16#1000]} | b], [junk], [{1, 8}],
                              [{-1, 8, [1]}], [{1, -8, [1]}], [{1, 8, [-1]}], [{1, 8, [a | b]}],
                              [{1, 8, [1 bsl 64]}], [{1, 8, junk}], {a, b}, <<"s">>]},
       {<<>>, [junk, "maps", [a | b], {a, b}, -1, #{}]}]},
     %% mallocinfo_process
     {mallocinfo_process, inspect_heap, [{self(), not_pid()}]},
     {mallocinfo_process, inspect_heap, [{self(), not_pid()}, {#{}, ProcOpts}]},
     {mallocinfo_process, inspect, [{self(), not_pid()}, {#{}, ProcOpts}]},
     {mallocinfo_process, heap, [{self(), not_pid()}]},
     {mallocinfo_process, name, [{self(), not_pid()}]},
     {mallocinfo_process, heap, [{self(), not_pid()}, {#{}, ProcOpts}]},
     %% top/2: any count is valid (more than there are processes gives them all).
     {mallocinfo_process, top, [{1, Count -- [1 bsl 64]},
                             {memory, [junk, "memory", <<"memory">>, 1, [a | b]]}]},
     {mallocinfo_process, top, [{1, Count -- [1 bsl 64]}, {native, ["native", <<"native">>]}]},
     {mallocinfo_process, print, [{self(), not_pid()}]},
     {mallocinfo_process, print, [{self(), not_pid()}, {#{}, ProcOpts}]},
     {mallocinfo_process, in_process, [{state, []}, {#{}, ProcOpts}, {ref, []}]},
     {mallocinfo_process, name_text, [{undefined, []}]},
     {mallocinfo_process, remote, [{report_local, [junk, inspect, heap, "report_local", 1]},
                                {self(), not_pid()}, {#{}, ProcOpts}]},
     {mallocinfo_process, report_local, [{self(), not_pid()}, {#{}, ProcOpts}]},
     {mallocinfo_process, verdict, [{heap_figures(), junk() ++ [#{}, maps:remove(complete,
                                                                             heap_figures())]}]},
     %% mallocinfo_prom
     {mallocinfo_prom, families, [{#{}, (junk() -- [#{junk => 1}]) ++
                                        [#{junk => 1}, #{allocator => "glibc"}, #{rss => -1},
                                         #{rss => junk}, #{mallinfo => [a]},
                                         #{heaps => #{heaps => junk}},
                                         #{tracker => #{preloaded => true, calls => junk}},
                                         #{layers => junk}, #{layers => #{}},
                                         #{layers => #{source => junk, time => 1, values => #{}}},
                                         #{layers => #{source => watch, time => 1.5,
                                                       values => #{}}},
                                         #{layers => #{source => watch, time => 1,
                                                       values => [a]}},
                                         #{layers => #{source => watch, time => 1,
                                                       values => #{junk => 1}}},
                                         #{layers => #{source => watch, time => 1,
                                                       values => #{rss => -1}}},
                                         #{layers => #{source => watch, time => 1,
                                                       values => #{{memory, "x"} => 1}}}]}]},
     {mallocinfo_prom, render, [{[Family], [junk, [a | b], [Family | b], {a, b}, [junk],
                                            [Family#{type => histogram}], [Family, Family],
                                            [Family#{name => <<"1x">>}],
                                            [Family#{samples => [{[], junk}]}], #{}]}]},
     %% mallocinfo_report
     {mallocinfo_report, collect, [{[], [junk, [a | b], [junk | b], {a, b}, <<"n">>, ["n"], [1],
                                         -1] ++ ReportOpts}]},
     {mallocinfo_report, collect, [{[], [junk, [a | b], [junk | b], ["n"]]},
                                   {#{}, not_opts() ++ [#{timeout => 0}, #{timeout => -1},
                                                        #{timeout => 1.5},
                                                        #{timeout => 1 bsl 32}] ++ ReportOpts}]},
     {mallocinfo_report, format, [{Report, bad_reports(Report)}]},
     {mallocinfo_report, format_cluster, [{[{node(), {ok, Report}}], bad_clusters(Report)}]},
     {mallocinfo_report_text, format, [{Report, bad_reports(Report)}]},
     {mallocinfo_report_text, format_cluster, [{[{node(), {ok, Report}}], bad_clusters(Report)}]},
     %% mallocinfo_tcmalloc: a valid prefix answers {error, {wrong_allocator, glibc}} here.
     {mallocinfo_tcmalloc, profile_start, [{Path, not_a_path() ++ ["", <<>>]}]},
     %% mallocinfo_trace
     {mallocinfo_trace, set_mode, [{off, [junk, "full", <<"full">>, 1, [a | b], {full}]}]},
     {mallocinfo_trace, olds, [{1, Count}]},
     {mallocinfo_trace, olds, [{1, Count}, {#{}, OldsOpts}]},
     %% olds/2 of a snapshot: one that has no olds, or forged ones.
     {mallocinfo_trace, olds, [{1, Count},
                               {#{snapshot => Snap#{olds => []}},
                                [#{snapshot => Snap}, #{snapshot => junk},
                                 #{snapshot => Snap#{olds => junk}},
                                 #{snapshot => Snap#{olds => [junk]}},
                                 #{snapshot => Snap#{olds => [{1, 2, 3, 'maybe', <<>>}]}},
                                 #{snapshot => Snap#{olds => []}, min_size => 1},
                                 #{snapshot => Snap#{olds => []}, demangle => 1}]}]},
     {mallocinfo_trace, snapshot, [{#{}, not_opts() ++ [#{olds => -1}, #{olds => junk},
                                                        #{max_age_ms => 1.5}, #{junk => 1}]}]},
     {mallocinfo_trace, pprof, [{#{}, ProfileOpts}]},
     {mallocinfo_trace, folded, [{#{}, ProfileOpts}]},
     {mallocinfo_trace, profile_data, [{#{}, ProfileOpts}]},
     {mallocinfo_trace, churn, [{1, Count}]},
     {mallocinfo_trace, churn, [{1, Count}, {#{}, not_opts() ++ [#{by => process},
                                                                #{by => junk},
                                                                #{short_lived_ms => 0},
                                                                #{demangle => 1},
                                                                #{min_size => 1}]}]},
     {mallocinfo_trace, sites, [{1, Count}]},
     {mallocinfo_trace, sites, [{1, Count}, {#{}, TraceOpts ++ [#{min_size => 1}] ++ ByOpts ++ SnapOpts}]},
     {mallocinfo_trace, diff, [{Snap, NotSnap}, {Snap, NotSnap}]},
     {mallocinfo_trace, diff, [{Snap, NotSnap}, {Snap, NotSnap}, {#{}, GrowthOpts}]},
     {mallocinfo_trace, growth, [{1, Count ++ [0, 1 bsl 32]}, {2, Count ++ [0, 1]}]},
     {mallocinfo_trace, growth, [{1, Count ++ [0, 1 bsl 32]}, {2, Count ++ [0, 1]},
                                 {#{}, GrowthOpts}]},
     {mallocinfo_trace, growth_of, [{[Snap, Snap], Snaps}]},
     {mallocinfo_trace, growth_of, [{[Snap, Snap], Snaps}, {#{}, GrowthOpts}]},
     {mallocinfo_trace, mappings, [{1, Count}]},
     {mallocinfo_trace, mappings, [{1, Count}, {#{}, TraceOpts ++ [#{min_size => 1},
                                                                  #{by => "function"},
                                                                  #{by => junk}]}]},
     {mallocinfo_trace, preload_env, [{#{}, not_opts() ++ [#{mode => junk}, #{table_size => 1},
                                                            #{stack_depth => 129},
                                                            #{exe => ""}, #{exe => junk},
                                                            #{exe => [a | b]},
                                                            #{sample_bytes => 0},
                                                            #{unwind => fast}]}]},
     %% mallocinfo_units
     {mallocinfo_units, bytes, [{0, [junk, 1.5, "1", <<"1">>, [a | b], {1}, #{}]}]},
     {mallocinfo_units, count, [{0, [junk, -1, 1.5, "1", <<"1">>, [a | b], {1}, #{}]}]},
     {mallocinfo_units, age, [{0, [junk, -1, 1.5, "1", <<"1">>, [a | b], {1}, #{}]}]},
     {mallocinfo_units, utc, [{0, [junk, -1, 1.5, "1", <<"1">>, [a | b], {1}, #{}]}]},
     %% mallocinfo_text
     {mallocinfo_text, name, [{<<"x">>, [1, -1, 1.5, {a}, #{}, self(), [a], [-1], [1.5],
                                         [<<1:1>>], [a | b], "x" ++ y]}]},
     %% module_info/1, which the compiler adds to every module
     {'*', module_info, [{exports, [junk, "exports", 1, [a | b], {exports}]}]}],
    %% mallocinfo_proc, the deprecated name of mallocinfo_process: the same
    %% cases for each function it still has.
    Old = mallocinfo_proc:module_info(exports),
    Cases ++ [{mallocinfo_proc, F, A} || {mallocinfo_process, F, A} <- Cases,
                                         lists:member({F, length(A)}, Old)]
    %% The internal homes of public functions that delegate to them: the
    %% same cases, so the checks are theirs, not the delegations'.
        ++ [{mallocinfo_glibc, F, A} || {mallocinfo, F, A} <- Cases, F =/= report, F =/= watch,
                                        F =/= capture_on]
        ++ [{mallocinfo_heapmap_summary, totals, A} || {mallocinfo_heap, totals, A} <- Cases].

not_pid() ->
    [junk, [a | b], {a, b}, -1, <<"<0.1.0>">>, "<0.1.0>", #{}, make_ref(), hd(erlang:ports())].

%% An arena summary as mallocinfo_heap returns it.
arena() ->
    #{arena => 0, address => 4096, system_bytes => 1000, in_use_bytes => 600, free_bytes => 400,
      by_kind => #{in_use => 500, free => 300, fast => 50, tcache => 20, top => 50, meta => 0},
      chunks => 10, free_chunks => 4, largest_free => 100, resident_bytes => 800,
      trimmable_bytes => 0, pinned_bytes => 250, segments => 1}.

%% What mallocinfo_process:verdict/1 reads.
heap_figures() ->
    #{total_heap_size => 100, live_words => 50, stack_size => 10, message_queue_len => 0,
      complete => true, binaries => #{bytes => 0, count => 0, shared_bytes => 0}}.

bad_reports(Report) ->
    junk() ++ [#{}, maps:remove(resident, Report), maps:remove(verdicts, Report),
               Report#{verdicts => junk}, Report#{verdicts => [junk]},
               Report#{verdicts => [<<"v">> | b]}, Report#{resident => junk},
               Report#{erts => #{}}, Report#{libc => #{mallinfo => junk}}].

bad_clusters(Report) ->
    [junk, [a | b], [{node(), {ok, Report}} | b], [junk], [{node(), Report}],
     [{"node", {ok, Report}}], [{node(), {ok, #{}}}], [{node(), {weird, 1}}],
     [{node(), {ok, Report#{verdicts => junk}}}], {a, b}, #{}].

%%% The tests -------------------------------------------------------------------

%% Under a loaded CI machine the export scan takes seconds: more than
%% EUnit's default 5 s limit.
every_export_has_a_case_test_() ->
    {timeout, 60,
     fun() ->
           with_scratch(
             fun(S) ->
                     Covered = lists:usort([{M, F, length(Args)} || {M, F, Args} <- cases(S), M =/= '*']),
                     Missing = [MFA || {M, _, _} = MFA <- exports_with_args(),
                                       element(2, MFA) =/= module_info,
                                       not lists:member(MFA, Covered),
                                       not lists:keymember(M, 1, excluded_modules())],
                     ?assertEqual([], Missing),
                     %% No case for something that is not exported (a stale entry).
                     ?assertEqual([], Covered -- exports_with_args())
             end)
     end}.

%% An argument that accepts any term is listed with a reason, and is one.
any_term_positions_are_listed_test() ->
    with_scratch(
      fun(S) ->
              AnyTerm = [{M, F, length(Args), I}
                         || {M, F, Args} <- cases(S), {I, {_, []}} <- enumerate(Args)],
              ?assertEqual(lists:usort(AnyTerm),
                           lists:usort([{M, F, A, I} || {M, F, A, I, _} <- any_term()]))
      end).

every_wrong_argument_raises_badarg_test_() ->
    {timeout, 300,
     fun() ->
             with_scratch(
               fun(S) ->
                       Writer = element(1, mallocinfo_png:open(#{width => 1, height => 1,
                                                                 format => rgb})),
                       try
                           Calls = [{M, F, Args} || {M0, F, Specs} <- cases(S),
                                                    M <- modules(M0),
                                                    Args <- vectors(Specs, Writer)],
                           Results = [{M, F, Args, outcome(M, F, Args)} || {M, F, Args} <- Calls],
                           Wrong = [R || {_, _, _, O} = R <- Results, O =/= badarg],
                           ?assertEqual([], Wrong),
                           %% Some hundreds of calls: a table that shrank by
                           %% mistake would say so.
                           ?assert(length(Results) > 700)
                       after
                           mallocinfo_png:close(Writer)
                       end
               end)
     end}.

%% The valid values are valid: with none of them wrong, a call does not
%% raise badarg (for the functions that are safe to call for real).
valid_values_are_valid_test_() ->
    {timeout, 120,
     fun() ->
             with_scratch(
               fun(S) ->
                       Unsafe = [{mallocinfo_http, start}, {mallocinfo_http, do},
                                 {mallocinfo, watch}, {mallocinfo_watch, watch},
                                 {mallocinfo, capture_on}, {mallocinfo_watch_capture, capture_on},
                                 {mallocinfo, mallopt}, {mallocinfo, trim},
                                 {mallocinfo_trace, set_mode}, {mallocinfo_trace, attach},
                                 {mallocinfo_jemalloc, profile_active},
                                 {mallocinfo_png, write}, {mallocinfo_png, close},
                                 {mallocinfo_heap, render}, {mallocinfo_heapmap, render},
                                 {mallocinfo_heapmap, render_report},
                                 {mallocinfo_heapmap, read_summary}],
                       {ok, _} = mallocinfo_heap:dump(filename:join(S, "valid.heapdump")),
                       Outcomes = [{M, F, outcome(M, F, [Good || {Good, _} <- Specs])}
                                   || {M0, F, Specs} <- cases(S), M <- modules(M0),
                                      not lists:member({M, F}, Unsafe)],
                       ?assertEqual([], [O || {_, _, badarg} = O <- Outcomes])
               end)
     end}.

%%% Helpers ---------------------------------------------------------------------

app_modules() ->
    {ok, Mods} = application:get_key(mallocinfo, modules),
    Mods.

exports_with_args() ->
    _ = application:load(mallocinfo),
    lists:usort([{M, F, A} || M <- app_modules(), {F, A} <- M:module_info(exports), A > 0]).

%% '*' stands for every module checked (module_info/1 is in all of them).
modules('*') -> app_modules() -- [M || {M, _} <- excluded_modules()];
modules(M) -> [M].

enumerate(L) -> lists:zip(lists:seq(1, length(L)), L).

%% Every argument vector with exactly one wrong value.
vectors(Specs, Writer) ->
    Valid = [valid(Good, Writer) || {Good, _} <- Specs],
    [setnth(I, Valid, valid(Bad, Writer)) || {I, {_, Bads}} <- enumerate(Specs), Bad <- Bads].

%% Placeholders for values that must be made fresh.
valid(writer, Writer) -> Writer;
valid(valid_mod, _) -> junk;  % do/1 has no valid value a test can make
valid(V, _) -> V.

setnth(I, L, V) ->
    {Before, [_ | After]} = lists:split(I - 1, L),
    Before ++ [V | After].

%% badarg, or what happened instead (in a process of its own, so that a
%% call that links or traps cannot disturb the test).
outcome(M, F, Args) ->
    Parent = self(),
    {Pid, Ref} = spawn_monitor(
                   fun() ->
                           R = try apply(M, F, Args) of
                                   V -> {returned, V}
                               catch
                                   error:badarg -> badarg;
                                   Class:Reason -> {Class, Reason}
                               end,
                           Parent ! {self(), R}
                   end),
    receive
        {Pid, R} ->
            erlang:demonitor(Ref, [flush]),
            R;
        {'DOWN', Ref, process, Pid, Why} ->
            {died, Why}
    after 60000 ->
            exit(Pid, kill),
            timeout
    end.

%% The calls run with a scratch directory (mktemp -d) as the working
%% directory: a wrong file name that slipped through could only land there.
with_scratch(Fun) ->
    Dir = string:trim(os:cmd("mktemp -d")),
    {ok, Cwd} = file:get_cwd(),
    ok = file:set_cwd(Dir),
    try
        Fun(Dir)
    after
        ok = file:set_cwd(Cwd),
        ok = file:del_dir_r(Dir)
    end.
