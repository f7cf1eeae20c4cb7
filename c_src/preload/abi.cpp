// The one non-malloc export: the versioned ABI the NIF reads
// (common/mi_abi.h). Everything here is a query; none of it runs in a hook.
#include <cstring>

#include "../common/mi_abi.h"
#include "attach.h"
#include "map_runtime.h"
#include "runtime.h"

namespace mi::preload {
namespace {

// This process records: the executable matched (or attach() made it), and
// it has not been detached since.
bool recording() {
  return ensure_init() && g_recording && !detached();
}

void abi_status(mi_abi_status* out, size_t out_size) {
  mi_abi_status s{};
  if (recording()) {
    g_tracker.status(&s);
    s.recording = 1;
  } else if (ensure_init() && g_recording) {
    // Detached: nothing records (the mode is off), but what was counted
    // while attached (calls, bytes, mallocinfo's own) stays readable.
    g_tracker.status(&s);
    s.recording = 0;
    s.mode = MI_MODE_OFF;
  } else {
    s.mode = MI_MODE_OFF;
  }
  if (s.tables_bytes != 0) {
    mi_abi_region_status r{};
    map_status(&r);
    s.tables_bytes += r.table_bytes;
  }
  std::memcpy(out, &s, out_size < sizeof s ? out_size : sizeof s);
}

int abi_set_mode(uint32_t mode) {
  if (!recording()) return -1;
  return change_mode(mode) ? 0 : -1;
}

int abi_erlang_context(const mi_erlang_layout* layout, size_t layout_size) {
  if (layout == nullptr || layout_size < sizeof(mi_erlang_layout) || !ensure_init() || !g_recording)
    return -1;
  return g_tracker.set_erlang_layout(*layout) ? 0 : -1;
}

void abi_quiet(int enter) {
  if (enter != 0)
    ++t_quiet;
  else if (t_quiet != 0)
    --t_quiet;
}

uint64_t abi_snapshot(mi_abi_sink sink, void* ctx) {
  if (!ensure_init() || !g_recording) return 0;
  // Batches on this thread's stack; the sink may allocate (through the
  // hooks, normally: this is not a hook).
  constexpr size_t kBatch = 512;
  mi_abi_entry batch[kBatch];
  size_t n = 0;
  const uint64_t total = g_tracker.for_each_live([&](const mi::track::LiveEntry& e) {
    batch[n++] = mi_abi_entry{e.address,
                              e.size,
                              e.timestamp_ns,
                              e.stack_id & ~mi::track::kSampledBit,
                              (e.stack_id & mi::track::kSampledBit) != 0 ? MI_ENTRY_SAMPLED : 0u,
                              e.pid};
    if (n == kBatch) {
      sink(ctx, batch, n);
      n = 0;
    }
  });
  if (n > 0) sink(ctx, batch, n);
  return total;
}

uint64_t abi_churn(mi_abi_churn_sink sink, void* ctx) {
  if (!ensure_init() || !g_recording) return 0;
  // Batches on this thread's stack (24 KiB), as abi_snapshot's.
  constexpr size_t kBatch = 64;
  mi_abi_churn batch[kBatch];
  size_t n = 0;
  const uint64_t total = g_tracker.for_each_churn([&](const mi_abi_churn& row) {
    batch[n++] = row;
    if (n == kBatch) {
      sink(ctx, batch, n);
      n = 0;
    }
  });
  if (n > 0) sink(ctx, batch, n);
  return total;
}

uint32_t abi_stack(uint32_t id, uint64_t* frames, uint32_t max) {
  if (!ensure_init() || !g_recording) return 0;
  return g_tracker.stack(id, frames, max);
}

uint64_t abi_reset() {
  if (!ensure_init() || !g_recording) return 0;
  return g_tracker.reset();
}

uint64_t abi_now_ns() {
  return mi::track::coarse_monotonic_ns();
}

uint64_t abi_reclaim() {
  if (!ensure_init() || !g_recording) return 0;
  return g_tracker.reclaim();
}

uint64_t abi_stack_hash(uint32_t id) {
  if (!ensure_init() || !g_recording) return 0;
  return g_tracker.stack_hash(id);
}

void abi_region_status(mi_abi_region_status* out, size_t out_size) {
  mi_abi_region_status s{};
  if (ensure_init() && g_recording) map_status(&s);
  std::memcpy(out, &s, out_size < sizeof s ? out_size : sizeof s);
}

uint64_t abi_regions(mi_abi_region* out, uint64_t max) {
  if (!ensure_init() || !g_recording) return 0;
  return map_copy(out, max);
}

void abi_resident(mi_abi_resident* out, size_t out_size) {
  mi_abi_resident r{};
  // Detached too: the tables stay mapped, and what they keep is still
  // the tracker's.
  if (ensure_init() && g_recording) g_tracker.resident(&r);
  std::memcpy(out, &r, out_size < sizeof r ? out_size : sizeof r);
}

constexpr mi_preload_abi kAbi = {
    MI_ABI_VERSION,
    sizeof(mi_preload_abi),
    abi_status,
    abi_set_mode,
    abi_snapshot,
    abi_stack,
    abi_reset,
    abi_now_ns,
    // attach block
    abi_attach,
    abi_detach,
    abi_attach_status,
    // stack reclamation
    abi_reclaim,
    abi_stack_hash,
    // mapped memory
    abi_region_status,
    abi_regions,
    // mallocinfo's own work
    abi_quiet,
    // Erlang context
    abi_erlang_context,
    // churn
    abi_churn,
    // what the tables keep resident
    abi_resident,
};

}  // namespace
}  // namespace mi::preload

extern "C" __attribute__((visibility("default"))) const mi_preload_abi* mallocinfo_preload_abi(
    void) {
  return &mi::preload::kAbi;
}
