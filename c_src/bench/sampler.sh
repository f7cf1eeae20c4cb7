#!/usr/bin/env bash
# The sampler's cost (issue 24): on a node with 100k processes and 10k ETS
# tables, what one sample of every layer takes, what a culprit search takes
# (when a layer grows: at most once a minute per layer), and what the
# sampler costs at its default period (10 s), as a share of one core: from
# its own timings, and from the node's CPU time (utime + stime in
# /proc/self/stat) over the same window with and without it. Rewrites the
# block between the sampler markers in BENCHMARKS.md (BENCH_NO_MD=1:
# don't). Reports, never gates.
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
md=$root/BENCHMARKS.md
ebin=$root/_build/default/lib/mallocinfo/ebin
procs=${SAMPLER_PROCS:-100000}
tables=${SAMPLER_TABLES:-10000}
window=${SAMPLER_SECONDS:-120}

die() {
  echo "sampler bench: $*" >&2
  exit 1
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mallocinfo-sampler.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/sampler_bench.erl" <<'ERL'
-module(sampler_bench).
-export([main/1]).
main([P, T, W]) ->
    Procs = [spawn(fun() -> receive stop -> ok end end) || _ <- lists:seq(1, list_to_integer(P))],
    Tabs = [begin Tab = ets:new(t, [public]), ets:insert(Tab, [{I, I} || I <- lists:seq(1, 10)]), Tab end
            || _ <- lists:seq(1, list_to_integer(T))],
    Window = list_to_integer(W) * 1000,
    {module, _} = code:ensure_loaded(mallocinfo),
    _ = mallocinfo_layers:sample(),
    Totals = median([us(fun() -> mallocinfo_layers:sample() end) || _ <- lists:seq(1, 21)]),
    Search = median([us(fun() -> mallocinfo_layers:sample(#{culprits => [binary, processes, ets]}) end)
                     || _ <- lists:seq(1, 3)]),
    %% The node alone, then with the sampler, for the same window.
    Idle = cpu_ms(fun() -> timer:sleep(Window) end),
    ok = mallocinfo:watch(),
    %% The first sample searches every layer's culprits: measured apart,
    %% the steady state after it.
    #{count := C1, mean_us := M1, last_us := First} = first_sample(),
    Watched = cpu_ms(fun() -> timer:sleep(Window) end),
    {ok, #{cost := Cost, ring := Ring}} = mallocinfo:history(),
    #{count := C2, mean_us := M2} = Cost,
    Steady = (M2 * C2 - M1 * C1) div max(1, C2 - C1),
    ok = mallocinfo:unwatch(),
    io:format("procs=~b~ntables=~b~nprocess_count=~b~nets_count=~b~ntotals_us=~b~nsearch_us=~b~n"
              "idle_cpu_ms=~b~nwatched_cpu_ms=~b~nwindow_ms=~b~nsamples=~b~nmean_us=~b~n"
              "last_us=~b~nmax_us=~b~nring_bytes=~b~nfirst_us=~b~nsteady_us=~b~nsteady_samples=~b~n",
              [length(Procs), length(Tabs), erlang:system_info(process_count),
               length(ets:all()), Totals, Search, Idle, Watched, Window,
               maps:get(count, Cost), maps:get(mean_us, Cost), maps:get(last_us, Cost),
               maps:get(max_us, Cost), maps:get(memory_bytes, Ring), First, Steady, C2 - C1]).

first_sample() ->
    case mallocinfo:history() of
        {ok, #{cost := #{count := N} = C}} when N >= 1 -> C;
        _ -> timer:sleep(100), first_sample()
    end.

us(F) -> {Us, _} = timer:tc(F), Us.
median(L) -> lists:nth((length(L) + 1) div 2, lists:sort(L)).

%% The node's CPU time (user + system, all threads) spent while F runs.
cpu_ms(F) -> A = cpu(), F(), cpu() - A.
cpu() ->
    {ok, Stat} = file:read_file("/proc/self/stat"),
    [_, After] = binary:split(Stat, <<") ">>),
    Fields = binary:split(After, <<" ">>, [global]),
    Ticks = binary_to_integer(lists:nth(12, Fields)) + binary_to_integer(lists:nth(13, Fields)),
    Ticks * 1000 div list_to_integer(string:trim(os:cmd("getconf CLK_TCK"))).
ERL
erlc -o "$tmp" "$tmp/sampler_bench.erl" || die "erlc failed"

start=$(date +%s)
out=$(erl -noshell +P 400000 -pa "$ebin" "$tmp" \
  -eval "sampler_bench:main([\"$procs\", \"$tables\", \"$window\"]), halt()." 2>&1) || die "the node failed: $out"
wall=$(($(date +%s) - start))
echo "$out"
val() { printf '%s\n' "$out" | sed -n "s/^$1=//p"; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f%%", 100 * a / b }'; }

block=$(cat <<EOF
<!-- sampler:begin -->
## The sampler (\`mallocinfo:watch()\`, issue 24)

- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}'), OTP $(erl -noshell -eval 'io:format("~s", [erlang:system_info(otp_release)]), halt().'); wall time ${wall}s; shared machine
- Node: $(val process_count) processes, $(val ets_count) ETS tables (10 objects each)
- One sample of every layer's totals (\`mallocinfo_layers:sample()\`: statm, smaps grouped, \`erlang:memory()\`, every allocator's sizes, \`mallinfo2\`): $(val totals_us) µs wall (median of 21)
- A culprit search of binaries, processes and ETS (when a layer grew: at most once a minute per layer): $(val search_us) µs wall (median of 3)
- At the default period (10 s), after the first sample (which searches every layer's culprits: $(val first_us) µs): $(val steady_samples) samples in $(( $(val window_ms) / 1000 )) s, $(val steady_us) µs each on average (the mappings are read once a minute, in one sample of six), **$(pct "$(val steady_us)" 10000000) of one core** by the sampler's own timings (wall time, an upper bound on its CPU); longest sample $(val max_us) µs
- The node's CPU time over that window: $(val idle_cpu_ms) ms without the sampler, $(val watched_cpu_ms) ms with it ($(pct "$(( $(val watched_cpu_ms) - $(val idle_cpu_ms) ))" "$(val window_ms)") of one core more; clock ticks of 10 ms on a shared machine: the sampler's own timings are the finer figure)
- Ring: $(val ring_bytes) bytes after those samples (a full ring at 10 s: 808 KB for 45 layers, \`mallocinfo_watch_ring_tests\`)
<!-- sampler:end -->
EOF
)

if [ "${BENCH_NO_MD:-}" != 1 ]; then
  if grep -q '<!-- sampler:begin -->' "$md"; then
    awk -v block="$block" '
      /<!-- sampler:begin -->/ { print block; skip = 1; next }
      /<!-- sampler:end -->/ { skip = 0; next }
      !skip { print }' "$md" >"$md.tmp" && mv "$md.tmp" "$md"
  else
    printf '\n%s\n' "$block" >>"$md"
  fi
fi
