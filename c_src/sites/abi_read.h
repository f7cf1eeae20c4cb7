// Reader side: the tracker's tables read through its ABI (common/mi_abi.h),
// the one home of the adapters every reader uses (the NIF's queries,
// sites/site_group, the heap map's forked child): a stack's frames, the
// interposer's stack hashes when it has them, canonicalize() over its
// stack table, the age of a timestamp on its clock, and a snapshot
// streamed into a C++ callable.
//
// Header-only, no erl_nif. Everything but stream_snapshot() is callable in
// the heap map's forked child: no allocation, no lock, no exception.
// Thread-safe as the ABI is (every ABI function may be called from any
// thread, never from inside a malloc hook).
#ifndef MALLOCINFO_SITES_ABI_READ_H
#define MALLOCINFO_SITES_ABI_READ_H

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>

#include "../common/mi_abi.h"
#include "stack_merge.h"

namespace mi::sites {

// FetchStack over the ABI: ctx is the const mi_preload_abi*.
inline uint32_t abi_fetch_stack(void* abi, uint32_t id, uint64_t* out, uint32_t max) {
  return static_cast<const mi_preload_abi*>(abi)->stack(id, out, max);
}

// HashStack over the ABI: ctx is the const mi_preload_abi*, which must
// have stack_hash (abi_stack_hasher()).
inline uint64_t abi_hash_stack(void* abi, uint32_t id) {
  return static_cast<const mi_preload_abi*>(abi)->stack_hash(id);
}

// abi_hash_stack when the interposer has stack hashes (a struct reaching
// past stack_hash, and set), else nullptr: canonicalize() then hashes the
// frames itself.
inline HashStack abi_stack_hasher(const mi_preload_abi* abi) {
  const bool has =
      abi->struct_size >= offsetof(mi_preload_abi, stack_hash) + sizeof(abi->stack_hash) &&
      abi->stack_hash != nullptr;
  return has ? abi_hash_stack : nullptr;
}

// canonicalize() (stack_merge.h) over the interposer's stack table: the
// same contract, frames and hashes read through `abi`.
inline void canonicalize(StackKey* keys, size_t n, const mi_preload_abi* abi) {
  // canonicalize() passes ctx back unchanged and the adapters read
  // through a const pointer: the cast only fits the C callback's void*.
  canonicalize(keys, n, abi_fetch_stack, abi_stack_hasher(abi), const_cast<mi_preload_abi*>(abi));
}

// The stored frames of stack `id` into pcs (room for kMaxFrames),
// innermost first; returns how many, 0 for id 0 (no stack stored) or an
// unknown id (never stored, or freed since).
inline uint32_t stack_frames(const mi_preload_abi* abi, uint32_t id, uint64_t* pcs) {
  if (id == 0) return 0;
  return std::min<uint32_t>(abi->stack(id, pcs, kMaxFrames), kMaxFrames);
}

// The age in whole ms, at `now_ns`, of a timestamp on the tracker's clock
// (now_ns(), which entries and regions are stamped with); 0 for one
// taken after now_ns (a block allocated while a snapshot streams).
inline uint64_t age_ms(uint64_t now_ns, uint64_t ts_ns) {
  return now_ns > ts_ns ? (now_ns - ts_ns) / 1000000 : 0;
}

// Streams every live entry into `consume(const mi_abi_entry*, size_t)`,
// batch by batch. The sink runs inside the interposer's C frames (built
// without exceptions), so no exception may cross them: the first one
// `consume` throws is kept, later batches are skipped, and it is rethrown
// here once the interposer has returned. Allocates only what `consume`
// does (and the exception's copy); not for the forked child.
template <class F>
void stream_snapshot(const mi_preload_abi* abi, F&& consume) {
  struct Ctx {
    F* consume;
    std::exception_ptr error;
  } ctx{&consume, nullptr};
  abi->snapshot(
      [](void* p, const mi_abi_entry* e, size_t n) {
        Ctx& c = *static_cast<Ctx*>(p);
        if (c.error) return;
        try {
          (*c.consume)(e, n);
        } catch (...) {
          c.error = std::current_exception();
        }
      },
      &ctx);
  if (ctx.error) std::rethrow_exception(ctx.error);
}

}  // namespace mi::sites

#endif
