#!/bin/sh
# Proves the interposer's boundary (STYLE.md §2): it defines exactly the
# malloc family, the mmap family and mallocinfo_preload_abi, needs nothing from the Erlang VM
# (no enif_ symbol), does not depend on libstdc++, and calls nothing that
# takes the loader's or libunwind's lock (issue 15).
#
# Usage: check_exports.sh SO [OBJECT...]. The lock check reads the OBJECTs
# given (everything a hook can reach), or the whole SO when none are: the
# attach code (preload/attach.cpp) runs on a dirty scheduler at attach() and
# detach(), never inside a hook, and its dlopen redirect calls the real
# dlopen for a caller that asked for it, so it may use the loader.
set -eu
so=$1
shift
expected="aligned_alloc calloc free malloc mallocinfo_preload_abi memalign mmap mmap64 mremap munmap posix_memalign pvalloc realloc reallocarray strdup strndup valloc"
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
# Hooks must never wait for a lock their caller may hold (track/unwind.h):
# no libunwind (its global lock), and none of the loader calls that take the
# loader lock. dlsym is used once, at start-up, before anything is recorded.
if readelf -d "$so" | grep -q 'libunwind'; then
  echo "check-exports: $so depends on libunwind" >&2
  exit 1
fi
if [ $# -gt 0 ]; then
  undefined=$(nm --undefined-only "$@" | awk 'NF == 2 {print $2}')
  where="hook code ($*)"
else
  undefined=$(nm -D --undefined-only "$so" | awk '{print $2}')
  where=$so
fi
locking=$(echo "$undefined" | sed 's/@.*//' | sort -u |
  grep -E '^(_U|unw_|dl_iterate_phdr$|dladdr|dlopen$|dlinfo$|_Unwind_)' || true)
if [ -n "$locking" ]; then
  echo "check-exports: $where calls functions that take the loader's or libunwind's lock:" $locking >&2
  exit 1
fi
