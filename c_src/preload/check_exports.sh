#!/bin/sh
# Proves the interposer's boundary (STYLE.md §2): it defines exactly the
# malloc family and mallocinfo_preload_abi, needs nothing from the Erlang VM
# (no enif_ symbol), and does not depend on libstdc++.
set -eu
so=$1
expected="aligned_alloc calloc free malloc mallocinfo_preload_abi memalign posix_memalign pvalloc realloc reallocarray strdup strndup valloc"
defined=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TWiV]$/ {print $3}' | sed 's/@.*//' | sort | tr '\n' ' ' | sed 's/ $//')
if [ "$defined" != "$expected" ]; then
  echo "check-exports: $so defines: $defined" >&2
  echo "check-exports: expected:    $expected" >&2
  exit 1
fi
if nm -D --undefined-only "$so" | grep -q ' enif_'; then
  echo "check-exports: $so needs enif_ symbols" >&2
  exit 1
fi
if readelf -d "$so" | grep -q 'libstdc++'; then
  echo "check-exports: $so depends on libstdc++" >&2
  exit 1
fi
