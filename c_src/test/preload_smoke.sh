#!/bin/sh
# Runs ordinary programs under the interposer in full mode with recording
# forced on for every executable (MALLOCINFO_TRACE_EXE='*'): each must
# behave exactly as without it. Then the concurrency stress binary, and the
# lock-order stress (allocations inside dl_iterate_phdr callbacks and from
# new call sites, 10 s, a watchdog ends it on a deadlock), and the
# byte-counter balance in full, counters and sample modes.
# Prints "preload_smoke: N passed, N failed" and fails if any failed.
set -u
so=$(cd "$(dirname "$0")/../../priv" && pwd)/libmallocinfo_preload.so
build=$(cd "$(dirname "$0")/.." && pwd)/build
passed=0
failed=0

run() {
  expected=$1
  shift
  out=$(LD_PRELOAD=$so MALLOCINFO_TRACE=full MALLOCINFO_TRACE_EXE='*' "$@" 2>&1)
  rc=$?
  if [ $rc -eq 0 ] && [ "$out" = "$expected" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "preload_smoke: FAILED: $* (rc=$rc): $out" >&2
  fi
}

run "hi" sh -c 'echo hi'
run "3" bash -c 'printf "a\nb\nc\n" | sort | wc -l'
run "4950" python3 -c 'print(sum(range(100)))'
run "$(git --version)" git --version
run "$(ls -a /)" ls -a /
run "ok" erl -noshell -eval 'io:format("ok~n"), halt().'
# Recording only in the emulator (the default glob): erl -> erlexec ->
# beam.smp keeps LD_PRELOAD along the way, and beam.smp records.
out=$(LD_PRELOAD=$so erl -noshell -eval '
  F = fun() -> case os:getenv("LD_PRELOAD") of false -> no; _ -> yes end end,
  io:format("~s~n", [F()]), halt().' 2>&1)
if [ "$out" = "yes" ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "preload_smoke: FAILED: LD_PRELOAD lost on the way to beam.smp: $out" >&2; fi

if LD_PRELOAD=$so MALLOCINFO_TRACE_EXE=stress_preload "$build/stress_preload"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "preload_smoke: FAILED: stress_preload" >&2
fi
if LD_PRELOAD=$so MALLOCINFO_TRACE_EXE=stress_loader_lock "$build/stress_loader_lock" 10; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "preload_smoke: FAILED: stress_loader_lock" >&2
fi
# The mmap family: the region table against /proc/self/maps (issue 14).
if LD_PRELOAD=$so MALLOCINFO_TRACE=full MALLOCINFO_TRACE_EXE=stress_mmap "$build/stress_mmap"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "preload_smoke: FAILED: stress_mmap" >&2
fi
# Byte counters that balance (and reset() giving pages back, in full mode).
for mode in full counters sample; do
  if LD_PRELOAD=$so MALLOCINFO_TRACE_EXE=drift_preload MALLOCINFO_TRACE=$mode "$build/drift_preload"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "preload_smoke: FAILED: drift_preload ($mode)" >&2
  fi
done
echo "preload_smoke: $passed passed, $failed failed"
[ $failed -eq 0 ]
