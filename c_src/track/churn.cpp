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
  // Row 0 ends the first page, so row 1 starts the second: a segment that
  // starts at a multiple of 32 rows starts on a page, and so does every
  // run of records the stack table gives back (its compaction chunks are
  // 512 records), whose rows' pages then go back whole.
  row_bytes_ = os_page_up(4096 - sizeof(Slot) + n * sizeof(Slot));
  bytes_ = row_bytes_ + os_page_up(n * sizeof(Spill));
  void* mem = os_map(bytes_);
  if (mem == nullptr) return false;
  mem_ = mem;
  slots_ = reinterpret_cast<Slot*>(static_cast<char*>(mem) + 4096 - sizeof(Slot));
  spills_ = reinterpret_cast<Spill*>(static_cast<char*>(mem) + row_bytes_);
  for (std::atomic<uint32_t>& u : used_) u.store(0, std::memory_order_relaxed);
  return true;
}

void ChurnTable::destroy() {
  if (mem_ != nullptr) os_unmap(mem_, bytes_);
  mem_ = nullptr;
  slots_ = nullptr;
  spills_ = nullptr;
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
  uint32_t old = s.id.load(std::memory_order_relaxed);
  while (old != id) {
    if (s.id.compare_exchange_weak(old, id, std::memory_order_relaxed)) {
      // The old id's stack was freed: nobody can name it any more. What it
      // counted stays in the totals, as the unknown stacks'. A row of no
      // id (never used, cleared, settled or given back) has nothing to
      // fold but a count that landed after that (a hook that checked the
      // id just before): that goes there too, not to the new id.
      fold(s, slots_[0]);
      return;
    }
  }
}

void ChurnTable::fold(Slot& from, Slot& to) {
  // A counter that reads 0 is left alone: most of a row's lifetime
  // buckets are, and an exchange and an add on each would double what a
  // sweep's compaction costs. A count landing on it right after the load
  // stays there, as one landing after an exchange would.
  auto take = [](auto& a) -> uint64_t {
    return a.load(std::memory_order_relaxed) != 0 ? a.exchange(0, std::memory_order_relaxed) : 0;
  };
  await_carry(from);
  Spill* sp = const_cast<Spill*>(spill_of(from, from.flags.load(std::memory_order_acquire)));
  for (unsigned i = 0; i < kCounts; ++i) {
    const uint64_t v = take(from.counts[i]) + (sp != nullptr ? take(sp->counts[i]) : 0);
    if (v != 0) add_wide(to, i, v);
  }
  if (const uint64_t b = take(from.allocated_bytes); b != 0)
    to.allocated_bytes.fetch_add(b, std::memory_order_relaxed);
  if (const uint64_t b = take(from.freed_bytes); b != 0)
    to.freed_bytes.fetch_add(b, std::memory_order_relaxed);
  if ((from.flags.load(std::memory_order_relaxed) & MI_CHURN_SAMPLED) != 0 &&
      (from.flags.fetch_and(~MI_CHURN_SAMPLED, std::memory_order_relaxed) & MI_CHURN_SAMPLED) != 0)
    to.flags.fetch_or(MI_CHURN_SAMPLED, std::memory_order_relaxed);
}

void ChurnTable::carry(Slot& s, unsigned i, uint32_t old, uint32_t v) {
  if (static_cast<uint32_t>(old + v) < old) {
    // Wrapped: adds piled up past 2^32 while another add's carry was
    // pending (which then finds less than kCarry and does nothing).
    spill_for(s)->counts[i].fetch_add(uint64_t{1} << 32, std::memory_order_relaxed);
    return;
  }
  // Bracketed for readers and folds (see the header). A CAS rather than a
  // subtraction: a fold that took the count meanwhile took the carry with
  // it, and the count must not go below zero. Release: a reader that sees
  // the lowered count sees the carry begun.
  Spill* sp = spill_for(s);
  s.flags.fetch_add(kCarryIn, std::memory_order_acq_rel);
  uint32_t cur = s.counts[i].load(std::memory_order_relaxed);
  while (cur >= kCarry)
    if (s.counts[i].compare_exchange_weak(cur, cur - kCarry, std::memory_order_release,
                                          std::memory_order_relaxed)) {
      sp->counts[i].fetch_add(kCarry, std::memory_order_relaxed);
      break;
    }
  s.flags.fetch_add(kCarryOut, std::memory_order_release);
}

void ChurnTable::await_carry(const Slot& s) const {
  for (int n = 0; n < 4096 && carrying(s.flags.load(std::memory_order_acquire)); ++n)
    if (n >= 64) ::sched_yield();
}

void ChurnTable::add_wide(Slot& s, unsigned i, uint64_t x) {
  if (x < kMaxAdd && s.counts[i].load(std::memory_order_relaxed) < kCarry / 2) {
    add(s, i, x);
    return;
  }
  spill_for(s)->counts[i].fetch_add(x, std::memory_order_relaxed);
}

ChurnTable::Spill* ChurnTable::spill_for(Slot& s) {
  // Flagged before the caller adds: a reader that reads the flags after
  // seeing the add also sees the flag, and reads the entry.
  if ((s.flags.load(std::memory_order_relaxed) & kSpilled) == 0)
    s.flags.fetch_or(kSpilled, std::memory_order_release);
  return &spills_[&s - slots_];
}

void ChurnTable::move_row(uint32_t id, uint32_t from, uint32_t to) {
  if (!valid_row(to)) return;
  Slot& d = slots_[to];
  if (d.id.load(std::memory_order_relaxed) != id) claim(d, id, to);
  if (valid_row(from) && slots_[from].id.load(std::memory_order_relaxed) == id)
    fold(slots_[from], d);
}

void ChurnTable::settle_row(uint32_t id, uint32_t from, uint32_t to) {
  if (!valid_row(from)) return;
  Slot& s = slots_[from];
  if (s.id.load(std::memory_order_relaxed) != id) return;  // claimed by another id since
  Slot& d =
      valid_row(to) && slots_[to].id.load(std::memory_order_relaxed) == id ? slots_[to] : slots_[0];
  fold(s, d);
  uint32_t expect = id;
  s.id.compare_exchange_strong(expect, 0, std::memory_order_relaxed);
}

void ChurnTable::release_rows(uint32_t first, uint32_t n) {
  if (slots_ == nullptr || first == 0 || first >= nslots_) return;
  if (n > nslots_ - first) n = static_cast<uint32_t>(nslots_ - first);
  // Whatever id a row has (a count may have landed on a row of none: see
  // claim()), its counts go to the unknown row. Only loads where nothing
  // was written (a store there would map a page just to give it back).
  for (uint32_t r = first; r < first + n; ++r) {
    Slot& s = slots_[r];
    fold(s, slots_[0]);
    if (s.id.load(std::memory_order_relaxed) != 0) s.id.store(0, std::memory_order_relaxed);
  }
  // The rows and their spill entries (zeroed by the folds).
  os_release_within(&slots_[first], &slots_[first] + n);
  os_release_within(&spills_[first], &spills_[first] + n);
}

void ChurnTable::clear() {
  if (slots_ == nullptr) return;
  // Zero pages, given back: the next write maps a fresh zero page. A site
  // counting meanwhile claims its row again (see the header on racing
  // hooks).
  for (std::atomic<uint32_t>& u : used_) u.store(0, std::memory_order_release);
  os_release(mem_, bytes_);  // the spill entries too: free again
}

size_t ChurnTable::resident_bytes(const PageCounter& pages) const {
  return mem_ != nullptr ? pages.count(mem_, bytes_) : 0;
}

}  // namespace mi::track
