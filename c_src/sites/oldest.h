// Reader side: the k oldest live blocks of a snapshot, kept while it
// streams by, without copying the whole table (a snapshot of millions of
// blocks needs k entries of memory here, not millions).
//
// Linked into the NIF and the Catch2 tests. Allocates k entries up front
// (std::bad_alloc is the NIF's {error, enomem}); offer() never allocates.
// A collector belongs to one thread at a time.
#ifndef MALLOCINFO_SITES_OLDEST_H
#define MALLOCINFO_SITES_OLDEST_H

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../common/mi_abi.h"
#include "abi_read.h"

namespace mi::sites {

class Oldest {
 public:
  // Keeps at most k entries allocated at or after `born_after` (on the
  // tracker's clock: leaves out blocks older than a maximum age) and at or
  // before `born_before` (leaves out younger ones), of at least min_size
  // bytes.
  Oldest(size_t k, uint64_t born_after, uint64_t born_before, uint64_t min_size)
      : k_(k), after_(born_after), before_(born_before), min_size_(min_size) {
    heap_.reserve(k);
  }

  // The collector of the k oldest blocks (k capped at 2^20) whose age at
  // now_ns, in whole ms as age_ms() counts it (abi_read.h), lies in
  // [min_age_ms, max_age_ms], of at least min_size bytes. Blocks allocated
  // after now_ns (while the snapshot streams) are 0 ms old. No bound
  // overflows, whatever the arguments.
  static Oldest by_age(uint64_t k, uint64_t now_ns, uint64_t min_age_ms, uint64_t max_age_ms,
                       uint64_t min_size) {
    constexpr uint64_t kMs = 1000000;
    // age_ms(now, ts) <= max_age  <=>  ts > now - (max_age + 1) ms
    const uint64_t span = max_age_ms >= UINT64_MAX / kMs - 1 ? UINT64_MAX : (max_age_ms + 1) * kMs;
    const uint64_t after = now_ns > span ? now_ns - span + 1 : 0;
    // age_ms(now, ts) >= min_age  <=>  ts <= now - min_age ms
    uint64_t before = UINT64_MAX;
    if (min_age_ms > 0) before = min_age_ms > now_ns / kMs ? 0 : now_ns - min_age_ms * kMs;
    return Oldest(static_cast<size_t>(std::min<uint64_t>(k, 1 << 20)), after, before, min_size);
  }

  void offer(const mi_abi_entry& e) {
    if (k_ == 0 || e.size < min_size_ || e.timestamp_ns < after_ || e.timestamp_ns > before_)
      return;
    if (heap_.size() < k_) {
      heap_.push_back(e);
      std::push_heap(heap_.begin(), heap_.end(), older);
    } else if (older(e, heap_.front())) {
      // The youngest kept one leaves (the heap's top is the youngest).
      std::pop_heap(heap_.begin(), heap_.end(), older);
      heap_.back() = e;
      std::push_heap(heap_.begin(), heap_.end(), older);
    }
  }

  // Oldest first (ties by address). Leaves this collector empty.
  std::vector<mi_abi_entry> take() {
    std::sort_heap(heap_.begin(), heap_.end(), older);
    return std::move(heap_);
  }

  // a was allocated before b (ties: the lower address first): a strict
  // order, so the result does not depend on the table's iteration order.
  static bool older(const mi_abi_entry& a, const mi_abi_entry& b) {
    return a.timestamp_ns != b.timestamp_ns ? a.timestamp_ns < b.timestamp_ns
                                            : a.address < b.address;
  }

 private:
  size_t k_;
  uint64_t after_, before_, min_size_;
  std::vector<mi_abi_entry> heap_;  // max-heap by age order: the youngest on top
};

}  // namespace mi::sites

#endif
