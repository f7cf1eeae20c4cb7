#!/usr/bin/env bash
# Allocation-tracker benchmark: glibc, jemalloc (plain and with its own
# sampling profiler), the mallocinfo interposer in each mode, and heaptrack's
# preload, side by side on one workload (bench_alloc.cpp); then the tracker's
# resident memory per live block and per thread (bench_alloc -m); then what
# one stack capture and one symbolization cost (bench_unwind, bench_symbolize),
# and the live table alone (bench_live_table).
# Prints the table and rewrites the block between the bench markers in
# BENCHMARKS.md. Exits 0 whatever the numbers are (a benchmark reports, it
# does not gate); non-zero only when the benchmark itself cannot run.
#
# Knobs (environment): BENCH_REPS (default 9) runs per cell, median taken;
# BENCH_TARGET_S (default 0.6) seconds the slowest cell of a configuration
# should take, used to size its iteration count; BENCH_ITERS fixes the
# iteration count for every configuration instead; BENCH_MI_SO benchmarks
# another build of the interposer; BENCH_NO_MD=1 leaves BENCHMARKS.md alone.
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$root/c_src/build/bench_alloc
mi_so=${BENCH_MI_SO:-$root/priv/libmallocinfo_preload.so}
ht_so=/usr/lib/heaptrack/libheaptrack_preload.so
je_so=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
# jemalloc's profiler sampling every 512 KiB (2^19 bytes), like our sample mode.
je_prof_conf=prof:true,prof_active:true,lg_prof_sample:19
md=$root/BENCHMARKS.md

reps=${BENCH_REPS:-9}
target_s=${BENCH_TARGET_S:-0.6}
threads_list=(1 2)
depth_list=(12 24)
ring_slots=1024
# Calibration cell: the slowest (2 threads, deepest stack). A first short
# run; when it was too short to time, a second one sized to take ~0.1 s.
cal_t=2
cal_d=24
cal_n=20000

# glibc-control is glibc again, run last in each round: its distance from the
# glibc row is the noise floor the small targets have to be read against.
# mi-attached is mi-full without LD_PRELOAD: bench_alloc dlopen()s the
# interposer and calls the ABI's attach entry (as mallocinfo_trace:attach/0
# does) before its threads start, so the hooks run through patched GOT slots.
configs=(glibc jemalloc jemalloc-prof mi-nomatch mi-off mi-counters mi-sample mi-full
  mi-attached heaptrack glibc-control)

die() {
  echo "bench: $*" >&2
  exit 1
}

[[ $reps =~ ^[1-9][0-9]*$ ]] || die "BENCH_REPS must be a positive integer"
make -s -C "$root/c_src" bench-bin || die "could not build the bench programs (make -C c_src bench-bin)"
[[ -x $bin ]] || die "$bin missing after make bench-bin"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mallocinfo-bench.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT

# A crashing interposer must not leave core files in the tree.
ulimit -c 0
# Only the variables each configuration sets may reach the workload.
unset LD_PRELOAD DUMP_HEAPTRACK_OUTPUT
for v in $(compgen -e); do
  [[ $v == MALLOCINFO_* ]] && unset "$v"
done

# field KEY LINE: the value of KEY=... in a key=value line.
field() {
  local kv
  for kv in $2; do
    if [[ $kv == "$1="* ]]; then
      echo "${kv#*=}"
      return
    fi
  done
}

