#include "quiet.h"

#include <cstddef>

namespace mi::nif {

std::atomic<QuietFn> g_quiet{nullptr};

bool has_quiet(const mi_preload_abi* abi) {
  return abi->struct_size >= offsetof(mi_preload_abi, quiet) + sizeof(abi->quiet);
}

namespace {
QuietFn quiet_of(const mi_preload_abi* abi) {
  return abi != nullptr && has_quiet(abi) ? abi->quiet : nullptr;
}
}  // namespace

void learn_quiet(const mi_preload_abi* abi) {
  if (QuietFn fn = quiet_of(abi)) g_quiet.store(fn, std::memory_order_release);
}

QuietScope::QuietScope(const mi_preload_abi* abi) noexcept : fn_(quiet_of(abi)) {
  if (fn_ != nullptr) fn_(1);
}

}  // namespace mi::nif
