#!/usr/bin/env bash
# The Erlang context's cost per recorded allocation: a NIF
# (test/mallocinfo_context_SUITE_data/mi_ctx_nif.c) called from Erlang
# allocates BLOCKS blocks of 64 bytes on a dirty scheduler, then frees
# them, ROUNDS times, in a node preloaded with the tracker, once with the
# context off (never enabled) and once on (mallocinfo_trace_context:
# enable/0), in `full' and in `sample' (the default 512 KiB mean: nearly
# every allocation takes the unsampled path). Prints, per mode, the median
# ns per malloc+free over the rounds, off and on, and their ratio; and the
# memory the context takes per stored stack and per live block.
#
# Usage: c_src/bench/context.sh [APP_DIR]   (default: this checkout's build)
# Knobs (environment): ROUNDS (default 15), BLOCKS (default 50000), PAIRS
# (default 3).
# A benchmark reports, it does not gate: exits 0 whatever the numbers.
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
app=${1:-$root/_build/default/lib/mallocinfo}
rounds=${ROUNDS:-15}
blocks=${BLOCKS:-50000}

die() {
  echo "context bench: $*" >&2
  exit 1
}

[[ -d $app/ebin && -f $app/priv/libmallocinfo_preload.so ]] || die "no ebin/ and priv/ under $app"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mallocinfo-context.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT
data=$root/test/mallocinfo_context_SUITE_data
erts=$(erl -noshell -eval 'io:format("~ts/erts-~ts/include", [code:root_dir(), erlang:system_info(version)]), halt().')
# The held-blocks array must take BLOCKS.
cc -O2 -g -fPIC -shared -pthread -I"$erts" -I"$root/test/include" -o "$tmp/mi_ctx_nif.so" \
  "$data/mi_ctx_nif.c" || die "cc failed"
erlc -I "$root/test/include" -o "$tmp" "$data/mi_ctx_nif.erl" || die "erlc failed"

echo "app: $app; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $blocks blocks x $rounds rounds"
printf '| mode | context off, ns/alloc+free | context on | on/off |\n|---|---|---|---|\n'
# Off and on alternate (PAIRS times, each a fresh node), so that a drift
# in the machine's speed hits both; each figure is the median of its runs'
# medians.
pairs=${PAIRS:-3}
run() {  # mode ctx: one node's median ns per alloc+free, and its context state
  MALLOCINFO_TRACE=$1 LD_PRELOAD=$app/priv/libmallocinfo_preload.so erl -noshell \
    -pa "$app/ebin" -pa "$tmp" -eval "
      case '$2' of on -> ok = mallocinfo_trace_context:enable(); off -> ok end,
      {module, _} = code:ensure_loaded(mi_ctx_nif),
      N = $blocks,
      Round = fun() ->
                  {T, ok} = timer:tc(fun() -> ok = mi_ctx_nif:leak_dirty(N, 64),
                                              ok = mi_ctx_nif:release() end),
                  T * 1000 / N
              end,
      _ = Round(),
      Times = lists:sort([Round() || _ <- lists:seq(1, $rounds)]),
      #{erlang_context := C} = mallocinfo_trace:status(),
      io:format(\"~.1f ~s~n\", [lists:nth(($rounds + 1) div 2, Times), C]),
      halt()." || echo "0 failed"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for mode in full sample; do
  offs=() ons=() bad=0
  for ((i = 0; i < pairs; i++)); do
    read -r t c <<<"$(run "$mode" off)"; [[ $c == off ]] || bad=1; offs+=("$t")
    read -r t c <<<"$(run "$mode" on)"; [[ $c == on ]] || bad=1; ons+=("$t")
  done
  if ((bad)); then echo "| $mode | a run failed | | |"; continue; fi
  off=$(printf '%s\n' "${offs[@]}" | median)
  on=$(printf '%s\n' "${ons[@]}" | median)
  ratio=$(awk -v a="$off" -v b="$on" 'BEGIN { printf "%.2f", b / a }')
  echo "| $mode | $off (${offs[*]}) | $on (${ons[*]}) | ${ratio}x |"
done
# The tracker alone (c_src/build/bench_context, make -C c_src bench-bin):
# instructions per malloc+free pair under callgrind, which the machine's
# load does not move: the difference of 220,000 and 20,000 pairs. `on' is
# a NIF allocating in a loop (the thread's context cache answers), `miss'
# the first allocation of a NIF call from the same loop (a y register
# changed: the cache checks the words that differ), `other' another
# process running the same code (the cache checks its stack in place).
bench=$root/c_src/build/bench_context
if command -v valgrind >/dev/null && { [[ -x $bench ]] || make -s -C "$root/c_src" build/bench_context; }; then
  count() {  # ctx iterations
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bench" "$1" "$2" 2>&1 |
      sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
  }
  for ctx in off on miss other; do
    a=$(count "$ctx" 20000) b=$(count "$ctx" 220000)
    eval "ins_$ctx=$(( (b - a) / 200000 ))"
  done
  echo
  echo "tracker alone (fake unwinder of 12 frames, fake scheduler): instructions per malloc+free"
  echo "pair: context off $ins_off; on, cache answering $ins_on (+$((ins_on - ins_off)));" \
    "on, a y register changed $ins_miss (+$((ins_miss - ins_off)));" \
    "on, another process running the same code $ins_other (+$((ins_other - ins_off)))"
fi
echo
echo "memory: a stored stack has room for its Erlang context (MI_CONTEXT_MAX_WORDS = 12 words:"
echo "96 bytes per stack-table slot) and its token (8 bytes); a live block carries its process"
echo "(8 bytes per live-table slot)."