# run_one CONFIG T D N: one run of the workload. Prints "ok NS NOTE..." or
# "fail REASON...". The checks make sure the row measures what it says: the
# intended library really defines malloc (ld.so ignores an unloadable
# preload with only a message), the interposer is in the requested mode, and
# heaptrack really wrote its trace.
run_one() {
  local cfg=$1 t=$2 d=$3 n=$4
  local -a envs=() args=()
  local provider=libc.so.6 ht_out=$tmp/heaptrack.out
  case $cfg in
    glibc | glibc-control) ;;
    jemalloc) envs=("LD_PRELOAD=$je_so") ;;
    jemalloc-prof) envs=("LD_PRELOAD=$je_so" "MALLOC_CONF=$je_prof_conf") ;;
    mi-nomatch) envs=("LD_PRELOAD=$mi_so" MALLOCINFO_TRACE_EXE=nomatch MALLOCINFO_TRACE=full) ;;
    mi-off | mi-counters | mi-sample | mi-full)
      envs=("LD_PRELOAD=$mi_so" MALLOCINFO_TRACE_EXE=bench_alloc "MALLOCINFO_TRACE=${cfg#mi-}")
      ;;
    # No preload: symbol lookup still finds glibc's malloc (provider
    # libc.so.6); the mode check below proves the attach took.
    mi-attached) args=(-a "$mi_so") ;;
    heaptrack)
      # What /usr/bin/heaptrack does, minus the FIFO and heaptrack_interpret:
      # the preload writes its raw trace to the file DUMP_HEAPTRACK_OUTPUT names.
      rm -f "$ht_out"
      envs=("LD_PRELOAD=$ht_so" "DUMP_HEAPTRACK_OUTPUT=$ht_out")
      ;;
  esac
  [[ $cfg == mi-* && $cfg != mi-attached ]] && provider=libmallocinfo_preload.so
  [[ $cfg == heaptrack ]] && provider=libheaptrack_preload.so
  [[ $cfg == jemalloc* ]] && provider=libjemalloc.so.2

  local out rc
  # timeout outside env: only the workload gets the preload.
  out=$(timeout 300 env "${envs[@]}" "$bin" -t "$t" -d "$d" -n "$n" "${args[@]}" 2>"$tmp/stderr")
  rc=$?
  if ((rc != 0)); then
    local why="exit status $rc"
    ((rc == 124)) && why="timed out"
    ((rc > 128 && rc != 124)) && why="killed by signal $((rc - 128))"
    echo "fail $why: $(head -c 200 "$tmp/stderr" | tr '\n' ' ')"
    return
  fi
  local ns got
  ns=$(field ns_per_pair "$out")
  got=$(field malloc_from "$out")
  if [[ -z $ns ]]; then
    echo "fail no result line: $(head -c 200 <<<"$out" | tr '\n' ' ')"
    return
  fi
  if [[ $got != "$provider" ]]; then
    local msg
    msg=$(grep -m1 -o 'cannot be preloaded.*' "$tmp/stderr")
    echo "fail malloc resolved to $got, not $provider${msg:+ (ld.so: $msg)}"
    return
  fi

  local notes=""
  case $cfg in
    mi-*)
      local mode rec unw live dropped
      mode=$(field mi_mode "$out")
      rec=$(field mi_recording "$out")
      unw=$(field mi_unwinder "$out")
      live=$(field mi_live "$out")
      dropped=$(field mi_dropped "$out")
      if [[ -z $mode ]]; then
        echo "fail interposer loaded but its ABI status is unreadable"
        return
      fi
      if [[ $cfg == mi-nomatch ]]; then
        [[ $rec == 0 ]] || {
          echo "fail MALLOCINFO_TRACE_EXE=nomatch but recording=$rec"
          return
        }
      else
        local want=${cfg#mi-}
        [[ $cfg == mi-attached ]] && want=full
        [[ $mode == "$want" && $rec == 1 ]] || {
          echo "fail asked for $want, interposer reports mode=$mode recording=$rec"
          return
        }
      fi
      [[ ($cfg == mi-full || $cfg == mi-attached) && $unw != cached ]] && notes+=" unwinder=$unw"
      if [[ $cfg == mi-full || $cfg == mi-attached ]]; then
        ((${live:-0} < ring_slots * t)) && notes+=" only ${live:-0} live blocks recorded"
        ((${dropped:-0} > 0)) && notes+=" $dropped dropped"
      fi
      ;;
    heaptrack)
      # Each pair writes a "+ size trace ptr" and a "- ptr" line (~35 bytes).
      local bytes
      bytes=$(stat -c %s "$ht_out" 2>/dev/null || echo 0)
      rm -f "$ht_out"
      if ((bytes < 20 * n * t)); then
        echo "fail heaptrack wrote only $bytes bytes for $((n * t)) pairs"
        return
      fi
      ;;
  esac
  echo "ok $ns$notes"
}

