// Stack capture for the allocation tracker (unwind_cached.cpp, built on
// eh_frame.h, cfi.h and stack_window.h).
//
// Contract for every function here:
//  - callable from inside a malloc hook: never allocates through malloc
//    (memory comes from the caller or from mmap), never throws, never
//    recurses into malloc, and never takes a lock nor calls anything that
//    does: no libunwind (its global cache lock), no dl_iterate_phdr, dladdr
//    or dlsym (the dynamic loader's lock). The hook's caller may hold either
//    lock (a dl_iterate_phdr callback, dlopen, another thread's unwinder),
//    so waiting for one could deadlock the process (issue 15). What it uses:
//    glibc's _dl_find_object (2.35+: lock-free), and the system calls
//    process_vm_readv, getpid, mincore and sigaltstack;
//  - never faults on any stack: stack memory is loaded only inside a window
//    proven readable (below), anything else through process_vm_readv, which
//    fails where a load would fault;
//  - thread-safe: a UnwindCache is owned by exactly one thread at a time
//    (the tracker's per-thread state), so lookups and inserts on it need no
//    atomics; different threads use different caches. Not reentrant: a
//    signal handler must not capture with the cache its thread is capturing
//    with (the tracker's re-entrancy guard ensures it). errno is preserved.
//
// How a frame is stepped: by the rule of its return address, cached per
// thread. A rule is the CFA rule of the DWARF CFI row at the call (CFA =
// RSP or RBP + offset, where the return address and the saved RBP are),
// found through _dl_find_object and the object's .eh_frame_hdr; or, for
// code without unwind info (JIT output, BEAM's), "libunwind's frame-pointer
// guess": 1.6.2's unw_step ends the stack if RBP is 0 or not in
// [CFA, CFA + 0x4000] (or unreadable), else continues with RIP = [RBP+8],
// RBP = [RBP], CFA + 16, and capture_cached does exactly that. A warm unwind
// (every rule cached, every load inside the window) is a few loads per frame
// (about 5 ns); a frame not seen before costs a rule derivation (a few
// hundred ns) and validated reads.
//
// What it returns: libunwind (an unw_step loop, test_unwind.cpp's reference)
// and capture_cached() return identical stacks wherever both can step every
// frame: frame pointer or not, alloca/VLA, frames without unwind info with
// valid, null, wild or fake frame pointers, frames whose registers no longer
// fit their rule. Where a frame's CFI is outside the supported shape (CFA or
// register expressions, DW_CFA_register on RBP/RSP/RA, a signal frame, a
// CFI instruction exactly at the return address, an object without
// .eh_frame_hdr, a PLT entry or unreadable code without unwind info),
// capture_cached's stack ends at that frame: a prefix of libunwind's, never
// a different frame and never a wait. The same where a frame's CFA would
// lie below its SP, where libunwind may go one frame further.
//
// The stack window: a cache keeps one range [lo, hi) of its owner thread's
// stack, learnt by a cold walk (the contiguous frames from the caller up,
// each under 1 MiB), proven readable page by page with process_vm_readv
// (mincore where that syscall is refused), and extended down by probing
// when a capture starts deeper. Every load of the warm path (return address
// at CFA - 8, saved RBP, a guessed frame's [RBP, RBP + 16)) must lie in it,
// else the cold walk steps that frame with validated reads. A thread's stack
// stays mapped while the thread runs, and the owner is checked (TCB address)
// on every capture, so a stale rule (code unmapped after dlclose, other code
// mapped at its addresses) can give a wrong frame but not a fault. Captures
// on a signal alternate stack learn no window (it may be freed while the
// cache lives).
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
// with the return address into the function that called capture_cached()
// (its own frame is not reported). At most `max` entries are written to
// `out`; returns how many. `cache` is the calling thread's, from
// unwind_cache_init; null is allowed (a thread without one): every rule is
// then derived and every load validated, which is correct but slow. With a
// cache it may make a few system calls the first time a thread uses it,
// when a capture starts deeper than ever before, and for frames not seen
// before.
size_t capture_cached(UnwindCache* cache, uintptr_t* out, size_t max);

// Counters of one cache, for benchmarks and tests.
struct UnwindCacheStats {
  uint64_t hits;       // frames stepped (or ended) by a cached rule
  uint64_t misses;     // rules derived from the CFI (not in the cache)
  uint64_t fallbacks;  // captures that left the warm path (a rule missing,
                       // a load outside the window, no window yet)
  uint64_t truncated;  // captures ended at a frame outside the supported shape
  uint64_t entries;    // rules stored (including "stop" and "end" rules)
  uint64_t slots;      // the table's size in rules: it grows with entries
};
UnwindCacheStats unwind_cache_stats(const UnwindCache* cache);

// Rules are keyed by return address, so they go stale when code is unmapped
// and other code is mapped at the same addresses. Meant to be called after
// dlclose() (and after a JIT frees code): every cache forgets its rules at its
// next capture_cached(). Until someone calls it, a stale rule costs at most a
// wrong frame, never a fault (the stack window above). Thread-safe (one
// atomic increment), never allocates.
void unwind_code_unmapped();

}  // namespace mi::track

#endif
