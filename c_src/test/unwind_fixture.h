// Stacks of known frame shapes for the unwinder tests (test_unwind.cpp),
// built by unwind_fixture.cpp from assembly with hand-written CFI. x86_64
// only. Test code: not thread-safe beyond what each test arranges.
#ifndef MALLOCINFO_TEST_UNWIND_FIXTURE_H
#define MALLOCINFO_TEST_UNWIND_FIXTURE_H

#include <cstddef>
#include <cstdint>

#include "../track/unwind.h"

#if defined(__x86_64__)

namespace unwind_fixture {
enum class Shape : uint8_t {
  kFp,
  kNoFp,
  kAlloca,
  kVla,
  kAligned,
  kBusy,
  kExpr,
  kQuirk,
  kJit,      // mapped at run time, no unwind info, frame-pointer frame
  kJitBp,    // mapped at run time, no unwind info, RBP = bad_bp during the call
  kJitFake,  // mapped at run time, no unwind info, RBP -> a record {0, code}
  kJitEdge,  // kJit placed so its return address is in a page's last 8 bytes
  kNoCfi,    // the kJit code in place, in .text, not covered by any FDE
  kBadFp,    // CFI says CFA = RBP + 16; RBP = bad_bp during the call if not 0
};
struct Ctx {
  const Shape* shapes;  // shape of level i is shapes[i % nshapes]
  size_t nshapes;
  int depth;
  size_t bytes;  // alloca/VLA size (plus the level)
  void (*leaf)(void*);
  void* arg;
  int (*run)(Ctx*, int);  // set by unwind_fixture_run; the fixture's code calls it
  uintptr_t bad_bp;       // RBP in kJitBp frames, and in kBadFp frames if not 0
};
// The fixture's assembly addresses these two fields by offset.
static_assert(offsetof(Ctx, run) == 48 && offsetof(Ctx, bad_bp) == 56, "Ctx layout");
}  // namespace unwind_fixture

extern "C" {
// Runs c->depth levels shaped by c->shapes, then c->leaf(c->arg).
int unwind_fixture_run(unwind_fixture::Ctx* c, int level);
// False where run-time code mapping (for the kJit shapes) is refused.
bool unwind_fixture_jit_available();
// Frameless stubs, so every back end is called from one call site:
// unwind_reference::capture_libunwind, unw_backtrace, and capture_cached
// with a null cache whatever cache is passed.
size_t unwind_fixture_libunwind_stub(mi::track::UnwindCache* cache, uintptr_t* out, size_t max);
size_t unwind_fixture_backtrace_stub(mi::track::UnwindCache* cache, uintptr_t* out, size_t max);
size_t unwind_fixture_nocache_stub(mi::track::UnwindCache* cache, uintptr_t* out, size_t max);
// The hand-written CFI frames (their return addresses lie a few bytes in).
int unwind_fixture_expr_frame(unwind_fixture::Ctx* c, int level);
int unwind_fixture_quirk_frame(unwind_fixture::Ctx* c, int level);
}

#endif
#endif