# Iteration count giving about target_s seconds for a cell that took ns/pair.
size_iters() {
  awk -v ns="$1" -v s="$target_s" 'BEGIN {
    n = s * 1e9 / ns; if (n < 10000) n = 10000; if (n > 20000000) n = 20000000;
    p = 10 ^ (int(log(n) / log(10)) - 1); printf "%d\n", int(n / p + 0.5) * p }'
}

declare -A iters skip
echo "bench: calibrating (T=$cal_t D=$cal_d)" >&2
for cfg in "${configs[@]}"; do
  if [[ $cfg == mi-* && ! -e $mi_so ]]; then
    skip[$cfg]="priv/libmallocinfo_preload.so not built"
    continue
  fi
  if [[ $cfg == heaptrack && ! -e $ht_so ]]; then
    skip[$cfg]="$ht_so not installed"
    continue
  fi
  if [[ $cfg == jemalloc* && ! -e $je_so ]]; then
    skip[$cfg]="$je_so not installed"
    continue
  fi
  read -r status rest < <(run_one "$cfg" "$cal_t" "$cal_d" "$cal_n")
  if [[ $status == ok ]] && awk -v ns="${rest%% *}" -v n="$cal_n" 'BEGIN { exit !(ns * n < 5e7) }'; then
    n2=$(awk -v ns="${rest%% *}" 'BEGIN { printf "%d\n", 1e8 / ns }')
    read -r status rest < <(run_one "$cfg" "$cal_t" "$cal_d" "$n2")
  fi
  if [[ $status != ok ]]; then
    skip[$cfg]=$rest
    continue
  fi
  if [[ -n ${BENCH_ITERS:-} ]]; then
    iters[$cfg]=$BENCH_ITERS
  else
    iters[$cfg]=$(size_iters "${rest%% *}")
  fi
done
[[ -z ${skip[glibc]:-} ]] || die "the plain glibc run failed: ${skip[glibc]}"

# Configurations interleave inside each repetition, so drift and noise
# spread over all of them instead of landing on one.
results=$tmp/results # cfg t d ns
failures=$tmp/failures # cfg t d reason
notes=$tmp/notes     # cfg t d note
: >"$results"
: >"$failures"
: >"$notes"
start=$SECONDS
load_start=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load_start" 'BEGIN { exit !(l > 0.5) }'; then
  echo "bench: warning: load average $load_start before starting; other work will skew the numbers" >&2
fi
for ((rep = 1; rep <= reps; rep++)); do
  echo "bench: repetition $rep/$reps" >&2
  for t in "${threads_list[@]}"; do
    for d in "${depth_list[@]}"; do
      for cfg in "${configs[@]}"; do
        [[ -n ${skip[$cfg]:-} ]] && continue
        read -r status rest < <(run_one "$cfg" "$t" "$d" "${iters[$cfg]}")
        if [[ $status == ok ]]; then
          echo "$cfg $t $d ${rest%% *}" >>"$results"
          [[ $rest == *" "* ]] && echo "$cfg $t $d ${rest#* }" >>"$notes"
        else
          echo "$cfg $t $d $rest" >>"$failures"
        fi
      done
    done
  done
done

# Memory: the same live population with and without the tracker. One process
# per cell holds N live 64-byte blocks (bench_alloc -m N, D=12) and reports
# its VmRSS; the tracker's resident memory is the difference from glibc's
# run (all its mappings, fixed part included). Median of mem_reps runs.
mem_reps=${BENCH_MEM_REPS:-3}
mem_counts=(1000 10000 100000 1000000 2000000)
mem_configs=(glibc mi-counters mi-sample mi-full)
mem_table=4194304
mem_results=$tmp/mem # cfg t n rss_kib
: >"$mem_results"
mem_env() {
  case $1 in
    glibc) ;;
    # One live-table capacity for every N, large enough for the largest.
    mi-*) echo "LD_PRELOAD=$mi_so MALLOCINFO_TRACE_EXE=bench_alloc MALLOCINFO_TRACE=${1#mi-} MALLOCINFO_TABLE_SIZE=$mem_table" ;;
  esac
}
mem_one() { # cfg threads count -> "rss_kib dropped" or nothing
  local out
  # shellcheck disable=SC2046
  out=$(timeout 300 env $(mem_env "$1") "$bin" -t "$2" -d 12 -m "$3" 2>/dev/null) || return
  echo "$(field rss_kib "$out") $(field mi_dropped "$out")"
}
echo "bench: memory" >&2
for ((rep = 1; rep <= mem_reps; rep++)); do
  for n in "${mem_counts[@]}"; do
    for cfg in "${mem_configs[@]}"; do
      [[ $cfg == mi-* && -n ${skip[mi-full]:-} ]] && continue
      read -r r dropped < <(mem_one "$cfg" 1 "$n")
      [[ -n $r ]] && echo "$cfg 1 $n $r ${dropped:-0}" >>"$mem_results"
    done
  done
  # Per-thread cost: 200 threads holding one block each vs one thread.
  for cfg in glibc mi-full mi-sample; do
    for t in 1 200; do
      read -r r dropped < <(mem_one "$cfg" "$t" 200)
      [[ -n $r ]] && echo "$cfg $t 200 $r ${dropped:-0}" >>"$mem_results"
    done
  done
