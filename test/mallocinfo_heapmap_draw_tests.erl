%% EUnit: the heap map drawer's own interface, below mallocinfo_heapmap's
%% (whose tests read the pixels back from the PNGs): the pictures it plans
%% for a dump, the legend's palettes and the ranking of call sites, and
%% the page showing exactly those palettes.
-module(mallocinfo_heapmap_draw_tests).
-include_lib("eunit/include/eunit.hrl").

-define(W, mi_heapdump_writer).
-define(D, mallocinfo_heapmap_draw).

with_dump(Spec, Fun) ->
    Dir = string:trim(os:cmd("mktemp -d -t mi_heapmap_draw_XXXXXX")),
    Path = filename:join(Dir, "d.heapdump"),
    try
        ok = ?W:write(Path, Spec),
        {ok, Dump} = mallocinfo_heapmap_read:read(Path),
        Fun(Dump, Path, Dir)
    after
        file:del_dir_r(Dir)
    end.

%% One picture per segment, in dump order, then mmap.png; a segment that
%% starts inside a page starts its picture at that page; big segments get
%% wider rows, then bigger pixels.
plan_test() ->
    Spec = #{tracker => true, heap_max => 256 bsl 20,
             arenas => [#{segments => [#{base => 16#10010, chunks => [{in_use, 4080}, {top, 8192}]}]},
                        #{segments => [#{base => 16#100000000, chunks => [{in_use, 4096},
                                                                          {meta, (8 bsl 20) - 4096}]},
                                       #{base => 16#200000000, chunks => [{in_use, 4096},
                                                                          {top, (64 bsl 20) - 4096}]}]}],
             mmaps => [{16#7f0000000000, 135168, 0}]},
    with_dump(Spec,
              fun(Dump, _, _) ->
                      Plan = ?D:plan(Dump),
                      ?assertEqual([{"arena0-seg0.png", segment, 0, 16#10000, 16, 4096, 256, 3},
                                    {"arena1-seg0.png", segment, 1, 16#100000000, 16, 8192, 512, 1024},
                                    {"arena1-seg1.png", segment, 1, 16#200000000, 32, 32768, 1024, 2048},
                                    {"mmap.png", mmap, undefined, 0, 16, 4096, 256, 33}],
                                   [{F, K, A, S, PB, R, W, H}
                                    || #{file := F, kind := K, arena := A, start := S,
                                         pixel_bytes := PB, row_bytes := R, width := W,
                                         height := H} <- Plan]),
                      %% Every picture covers its bytes: from start, whole rows.
                      [?assert(S =< B andalso B + Sz =< S + H * R)
                       || #{start := S, base := B, size := Sz, row_bytes := R, height := H} <- Plan]
              end).

kinds_test() ->
    Kinds = ?D:kinds(false),
    ?assertEqual([in_use, free, free_pages, fast, tcache, top, mmap, meta, outside],
                 [K || {K, _, _} <- Kinds]),
    %% Four shades each; the kinds' own colours all differ, and differ from
    %% every site colour.
    ?assert(lists:all(fun({_, _, Cs}) -> length(Cs) =:= 4 end, Kinds)),
    Sites = maps:from_list([{Id, {1000 - Id, 1, <<"s">>}} || Id <- lists:seq(1, 20)]),
    Base = [hd(Cs) || {_, _, Cs} <- Kinds]
        ++ [hd(Cs) || {_, _, Cs} <- ?D:sites(Sites)] ++ [hd(?D:other_site())],
    ?assertEqual(length(Base), length(lists:usort(Base))),
    %% With tracker data, in-use pixels are what the tracker does not know.
    {in_use, Label, _} = lists:keyfind(in_use, 1, ?D:kinds(true)),
    ?assertEqual("in use, not in the tracker's table", Label).

%% The 12 sites with the most live bytes, largest first (ties: the lower
%% id), never "other" (65535).
sites_test() ->
    Sites = maps:from_list([{Id, {Id * 10, 1, <<"s">>}} || Id <- lists:seq(1, 20)]
                           ++ [{21, {200, 1, <<"tie">>}}, {65535, {1 bsl 40, 1, <<"other">>}}]),
    ?assertEqual([20, 21, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10],
                 [Id || {Id, _, _} <- ?D:sites(Sites)]),
    ?assertEqual([20, 21], [Id || {Id, _, _} <- lists:sublist(?D:sites(maps:with([20, 21], Sites)), 2)]),
    ?assertEqual([], ?D:sites(#{})).

%% index.html's legend carries the drawer's palettes, kind by kind and
%% site by site: what a reader matches against the PNG's pixels.
page_shows_the_palettes_test() ->
    Spec = #{tracker => true,
             arenas => [#{segments => [#{base => 16#10000,
                                         chunks => [{in_use, 512, 1}, {in_use, 512, 2},
                                                    {free, 3072}, {top, 4096}]}]}],
             sites => [{1, 512, 1, <<"a">>}, {2, 512, 1, <<"b">>}]},
    with_dump(Spec,
              fun(Dump, _, _) ->
                      Html = mallocinfo_heapmap_html:page(Dump, ?D:plan(Dump)),
                      {match, Items} = re:run(Html, "data-(?:kind|site)=\"([a-z_0-9]+)\" "
                                              "data-colours=\"([^\"]+)\"",
                                              [global, {capture, [1, 2], list}]),
                      Hex = fun(Cs) -> string:join([lists:flatten(io_lib:format(
                                                                    "#~2.16.0b~2.16.0b~2.16.0b",
                                                                    [R, G, B]))
                                                    || {R, G, B} <- Cs], " ")
                            end,
                      Expected = [{atom_to_list(K), Hex(Cs)} || {K, _, Cs} <- ?D:kinds(true)]
                          ++ [{integer_to_list(Id), Hex(Cs)}
                              || {Id, _, Cs} <- ?D:sites(maps:get(sites, Dump))]
                          ++ [{"other", Hex(?D:other_site())}],
                      ?assertEqual(Expected, [{K, Cs} || [K, Cs] <- Items])
              end).
