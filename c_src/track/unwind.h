// Stack capture for the allocation tracker.
//
// Contract for every function here:
//  - callable from inside a malloc hook: never allocates through malloc
//    (memory comes from the caller or from mmap), never throws, never takes
//    a lock another thread can hold across a malloc call, never recurses
//    into malloc (libunwind local unwinding is used with per-thread caching);
//  - thread-safe: a UnwindCache is owned by exactly one thread at a time
//    (the tracker's per-thread state), so lookups and inserts on it need no
//    atomics; different threads use different caches. Not reentrant: a
//    signal handler must not capture with the cache its thread is capturing
//    with (the tracker's re-entrancy guard ensures it).
//
// Two back ends, one interface (STYLE.md §8):
//  - capture_libunwind(): unw_backtrace-equivalent, the reference;
//  - capture_cached(): a warm path that caches, per return address, the rule
//    that finds the caller's frame (the CFA rule: CFA = SP or BP + offset,
//    where the return address and the saved BP are), so that a warm unwind
//    is a few loads per frame. Any address not yet seen, or any rule that
//    does not validate, falls back to libunwind for the rest of the stack
//    and records what it learns. It returns exactly what capture_libunwind()
//    returns for the same stack (test_unwind.cpp proves it).
#ifndef MALLOCINFO_TRACK_UNWIND_H
#define MALLOCINFO_TRACK_UNWIND_H

#include <cstddef>
#include <cstdint>

namespace mi::track {

struct UnwindCache;

// Bytes a UnwindCache needs. The caller provides zero-filled memory of that
// size (the tracker mmaps it), then calls unwind_cache_init on it.
size_t unwind_cache_bytes();
UnwindCache* unwind_cache_init(void* zeroed_memory);

// Return addresses of the calling thread's stack, innermost first, starting
// with the return address into the function that called capture_*() (the
// frame of capture_*() itself is not reported). At most `max` entries are
// written to `out`; returns how many. Both back ends return identical
// sequences for identical stacks.
// capture_cached needs a non-null cache from unwind_cache_init.
size_t capture_libunwind(uintptr_t* out, size_t max);
size_t capture_cached(UnwindCache* cache, uintptr_t* out, size_t max);

// Counters of one cache, for benchmarks and tests.
struct UnwindCacheStats {
  uint64_t hits;       // frames resolved from the cache
  uint64_t misses;     // frames that needed libunwind
  uint64_t fallbacks;  // captures that fell back to libunwind at some frame
  uint64_t entries;    // rules stored (including "use libunwind" markers)
};
UnwindCacheStats unwind_cache_stats(const UnwindCache* cache);

// Sets libunwind's caching policy to per-thread, once per process (an atomic
// flag, no guarded static). Both back ends call it; callable at any time,
// thread-safe, never allocates. Note: a libunwind built without __thread
// support (Debian's 1.6.2 is) quietly uses its global cache instead, whose
// mutex each unw_step takes and releases with all signals masked (two
// sigprocmask calls): never held across a malloc, but about 0.6 us a frame.
void unwind_libunwind_setup();

// Rules are keyed by return address, so they go stale when code is unmapped
// and other code is mapped at the same addresses. The interposer calls this
// after dlclose(): every cache forgets its rules at its next capture_cached().
// Thread-safe (one atomic increment), never allocates.
void unwind_code_unmapped();

}  // namespace mi::track

#endif
