%% @private The timeline served at `/timeline.json' and `/timeline.html',
%% from the sampler's history (`mallocinfo_watch:history/0'); pure.
%%
%% The JSON document ({@link doc/2}) holds the samples' times and every
%% layer's series by name (`mallocinfo_layers_growth:layer_name/1'), the
%% resident set split by layer for a stacked chart (`stacked': labels
%% bottom to top, one series each, adding up to what the mappings hold),
%% the current verdicts, each part's rate over the last minute and hour,
%% the latest culprits of each layer, the ring's size and the samples'
%% cost. The page ({@link page/2}) is one self-contained HTML document
%% (inline CSS, SVG drawn by an inline script from the document embedded
%% in it; nothing fetched) with the stacked chart, the verdicts, the rates
%% and the culprits, and links to `/report.txt', `/flamegraph.html' and
%% `/timeline.json'. After drawing, the body carries `data-ok="1"',
%% `data-samples' and `data-layers', and `#errors' lists any script error:
%% the test suite reads them from Chromium's `--dump-dom'.
-module(mallocinfo_http_timeline).

-export([doc/2, json/2, page/2]).

%% @doc The JSON document of a history, as a term for
%% `mallocinfo_json:encode/1'. `Node' names the node (an atom, its os pid
%% beside it).
-spec doc(map(), #{node := node(), os_pid := string()}) -> map().
doc(#{samples := Samples} = H, #{node := Node, os_pid := OsPid}) ->
    Keys = case Samples of
               [#{layers := L} | _] -> lists:sort(maps:keys(L));
               [] -> []
           end,
    Series = maps:from_list(
               [{mallocinfo_layers_growth:layer_name(K),
                 [maps:get(K, L, undefined) || #{layers := L} <- Samples]} || K <- Keys]),
    Parts = [mallocinfo_layers_growth:rss_parts(L) || L <- carried(Samples)],
    Stacked = [#{label => Label,
                 values => [proplists:get_value(Label, P, undefined) || P <- Parts]}
               || Label <- mallocinfo_layers_growth:stacked_labels()],
    Growth = maps:get(growth, H, #{}),
    Last = maps:from_list([{P, V} || #{part := P, last := V} <- maps:get(parts, Growth, [])]),
    Growing = [P || #{part := P} <- maps:get(growing, Growth, [])],
    #{node => Node, os_pid => list_to_binary(OsPid),
      period_ms => maps:get(period_ms, H), started_ms => maps:get(started, H),
      times_ms => [T || #{time := T} <- Samples],
      layers => Series,
      stacked => Stacked,
      verdicts => maps:get(verdicts, H, []),
      noise_bytes => mallocinfo_layers_growth:noise_bytes(),
      rates => [#{part => P, label => list_to_binary(mallocinfo_layers_growth:part_label(P)),
                  bytes => maps:get(P, Last, undefined), growing => lists:member(P, Growing),
                  minute_bytes_per_s => M, hour_bytes_per_s => Hr}
                || #{part := P, minute := M, hour := Hr} <- maps:get(rates, H, [])],
      culprits => maps:map(fun(_, #{time := T, culprits := Cs}) ->
                                   #{time_ms => T, culprits => Cs}
                           end, maps:get(culprits, H, #{})),
      ring => maps:get(ring, H, #{}),
      cost => maps:get(cost, H, #{})}.

%% The sampler reads the mappings once a minute: a sample without them
%% takes the kinds of the last one that has them (its RSS is its own).
carried(Samples) ->
    {Layers, _} = lists:mapfoldl(
                    fun(#{layers := L}, Kinds) ->
                            case maps:get({smaps, anon}, L, undefined) of
                                undefined -> {maps:merge(L, Kinds), Kinds};
                                _ -> {L, maps:filter(fun({smaps, _}, _) -> true;
                                                        (_, _) -> false
                                                     end, L)}
                            end
                    end, #{}, Samples),
    Layers.

%% @doc The JSON text of {@link doc/2}.
-spec json(map(), #{node := node(), os_pid := string()}) -> iodata().
json(H, Who) ->
    mallocinfo_json:encode(doc(H, Who)).

%% @doc The page of a history.
-spec page(map(), #{node := node(), os_pid := string()}) -> iodata().
page(H, #{node := Node, os_pid := OsPid} = Who) ->
    %% Inside <script>, only "</" could end the element: "<\/" is the same
    %% JSON string.
    Json = binary:replace(iolist_to_binary(json(H, Who)), <<"</">>, <<"<\\/">>, [global]),
    Title = ["memory timeline of ", escape(mallocinfo_text:name(atom_to_binary(Node))),
             " (os pid ", OsPid, ")"],
    [<<"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>">>, Title,
     <<"</title>\n">>, style(), <<"</head>\n<body data-errors=\"0\">\n<h1>">>, Title, <<"</h1>\n">>,
     <<"<p class=\"links\"><a href=\"/report.txt\">the report</a> &middot; "
       "<a href=\"/flamegraph.html\">the native heap as a flame graph</a> &middot; "
       "<a href=\"/timeline.json\">this timeline as JSON</a></p>\n"
       "<h2>What grows</h2>\n<ul id=\"verdicts\"></ul>\n"
       "<h2>Resident set by layer</h2>\n<div id=\"chart\"></div>\n<div id=\"legend\"></div>\n"
       "<h2>Each part's rate</h2>\n<table id=\"rates\"></table>\n"
       "<h2>Who holds each layer (latest search)</h2>\n<div id=\"culprits\"></div>\n"
       "<p id=\"ring\"></p>\n<pre id=\"errors\"></pre>\n"
       "<script type=\"application/json\" id=\"data\">">>, Json, <<"</script>\n">>,
     script(), <<"</body></html>\n">>].

escape(Text) ->
    << <<(case C of
              $& -> <<"&amp;">>;
              $< -> <<"&lt;">>;
              $> -> <<"&gt;">>;
              $" -> <<"&quot;">>;
              _ -> <<C>>
          end)/binary>> || <<C>> <= unicode:characters_to_binary(Text) >>.

style() ->
    <<"<style>
body { font: 14px sans-serif; margin: 1em 2em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.4em; }
.links a { margin-right: .3em; }
#verdicts li { margin: .3em 0; }
#verdicts li.none { color: #555; list-style: none; }
table { border-collapse: collapse; }
td, th { padding: 2px 10px; text-align: right; border-bottom: 1px solid #ddd; }
td:first-child, th:first-child, td:last-child, th:last-child { text-align: left; }
.grow { color: #b00; font-weight: bold; }
#legend span { display: inline-block; margin: 2px 12px 2px 0; }
#legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
            vertical-align: middle; }
svg text { font: 11px sans-serif; fill: #444; }
#errors { color: #b00; }
</style>\n">>.

script() ->
    [mallocinfo_http_page:script_head(),
     <<"var COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1',
              '#9c755f'];
var SVG = 'http://www.w3.org/2000/svg';

function bytes(b) {
  if (b === null || b === undefined) return '-';
  var neg = b < 0, v = Math.abs(b), units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (neg ? '-' : '') + (i === 0 ? String(v) : v.toFixed(1)) + ' ' + units[i];
}
function rate(b) {
  if (b === null || b === undefined) return '-';
  return (b > 0 ? '+' : '') + bytes(b) + '/s';
}
function el(tag, attrs, text) {
  var e = tag.indexOf('svg:') === 0 ? document.createElementNS(SVG, tag.slice(4))
                                    : document.createElement(tag);
  for (var k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function clock(ms) {
  var d = new Date(ms);
  function two(n) { return (n < 10 ? '0' : '') + n; }
  return two(d.getUTCHours()) + ':' + two(d.getUTCMinutes()) + ':' + two(d.getUTCSeconds());
}

function verdicts(data) {
  var ul = document.getElementById('verdicts');
  if (data.verdicts.length === 0) {
    ul.appendChild(el('li', { 'class': 'none' },
      'nothing grew by the noise threshold (' + bytes(data.noise_bytes) +
      ') over the last minute'));
  }
  data.verdicts.forEach(function (v) { ul.appendChild(el('li', {}, v)); });
}

function chart(data) {
  var W = 960, H = 340, L = 70, R = 20, T = 10, B = 30;
  var times = data.times_ms, n = times.length;
  var svg = el('svg:svg', { width: W, height: H, viewBox: '0 0 ' + W + ' ' + H });
  document.getElementById('chart').appendChild(svg);
  var series = data.stacked.map(function (s) {
    return s.values.map(function (v) { return v === null ? 0 : v; });
  });
  var tops = [];
  for (var i = 0; i < n; i++) {
    var sum = 0;
    for (var j = 0; j < series.length; j++) sum += series[j][i];
    tops.push(sum);
  }
  var rss = (data.layers.rss || []).map(function (v) { return v === null ? 0 : v; });
  var max = Math.max.apply(null, tops.concat(rss, [1]));
  var t0 = n > 0 ? times[0] : 0, t1 = n > 1 ? times[n - 1] : t0 + 1;
  function x(t) { return L + (W - L - R) * (t - t0) / Math.max(1, t1 - t0); }
  function y(b) { return H - B - (H - T - B) * b / max; }
  for (var g = 0; g <= 4; g++) {
    var b = max * g / 4;
    svg.appendChild(el('svg:line', { x1: L, x2: W - R, y1: y(b), y2: y(b), stroke: '#ddd' }));
    svg.appendChild(el('svg:text', { x: L - 6, y: y(b) + 4, 'text-anchor': 'end' }, bytes(b)));
  }
  for (var k = 0; k <= 4 && n > 0; k++) {
    var t = t0 + (t1 - t0) * k / 4;
    var anchor = k === 0 ? 'start' : k === 4 ? 'end' : 'middle';
    svg.appendChild(el('svg:text', { x: x(t), y: H - 10, 'text-anchor': anchor },
                       clock(t) + ' UTC'));
  }
  var base = times.map(function () { return 0; });
  series.forEach(function (s, j) {
    var upper = s.map(function (v, i) { return base[i] + v; });
    var pts = [];
    for (var i = 0; i < n; i++) pts.push(x(times[i]) + ',' + y(upper[i]));
    for (var i2 = n - 1; i2 >= 0; i2--) pts.push(x(times[i2]) + ',' + y(base[i2]));
    if (n === 1) {
      pts = [L + ',' + y(upper[0]), (W - R) + ',' + y(upper[0]), (W - R) + ',' + y(base[0]),
             L + ',' + y(base[0])];
    }
    var poly = el('svg:polygon', { points: pts.join(' '), fill: COLORS[j % COLORS.length],
                                   'fill-opacity': '0.85', 'data-layer': data.stacked[j].label });
    poly.appendChild(el('svg:title', {}, data.stacked[j].label + ': ' +
                        bytes(n > 0 ? s[n - 1] : null) + ' now'));
    svg.appendChild(poly);
    base = upper;
  });
  var line = [];
  for (var i3 = 0; i3 < n; i3++) if (rss[i3] !== null) line.push(x(times[i3]) + ',' + y(rss[i3]));
  if (line.length > 1) {
    svg.appendChild(el('svg:polyline', { points: line.join(' '), fill: 'none', stroke: '#000',
                                         'stroke-width': '1.5', 'stroke-dasharray': '4 3' }));
  }
  var legend = document.getElementById('legend');
  data.stacked.forEach(function (s, j) {
    var span = el('span', {});
    span.appendChild(el('i', { style: 'background:' + COLORS[j % COLORS.length] }));
    span.appendChild(document.createTextNode(s.label + ' ' +
                                             bytes(n > 0 ? s.values[n - 1] : null)));
    legend.appendChild(span);
  });
  legend.appendChild(el('span', {}, '- - - RSS ' + bytes(n > 0 ? rss[n - 1] : null)));
}

function rates(data) {
  var table = document.getElementById('rates');
  var head = el('tr', {});
  ['part', 'now', 'last minute', 'last hour'].forEach(function (h) {
    head.appendChild(el('th', {}, h));
  });
  table.appendChild(head);
  data.rates.forEach(function (r) {
    var tr = el('tr', { 'data-part': r.part });
    var grows = r.growing;
    tr.appendChild(el('td', grows ? { 'class': 'grow' } : {}, r.label));
    tr.appendChild(el('td', {}, bytes(r.bytes)));
    tr.appendChild(el('td', {}, rate(r.minute_bytes_per_s)));
    tr.appendChild(el('td', {}, rate(r.hour_bytes_per_s)));
    table.appendChild(tr);
  });
}

function culprit(c) {
  var who = c.pid ? c.pid + (c.name ? ' ' + c.name : '') +
                    (c.message_queue_len !== undefined && c.message_queue_len !== null ?
                     ', queue ' + c.message_queue_len : '')
          : c.table ? 'table ' + c.table + ' (owner ' + c.owner +
                      (c.owner_name ? ' ' + c.owner_name : '') + ')'
          : (c['function'] || '?') + ' (' + c.object + ')';
  return [bytes(c.bytes), c.delta !== undefined ? (c.delta >= 0 ? '+' : '') + bytes(c.delta)
                                                : '', who];
}

function culprits(data) {
  var div = document.getElementById('culprits');
  Object.keys(data.culprits).sort().forEach(function (layer) {
    var found = data.culprits[layer];
    div.appendChild(el('h3', {}, layer + ' (searched at ' + clock(found.time_ms) + ' UTC)'));
    var table = el('table', { 'data-layer': layer });
    var head = el('tr', {});
    ['holds', 'grew', 'who'].forEach(function (h) { head.appendChild(el('th', {}, h)); });
    table.appendChild(head);
    found.culprits.forEach(function (c) {
      var tr = el('tr', {});
      culprit(c).forEach(function (cell) { tr.appendChild(el('td', {}, cell)); });
      table.appendChild(tr);
    });
    div.appendChild(table);
  });
}

function main() {
  var data = JSON.parse(document.getElementById('data').textContent);
  verdicts(data);
  chart(data);
  rates(data);
  culprits(data);
  document.getElementById('ring').textContent =
    data.times_ms.length + ' samples every ' + (data.period_ms / 1000) + ' s; the ring holds ' +
    data.ring.fine_slots + ' at the period and ' + data.ring.coarse_slots +
    ' coarser ones in ' + bytes(data.ring.memory_bytes) + '; a sample takes ' +
    (data.cost.mean_us / 1000).toFixed(1) + ' ms on average';
  document.body.setAttribute('data-samples', String(data.times_ms.length));
  document.body.setAttribute('data-layers', String(data.stacked.length));
  document.body.setAttribute('data-ok', '1');
}
main();
</script>\n">>].
