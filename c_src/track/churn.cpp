#include "churn.h"

#include "os_mem.h"

namespace mi::track {

namespace {

size_t used_words(size_t capacity, size_t per_page) {
  const size_t pages = (capacity + per_page - 1) / per_page;
  return (pages + 63) / 64;
}

}  // namespace

bool ChurnTable::init(size_t capacity) {
  if (capacity == 0 || (capacity & (capacity - 1)) != 0 || capacity > (size_t{1} << 31))
    return false;
  const size_t slots = (capacity + 1) * sizeof(Slot);
  const size_t words = used_words(capacity, kSlotsPerPage);
  bytes_ = slots + words * sizeof(uint64_t);
  void* mem = os_map(bytes_);
  if (mem == nullptr) return false;
  slots_ = static_cast<Slot*>(mem);
  used_ = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(mem) + slots);
  mask_ = static_cast<uint32_t>(capacity - 1);
  return true;
}

void ChurnTable::destroy() {
  if (slots_ != nullptr) os_unmap(slots_, bytes_);
  slots_ = nullptr;
  used_ = nullptr;
  bytes_ = 0;
}

void ChurnTable::claim(Slot& s, uint32_t id) {
  Slot& unknown = slots_[mask_ + 1];
  uint32_t old = s.id.load(std::memory_order_relaxed);
  while (old != id) {
    if (s.id.compare_exchange_weak(old, id, std::memory_order_relaxed)) {
      mark_page(static_cast<size_t>(&s - slots_));
      if (old == 0) return;  // never used (or cleared): nothing to fold
      // The old id's stack was freed: nobody can name it any more. What it
      // counted stays in the totals, as the unknown stacks'.
      unknown.allocated_count.fetch_add(s.allocated_count.exchange(0, std::memory_order_relaxed),
                                        std::memory_order_relaxed);
      unknown.allocated_bytes.fetch_add(s.allocated_bytes.exchange(0, std::memory_order_relaxed),
                                        std::memory_order_relaxed);
      unknown.freed_bytes.fetch_add(s.freed_bytes.exchange(0, std::memory_order_relaxed),
                                    std::memory_order_relaxed);
      unknown.temporary.fetch_add(s.temporary.exchange(0, std::memory_order_relaxed),
                                  std::memory_order_relaxed);
      for (unsigned b = 0; b < kLifetimeBuckets; ++b)
        unknown.lifetimes[b].fetch_add(s.lifetimes[b].exchange(0, std::memory_order_relaxed),
                                       std::memory_order_relaxed);
      if (s.flags.exchange(0, std::memory_order_relaxed) != 0)
        unknown.flags.store(MI_CHURN_SAMPLED, std::memory_order_relaxed);
      return;
    }
  }
}

void ChurnTable::clear() {
  if (slots_ == nullptr) return;
  // Zero pages, given back: the next write maps a fresh zero page.
  os_release(slots_, bytes_);
}

size_t ChurnTable::resident_bytes() const {
  return slots_ != nullptr ? os_resident(slots_, bytes_) : 0;
}

}  // namespace mi::track
