#include "churn.h"

#include "os_mem.h"

namespace mi::track {

bool ChurnTable::init(const size_t* rows, unsigned segments) {
  if (segments == 0 || segments > kMaxSegments) return false;
  size_t n = 1;
  for (unsigned g = 0; g < segments; ++g) {
    if (rows[g] == 0) return false;
    base_[g] = n;
    n += rows[g];
  }
  if (n > (size_t{1} << 32)) return false;
  base_[segments] = n;
  segments_ = segments;
  nslots_ = n;
  bytes_ = os_page_up(n * sizeof(Slot));
  void* mem = os_map(bytes_);
  if (mem == nullptr) return false;
  slots_ = static_cast<Slot*>(mem);
  for (std::atomic<uint32_t>& u : used_) u.store(0, std::memory_order_relaxed);
  return true;
}

void ChurnTable::destroy() {
  if (slots_ != nullptr) os_unmap(slots_, bytes_);
  slots_ = nullptr;
  bytes_ = 0;
}

void ChurnTable::claim(Slot& s, uint32_t id, uint32_t row) {
  // Readers look as far as the highest row claimed in its segment: raised
  // before the row counts, so a reader that sees the counts sees the row
  // (release). Row 0 is never claimed (on_alloc).
  unsigned g = 0;
  while (g + 1 < segments_ && row >= base_[g + 1]) ++g;
  const uint32_t at = static_cast<uint32_t>(row - base_[g]);
  std::atomic<uint32_t>& u = used_[g];
  uint32_t used = u.load(std::memory_order_relaxed);
  while (used <= at && !u.compare_exchange_weak(used, at + 1, std::memory_order_release,
                                                std::memory_order_relaxed)) {
  }
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
  // Zero pages, given back: the next write maps a fresh zero page. A site
  // counting meanwhile claims its row again (see the header on racing
  // hooks).
  for (std::atomic<uint32_t>& u : used_) u.store(0, std::memory_order_release);
  os_release(slots_, bytes_);
}

size_t ChurnTable::resident_bytes(const PageCounter& pages) const {
  return slots_ != nullptr ? pages.count(slots_, bytes_) : 0;
}

}  // namespace mi::track
