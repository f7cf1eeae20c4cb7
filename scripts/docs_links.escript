#!/usr/bin/env escript
%% make docs' check of the generated tree: every guide (doc/*.md) is linked
%% from the overview page, and every relative link in the overview and in
%% the Markdown files copied beside it reaches a file of the tree, and a
%% heading of it when the link names one (GitHub's anchors: the heading
%% lowercased, punctuation dropped, spaces as hyphens). A broken link is
%% printed with its file and line, and the check fails.
%%
%% Usage: escript scripts/docs_links.escript DocsDir
-mode(compile).

main([Dir]) ->
    Overview = filename:join(Dir, "overview-summary.html"),
    {ok, Html} = file:read_file(Overview),
    Guides = [filename:join("doc", filename:basename(F))
              || F <- filelib:wildcard(filename:join([Dir, "doc", "*.md"]))],
    Hrefs = matches(Html, "\\shref=\"([^\"]+)\""),
    Unlinked = [G || G <- Guides, not lists:member(G, Hrefs)],
    [io:format("docs: ~ts is not linked from ~ts~n", [G, Overview]) || G <- Unlinked],
    Md = [filename:join(Dir, F) || F <- filelib:wildcard("**/*.md", Dir)],
    Broken = lists:append([broken(Overview, 1, H) || H <- Hrefs, relative(H)])
        ++ lists:append([md_links(F) || F <- Md]),
    [io:format("docs: ~ts:~b: broken link ~ts~n", [F, L, T]) || {F, L, T} <- Broken],
    case Unlinked ++ Broken of
        [] ->
            io:format("docs: ~b guides linked from the overview, ~b Markdown files, "
                      "every relative link resolves~n", [length(Guides), length(Md)]);
        _ ->
            halt(1)
    end.

%% The first group of every match of `Re' in `Subject'.
matches(Subject, Re) ->
    case re:run(Subject, Re, [global, unicode, {capture, all_but_first, list}]) of
        {match, Ms} -> [M || [M] <- Ms];
        nomatch -> []
    end.

relative(Target) ->
    not lists:any(fun(P) -> lists:prefix(P, Target) end, ["http:", "https:", "mailto:", "#"])
        andalso not lists:member($:, lists:takewhile(fun(C) -> C =/= $/ end, Target)).

%% The [text](target) links of a Markdown file, outside code blocks.
md_links(File) ->
    {ok, Bin} = file:read_file(File),
    Split = string:split(Bin, "\n", all),
    Lines = lists:zip(lists:seq(1, length(Split)), Split),
    {_, Links} = lists:foldl(
                   fun({N, Line}, {InCode, Acc}) ->
                           case string:prefix(string:trim(Line, leading), "```") of
                               nomatch when InCode -> {InCode, Acc};
                               nomatch ->
                                   Targets = matches(Line, "\\]\\(([^)\\s]+)\\)"),
                                   {InCode, Acc ++ [{N, T} || T <- Targets]};
                               _ ->
                                   {not InCode, Acc}
                           end
                   end, {false, []}, Lines),
    lists:append([broken(File, N, T) || {N, T} <- Links, relative(T) orelse hd(T) =:= $#]).

%% [] when `Target', relative to `From', is a file (and names a heading of
%% it, if it names one), else the one broken link.
broken(From, Line, Target) ->
    {Path, Anchor} = case string:split(Target, "#") of
                         [P, A] -> {P, A};
                         [P] -> {P, ""}
                     end,
    File = case Path of
               "" -> From;
               _ -> filename:join(filename:dirname(From), Path)
           end,
    Ok = filelib:is_regular(File)
        andalso (Anchor =:= "" orelse filename:extension(File) =/= ".md"
                 orelse lists:member(Anchor, anchors(File))),
    case Ok of
        true -> [];
        false -> [{From, Line, Target}]
    end.

anchors(File) ->
    {ok, Bin} = file:read_file(File),
    {_, Slugs} = lists:foldl(
                   fun(Line, {InCode, Acc}) ->
                           case {string:prefix(Line, "```"), InCode} of
                               {nomatch, true} -> {true, Acc};
                               {nomatch, false} ->
                                   case re:run(Line, "^#+\\s+(.*)$", [unicode, {capture, all_but_first, list}]) of
                                       {match, [H]} -> {false, Acc ++ [slug(H)]};
                                       nomatch -> {false, Acc}
                                   end;
                               _ -> {not InCode, Acc}
                           end
                   end, {false, []}, string:split(unicode:characters_to_list(Bin), "\n", all)),
    numbered(Slugs, #{}).

%% A repeated heading's anchor takes -1, -2, ...
numbered([], _) -> [];
numbered([S | Rest], Seen) ->
    N = maps:get(S, Seen, 0),
    [case N of 0 -> S; _ -> S ++ "-" ++ integer_to_list(N) end | numbered(Rest, Seen#{S => N + 1})].

slug(Heading) ->
    Kept = [C || C <- string:lowercase(Heading),
                 C =:= $\s orelse C =:= $- orelse C =:= $_ orelse
                     (C >= $a andalso C =< $z) orelse (C >= $0 andalso C =< $9) orelse C > 127
                     andalso not lists:member(C, "–—’“”…×→")],
    [case C of $\s -> $-; _ -> C end || C <- Kept].
