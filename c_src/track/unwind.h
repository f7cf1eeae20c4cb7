// Stack capture for the allocation tracker.
//
// Contract for every function here:
//  - callable from inside a malloc hook: never allocates through malloc
//    (memory comes from the caller or from mmap), never throws, never takes
//    a lock another thread can hold across a malloc call, never recurses
//    into malloc (libunwind local unwinding under its global cache, whose
//    lock libunwind holds only around its own work);
//  - never faults on a stack it can walk at all: capture_cached() loads stack
//    memory only inside a window proven readable (below), libunwind
//    validates every address it loads while stepping (mincore plus a pipe
//    write: 1.6.2's CONSERVATIVE_CHECKS, which also stays on for the rest of
//    a walk once set);
//  - thread-safe: a UnwindCache is owned by exactly one thread at a time
//    (the tracker's per-thread state), so lookups and inserts on it need no
//    atomics; different threads use different caches. Not reentrant: a
//    signal handler must not capture with the cache its thread is capturing
//    with (the tracker's re-entrancy guard ensures it). errno is preserved by
//    capture_cached's own system calls (libunwind's may change it).
//
// Two back ends, one interface (STYLE.md §8):
//  - capture_libunwind(): a plain unw_step() loop, the reference. About
//    0.65 us a frame with Debian's libunwind 1.6.2 (two sigprocmask calls a
//    step; see unwind_libunwind.cpp for why no libunwind option helps);
//  - capture_cached(): a warm path that caches, per return address, the rule
//    that finds the caller's frame, so that a warm unwind is a few loads per
//    frame (about 5 ns). Rules: the CFA rule of the CFI (CFA = SP or BP +
//    offset, where the return address and the saved BP are), or, for code
//    without unwind info (JIT output), "libunwind's frame-pointer guess":
//    1.6.2's unw_step then ends the stack if RBP is 0 or not in
//    [CFA, CFA + 0x4000] (or unreadable), else continues with RIP = [RBP+8],
//    RBP = [RBP], CFA + 16, and capture_cached does exactly that. Any address
//    not yet seen, or any rule that does not validate, falls back to
//    libunwind from the top of the stack, re-entering the warm path past
//    that frame and recording what it learns.
//
// What "identical" means: capture_cached() returns what capture_libunwind()
// returns for the same stack, frames without unwind info included, with no
// truncation (test_unwind.cpp proves it over many frame shapes, JIT-like
// code with valid, null, wild and fake frame pointers, and frames whose
// registers no longer fit their rule). The one exception is libunwind's, not
// the cache's: for a return address that is unmapped (or within 8 bytes of
// an unmapped page) libunwind 1.6.2 takes a "RIP fix-up" path that reads the
// stack pointer of the function that called unw_getcontext (or an
// uninitialised one), so two libunwind walks from different capture
// functions may differ there; capture_cached never caches such an address
// and hands it to libunwind.
//
// The stack window: a cache keeps one range [lo, hi) of its owner thread's
// stack, learnt by the first libunwind walk on the thread (the contiguous
// call frames from the caller up, each under 1 MiB) and proven readable page
// by page with process_vm_readv (mincore where that syscall is refused), and
// extended down by probing when a capture starts deeper. Every load of the
// warm path (return address at CFA - 8, saved RBP, a guessed frame's
// [RBP, RBP + 16)) must lie in it, else libunwind steps that frame. A
// thread's stack stays mapped while the thread runs, and the owner is checked
// (TCB address) on every capture, so a stale rule (code unmapped after
// dlclose, other code mapped at its addresses) can give a wrong frame but not
// a fault. Captures on a signal alternate stack learn no window (it may be
// freed while the cache lives) and go to libunwind.
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
// sequences for identical stacks (see "What identical means" above).
// capture_cached needs a non-null cache from unwind_cache_init, owned by the
// calling thread; it may make a few system calls (no locks) the first time a
// thread uses the cache and when a capture starts deeper than ever before.
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

// Sets libunwind's caching policy to UNW_CACHE_GLOBAL, once per process (an
// atomic flag, no guarded static). Both back ends call it; callable at any
// time, thread-safe, never allocates. Its mutex is taken by each unw_step
// with all signals masked (two sigprocmask calls): never held across a
// malloc, about 0.65 us a frame, still the fastest policy this libunwind has
// (UNW_CACHE_PER_THREAD is not built in and becomes GLOBAL; UNW_CACHE_NONE
// measured 4x slower: it masks signals around every FDE lookup).
void unwind_libunwind_setup();

// Rules are keyed by return address, so they go stale when code is unmapped
// and other code is mapped at the same addresses. Meant to be called after
// dlclose() (and after a JIT frees code): every cache forgets its rules at its
// next capture_cached(). Until someone calls it, a stale rule costs at most a
// wrong frame, never a fault (the stack window above). Thread-safe (one
// atomic increment), never allocates.
void unwind_code_unmapped();

}  // namespace mi::track

#endif