done

# What one stack capture and one symbolization cost, apart from any
# allocator (bench_unwind.cpp, bench_symbolize.cpp: each prints key=value
# lines and checks it measured what it says): one run each.
core=$tmp/core.txt
: >"$core"
for b in bench_unwind bench_symbolize; do
  "$root/c_src/build/$b" >>"$core" 2>&1 || echo "$b: failed (exit $?)" >>"$core"
done

# The live table alone (bench_live_table.cpp): its probes behind long-lived
# blocks, in a fragmented heap's steady state and after a peak, and what it
# keeps resident per block; one run.
table=$tmp/table.txt
"$root/c_src/build/bench_live_table" >"$table" 2>&1 || echo "bench_live_table: failed (exit $?)" >>"$table"

core_report() {
  echo "Unwinder and symbolizer on their own (\`c_src/build/bench_unwind\`, \`bench_symbolize\`, one run each; ns and us per call):"
  echo
  sed 's/^/    /' "$core"
  echo
  echo "The live table alone (\`c_src/build/bench_live_table\`, default capacity, one run; ns of table work per operation, medians of 5 batches; resident bytes per live block):"
  echo
  sed 's/^/    /' "$table"
}

mem_report() {
  awk -v counts="${mem_counts[*]}" -v table="$mem_table" '
    function key(c, t, n) { return c SUBSEP t SUBSEP n }
    function median(k,   n, a, i, j, x) {
      n = split(vals[k], a, " ")
      for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { vals[key($1, $2, $3)] = vals[key($1, $2, $3)] " " $4; if ($5 + 0 > 0) drops[key($1, $2, $3)] = $5 }
    END {
      for (k in vals) med[k] = median(k)
      printf "Tracker resident memory (VmRSS with the tracker minus VmRSS of plain glibc holding the same N live 64-byte blocks, one thread, D=12, live-table capacity %d fixed for every N; KiB, medians):\n", table
      print ""
      print "| live blocks | glibc RSS KiB | counters +KiB | sample +KiB | full +KiB | full bytes/block | full target (64 B/block + 2 MiB) | sample target (4 MiB) |"
      print "|---:|---:|---:|---:|---:|---:|---|---|"
      nn = split(counts, ns, " ")
      for (i = 1; i <= nn; i++) {
        n = ns[i]; g = key("glibc", 1, n)
        if (!(g in med)) continue
        row = sprintf("| %d | %d |", n, med[g])
        split("mi-counters mi-sample mi-full", cs, " ")
        for (ci = 1; ci <= 3; ci++) {
          k = key(cs[ci], 1, n)
          row = row ((k in med) ? sprintf(" %+d |", med[k] - med[g]) : " n/a |")
        }
        k = key("mi-full", 1, n)
        if (k in med) {
          extra = (med[k] - med[g]) * 1024
          row = row sprintf(" %.0f | %s |", extra / n, extra <= 64 * n + 2 * 1048576 ? "PASS" : sprintf("MISS (%.1f MiB over)", (extra - 64 * n - 2 * 1048576) / 1048576))
        } else row = row " n/a | n/a |"
        k = key("mi-sample", 1, n)
        row = row ((k in med) ? (((med[k] - med[g]) * 1024 <= 4 * 1048576) ? " PASS |" : " MISS |") : " n/a |")
        if (key("mi-full", 1, n) in drops) row = row sprintf(" full dropped %d blocks (table full): not a valid cell |", drops[key("mi-full", 1, n)])
        print row
      }
      print ""
      split("mi-full mi-sample", cs, " ")
      for (ci = 1; ci <= 2; ci++) {
        c = cs[ci]
        a1 = key(c, 1, 200); a2 = key(c, 200, 200); g1 = key("glibc", 1, 200); g2 = key("glibc", 200, 200)
        if ((a1 in med) && (a2 in med) && (g1 in med) && (g2 in med))
          printf "- Per recording thread (%s): %.1f KiB (200 threads vs 1, each holding one block, minus the same for glibc); a node with 200 threads pays %.1f MiB\n", c, ((med[a2] - med[g2]) - (med[a1] - med[g1])) / 199, ((med[a2] - med[g2]) - (med[a1] - med[g1])) * 200 / 199 / 1024
      }
    }' "$mem_results"
}
elapsed=$((SECONDS - start))
load_end=$(cut -d' ' -f1 /proc/loadavg)

# The report: one markdown table plus the issue's targets, from the medians.
report() {
  local skips="" cfg its=""
  for cfg in "${configs[@]}"; do
    skips+="$cfg=${skip[$cfg]:-}"$'\x1f'
    its+="$cfg=${iters[$cfg]:-}"$'\x1f'
  done
  awk -v configs="${configs[*]}" -v tlist="${threads_list[*]}" -v dlist="${depth_list[*]}" \
    -v skips="$skips" -v its="$its" -v reps="$reps" '
    function key(c, t, d) { return c SUBSEP t SUBSEP d }
    function median(k,   n, a, i, j, x) {
      n = split(vals[k], a, " ")
      for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      lo[k] = a[int(n / 4) + 1]; hi[k] = a[n - int(n / 4)]  # quartiles, near enough
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function have(c, t, d) { return (key(c, t, d) in med) }
    function added(c, t, d) { return med[key(c, t, d)] - med[key("glibc", t, d)] }
    function frac(x) {
      if (x <= 0 || x >= 1) return sprintf("%.3f", x)
      return sprintf("%.3f (1/%s)", x, 1 / x < 10 ? sprintf("%.1f", 1 / x) : sprintf("%.0f", 1 / x))
    }
    function why(c, t, d,   k) {
      if (c in skipped) return skipped[c]
      k = key(c, t, d); return (k in failed) ? failed[k] : "no result"
    }
    function verdict(ok) { return ok ? "PASS" : "MISS" }
    BEGIN {
      nc = split(configs, cfgs, " "); nt = split(tlist, ts, " "); nd = split(dlist, ds, " ")
      n = split(skips, a, "\037"); for (i = 1; i <= n; i++) { p = index(a[i], "="); if (p && substr(a[i], p + 1) != "") skipped[substr(a[i], 1, p - 1)] = substr(a[i], p + 1) }
      n = split(its, a, "\037"); for (i = 1; i <= n; i++) { p = index(a[i], "="); if (p) niters[substr(a[i], 1, p - 1)] = substr(a[i], p + 1) }
    }
    FILENAME ~ /results$/ { vals[key($1, $2, $3)] = vals[key($1, $2, $3)] " " $4; next }
    FILENAME ~ /failures$/ { r = $0; sub(/^[^ ]+ [^ ]+ [^ ]+ /, "", r); failed[key($1, $2, $3)] = r; nfail[key($1, $2, $3)]++; next }
    FILENAME ~ /notes$/ { r = $0; sub(/^[^ ]+ [^ ]+ [^ ]+ /, "", r); note[key($1, $2, $3)] = r; next }
    END {
      for (k in vals) med[k] = median(k)
      print "| config | T | D | iterations | ns/pair (median) | spread | added ns vs glibc | added / heaptrack added | total / glibc | notes |"
      print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
      for (ci = 1; ci <= nc; ci++) for (ti = 1; ti <= nt; ti++) for (di = 1; di <= nd; di++) {
        c = cfgs[ci]; t = ts[ti]; d = ds[di]; k = key(c, t, d)
        if (c in skipped) {  # one row for a configuration that could not run at all
          if (ti == 1 && di == 1) printf "| %s | all | all | | n/a | | | | | %s |\n", c, skipped[c]
          continue
        }
        if (!have(c, t, d)) { printf "| %s | %s | %s | | n/a | | | | | %s |\n", c, t, d, why(c, t, d); continue }
        m = med[k]; g = med[key("glibc", t, d)]
        spread = sprintf("±%.0f%%", 50 * (hi[k] - lo[k]) / m)
        add = (c == "glibc") ? "-" : sprintf("%+.1f", m - g)
        if (c == "glibc") vsht = "-"
        else if (have("heaptrack", t, d) && added("heaptrack", t, d) > 0) vsht = frac(added(c, t, d) / added("heaptrack", t, d))
        else vsht = "n/a"
        nn = note[k]; if (k in nfail) nn = nn (nn == "" ? "" : "; ") nfail[k] " of " reps " runs failed: " failed[k]
        printf "| %s | %s | %s | %s | %.1f | %s | %s | %s | %.2fx | %s |\n", c, t, d, niters[c], m, spread, add, vsht, m / g, nn
      }
      print ""
      print "Targets (issue 12; medians of this run):"
      print ""
      # 1. full vs heaptrack, at D=12, one and two threads.
      line = ""; ok = 1; na = ""
      for (ti = 1; ti <= nt; ti++) {
        t = ts[ti]
        if (!have("mi-full", t, 12)) { na = why("mi-full", t, 12); break }
        if (!have("heaptrack", t, 12)) { na = why("heaptrack", t, 12); break }
        r = added("mi-full", t, 12) / added("heaptrack", t, 12)
        line = line sprintf(" T=%s: %.1f / %.1f ns = %.3f;", t, added("mi-full", t, 12), added("heaptrack", t, 12), r)
        if (r > 1 / 8) ok = 0
      }
      if (na != "") printf "- full added cost <= 1/8 of heaptrack added (D=12): n/a (%s)\n", na
      else printf "- full added cost <= 1/8 of heaptrack added (D=12):%s %s\n", line, verdict(ok)
      # 2. total / glibc limits, every T and D.
      nl = split("mi-sample 1.05 mi-counters 1.05 mi-off 1.05 mi-nomatch 1.05", lim, " ")
      for (li = 1; li <= nl; li += 2) {
        c = lim[li]; x = lim[li + 1] + 0; line = ""; ok = 1; na = ""
        for (ti = 1; ti <= nt; ti++) for (di = 1; di <= nd; di++) {
          t = ts[ti]; d = ds[di]
          if (!have(c, t, d)) { na = why(c, t, d); break }
          r = med[key(c, t, d)] / med[key("glibc", t, d)]
          line = line sprintf(" T=%s D=%s: %.3fx;", t, d, r)
          if (r > x) ok = 0
        }
        if (na != "") printf "- %s <= %.2fx glibc: n/a (%s)\n", c, x, na
        else printf "- %s <= %.2fx glibc:%s %s\n", c, x, line, verdict(ok)
      }
      # 3. Moonshot: the added ns of sample beside that of jemalloc-prof over plain jemalloc.
      line = ""; na = ""
      for (ti = 1; ti <= nt; ti++) for (di = 1; di <= nd; di++) {
        t = ts[ti]; d = ds[di]
        if (!have("mi-sample", t, d) || !have("jemalloc-prof", t, d) || !have("jemalloc", t, d)) { na = "a configuration did not run"; break }
        line = line sprintf(" T=%s D=%s: %+.1f vs %+.1f ns;", t, d, added("mi-sample", t, d), med[key("jemalloc-prof", t, d)] - med[key("jemalloc", t, d)])
      }
      if (na != "") printf "- (moonshot) sample added vs jemalloc-prof added over jemalloc: n/a (%s)\n", na
      else printf "- (moonshot) sample added vs jemalloc-prof added over jemalloc:%s\n", line
      # 4. Issue 11: attached hooks cost what the preloaded ones cost, within 5%.
      line = ""; ok = 1; na = ""
      for (ti = 1; ti <= nt; ti++) for (di = 1; di <= nd; di++) {
        t = ts[ti]; d = ds[di]
        if (!have("mi-attached", t, d)) { na = why("mi-attached", t, d); break }
        if (!have("mi-full", t, d)) { na = why("mi-full", t, d); break }
        r = med[key("mi-attached", t, d)] / med[key("mi-full", t, d)]
        line = line sprintf(" T=%s D=%s: %.3fx;", t, d, r)
        if (r > 1.05) ok = 0
      }
      if (na != "") printf "- (issue 11) mi-attached <= 1.05x mi-full (preloaded): n/a (%s)\n", na
      else printf "- (issue 11) mi-attached <= 1.05x mi-full (preloaded):%s %s\n", line, verdict(ok)
      # The noise floor: the same glibc run twice.
      line = ""
      for (ti = 1; ti <= nt; ti++) {
        t = ts[ti]
        if (have("glibc-control", t, 12)) line = line sprintf(" T=%s: %.3fx;", t, med[key("glibc-control", t, 12)] / med[key("glibc", t, 12)])
      }
      if (line != "") printf "- (noise floor, not a target) glibc-control / glibc:%s\n", line
      # 3. thread scaling of the added cost.
      nl = split("mi-full mi-sample mi-counters", sc, " ")
      for (li = 1; li <= nl; li++) {
        c = sc[li]
        if (!have(c, 1, 12) || !have(c, 2, 12)) { printf "- %s: 2-thread added <= 1.3x 1-thread added: n/a (%s)\n", c, why(c, have(c, 1, 12) ? 2 : 1, 12); continue }
        a1 = added(c, 1, 12); a2 = added(c, 2, 12)
        if (a1 > 0) printf "- %s: 2-thread added <= 1.3x 1-thread added: %.1f / %.1f ns = %.2fx %s\n", c, a2, a1, a2 / a1, verdict(a2 <= 1.3 * a1)
        else printf "- %s: 2-thread added <= 1.3x 1-thread added: %.1f vs %.1f ns (1-thread added <= 0, within noise) %s\n", c, a2, a1, verdict(a2 <= 0)
      }
    }' "$results" "$failures" "$notes"
}

machine() {
  local cpu kernel libc libcpkg htver gxx rev
  cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
  kernel=$(uname -r)
  libc=$(getconf GNU_LIBC_VERSION 2>/dev/null)
  libcpkg=$(dpkg-query -W -f '${Version}' libc6 2>/dev/null)
  htver=$(dpkg-query -W -f '${Version}' heaptrack 2>/dev/null)
  gxx=$(g++ -dumpfullversion 2>/dev/null)
  rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null)
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- CPU: ${cpu:-unknown}, $(nproc) cores (lscpu: $(lscpu 2>/dev/null | sed -n 's/^CPU(s):[[:space:]]*//p' | head -1) CPUs)"
  echo "- Kernel: $kernel; ${libc:-glibc ?}${libcpkg:+ (Debian $libcpkg)}; g++ ${gxx:-?}"
  echo "- heaptrack: ${htver:-not installed}; mallocinfo commit: ${rev:-unknown} (plus any uncommitted changes)"
  echo "- $reps runs per cell, interleaved, median shown; spread = ±half the interquartile range, relative to the median"
  echo "- Wall time ${elapsed}s; 1-minute load average ${load_start} before, ${load_end} after (the benchmark itself keeps up to 2 cores busy)"
}

block=$tmp/block.md
{
  echo "## Results"
  echo
  machine
  echo
  report
  echo
  mem_report
  echo
  core_report
} >"$block"

echo
cat "$block"

if [[ ${BENCH_NO_MD:-} != 1 ]]; then
  new=$tmp/BENCHMARKS.md
  if [[ -f $md ]] && grep -q '^<!-- bench:begin -->' "$md" && grep -q '^<!-- bench:end -->' "$md"; then
    awk -v blockfile="$block" '
      /^<!-- bench:begin -->/ { print; while ((getline l < blockfile) > 0) print l; skipping = 1; next }
      /^<!-- bench:end -->/ { skipping = 0 }
      !skipping { print }' "$md" >"$new"
  else
    { [[ -f $md ]] && cat "$md" && echo; echo "<!-- bench:begin -->"; cat "$block"; echo "<!-- bench:end -->"; } >"$new"
  fi
  cp "$new" "$md" && echo && echo "bench: results written to $md"
fi
exit 0
