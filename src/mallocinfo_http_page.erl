%% @private What the HTTP endpoint's self-contained pages (the flame graph,
%% the timeline) share: the opening of their script, which records every
%% script error on the page itself (`data-errors' on `<body>', the text in
%% `#errors'), so that a test in headless Chromium reads them from the DOM.
-module(mallocinfo_http_page).

-export([script_head/0]).

%% @doc `<script>', strict mode and the error hook; the page's own script
%% follows, then `</script>'. The page must have an element `#errors'.
-spec script_head() -> binary().
script_head() ->
    <<"<script>
'use strict';
var errorsSeen = [];
window.onerror = function (msg, src, line) {
  errorsSeen.push(msg + ' (line ' + line + ')');
  document.getElementById('errors').textContent = errorsSeen.join('\\n');
  document.body.setAttribute('data-errors', String(errorsSeen.length));
};
">>.
