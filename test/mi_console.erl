%% What the end-to-end suites (mallocinfo_release_SUITE,
%% mallocinfo_elixir_SUITE) do as an operator would: run commands, and type
%% into a release's remote console through a pty that tmux owns, reading
%% back the screen.
%%
%% A console is {Socket, Session}: the tmux server on its own socket (-L,
%% so a suite never meets another's, nor the user's) and the session that
%% runs the console command. Every wait here has a limit and fails the test
%% case with what was last seen; none asserts a duration.
-module(mi_console).
-export([executable/1, run/4, sh/1, q/1, open/4, type/3, wait_for/4, leave/1, kill_server/1]).

%% The path of the program Name, or a failed case saying `make deps'
%% installs it: nothing in these suites is skipped.
executable(Name) ->
    case os:find_executable(Name) of
        false -> ct:fail({missing_executable, Name, "make deps installs it"});
        Path -> Path
    end.

%% Runs Exe with Args in Dir, Env added to this node's environment
%% ({Name, false} unsets Name); fails the test with its output on a
%% non-zero exit or after 15 minutes. Returns the output (stderr included)
%% as a binary, and logs it.
run(Exe, Args, Env, Dir) ->
    Port = open_port({spawn_executable, Exe},
                     [{args, Args}, {env, Env}, {cd, Dir}, exit_status, binary, stream,
                      stderr_to_stdout, hide]),
    Out = collect(Port, [Exe | Args]),
    ct:log("~ts ~p~n~ts", [Exe, Args, Out]),
    Out.

%% run/4 of a /bin/sh command line (an iolist) in the current directory.
sh(Cmd) ->
    run("/bin/sh", ["-c", lists:flatten(Cmd)], [], ".").

collect(Port, What) ->
    collect(Port, What, []).

collect(Port, What, Acc) ->
    receive
        {Port, {data, D}} -> collect(Port, What, [Acc, D]);
        {Port, {exit_status, 0}} -> iolist_to_binary(Acc);
        {Port, {exit_status, S}} -> ct:fail({command_failed, What, S, iolist_to_binary(Acc)})
    after 900000 -> ct:fail({command_timeout, What})
    end.

%% S (an iolist) quoted for the shell as one word.
q(S) -> "'" ++ string:replace(lists:flatten(S), "'", "'\\''", all) ++ "'".

%% Starts Cmd (a shell command line) in a new detached session Sess of the
%% tmux server on socket Sock, 250 columns wide, and waits up to 60 s for
%% its first prompt, a regular expression matched against the screen.
%% Returns the console. tmux gives the command the tmux server's
%% environment, not this node's: Cmd sets what it needs itself.
open(Sock, Sess, Cmd, Prompt) ->
    sh(["tmux -L ", Sock, " new-session -d -s ", Sess, " -x 250 -y 80 ", q(Cmd)]),
    Console = {Sock, Sess},
    wait_for(Console, "", Prompt, 60),
    Console.

%% Types Line and Enter, then waits up to 60 s until the text after the
%% echoed line matches Regex. Returns that text (and logs it).
type({Sock, Sess} = Console, Line0, Regex0) ->
    Line = lists:flatten(Line0),
    Regex = lists:flatten(Regex0),
    sh(["tmux -L ", Sock, " send-keys -t ", Sess, " -l ", q(Line)]),
    sh(["tmux -L ", Sock, " send-keys -t ", Sess, " Enter"]),
    Out = wait_for(Console, Line, Regex, 60),
    ct:log("> ~ts~n~ts", [Line, Out]),
    Out.

%% Waits up to Secs seconds until the screen's text after the last
%% occurrence of Line (all of it, for "") matches Regex (multiline,
%% Unicode). Returns that text; fails the case with the last screen.
wait_for(Console, Line, Regex, Secs) ->
    wait_for(Console, Line, Regex, Secs * 10, "").

wait_for(_Console, Line, Regex, 0, Last) ->
    ct:fail({console_timeout, Line, Regex, Last});
wait_for({Sock, Sess} = Console, Line, Regex, N, _) ->
    Screen = os:cmd("tmux -L " ++ Sock ++ " capture-pane -p -J -S -3000 -t " ++ Sess),
    After = case string:find(Screen, Line, trailing) of
                nomatch -> "";
                Rest -> string:slice(Rest, string:length(Line))
            end,
    case re:run(After, Regex, [multiline, unicode]) of
        {match, _} ->
            After;
        nomatch ->
            timer:sleep(100),
            wait_for(Console, Line, Regex, N - 1, Screen)
    end.

%% Leaves a remote console the way a person does, ^G then q (q() or
%% System.stop would stop the release), and waits up to 10 s for its
%% session to end.
leave({Sock, Sess} = Console) ->
    sh(["tmux -L ", Sock, " send-keys -t ", Sess, " C-g"]),
    wait_for(Console, "", "User switch command", 10),
    sh(["tmux -L ", Sock, " send-keys -t ", Sess, " q Enter"]),
    wait_closed(Console, 100).

wait_closed({Sock, Sess}, 0) -> ct:fail({console_still_open, Sock, Sess});
wait_closed({Sock, Sess} = Console, N) ->
    case os:cmd("tmux -L " ++ Sock ++ " has-session -t " ++ Sess ++ " 2>&1") of
        "" -> timer:sleep(100), wait_closed(Console, N - 1);
        _ -> ok
    end.

%% Stops the tmux server on Sock and whatever its sessions still run, if it
%% is there at all: for end_per_suite after a failed case.
kill_server(Sock) ->
    _ = os:cmd("tmux -L " ++ Sock ++ " kill-server"),
    ok.
