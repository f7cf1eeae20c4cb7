%% @private `mallocinfo-heapmap DUMP OUTDIR': the command-line face of
%% {@link mallocinfo_heapmap:render/2}, built into the `priv/mallocinfo-heapmap'
%% escript (scripts/mkcli.escript) so a heap dump can be drawn on a laptop
%% that has only Erlang.
%%
%% Prints the files written and a summary; on a bad dump or a file error
%% prints one line to standard error. Exit status: 0 success, 1 the dump
%% or the output directory failed, 2 usage.
-module(mallocinfo_heapmap_cli).

-export([main/1]).

-define(NAME, "mallocinfo-heapmap").

%% @doc escript entry point.
-spec main([string()]) -> no_return().
main([Help]) when Help =:= "-h"; Help =:= "--help" ->
    io:put_chars(usage()),
    halt(0);
main([Dump, Out]) ->
    halt(run(Dump, Out));
main(_) ->
    io:put_chars(standard_error, usage()),
    halt(2).

usage() ->
    "usage: " ?NAME " DUMP OUTDIR\n"
    "  Draws a mallocinfo heap dump (mallocinfo_heap:dump/1) as PNG heap maps\n"
    "  and OUTDIR/index.html, and prints a summary of every arena.\n".

run(Dump, Out) ->
    case mallocinfo_heapmap:render_report(Dump, Out) of
        {ok, Files, Summary, Header} ->
            io:put_chars(mallocinfo_heapmap:format_header(Header)),
            io:put_chars(mallocinfo_heapmap:format_summary(Summary)),
            io:format("wrote ~b files:~n", [length(Files)]),
            [io:format("  ~ts~n", [name(F)]) || F <- Files],
            0;
        {error, {bad_dump, Why}} ->
            complain("~ts: not a usable heap dump: ~ts", [name(Dump), why(Why)]);
        {error, Posix} ->
            %% Say which path failed: the dump if it cannot be read (asked
            %% the way render does, which never blocks on a FIFO).
            case mallocinfo_heapmap_read:open(Dump) of
                {ok, Fd} ->
                    ok = file:close(Fd),
                    out_error(Out, Posix);
                {error, eftype} ->
                    complain("~ts: not a regular file (a FIFO, device or socket): not read",
                             [name(Dump)]);
                {error, _} ->
                    complain("~ts: ~ts", [name(Dump), file:format_error(Posix)])
            end
    end.

%% eexist and eisdir from OUTDIR: a name render/2 would write is taken by
%% something it does not replace.
out_error(Out, Refused) when Refused =:= eexist; Refused =:= eisdir ->
    complain("~ts: index.html or a PNG there is ~ts, not a regular file: nothing was replaced",
             [name(Out), case Refused of
                       eisdir -> "a directory";
                       eexist -> "a symbolic link, device, FIFO or socket"
                   end]);
out_error(Out, Posix) ->
    complain("~ts: ~ts", [name(Out), file:format_error(Posix)]).

%% Paths are the user's, or made from them: printed escaped
%% (mallocinfo_text), as the dump's own text is by format_header/1.
name(Path) ->
    mallocinfo_text:name(Path).

complain(Format, Args) ->
    io:format(standard_error, ?NAME ": " ++ Format ++ "~n", Args),
    1.

why(truncated) -> "truncated (the file ends before its END record)";
why(bad_magic) -> "wrong magic (not a heap dump)";
why({unsupported_version, V}) -> io_lib:format("format version ~b, this tool reads version 1", [V]);
why(Why) -> io_lib:format("corrupt (~0p)", [Why]).
