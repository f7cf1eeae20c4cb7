// The reference back end: one libunwind step per frame (unw_backtrace's
// slow path, without unw_backtrace's own frame). capture_cached() must
// return exactly what this returns, so this file is kept deliberately plain.
//
// Its cost is libunwind's, about 0.65 us a frame with Debian's 1.6.2, and
// none of libunwind's options lowers it without changing results or safety
// (measured, and read in the 1.6.2 sources; figures in unwind.h):
//  - UNW_CACHE_PER_THREAD needs a libunwind configured with
//    --enable-per-thread-cache; Debian's is not, so unw_set_caching_policy
//    turns it into UNW_CACHE_GLOBAL: a mutex per unw_step, taken with all
//    signals masked (two sigprocmask syscalls, CONFIG_BLOCK_SIGNALS).
//  - UNW_CACHE_NONE drops that mutex but looks every frame's FDE up again,
//    and that lookup (dwarf_find_proc_info) masks signals around
//    dl_iterate_phdr too, several times a step: 4x slower than GLOBAL.
//  - unw_backtrace is 30-50x faster once warm, but its fast path (tdep_trace)
//    replays per-address frame shapes with unvalidated loads, so a frame
//    whose RBP no longer fits its CFI faults where unw_step stops (a test
//    shows it), and for frames without unwind info it computes the CFA as
//    RBP + 16 where unw_step uses CFA + 16: different stacks.
// So this stays an unw_step loop under the global cache, and the speed comes
// from capture_cached(), which needs libunwind only for addresses it has
// not seen.
#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include "unwind.h"

namespace mi::track {

namespace {
// Not a function-local static: that would need a guard (libstdc++) and
// could recurse into malloc. A plain flag is enough because setting the
// policy twice is harmless; the flag only avoids flushing libunwind's caches
// on every call.
bool g_policy_set = false;
}  // namespace

void unwind_libunwind_setup() {
  if (__atomic_load_n(&g_policy_set, __ATOMIC_ACQUIRE)) return;
  if (!__atomic_exchange_n(&g_policy_set, true, __ATOMIC_ACQ_REL)) {
    // The default already; said explicitly because it is the fastest policy
    // this libunwind has (see the top of this file).
    unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_GLOBAL);
  }
}

// noinline: the initial frame libunwind sees is this function's, and the
// first step lands in our caller; inlined, the first entry would be our
// caller's caller.
__attribute__((noinline)) size_t capture_libunwind(uintptr_t* out, size_t max) {
  unwind_libunwind_setup();
  unw_context_t context;
  unw_cursor_t cursor;
  if (unw_getcontext(&context) != 0) return 0;
  if (unw_init_local(&cursor, &context) != 0) return 0;
  size_t n = 0;
  while (n < max && unw_step(&cursor) > 0) {
    unw_word_t ip = 0;
    if (unw_get_reg(&cursor, UNW_REG_IP, &ip) != 0) break;
    out[n++] = static_cast<uintptr_t>(ip);
  }
  // Keeps the call to unw_step out of tail position and this frame alive.
  __asm__ volatile("" : "+r"(n));
  return n;
}

}  // namespace mi::track
