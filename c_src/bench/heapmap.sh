#!/usr/bin/env bash
# Heap-map benchmark: dump (and, when the renderer is present, render) a
# fragmented glibc heap of about 1 GB with millions of chunks, on a live
# node whose normal schedulers are watched while the dump runs. Rewrites the
# block between the heapmap markers in BENCHMARKS.md (BENCH_NO_MD=1: don't).
# Reports, never gates: exits non-zero only when the benchmark cannot run.
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
md=$root/BENCHMARKS.md
ebin=$root/_build/default/lib/mallocinfo/ebin
threads=${HEAPMAP_THREADS:-4}
blocks=${HEAPMAP_BLOCKS:-900000}
size=${HEAPMAP_SIZE:-256}

die() {
  echo "heapmap bench: $*" >&2
  exit 1
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mallocinfo-heapmap.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT
erts=$(erl -noshell -eval 'io:format("~ts/erts-~ts/include", [code:root_dir(), erlang:system_info(version)]), halt().')
cc -O1 -g -fPIC -shared -pthread -I"$erts" -I"$root/test/include" -o "$tmp/mi_frag_nif.so" \
  "$root/test/mallocinfo_heap_SUITE_data/mi_frag_nif.c" || die "cannot build the fragmenting NIF"
erlc -I "$root/test/include" -o "$tmp" "$root/test/mallocinfo_heap_SUITE_data/mi_frag_nif.erl" || die "erlc failed"

# In the node: fragment (threads x blocks of `size` bytes, every other one
# freed), then dump three times while a normal-scheduler process measures
# the longest gap between its 1 ms ticks; the same for summary() and render.
cat >"$tmp/bench.erl" <<'ERL'
-module(bench).
-export([main/1]).
main([Dir, T, N, S]) ->
    c:l(mallocinfo),
    ok = mi_frag_nif:fragment(list_to_integer(T), list_to_integer(N), list_to_integer(S), 2),
    Path = filename:join(Dir, "heap.heapdump"),
    Dumps = [watch(fun() -> mallocinfo_heap:dump(Path) end) || _ <- lists:seq(1, 3)],
    Sums = [watch(fun() -> mallocinfo_heap:summary() end) || _ <- lists:seq(1, 3)],
    {_, _, IdleGap} = watch(fun() -> timer:sleep(600) end),
    {_, {ok, S0}, _} = hd(Dumps),
    Render = case erlang:function_exported(mallocinfo_heapmap, render, 2)
                 orelse code:ensure_loaded(mallocinfo_heapmap) =:= {module, mallocinfo_heapmap} of
                 true ->
                     Out = filename:join(Dir, "render"),
                     {RUs, RRes} = timer:tc(fun() -> mallocinfo_heap:render(Path, Out) end),
                     case RRes of
                         {ok, Files} ->
                             Bytes = lists:sum([filelib:file_size(F) || F <- Files]),
                             {RUs div 1000, length(Files), Bytes};
                         Err -> {error, Err}
                     end;
                 false -> none
             end,
    Med = fun(L) -> lists:nth(2, lists:sort(L)) end,
    #{total := Tot} = S0,
    io:format("rss=~b system=~b in_use=~b chunks=~b file=~b~n",
              [mallocinfo_nif:rss(),
               maps:get(system_bytes, Tot), maps:get(in_use_bytes, Tot),
               maps:get(chunks, S0), maps:get(file_bytes, S0)]),
    io:format("dump_ms=~b walk_ms=~b fork_us=~b gap_ms=~b~n",
              [Med([W || {W, _, _} <- Dumps]),
               Med([maps:get(walk_ms, R) || {_, {ok, R}, _} <- Dumps]),
               Med([maps:get(fork_us, R) || {_, {ok, R}, _} <- Dumps]),
               lists:max([G || {_, _, G} <- Dumps])]),
    io:format("summary_ms=~b summary_gap_ms=~b idle_gap_ms=~b~n",
              [Med([W || {W, _, _} <- Sums]), lists:max([G || {_, _, G} <- Sums]), IdleGap]),
    case Render of
        {Ms, NF, B} -> io:format("render_ms=~b render_files=~b render_bytes=~b~n", [Ms, NF, B]);
        _ -> io:format("render=none~n")
    end,
    halt().

%% Runs F while a process on a normal scheduler sleeps 1 ms at a time and
%% records the longest gap it saw: what the dump costs the node's schedulers.
watch(F) ->
    Self = self(),
    W = spawn(fun() -> tick(erlang:monotonic_time(microsecond), 0, Self) end),
    {Us, Res} = timer:tc(F),
    W ! stop,
    Gap = receive {gap, G} -> G end,
    {Us div 1000, Res, (Gap + 999) div 1000 - 1}.

tick(Last, Max, Parent) ->
    receive stop -> Parent ! {gap, Max}
    after 1 ->
        Now = erlang:monotonic_time(microsecond),
        tick(Now, max(Max, Now - Last), Parent)
    end.
ERL
erlc -o "$tmp" "$tmp/bench.erl" || die "erlc bench failed"
start=$(date +%s)
out=$(erl -noshell -pa "$ebin" -pa "$tmp" -run bench main "$tmp" "$threads" "$blocks" "$size" 2>&1) ||
  die "node failed: $out"
wall=$(($(date +%s) - start))
echo "$out"
val() { grep -o "$1=[0-9]*" <<<"$out" | head -1 | cut -d= -f2; }
mib() { awk -v b="$1" 'BEGIN { if (b >= 1048576) printf "%.0f MiB", b / 1048576; else printf "%.0f KiB", b / 1024 }'; }

render_line="- render: not measured (renderer not built)"
if [[ -n $(val render_ms) ]]; then
  render_line="- \`render/2\` of that dump: $(val render_ms) ms, $(val render_files) files, $(mib "$(val render_bytes)")"
fi
block=$(
  cat <<MD
<!-- heapmap:begin -->
## Heap map: dump and render

- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}'), OTP $(erl -noshell -eval 'io:format("~s", [erlang:system_info(otp_release)]), halt().'); wall time ${wall}s
- Heap: $threads threads × $blocks blocks of $size bytes, every other one freed (fragmented on purpose): RSS $(mib "$(val rss)"), glibc system $(mib "$(val system)"), in use $(mib "$(val in_use)"), $(val chunks) chunks
- \`dump/1\`: $(val dump_ms) ms wall (median of 3), of which the child's walk and write $(val walk_ms) ms; file $(mib "$(val file)") ($(awk -v f="$(val file)" -v c="$(val chunks)" 'BEGIN { printf "%.1f", f / c }') bytes per chunk)
- Parent held by \`fork()\`: $(val fork_us) µs (median); longest gap seen by a process ticking every 1 ms on a normal scheduler during the dumps: $(val gap_ms) ms (the same process while the node idles: $(val idle_gap_ms) ms)
- \`summary/0\` (walk, no file): $(val summary_ms) ms; longest scheduler gap $(val summary_gap_ms) ms
$render_line
<!-- heapmap:end -->
MD
)
if [[ ${BENCH_NO_MD:-0} != 1 ]]; then
  if grep -q '<!-- heapmap:begin -->' "$md"; then
    awk -v block="$block" '
      /<!-- heapmap:begin -->/ { print block; skip = 1; next }
      /<!-- heapmap:end -->/ { skip = 0; next }
      !skip { print }' "$md" >"$md.tmp" && mv "$md.tmp" "$md"
  else
    printf '\n%s\n' "$block" >>"$md"
  fi
fi
echo "$block"
