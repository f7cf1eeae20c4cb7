// The reference back end: one libunwind step per frame (unw_backtrace's
// slow path, without unw_backtrace's own frame). capture_cached() must
// return exactly what this returns, so this file is kept deliberately plain.
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
    // Per-thread caches: the global one takes a lock and masks signals on
    // every step.
    unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
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
