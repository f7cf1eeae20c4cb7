%% @doc Evidence captured under memory pressure: when the node's resident
%% set crosses a mark, the files an operator would want before an OOM kill
%% are written into a directory, once per crossing.
%%
%% ```
%% 1> mallocinfo:capture_on(#{rss_above => {fraction, 0.8}, dir => "/var/tmp/mi"}).
%% ok
%% 2> mallocinfo:capture_off().
%% ok
%% '''
%%
%% <b>The mark.</b> `rss_above' is bytes, or `{fraction, F}' (0 &lt; F =&lt; 1) of
%% the node's cgroup v2 limit: the lowest `memory.high' or `memory.max' set
%% on its cgroup (`/proc/self/cgroup''s `0::' line, under
%% `/sys/fs/cgroup') or an ancestor's. None set (every one `max', or no
%% cgroup v2 memory controller): `{error, no_limit}'.
%%
%% <b>When.</b> A process of mallocinfo's application (`mallocinfo_app')
%% reads the RSS (`/proc/self/statm') every `period' ms (default 1000).
%% Above the mark, while armed, it captures and disarms; it is armed again
%% when the RSS falls below the mark by 5% of the mark (at least 1 MiB):
%% the hysteresis, so an RSS that hovers at the mark captures once. Two
%% captures are at least `min_interval' ms apart (default 60000): a
%% crossing within that time is captured when it ends, if the RSS is still
%% above the mark. The RSS is already above the mark when capture_on/1 is
%% called: that is a crossing.
%%
%% <b>What.</b> A capture is a set of files named
%% `mallocinfo-YYYYMMDDTHHMMSS.mmmZ-Kind' (UTC): `report.txt'
%% (`mallocinfo:report()''s text), `heap.pb.gz' (pprof) and `heap.folded'
%% (folded stacks) when the tracker records, `timeline.json' when the
%% sampler runs (`mallocinfo:watch/0'), `top.txt'
%% (`mallocinfo_process:top(20, memory)'), and `notes.txt' last: the RSS,
%% the mark, each file written and each left out with the reason.
%%
%% <b>Safely.</b> Each file is written to a temporary name in the
%% directory, then hard-linked to its name, which fails if that name
%% exists: a file is never overwritten, never seen half written. Each file
%% is cut at `max_file_bytes' (default 8 MiB, said in the notes); the
%% newest `keep' captures (default 10) are kept: the files of older ones
%% this capture_on/1 wrote are deleted, and nothing else in the
%% directory is. So the captures hold at most `keep' times 6 times
%% `max_file_bytes'.
-module(mallocinfo_watch_capture).

-include_lib("kernel/include/file.hrl").

-export([capture_on/1, capture_off/0, status/0]).
%% The pure parts, for the server (mallocinfo_watch_capture_server) and
%% EUnit (mallocinfo_watch_capture_tests).
-export([cgroup_limit/2, mark/2, step/3, rearm/1, stamp/1, file_name/2, write_new/3,
         check_dir/1]).

-define(SERVER, mallocinfo_watch_capture_server).
-define(SUP, mallocinfo_sup).
-define(MiB, (1 bsl 20)).
-define(DEFAULTS, #{period => 1000, min_interval => 60000, keep => 10,
                    max_file_bytes => 8 * ?MiB}).

-type opts() :: #{rss_above := pos_integer() | {fraction, number()},
                  dir := file:name_all(),
                  period => pos_integer(), min_interval => non_neg_integer(),
                  keep => pos_integer(), max_file_bytes => pos_integer()}.
-export_type([opts/0]).

%%% ---------------------------------------------------------------------------
%%% API

%% @doc Starts watching the RSS (see the module's documentation). `ok';
%% `{error, Posix}' when `dir' cannot be used (`enoent', `enotdir',
%% `eacces', `erofs': a file is created and deleted there to know);
%% `{error, no_limit}' for a fraction without a cgroup limit;
%% `{error, already_capturing}' when it runs (capture_off/0 first);
%% `{error, {start_failed, Reason}}' when mallocinfo's application could
%% not be started. Raises `badarg' for a missing or unknown option or a
%% value outside its type: `rss_above' a positive integer or `{fraction,
%% F}' with 0 &lt; F =&lt; 1, `dir' a file name, `period' 100 to 60000 ms,
%% `min_interval' 0 to 86400000 ms, `keep' 1 to 1000, `max_file_bytes' at
%% least 4096.
-spec capture_on(opts()) -> ok | {error, term()}.
capture_on(Opts) ->
    O = options(Opts),
    case check_dir(maps:get(dir, O)) of
        ok ->
            case mark(maps:get(rss_above, O), fun cgroup_limit/0) of
                {ok, Mark} -> start(O#{mark => Mark});
                {error, _} = E -> E
            end;
        {error, _} = E ->
            E
    end.

options(#{rss_above := Above, dir := Dir} = Opts) ->
    O = maps:merge(?DEFAULTS, Opts),
    Name = mallocinfo_lib:path_name(Dir, [Opts]),
    Ok = maps:keys(O) -- [rss_above, dir | maps:keys(?DEFAULTS)] =:= []
        andalso case Above of
                    N when is_integer(N) -> N > 0;
                    {fraction, F} when is_number(F) -> F > 0 andalso F =< 1;
                    _ -> false
                end
        andalso Name =/= "" andalso Name =/= <<>>
        andalso in(maps:get(period, O), 100, 60000)
        andalso in(maps:get(min_interval, O), 0, 86400000)
        andalso in(maps:get(keep, O), 1, 1000)
        andalso in(maps:get(max_file_bytes, O), 4096, 1 bsl 40),
    Ok orelse erlang:error(badarg, [Opts]),
    %% Absolute: the node's working directory may change while it runs.
    O#{dir => filename:absname(Name)};
options(Opts) ->
    erlang:error(badarg, [Opts]).

in(V, Lo, Hi) -> is_integer(V) andalso V >= Lo andalso V =< Hi.

start(O) ->
    case mallocinfo_app:ensure_started() of
        ok ->
            case supervisor:start_child(?SUP, mallocinfo_app:capture_child(O)) of
                {ok, _} -> ok;
                {error, {already_started, _}} -> {error, already_capturing};
                {error, already_present} ->
                    %% A supervisor that gave up leaves its id behind.
                    _ = supervisor:delete_child(?SUP, capture),
                    start(O);
                {error, Reason} -> {error, {start_failed, Reason}}
            end;
        {error, _} = E ->
            E
    end.

%% @doc Stops watching the RSS; the files written stay. Always `ok'.
-spec capture_off() -> ok.
capture_off() ->
    case whereis(?SUP) of
        undefined -> ok;
        _ ->
            _ = supervisor:terminate_child(?SUP, capture),
            _ = supervisor:delete_child(?SUP, capture),
            ok
    end.

%% @doc `{ok, #{mark, rearm, armed, rss, captures, busy}}': the mark and
%% the RSS under which it is armed again, whether it is armed, the last
%% RSS read, the captures kept (oldest first, each `#{stamp, files}'),
%% whether a capture is being written. `{error, not_capturing}' when it
%% does not run.
-spec status() -> {ok, map()} | {error, not_capturing}.
status() ->
    try gen_server:call(?SERVER, status, 60000)
    catch exit:{noproc, _} -> {error, not_capturing};
          exit:{normal, _} -> {error, not_capturing};
          exit:{shutdown, _} -> {error, not_capturing}
    end.

%%% ---------------------------------------------------------------------------
%%% Pure parts (EUnit: mallocinfo_watch_capture_tests)

%% @doc The mark in bytes: `Bytes' itself, or the fraction of the limit
%% `Limit()' returns.
-spec mark(pos_integer() | {fraction, number()},
           fun(() -> {ok, pos_integer()} | {error, no_limit})) ->
          {ok, pos_integer()} | {error, no_limit}.
mark(Bytes, Limit) when is_integer(Bytes), Bytes > 0, is_function(Limit, 0) ->
    {ok, Bytes};
mark({fraction, F}, Limit) when is_number(F), F > 0, F =< 1, is_function(Limit, 0) ->
    case Limit() of
        {ok, L} -> {ok, max(1, trunc(F * L))};
        {error, _} = E -> E
    end;
mark(Above, Limit) ->
    erlang:error(badarg, [Above, Limit]).

cgroup_limit() ->
    cgroup_limit("/proc/self/cgroup", "/sys/fs/cgroup").

%% @doc The memory limit of the cgroup v2 named in `CgroupFile' (the
%% `0::Path' line of a `/proc/PID/cgroup'), under `Root': the lowest
%% `memory.high' or `memory.max' set on it or an ancestor. `{error,
%% no_limit}' when none is set (`max', no such file, no `0::' line).
-spec cgroup_limit(file:name_all(), file:name_all()) -> {ok, pos_integer()} | {error, no_limit}.
cgroup_limit(CgroupFile0, Root0) ->
    CgroupFile = mallocinfo_lib:path_name(CgroupFile0, [CgroupFile0, Root0]),
    Root = mallocinfo_lib:path_name(Root0, [CgroupFile0, Root0]),
    Path = case file:read_file(CgroupFile) of
               {ok, Text} ->
                   [P || <<"0::", P/binary>> <- binary:split(Text, <<"\n">>, [global])];
               {error, _} ->
                   []
           end,
    Limits = case Path of
                 [P | _] ->
                     [L || Dir <- ancestors(P), File <- ["memory.high", "memory.max"],
                           {ok, L} <- [read_limit(filename:join([Root, Dir, File]))]];
                 [] ->
                     []
             end,
    case Limits of
        [] -> {error, no_limit};
        _ -> {ok, lists:min(Limits)}
    end.

%% "/a/b" -> ["/a/b", "/a", "/"], relative to the root: ["a/b", "a", "."]
ancestors(P) ->
    Parts = [S || S <- binary:split(P, <<"/">>, [global]), S =/= <<>>, S =/= <<".">>,
                  S =/= <<"..">>],
    [case lists:sublist(Parts, N) of
         [] -> ".";
         Ps -> filename:join(Ps)
     end || N <- lists:seq(length(Parts), 0, -1)].

read_limit(File) ->
    case file:read_file(File) of
        {ok, Text} ->
            case string:to_integer(string:trim(binary_to_list(Text))) of
                {N, ""} when N > 0 -> {ok, N};
                _ -> none
            end;
        {error, _} ->
            none
    end.

%% @doc One check: `{Action, State1}' for the RSS read at `Now' (ms).
%% `State' is `#{mark, min_interval, armed, last}' (`last': when the last
%% capture began, or `undefined'). `capture' when armed, above the mark
%% and `min_interval' passed since the last capture (then disarmed);
%% `wait' when armed and above but too soon (still armed); `none'
%% otherwise, armed again below the mark minus the hysteresis
%% ({@link rearm/1}).
-spec step(non_neg_integer(), integer(), map()) -> {capture | wait | none, map()}.
step(Rss, Now, #{mark := Mark, min_interval := Min, armed := Armed, last := Last} = S)
  when is_integer(Rss), Rss >= 0, is_integer(Now), is_integer(Mark), Mark > 0,
       is_integer(Min), Min >= 0, is_boolean(Armed), Last =:= undefined orelse is_integer(Last) ->
    Rearm = rearm(Mark),
    if
        Armed, Rss > Mark, Last =:= undefined orelse Now - Last >= Min ->
            {capture, S#{armed => false, last => Now}};
        Armed, Rss > Mark ->
            {wait, S};
        not Armed, Rss < Rearm ->
            {none, S#{armed => true}};
        true ->
            {none, S}
    end;
step(Rss, Now, S) ->
    erlang:error(badarg, [Rss, Now, S]).

%% @doc The RSS under which a disarmed mark is armed again: 5% of the
%% mark (at least 1 MiB) below it.
-spec rearm(pos_integer()) -> non_neg_integer().
rearm(Mark) when is_integer(Mark), Mark > 0 ->
    max(0, Mark - max(Mark div 20, ?MiB));
rearm(Mark) ->
    erlang:error(badarg, [Mark]).

%% @doc The UTC time of `Ms' (system time, ms) as a capture's files
%% carry it: `20261126T135309.123Z'.
-spec stamp(integer()) -> string().
stamp(Ms) when is_integer(Ms), Ms >= 0 ->
    {{Y, Mo, D}, {H, Mi, S}} = calendar:system_time_to_universal_time(Ms div 1000, second),
    lists:flatten(io_lib:format("~4..0B~2..0B~2..0BT~2..0B~2..0B~2..0B.~3..0BZ",
                                [Y, Mo, D, H, Mi, S, Ms rem 1000]));
stamp(Ms) ->
    erlang:error(badarg, [Ms]).

%% @doc A capture's file name: `mallocinfo-Stamp-Kind'.
-spec file_name(string(), string()) -> string().
file_name(Stamp, Kind) ->
    io_lib:char_list(Stamp) andalso io_lib:char_list(Kind)
        orelse erlang:error(badarg, [Stamp, Kind]),
    "mallocinfo-" ++ Stamp ++ "-" ++ Kind.

%% @doc Writes `Data' as `Dir/Name' if no such file exists: to a new
%% temporary name in `Dir' first (created exclusively), then hard-linked
%% to `Name' (which fails if it exists), then the temporary name removed.
%% `ok', `{error, eexist}' when `Name' exists (it is left as it was), or
%% `{error, Posix}'.
-spec write_new(file:name_all(), file:name_all(), iodata()) -> ok | {error, atom()}.
write_new(Dir0, Name0, Data) ->
    Dir = mallocinfo_lib:path_name(Dir0, [Dir0, Name0, Data]),
    Name = mallocinfo_lib:path_name(Name0, [Dir0, Name0, Data]),
    try iolist_size(Data)
    catch error:_ -> erlang:error(badarg, [Dir0, Name0, Data])
    end,
    Tmp = filename:join(Dir, ".mallocinfo-" ++ integer_to_list(erlang:unique_integer([positive]))
                        ++ "-" ++ os:getpid() ++ ".tmp"),
    Final = filename:join(Dir, Name),
    case file:open(Tmp, [write, exclusive, raw, binary]) of
        {ok, Fd} ->
            Written = case file:write(Fd, Data) of
                          ok -> file:sync(Fd);
                          {error, _} = E -> E
                      end,
            _ = file:close(Fd),
            Result = case Written of
                         ok -> file:make_link(Tmp, Final);
                         {error, _} = E2 -> E2
                     end,
            _ = file:delete(Tmp),
            Result;
        {error, _} = E ->
            E
    end.

%% @doc `ok' when `Dir' is a directory this node can create files in;
%% `{error, Posix}' otherwise (`enoent', `enotdir', `eacces', `erofs',
%% ...): a file is created there and removed to know.
-spec check_dir(file:name_all()) -> ok | {error, atom()}.
check_dir(Dir0) ->
    Dir = mallocinfo_lib:path_name(Dir0, [Dir0]),
    case file:read_file_info(Dir) of
        {ok, #file_info{type = directory}} ->
            Probe = filename:join(Dir, ".mallocinfo-probe-" ++ os:getpid() ++ "-"
                                  ++ integer_to_list(erlang:unique_integer([positive]))),
            case file:open(Probe, [write, exclusive, raw]) of
                {ok, Fd} ->
                    _ = file:close(Fd),
                    _ = file:delete(Probe),
                    ok;
                {error, _} = E ->
                    E
            end;
        {ok, _} ->
            {error, enotdir};
        {error, _} = E ->
            E
    end.

