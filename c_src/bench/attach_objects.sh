#!/usr/bin/env bash
# attach() duration with ~100 objects loaded: builds 100 small shared
# objects (each calling malloc, calloc, realloc and free through its PLT)
# in a scratch directory, dlopen()s them all in bench_alloc, attaches, and
# prints bench_alloc's line (attach_us=, objects_loaded=) for each of
# BENCH_REPS runs (default 5). Reports; never gates.
set -eu -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
make -s -C "$root/c_src" bench-bin all
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mallocinfo-attach-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for i in $(seq -w 1 100); do
  printf '#include <stdlib.h>\nvoid* obj%s(size_t n) { void* p = calloc(1, n); p = realloc(p, 2 * n); free(malloc(n)); return p; }\n' "$i" >"$tmp/o$i.c"
  cc -O1 -fPIC -shared -o "$tmp/libo$i.so" "$tmp/o$i.c"
done
for _ in $(seq 1 "${BENCH_REPS:-5}"); do
  "$root/c_src/build/bench_alloc" -t 1 -d 1 -n 1000 -o "$tmp" -a "$root/priv/libmallocinfo_preload.so" |
    grep -o 'attach_us=[0-9]* objects_loaded=[0-9]*'
done
