%% @private The flame graph page served at `/flamegraph.html': one
%% self-contained HTML document (inline CSS and script, the collapsed
%% stacks inline, nothing fetched, so it works offline and saved to a
%% file) that draws the live heap three ways:
%%
%% <ul>
%% <li>`stack': an icicle graph, the stacks' roots at the top, each box as
%%   wide as the bytes allocated below it;</li>
%% <li>`function': the allocating functions at the top (the frame that
%%   called malloc), their callers below: the widest top box is the
%%   function holding the most live memory;</li>
%% <li>`object': the same with each frame's object (shared library or
%%   executable), repeated objects in a row merged into one.</li>
%% </ul>
%%
%% A search box highlights the boxes whose name contains the text and says
%% how many bytes they cover; a click zooms into a box. After drawing, the
%% body carries `data-ok="1"', `data-view', `data-total' and `data-widest'
%% (the widest top box's name), and `#errors' lists any script error:
%% the test suite reads them from Chromium's `--dump-dom'.
-module(mallocinfo_http_flamegraph).

-export([page/2, page/3, coverage/2]).

%% @equiv page(Folded, Title, <<>>)
-spec page(Folded :: iodata(), Title :: iodata()) -> iodata().
page(Folded, Title) ->
    page(Folded, Title, <<>>).

%% @doc The page for a collapsed-stacks text (see
%% {@link mallocinfo_trace:folded/1}); `Title' is shown as the heading,
%% `Coverage' (see {@link coverage/2}) under it, in `#coverage'.
-spec page(Folded :: iodata(), Title :: iodata(), Coverage :: iodata()) -> iodata().
page(Folded, Title, Coverage) ->
    [<<"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>">>,
     escape(Title), <<"</title>\n">>, style(), <<"</head>\n<body>\n<h1>">>, escape(Title),
     <<"</h1>\n<p id=\"coverage\">">>, escape(Coverage), <<"</p>\n">>, controls(),
     %% A textarea's content is text up to </textarea: escaping & and <
     %% makes any frame name safe (C++ templates are full of <).
     <<"<textarea id=\"folded\" hidden readonly>">>, escape(Folded), <<"</textarea>\n">>,
     script(), <<"</body></html>\n">>].

%% @doc What the graph covers, from the tracker's status and the node's
%% RSS (bytes, or undefined): malloc'ed blocks seen since the tracker
%% started recording, and what it does not show.
-spec coverage(map(), non_neg_integer() | undefined) -> binary().
coverage(Status, Rss) ->
    Since = case Status of
                #{attached_at := At} when is_integer(At) ->
                    ["since attach at ",
                     calendar:system_time_to_rfc3339(At, [{unit, millisecond}, {offset, "Z"}])];
                _ -> "since the node started"
            end,
    Of = case Rss of
             R when is_integer(R), R > 0 -> [" of the node's ", mallocinfo_units:bytes(R), " RSS"];
             _ -> ""
         end,
    Mode = case Status of
               #{mode := sample} -> " (sample mode: estimates)";
               _ -> ""
           end,
    iolist_to_binary(
      ["malloc'ed memory seen ", Since, ": ", mallocinfo_units:bytes(maps:get(live_bytes, Status, 0)),
       " live", Of, Mode, ". ERTS's carriers, libc's free memory and mappings are not drawn: ",
       "mallocinfo:report() accounts for the whole RSS. mallocinfo's own allocations are never "
       "recorded."]).

escape(Text) ->
    Bin = iolist_to_binary(Text),
    case binary:match(Bin, [<<"&">>, <<"<">>, <<">">>, <<"\"">>]) of
        nomatch -> Bin;
        _ -> << <<(escape_char(C))/binary>> || <<C>> <= Bin >>
    end.

