#!/usr/bin/env bash
# What churn (issue 26: per-site allocated/freed counters, lifetimes,
# temporary allocations) adds to the hooks. Two tables:
#  1. instructions per malloc+free pair of bench_alloc (one thread, D=12)
#     under callgrind, which the machine's load does not move: the
#     difference of 220,000 and 20,000 iterations over 200,000; for glibc
#     alone and the interposer in `sample' and `full' (and `full' with two
#     call sites in turn, which a per-thread stack memo cannot help), this
#     build's and, when BASE_SO names one, an older build's interposer
#     (say, main's before churn) for the same workload binary;
#  2. wall-clock ns per pair in `full' at 1 and 2 threads (bench_alloc's
#     threads all allocate from one call stack: one hot site, whose churn
#     slot the threads share), ROUNDS alternating runs each, medians: the
#     cost of the contended atomics (noisy on a shared machine).
#
# Usage: BASE_SO=/path/to/old/libmallocinfo_preload.so c_src/bench/churn.sh
# Knobs: ROUNDS (default 5), ITERS (default 2000000, table 2).
# A benchmark reports, it does not gate: exits 0 whatever the numbers.
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$root/c_src/build/bench_alloc
so=$root/priv/libmallocinfo_preload.so
base=${BASE_SO:-}
rounds=${ROUNDS:-5}
iters=${ITERS:-2000000}

die() {
  echo "churn bench: $*" >&2
  exit 1
}

make -s -C "$root/c_src" bench-bin >/dev/null || die "make -C c_src bench-bin failed"
[[ -x $bin && -f $so ]] || die "no $bin or $so"
command -v valgrind >/dev/null || die "valgrind is not installed"

# env for a configuration: glibc | <so>:<mode>
envs() {
  case $1 in
    glibc) echo "MALLOCINFO_UNUSED=1" ;;
    *) echo "LD_PRELOAD=${1%:*} MALLOCINFO_TRACE_EXE=bench_alloc MALLOCINFO_TRACE=${1##*:}" ;;
  esac
}
collected() {  # config iterations sites -> instructions callgrind collected
  # shellcheck disable=SC2046
  env $(envs "$1") valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    "$bin" -t 1 -d 12 -s "$3" -n "$2" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
per_pair() {  # config [sites]
  local a b
  a=$(collected "$1" 20000 "${2:-1}") b=$(collected "$1" 220000 "${2:-1}")
  [[ -n $a && -n $b ]] || { echo "failed"; return; }
  echo $(((b - a) / 200000))
}

echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "| interposer | glibc | sample (512 KiB) | full | full, two call sites in turn (-s 2) |"
echo "|---|---:|---:|---:|---:|"
g=$(per_pair glibc)
for s in ${base:+"$base"} "$so"; do
  label=this
  [[ $s == "$base" ]] && label="base ($s)"
  echo "| $label | $g | $(per_pair "$s:sample") | $(per_pair "$s:full") | $(per_pair "$s:full" 2) |"
done

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
wall() {  # config threads -> ns_per_pair
  # shellcheck disable=SC2046
  env $(envs "$1") "$bin" -t "$2" -d 12 -n "$iters" | sed -n 's/.*ns_per_pair=\([0-9.]*\).*/\1/p'
}
echo
echo "full, wall clock ns per pair (median of $rounds, the interposers alternating; all threads"
echo "on one call site):"
echo "| interposer | 1 thread | 2 threads |"
echo "|---|---:|---:|"
declare -A runs
sos=(${base:+"$base"} "$so")
for ((i = 0; i < rounds; i++)); do
  for k in "${!sos[@]}"; do
    runs[$k,1]+="$(wall "${sos[$k]}:full" 1) "
    runs[$k,2]+="$(wall "${sos[$k]}:full" 2) "
  done
done
for k in "${!sos[@]}"; do
  label=this
  [[ ${sos[$k]} == "$base" ]] && label=base
  one=$(tr ' ' '\n' <<<"${runs[$k,1]}" | grep . | median)
  two=$(tr ' ' '\n' <<<"${runs[$k,2]}" | grep . | median)
  echo "| $label | $one (${runs[$k,1]% }) | $two (${runs[$k,2]% }) |"
done
