%% @private The application callback and its supervisors, for the sampler
%% (`mallocinfo_watch') and nothing else: every other part of mallocinfo
%% is a library and runs in its caller.
%%
%% <pre>
%% mallocinfo_sup (one_for_one; registered)
%%   watch: an anonymous supervisor, temporary (one_for_one, 3 restarts in 60 s)
%%     mallocinfo_watch_server: the sampler, permanent
%%   capture: the same, for mallocinfo_watch_capture (capture_on/1)
%% </pre>
%%
%% The sampler is restarted when it crashes (its ring starts again, empty);
%% a sampler that crashes more than 3 times in 60 s takes only its own
%% supervisor down, which is temporary: mallocinfo_sup and the application
%% stay up, whatever type the release started the application with, so a
%% diagnostic never stops the node. `mallocinfo:watch/0' starts the
%% application when it is not running (a node where the tarball was
%% injected from a remote console), from its `.app' file or, loaded over
%% distribution without one, from the specification {@link spec/0}.
%%
%% A release that lists mallocinfo starts it at boot: with
%% `{mallocinfo, [{watch, true | #{period => Ms}}]}' in its sys.config the
%% sampler starts then too.
-module(mallocinfo_app).

-behaviour(application).
-behaviour(supervisor).

-export([start/2, stop/1, init/1]).
-export([spec/0, watch_child/1, capture_child/1, ensure_started/0]).

-define(SUP, mallocinfo_sup).

%% @private
-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    supervisor:start_link({local, ?SUP}, ?MODULE, top).

%% @private
-spec stop(term()) -> ok.
stop(_State) ->
    ok.

%% @private
-spec init(top | {watch, map()} | {capture, map()}) ->
          {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init(top) ->
    Children = case application:get_env(mallocinfo, watch) of
                   {ok, true} -> [watch_child(#{})];
                   {ok, #{} = Opts} -> [watch_child(Opts)];
                   _ -> []
               end,
    {ok, {#{strategy => one_for_one, intensity => 5, period => 60}, Children}};
init({capture, Opts}) ->
    {ok, {#{strategy => one_for_one, intensity => 3, period => 60},
          [#{id => capture, start => {mallocinfo_watch_capture_server, start_link, [Opts]},
             restart => permanent, shutdown => 5000, type => worker,
             modules => [mallocinfo_watch_capture_server]}]}};
init({watch, Opts}) ->
    {ok, {#{strategy => one_for_one, intensity => 3, period => 60},
          [#{id => sampler, start => {mallocinfo_watch_server, start_link, [Opts]},
             restart => permanent, shutdown => 5000, type => worker,
             modules => [mallocinfo_watch_server]}]}}.

%% @doc Starts mallocinfo's application if it is not running: from its
%% .app file, or (loaded over distribution, no file) from {@link spec/0}.
%% `ok' or `{error, {start_failed, Reason}}'.
-spec ensure_started() -> ok | {error, {start_failed, term()}}.
ensure_started() ->
    case whereis(?SUP) of
        Pid when is_pid(Pid) ->
            ok;
        undefined ->
            _ = application:load(mallocinfo) =:= ok orelse application:load(spec()),
            case application:ensure_all_started(mallocinfo) of
                {ok, _} -> ok;
                {error, Reason} -> {error, {start_failed, Reason}}
            end
    end.

%% @doc The child of mallocinfo_sup that supervises the capture
%% (`mallocinfo_watch_capture'), as watch_child/1 the sampler's.
-spec capture_child(map()) -> supervisor:child_spec().
capture_child(Opts) ->
    #{id => capture, start => {supervisor, start_link, [?MODULE, {capture, Opts}]},
      restart => temporary, shutdown => infinity, type => supervisor, modules => [?MODULE]}.

%% @doc The child of mallocinfo_sup that supervises the sampler.
-spec watch_child(map()) -> supervisor:child_spec().
watch_child(Opts) ->
    #{id => watch, start => {supervisor, start_link, [?MODULE, {watch, Opts}]},
      restart => temporary, shutdown => infinity, type => supervisor, modules => [?MODULE]}.

%% @doc The application's specification, for a node where mallocinfo was
%% loaded without its `.app' file (over distribution).
-spec spec() -> {application, mallocinfo, list()}.
spec() ->
    {application, mallocinfo,
     [{description, "Where did my memory go? glibc malloc introspection for a running BEAM node"},
      {vsn, "loaded"},
      {modules, mallocinfo_lib:app_modules()},
      {registered, [?SUP, mallocinfo_watch_server, mallocinfo_watch_capture_server]},
      {applications, [kernel, stdlib]},
      {mod, {?MODULE, []}},
      {env, []}]}.
