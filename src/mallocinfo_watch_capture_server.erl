%% @private The capture's watcher (`mallocinfo_watch_capture'): a
%% gen_server under mallocinfo's application (`mallocinfo_app'),
%% registered as `mallocinfo_watch_capture_server', started with options
%% ?CAPTURE:capture_on/1 checked. Every period it reads
%% the RSS and steps the mark (`?CAPTURE:step/3'); a
%% capture is written by a process of its own, so the watcher keeps its
%% period and its heap stays small; the captures beyond `keep' that it
%% wrote are deleted.
-module(mallocinfo_watch_capture_server).

-behaviour(gen_server).

-export([start_link/1]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-define(SERVER, ?MODULE).
-define(CAPTURE, mallocinfo_watch_capture).
%% The processes listed in top.txt.
-define(TOP, 20).

%% @private
-spec start_link(map()) -> {ok, pid()} | {error, term()}.
start_link(Opts) ->
    gen_server:start_link({local, ?SERVER}, ?MODULE, Opts, []).

%% @private
init(#{mark := _} = O) ->
    self() ! check,
    {ok, O#{armed => true, last => undefined, rss => undefined, captures => [],
            worker => undefined}}.

%% @private
handle_call(status, _From, #{mark := Mark, armed := Armed, rss := Rss, captures := Cs,
                             worker := W} = S) ->
    {reply, {ok, #{mark => Mark, rearm => ?CAPTURE:rearm(Mark), armed => Armed,
                   rss => Rss, captures => lists:reverse(Cs), busy => W =/= undefined}}, S};
handle_call(_, _From, S) ->
    {reply, {error, unknown_request}, S}.

%% @private
handle_cast(_, S) ->
    {noreply, S}.

%% @private
handle_info(check, #{period := Period} = S) ->
    erlang:send_after(Period, self(), check),
    {noreply, check(S)};
handle_info({'DOWN', Ref, process, _, Result}, #{worker := Ref, captures := Cs,
                                                  keep := Keep} = S) ->
    Cs1 = case Result of
              {captured, C} -> [C | Cs];
              _ -> Cs
          end,
    {Kept, Old} = lists:split(min(Keep, length(Cs1)), Cs1),
    [_ = file:delete(F) || #{files := Fs} <- Old, F <- Fs],
    {noreply, S#{worker => undefined, captures => Kept}};
handle_info(_, S) ->
    {noreply, S}.

%% @private
terminate(_, _) ->
    ok.

%% While a capture is being written the RSS is read but not acted on (the
%% capture itself allocates): the mark stays as it was.
check(#{worker := W} = S) when W =/= undefined ->
    S#{rss => rss()};
check(S) ->
    Rss = rss(),
    case is_integer(Rss) of
        false ->
            S;
        true ->
            case ?CAPTURE:step(Rss, erlang:monotonic_time(millisecond), S) of
                {capture, S1} ->
                    Args = maps:with([dir, mark, max_file_bytes], S1),
                    {_, Ref} = spawn_monitor(fun() ->
                                                     exit({captured, write(Args#{rss => Rss})})
                                             end),
                    S1#{rss => Rss, worker => Ref};
                {_, S1} ->
                    S1#{rss => Rss}
            end
    end.

rss() ->
    try mallocinfo_glibc:rss()
    catch _:_ -> undefined
    end.

%% The capture, in a process of its own: each part read and written in
%% turn, whatever fails is said in the notes.
write(#{dir := Dir, mark := Mark, rss := Rss, max_file_bytes := Max}) ->
    Stamp = ?CAPTURE:stamp(erlang:system_time(millisecond)),
    Recording = try mallocinfo_trace:status() of
                    #{recording := true} -> true;
                    _ -> false
                catch
                    _:_ -> false
                end,
    Parts = [{"report.txt",
              fun() -> {ok, mallocinfo_report:format(mallocinfo_report:collect())} end},
             {"heap.pb.gz", profile(Recording, fun mallocinfo_trace:pprof/0)},
             {"heap.folded", profile(Recording, fun mallocinfo_trace:folded/0)},
             {"timeline.json", fun timeline/0},
             {"top.txt", fun top/0}],
    Done = [{Kind, part(Dir, ?CAPTURE:file_name(Stamp, Kind), Read, Max)}
            || {Kind, Read} <- Parts],
    Notes = [io_lib:format("mallocinfo capture ~s on ~s (os pid ~s)~n"
                           "RSS ~B bytes crossed the mark ~B (armed again below ~B)~n",
                           [Stamp, node(), os:getpid(), Rss, Mark,
                            ?CAPTURE:rearm(Mark)])
             | [[Kind, ": ", note(R), $\n] || {Kind, R} <- Done]],
    NotesName = ?CAPTURE:file_name(Stamp, "notes.txt"),
    Written = [filename:join(Dir, ?CAPTURE:file_name(Stamp, K)) || {K, {written, _}} <- Done]
        ++ [filename:join(Dir, NotesName)
            || ?CAPTURE:write_new(Dir, NotesName, Notes) =:= ok],
    #{stamp => Stamp, files => Written}.

profile(true, Read) -> Read;
profile(false, _) -> fun() -> {skipped, "the tracker does not record in this node"} end.

timeline() ->
    case mallocinfo_watch:history() of
        {ok, H} ->
            {ok, mallocinfo_http_timeline:json(H, #{node => node(), os_pid => os:getpid()})};
        {error, not_watching} ->
            {skipped, "the sampler does not run (mallocinfo:watch/0)"}
    end.

top() ->
    Rows = mallocinfo_process:top(?TOP, memory),
    {ok, [io_lib:format("~14s  ~-16s ~s~n", ["memory (bytes)", "pid", "name"])
          | [io_lib:format("~14B  ~-16s~ts~n",
                           [V, pid_to_list(P), mallocinfo_process:name_text(N)])
             || #{pid := P, value := V, name := N} <- Rows]]}.

part(Dir, Name, Read, Max) ->
    try Read() of
        {ok, Data} ->
            Bin = iolist_to_binary(Data),
            {Body, Cut} = case byte_size(Bin) > Max of
                              true -> {binary:part(Bin, 0, Max), byte_size(Bin)};
                              false -> {Bin, false}
                          end,
            case ?CAPTURE:write_new(Dir, Name, Body) of
                ok -> {written, {Name, byte_size(Body), Cut}};
                {error, Why} -> {failed, Why}
            end;
        {skipped, Why} ->
            {skipped, Why};
        {error, Why} ->
            {failed, Why}
    catch
        Class:Why -> {failed, {Class, Why}}
    end.

note({written, {Name, Bytes, false}}) ->
    io_lib:format("~s, ~B bytes", [Name, Bytes]);
note({written, {Name, Bytes, Of}}) ->
    io_lib:format("~s, cut at ~B bytes of ~B (max_file_bytes)", [Name, Bytes, Of]);
note({skipped, Why}) ->
    ["skipped: ", Why];
note({failed, eexist}) ->
    "not written: a file of that name exists (never overwritten)";
note({failed, Why}) ->
    io_lib:format("failed: ~0tp", [Why]).
