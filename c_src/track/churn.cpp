#include "churn.h"

#include "os_mem.h"

namespace mi::track {

// Slots past the stack table's capacity (and the unknown row's): racing
// first allocations of one stack-table slot may each take a churn slot
// before one of them is kept (the others are never used).
constexpr size_t kSpare = 64;

bool ChurnTable::init(size_t capacity) {
  if (capacity == 0 || (capacity & (capacity - 1)) != 0 || capacity > (size_t{1} << 31))
    return false;
  // Whole pages of slots: the index after them starts on a page (clear()
  // gives both back by page).
  constexpr size_t kPerPage = 4096 / sizeof(Slot);
  nslots_ = (capacity + 1 + kSpare + kPerPage - 1) / kPerPage * kPerPage;
  slot_bytes_ = nslots_ * sizeof(Slot);
  bytes_ = slot_bytes_ + capacity * sizeof(std::atomic<uint32_t>);
  void* mem = os_map(bytes_);
  if (mem == nullptr) return false;
  slots_ = static_cast<Slot*>(mem);
  index_ = reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(mem) + slot_bytes_);
  mask_ = static_cast<uint32_t>(capacity - 1);
  next_.store(0, std::memory_order_relaxed);
  return true;
}

void ChurnTable::destroy() {
  if (slots_ != nullptr) os_unmap(slots_, bytes_);
  slots_ = nullptr;
  index_ = nullptr;
  bytes_ = 0;
}

uint32_t ChurnTable::assign(uint32_t k) {
  uint32_t i = index_[k].load(std::memory_order_relaxed);
  if (i != 0) return i;
  const uint32_t mine = next_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (mine >= nslots_) return 0;  // none left (only after clears raced hooks)
  // Whoever publishes first gives the slot; a loser's churn slot stays
  // unused (counted in kSpare).
  if (index_[k].compare_exchange_strong(i, mine, std::memory_order_relaxed)) return mine;
  return i;
}

void ChurnTable::claim(Slot& s, uint32_t id) {
  Slot& unknown = slots_[0];
  uint32_t old = s.id.load(std::memory_order_relaxed);
  while (old != id) {
    if (s.id.compare_exchange_weak(old, id, std::memory_order_relaxed)) {
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
  // Zero pages, given back: the next write maps a fresh zero page. The
  // index first, then the count of slots given: a site counting meanwhile
  // takes a new slot from 1 (see the header on racing hooks).
  os_release(index_, bytes_ - slot_bytes_);
  next_.store(0, std::memory_order_release);
  os_release(slots_, slot_bytes_);
}

size_t ChurnTable::resident_bytes() const {
  return slots_ != nullptr ? os_resident(slots_, bytes_) : 0;
}

}  // namespace mi::track