escape_char($&) -> <<"&amp;">>;
escape_char($<) -> <<"&lt;">>;
escape_char($>) -> <<"&gt;">>;
escape_char($") -> <<"&quot;">>;
escape_char(C) -> <<C>>.

style() ->
    <<"<style>
body { font: 13px sans-serif; margin: 12px; color: #222; }
h1 { font-size: 16px; margin: 0 0 8px 0; }
#bar { margin-bottom: 8px; }
#bar button.on { font-weight: bold; }
#graph { position: relative; width: 100%; overflow: hidden; }
.f { position: absolute; height: 17px; overflow: hidden; white-space: nowrap; font: 11px monospace;
     line-height: 17px; padding-left: 2px; box-sizing: border-box; border: 1px solid #fff;
     cursor: pointer; }
.f.match { background: #e040e0 !important; color: #fff; }
#info, #matched { margin: 6px 0; min-height: 16px; }
#errors { color: #b00; }
</style>\n">>.

controls() ->
    <<"<div id=\"bar\">
view: <button data-view=\"stack\">by stack</button>
<button data-view=\"function\">by function</button>
<button data-view=\"object\">by object</button>
&nbsp; search: <input id=\"search\" size=\"30\" placeholder=\"function or object name\">
<button id=\"reset\">reset zoom</button>
</div>
<div id=\"info\"></div><div id=\"matched\"></div>
<div id=\"graph\"></div>
<pre id=\"errors\"></pre>\n">>.

script() ->
    [mallocinfo_http_page:script_head(),
     <<"var ROW = 18;
var sites = [];
var total = 0;
var view = 'stack';
var root = null;
var zoom = null;

function parse() {
  var text = document.getElementById('folded').value;
  var lines = text.split('\\n');
  for (var i = 0; i < lines.length; i++) {
    var line = lines[i];
    var sp = line.lastIndexOf(' ');
    if (sp <= 0) continue;
    var bytes = Number(line.slice(sp + 1));
    if (!(bytes > 0)) continue;
    sites.push({ frames: line.slice(0, sp).split(';'), bytes: bytes });
    total += bytes;
  }
}

// 'function (object)' -> [function, object]
function split(frame) {
  var open = frame.lastIndexOf(' (');
  if (open < 0 || frame.charAt(frame.length - 1) !== ')') return [frame, ''];
  return [frame.slice(0, open), frame.slice(open + 2, frame.length - 1)];
}

// The path of boxes a site adds to in a view, top row first.
function path(frames) {
  if (view === 'stack') return frames;
  var out = [];
  for (var i = frames.length - 1; i >= 0; i--) {
    var parts = split(frames[i]);
    var name = view === 'function' ? parts[0] : (parts[1] || parts[0]);
    if (view === 'object' && out.length > 0 && out[out.length - 1] === name) continue;
    out.push(name);
  }
  return out;
}

// Children by name in a Map: in a plain object a function named
// constructor, __proto__ or toString would find an inherited member.
function build() {
  root = { name: 'all', bytes: 0, kids: new Map(), list: null };
  for (var i = 0; i < sites.length; i++) {
    var p = path(sites[i].frames);
    var node = root;
    node.bytes += sites[i].bytes;
    for (var j = 0; j < p.length; j++) {
      var k = node.kids.get(p[j]);
      if (!k) {
        k = { name: p[j], bytes: 0, kids: new Map(), list: null };
        node.kids.set(p[j], k);
      }
      k.bytes += sites[i].bytes;
      node = k;
    }
  }
  zoom = root;
}

function kids(node) {
  if (!node.list) {
    node.list = Array.from(node.kids.values());
    node.list.sort(function (a, b) { return b.bytes - a.bytes || (a.name < b.name ? -1 : 1); });
  }
  return node.list;
}

function hue(name) {
  var h = 0;
  for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
  return h;
}

function color(name) {
  var h = hue(name);
  if (view === 'object') return 'hsl(' + (h % 360) + ',55%,70%)';
  return 'hsl(' + (10 + h % 45) + ',' + (70 + h % 20) + '%,' + (58 + h % 12) + '%)';
}

function human(n) {
  var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  var u = 0;
  while (n >= 1024 && u < units.length - 1) { n /= 1024; u++; }
  return (u === 0 ? String(n) : n.toFixed(2)) + ' ' + units[u];
}

function draw() {
  var graph = document.getElementById('graph');
  graph.textContent = '';
  var width = graph.clientWidth || 1000;
  var scale = zoom.bytes > 0 ? width / zoom.bytes : 0;
  var depth = 0;
  var frag = document.createDocumentFragment();
  function place(node, x, level) {
    var w = node.bytes * scale;
    if (w < 1) return;
    if (level >= 0) {
      var d = document.createElement('div');
      d.className = 'f';
      d.style.left = x + 'px';
      d.style.top = (level * ROW) + 'px';
      d.style.width = w + 'px';
      d.style.background = color(node.name);
      d.textContent = node.name;
      d.title = node.name + ': ' + human(node.bytes) + ' (' +
        (100 * node.bytes / total).toFixed(2) + '% of ' + human(total) + ')';
      d.mi = node;
      d.onclick = function () { zoom = this.mi; draw(); };
      frag.appendChild(d);
      depth = Math.max(depth, level + 1);
    }
    var ks = kids(node);
    for (var i = 0; i < ks.length; i++) {
      place(ks[i], x, level + 1);
      x += ks[i].bytes * scale;
    }
  }
  place(zoom, 0, zoom === root ? -1 : 0);
  graph.appendChild(frag);
  graph.style.height = (depth * ROW + 2) + 'px';
  var buttons = document.querySelectorAll('#bar button[data-view]');
  for (var i = 0; i < buttons.length; i++)
    buttons[i].className = buttons[i].getAttribute('data-view') === view ? 'on' : '';
  document.getElementById('info').textContent = 'live heap: ' + human(total) + ' in ' +
    sites.length + ' call sites; view: by ' + view +
    (zoom === root ? '' : '; zoomed into ' + zoom.name + ' (' + human(zoom.bytes) + ')');
  highlight();
  var top = kids(root);
  document.body.setAttribute('data-view', view);
  document.body.setAttribute('data-total', String(total));
  document.body.setAttribute('data-widest', top.length > 0 ? top[0].name : '');
}

function highlight() {
  var q = document.getElementById('search').value.toLowerCase();
  var boxes = document.querySelectorAll('#graph .f');
  var seen = new Set();
  var bytes = 0;
  for (var i = 0; i < boxes.length; i++) {
    var hit = q !== '' && boxes[i].mi.name.toLowerCase().indexOf(q) >= 0;
    boxes[i].className = hit ? 'f match' : 'f';
    if (hit) seen.add(boxes[i].mi);
  }
  // Bytes under the matches, each counted once: a match inside another
  // match adds nothing.
  function under(node, inside) {
    var hit = seen.has(node);
    if (hit && !inside) bytes += node.bytes;
    var ks = kids(node);
    for (var i = 0; i < ks.length; i++) under(ks[i], inside || hit);
  }
  if (q !== '') under(zoom, false);
  document.getElementById('matched').textContent = q === '' ? '' :
    'matched: ' + human(bytes) + ' (' + (100 * bytes / (total || 1)).toFixed(2) + '%)';
  document.body.setAttribute('data-matched', String(bytes));
}

function show(v) {
  view = v;
  build();
  draw();
}

(function main() {
  parse();
  var params = new URLSearchParams(location.search);
  var v = params.get('view');
  var q = params.get('search');
  if (q) document.getElementById('search').value = q;
  var buttons = document.querySelectorAll('#bar button[data-view]');
  for (var i = 0; i < buttons.length; i++)
    buttons[i].onclick = function () { show(this.getAttribute('data-view')); };
  document.getElementById('search').oninput = highlight;
  document.getElementById('reset').onclick = function () { zoom = root; draw(); };
  window.onresize = draw;
  show(v === 'function' || v === 'object' ? v : 'stack');
  document.body.setAttribute('data-errors', String(errorsSeen.length));
  document.body.setAttribute('data-ok', '1');
})();
</script>\n">>].
