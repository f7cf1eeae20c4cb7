// The reference unwinder of test_unwind.cpp: one libunwind step per frame
// (unw_backtrace's slow path, without unw_backtrace's own frame), kept
// deliberately plain. capture_cached() must return what this returns
// wherever both can step every frame (track/unwind.h).
//
// Why unw_step and not unw_backtrace: unw_backtrace's fast path (tdep_trace)
// replays per-address frame shapes with unvalidated loads, so a frame whose
// RBP no longer fits its CFI faults where unw_step stops (a test shows it),
// and for frames without unwind info it computes the CFA as RBP + 16 where
// unw_step uses CFA + 16: different stacks.
#define UNW_LOCAL_ONLY
#include "unwind_reference.h"

#include <libunwind.h>

namespace unwind_reference {

// noinline: the initial frame libunwind sees is this function's, and the
// first step lands in our caller; inlined, the first entry would be our
// caller's caller.
__attribute__((noinline)) size_t capture_libunwind(uintptr_t* out, size_t max) {
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

}  // namespace unwind_reference
