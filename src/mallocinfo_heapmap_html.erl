%% @private The heap map's `index.html': the dump's header, the per-arena
%% table, how to read the picture, the legend (each swatch carries its
%% palette in `data-colours', which the tests read back), the call sites
%% and one figure per picture, with a script that shows the address under
%% the pointer. One self-contained page, no external resources. Pure.
-module(mallocinfo_heapmap_html).

-export([page/2]).

%% The page for a dump (mallocinfo_heapmap_read:read/1) and its pictures
%% (mallocinfo_heapmap_draw:plan/1), as UTF-8.
-spec page(mallocinfo_heapmap_read:dump(), [mallocinfo_heapmap_draw:image()]) -> binary().
page(#{header := #{tracker := Tracker, pid := Pid} = H, summary := #{arenas := Arenas, total := T},
       sites := Sites, segments := Segs}, Imgs) ->
    Title = io_lib:format("Heap map of pid ~b", [Pid]),
    Page = [<<"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n">>,
            "<title>", Title, "</title>\n<style>\n", css(), "</style>\n</head>\n<body>\n",
            "<h1>", Title, "</h1>\n",
            header_html(H, length(Segs), T),
            "<h2>Summary</h2>\n", table_html(Arenas, T, Tracker),
            reading_html(),
            "<h2>Legend</h2>\n", legend_html(Tracker),
            sites_html(Tracker, Sites),
            [[arena_html(A), [segment_html(I) || #{kind := segment, arena := N} = I <- Imgs,
                                                  N =:= maps:get(arena, A)]]
             || A <- Arenas],
            case [I || #{kind := mmap} = I <- Imgs] of
                [] -> [];
                Mmap -> ["<h2 id=\"mmap\">mmapped blocks</h2>\n", [segment_html(I) || I <- Mmap]]
            end,
            "<div id=\"cursor\" class=\"cursor\"></div>\n",
            "<script>\n", script(), "</script>\n</body>\n</html>\n"],
    unicode:characters_to_binary(Page).

css() ->
    <<"body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }\n"
      "table { border-collapse: collapse; }\n"
      "th, td { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: right;"
      " white-space: nowrap; }\n"
      "th:first-child, td:first-child { text-align: left; }\n"
      "tr.total td { font-weight: bold; border-top: 2px solid #888; }\n"
      "td.label { text-align: left; font-family: monospace; }\n"
      "th.label { text-align: left; }\n"
      "td.label span { display: inline-block; max-width: 70em; overflow: hidden;"
      " text-overflow: ellipsis; vertical-align: bottom; }\n"
      "div.wide { overflow-x: auto; font-size: 13px; }\n"
      ".sw { display: inline-block; width: 28px; height: 14px; vertical-align: middle;"
      " border: 1px solid #888; margin-right: 6px; }\n"
      ".legend span.item { display: inline-block; margin: 2px 14px 2px 0; }\n"
      "figure { margin: 1em 0 2em 0; }\n"
      "figcaption { margin-bottom: 4px; color: #444; }\n"
      "img.map { image-rendering: pixelated; border: 1px solid #888; display: block; }\n"
      ".meta { color: #555; }\n"
      ".cursor { position: fixed; right: 8px; bottom: 8px; background: #fff;"
      " border: 1px solid #888; padding: 2px 6px; font-family: monospace; display: none; }\n">>.

header_html(#{time_ms := Time, glibc := Glibc, page_size := PS, heap_max := HeapMax,
              tracker := Tracker}, Segs, T) ->
    io_lib:format("<p class=\"meta\">Dumped ~s &middot; glibc ~ts &middot; page ~s &middot; "
                  "non-main heap size ~s &middot; ~b arenas, ~b segments, ~b chunks"
                  "~s &middot; tracker data: ~s</p>\n",
                  [mallocinfo_units:utc(Time), esc(Glibc), mallocinfo_units:bytes(PS),
                   mallocinfo_units:bytes(HeapMax),
                   maps:get(arena_count, T), Segs, maps:get(chunks, T),
                   case maps:get(tracked_mmap_chunks, T) of
                       0 -> "";
                       MC -> io_lib:format(", ~b mmapped blocks seen by the tracker (~s)",
                                           [MC, mallocinfo_units:bytes(maps:get(tracked_mmap_bytes, T))])
                   end,
                   case Tracker of true -> "yes"; false -> "no" end]).

columns(Tracker) ->
    [{"arena", arena, "arena index (0 = main)"},
     {"system", system_bytes, "bytes the arena got from the kernel"},
     {"in use", in_use_bytes, "system - free (glibc's uordblks: tcache chunks and headers count as in use)"},
     {"free", free_bytes, "free + fastbin + top (glibc's fordblks)"},
     {"in bins", {by_kind, free}, "free chunks in regular bins"},
     {"fastbins", {by_kind, fast}, "free chunks in fastbins"},
     {"tcache", {by_kind, tcache}, "free chunks in thread caches"},
     {"top", {by_kind, top}, "the top chunk"},
     {"free chunks", free_chunks, "number of bin, fastbin and tcache chunks"},
     {"largest free", largest_free, "largest bin, fastbin, tcache or top chunk"},
     {"resident", resident_bytes, "resident pages of the arena's segments"},
     {"trimmable", trimmable_bytes, "resident whole pages inside free and fastbin chunks, and of the main arena's top: what malloc_trim(0) could return now"},
     {"pinned", pinned_bytes, "free and fastbin bytes not in whole pages: held by the live blocks around them"}]
        ++ case Tracker of
               true -> [{"live", live_bytes, "in use blocks in the tracker's live table"},
                        {"untracked", unrecorded_bytes, "in use blocks the tracker does not know"}];
               false -> []
           end.

%% One line of figures above an arena's maps.
arena_html(#{arena := N} = A) ->
    B = fun(K) -> mallocinfo_units:bytes(maps:get(K, A)) end,
    io_lib:format("<h2 id=\"arena~b\">Arena ~b~s</h2>\n<p class=\"meta\">system ~s, in use ~s, free ~s"
                  " in ~b chunks (pinned ~s, trimmable ~s, largest ~s), resident ~s</p>\n",
                  [N, N, case N of 0 -> " (main)"; _ -> "" end,
                   B(system_bytes), B(in_use_bytes), B(free_bytes), maps:get(free_chunks, A),
                   B(pinned_bytes), B(trimmable_bytes), B(largest_free), B(resident_bytes)]).

table_html(Arenas, T, Tracker) ->
    Cols = columns(Tracker),
    Head = ["<tr>", [io_lib:format("<th title=\"~s\">~s</th>", [Tip, Name]) || {Name, _, Tip} <- Cols],
            "</tr>\n"],
    Row = fun(Class, First, M) ->
                  [io_lib:format("<tr~s>", [Class]),
                   [case K of
                        arena -> ["<td>", First, "</td>"];
                        free_chunks -> ["<td>", integer_to_list(maps:get(K, M)), "</td>"];
                        _ -> cell(value(K, M))
                    end || {_, K, _} <- Cols],
                   "</tr>\n"]
          end,
    ["<div class=\"wide\"><table>\n", Head,
     [Row("", io_lib:format("<a href=\"#arena~b\">~b</a>", [maps:get(arena, A), maps:get(arena, A)]), A)
      || A <- Arenas],
     Row(" class=\"total\"", "total", T), "</table></div>\n"].

value({by_kind, K}, M) -> maps:get(K, maps:get(by_kind, M));
value(K, M) -> maps:get(K, M).

cell(Bytes) ->
    io_lib:format("<td title=\"~b bytes\">~s</td>", [Bytes, mallocinfo_units:bytes(Bytes)]).

reading_html() ->
    <<"<p>Free memory comes in two sorts. <b>Trimmable</b>: resident whole pages"
      " inside free chunks (and the top chunk) that <code>mallocinfo:trim()</code>"
      " would give back to the kernel now. <b>Pinned</b>: free bytes that share"
      " their pages with live blocks, so no trim can return them: that is"
      " fragmentation. Faded, hatched pages are not resident (never touched, or"
      " already given back): they cost address space, not RAM.</p>\n">>.

legend_html(Tracker) ->
    Kinds = mallocinfo_heapmap_draw:kinds(Tracker),
    {free_pages, _, [_, _, Faded, Stroke]} = lists:keyfind(free_pages, 1, Kinds),
    ["<div class=\"legend\">",
     [legend_item(Colours, ["data-kind=\"", atom_to_list(Key), "\""], Label)
      || {Key, Label, Colours} <- Kinds],
     "<span class=\"item\"><span class=\"sw\" style=\"background: repeating-linear-gradient(135deg, ",
     hex(Stroke), " 0 2px, ", hex(Faded), " 2px 6px)\"></span>",
     "non-resident page (here: whole free pages, already returned)</span>",
     "</div>\n<p class=\"meta\">Each chunk begins with a darker pixel, so neighbours of the same"
     " kind stay apart; when a pixel covers several chunks it takes the colour of the kind"
     " holding most of its bytes, darker when a chunk of that kind starts in it.",
     case Tracker of
         true -> " Live blocks are coloured by call site (below).";
         false -> ""
     end, "</p>\n"].

%% data-colours lists the class's palette: resident, resident chunk start,
%% non-resident, non-resident stroke.
legend_item([Base, Start | _] = Colours, Attr, Label) ->
    ["<span class=\"item\" ", Attr, " data-colours=\"", lists:join(" ", [hex(C) || C <- Colours]),
     "\"><span class=\"sw\" style=\"background: ", hex(Base),
     "; border-left: 4px solid ", hex(Start), "\"></span>", esc(Label), "</span>"].

sites_html(false, _) ->
    [];
sites_html(true, Sites) ->
    case mallocinfo_heapmap_draw:sites(Sites) of
        [] ->
            [];
        Top ->
            Rows = [["<tr><td>", legend_item(Colours, ["data-site=\"", integer_to_list(Id), "\""], ""),
                     "</td><td>", mallocinfo_units:bytes(B), "</td><td>", integer_to_list(N),
                     "</td><td class=\"label\"><span title=\"", esc(L), "\">", esc(L),
                     "</span></td></tr>\n"]
                    || {Id, {B, N, L}, Colours} <- Top],
            Other = ["<tr><td>", legend_item(mallocinfo_heapmap_draw:other_site(),
                                             "data-site=\"other\"", ""),
                     "</td><td></td><td></td><td class=\"label\">every other site</td></tr>\n"],
            ["<h2 id=\"sites\">Call sites of live blocks</h2>\n"
             "<table>\n<tr><th></th><th>live bytes</th><th>blocks</th><th class=\"label\">site (innermost frames)</th></tr>\n",
             Rows, Other, "</table>\n"]
    end.

segment_html(#{file := File, title := Title, kind := Kind, start := Start, pixel_bytes := PB,
               row_bytes := R, width := W, height := Rows, base := Base, size := Size}) ->
    %% Narrow maps are enlarged (pixelated, not smoothed) to about 1024
    %% pixels across.
    Zoom = max(1, 1024 div W),
    Where = case Kind of
                segment -> io_lib:format("0x~.16b&ndash;0x~.16b, ~s",
                                         [Base, Base + Size, mallocinfo_units:bytes(Size)]);
                mmap -> io_lib:format("~s, laid end to end in dump order (not at their addresses)",
                                      [mallocinfo_units:bytes(Size)])
            end,
    io_lib:format("<figure>\n<figcaption><b>~s</b>: ~s. One pixel = ~s, one row = ~s"
                  " (~b&times;~b px).</figcaption>\n"
                  "<img class=\"map\" src=\"~s\" alt=\"~s\" width=\"~b\" height=\"~b\""
                  " data-start=\"~b\" data-px=\"~b\" data-row=\"~b\" data-addr=\"~s\">\n</figure>\n",
                  [Title, Where, mallocinfo_units:bytes(PB), mallocinfo_units:bytes(R), W, Rows,
                   File, Title, W * Zoom, Rows * Zoom, Start, PB, R,
                   case Kind of segment -> "1"; mmap -> "0" end]).

%% Shows the address under the pointer: start + row * row_bytes + column *
%% pixel_bytes. Addresses fit in a double (below 2^53).
script() ->
    <<"(function () {\n"
      "  var box = document.getElementById('cursor');\n"
      "  document.querySelectorAll('img.map').forEach(function (img) {\n"
      "    img.addEventListener('mousemove', function (e) {\n"
      "      var x = Math.floor(e.offsetX * img.naturalWidth / img.clientWidth);\n"
      "      var y = Math.floor(e.offsetY * img.naturalHeight / img.clientHeight);\n"
      "      var off = y * Number(img.dataset.row) + x * Number(img.dataset.px);\n"
      "      var text = img.dataset.addr === '1'\n"
      "        ? '0x' + (Number(img.dataset.start) + off).toString(16)\n"
      "        : '+' + off + ' bytes';\n"
      "      box.textContent = img.alt + ': ' + text;\n"
      "      box.style.display = 'block';\n"
      "    });\n"
      "    img.addEventListener('mouseleave', function () { box.style.display = 'none'; });\n"
      "  });\n"
      "})();\n">>.

hex({R, G, B}) -> io_lib:format("#~2.16.0b~2.16.0b~2.16.0b", [R, G, B]).

%% Text from the dump (labels, the glibc version) is bytes: made printable
%% (invalid UTF-8 and controls escaped, mallocinfo_text), then HTML-escaped.
esc(Text) ->
    lists:map(fun($<) -> "&lt;";
                 ($>) -> "&gt;";
                 ($&) -> "&amp;";
                 ($") -> "&quot;";
                 (C) -> C
              end, mallocinfo_text:name(Text)).
