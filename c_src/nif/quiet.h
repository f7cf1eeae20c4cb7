// Every NIF call is mallocinfo's own work: what it allocates (the
// symbolizer's caches, a query's tables, the buffers a reply is built in)
// must never be recorded as the node's memory. The interposer keeps a
// per-thread "quiet" flag for that (mi_preload_abi.quiet); guarded<> in
// term.h raises it around every NIF body with a QuietScope, so no view
// (sites, olds, snapshots, pprof, folded stacks, the flame graph, the heap
// map's colours, the report) ever sees a block of mallocinfo's, and the
// tracker counts them apart (status' self_calls / self_bytes).
//
// The entry point is learned once the interposer is found (at load when
// it is preloaded, by attach() otherwise); before that there is nothing to
// tell, as nothing records.
#ifndef MALLOCINFO_NIF_QUIET_H
#define MALLOCINFO_NIF_QUIET_H

#include <atomic>

#include "../common/mi_abi.h"

namespace mi::nif {

using QuietFn = void (*)(int enter);

// The interposer's quiet entry point, or nullptr (none found yet, or an
// interposer from before it).
extern std::atomic<QuietFn> g_quiet;

// Whether `abi` (checked, non-null) has the quiet block: quiet() and the
// self_* counters of its status and region status. Never allocates.
bool has_quiet(const mi_preload_abi* abi);

// Remembers abi's quiet entry point (when it has one). Thread-safe; never
// allocates.
void learn_quiet(const mi_preload_abi* abi);

// Marks the calling thread quiet for its lifetime (nesting), when the
// interposer is known; else does nothing. The default constructor reads
// g_quiet; the other takes the entry point of an ABI found during the call
// (attach()), so the rest of that call is quiet too.
class QuietScope {
 public:
  QuietScope() noexcept : fn_(g_quiet.load(std::memory_order_acquire)) {
    if (fn_ != nullptr) fn_(1);
  }
  explicit QuietScope(const mi_preload_abi* abi) noexcept;
  ~QuietScope() {
    if (fn_ != nullptr) fn_(0);
  }
  QuietScope(const QuietScope&) = delete;
  QuietScope& operator=(const QuietScope&) = delete;

 private:
  QuietFn fn_;
};

}  // namespace mi::nif

#endif
