// Per-call-site churn (issue 26): what each stack allocated and freed since
// the tracker started or was last reset, how long its blocks lived, and
// how many were temporary (memray's rule: freed before any other
// allocation on the thread that allocated them).
//
// One row per stack-table record (StackTable::row()), in a separate
// mmapped array: row 0, then a segment per record class. The stack table
// hands each class's records out lowest first, moves the stacks stored
// high down after each sweep (the rows move with them: move_row(),
// settle_row()) and gives the pages of the free records above back
// (release_rows()), so the resident set is about 256 bytes per stack
// stored, not per stack stored at the busiest moment, nor a page per site
// scattered over the table.
// Row 0 is the blocks' without a stack (id 0). A site's counters outlive
// its live blocks. A row belongs to the id that last claimed it. The
// stack table gives a record to another stack only after a sweep freed
// its stack (no live block referenced it); the first allocation of the
// new id then claims the row and folds what the old id counted into the
// row of blocks without a known stack, so the totals still add up (the
// old id's frames are gone: nobody could name it any more).
//
// Block counts are kept in fixed point (kCountOne per block): a sampled
// block of n bytes stands for 1/p(n) blocks, 1.09 for n = 10 KiB at the
// default interval, and rounding each to a whole block would bias the
// estimate; rows are rounded once, when read.
//
// A row is 128 bytes (two cache lines, 32 a page): its id and flags, the
// bytes allocated and freed (64 bits), and 26 block counts of 32 bits
// (allocated, temporary, and the lifetime buckets). A count carries:
// the add that takes it to kCarry (2^31, 2 Mi blocks) moves kCarry to the
// row's spill entry, 64-bit counts in an array apart (a 208-byte entry per
// row, mapped but touched only by the rows that carry: Spill). So a row
// holds any count a 64-bit one does, and the resident set is a row of 128
// bytes a site, not 256: only sites that count millions of blocks touch
// their spill entry. A carry is bracketed by two counts in the row's
// flags (kCarryIn, kCarryOut); a reader retries a row whose carries
// changed or were in progress while it read (bounded: after 64 tries it
// takes what it read), so it never sees a count kCarry off. (Adds that
// pile up past 2^32 while a carry is pending, 2^31 more in the few
// instructions of a carry, wrap: the add that wraps adds 2^32 to the
// spill entry, unbracketed.)
//
// Lifetimes come from the live entries' timestamps (the tracker's coarse
// clock), bucketed by log2 of whole milliseconds: bucket 0 holds the
// blocks freed within 1 ms (in practice: within the clock's resolution),
// bucket k (1 <= k < kLifetimeBuckets - 1) those of [2^(k-1), 2^k) ms,
// the last bucket everything longer.
//
// Thread-safety: every method is thread-safe. on_alloc/on_free are
// hook-safe (no malloc, no lock, no syscall); init/destroy are not
// thread-safe; clear() may race with hooks: a count landing mid-clear may
// survive it or be lost, and a row claimed across a clear may count
// without being listed by for_each() until a higher row is claimed. A
// row's claim by a new id folds what the old id counted into the unknown
// row; counts the new id adds during that fold may go there too (the
// totals still add up).
#ifndef MALLOCINFO_TRACK_CHURN_H
#define MALLOCINFO_TRACK_CHURN_H

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../common/mi_abi.h"
#include "os_mem.h"

namespace mi::track {

constexpr unsigned kLifetimeBuckets = MI_LIFETIME_BUCKETS;
// One block, in ChurnTable's fixed-point counts: 10 bits of fraction, so
// a sampled block's weight is rounded by at most 1/2048 of a block.
constexpr uint64_t kCountOne = uint64_t{1} << 10;

// The lifetime bucket of a block that lived `ns` nanoseconds.
inline unsigned lifetime_bucket(uint64_t ns) {
  const uint64_t ms = ns / 1000000;
  if (ms == 0) return 0;
  const unsigned k = 64u - static_cast<unsigned>(__builtin_clzll(ms));  // ms in [2^(k-1), 2^k)
  return k < kLifetimeBuckets - 1 ? k : kLifetimeBuckets - 1;
}

class ChurnTable {
 public:
  // Row 0, then `segments` segments, segment g of rows[g] rows (the
  // stack table's kClasses and segment_rows()). False when the memory
  // cannot be mapped.
  static constexpr unsigned kMaxSegments = 8;
  bool init(const size_t* rows, unsigned segments);
  void destroy();

  // A block of stack `id` (0: none), whose row is `row` (the stack table's
  // row(id): 0 for id 0), entered the live table, standing for `count`
  // blocks (fixed point: kCountOne is one) of `bytes` bytes in all;
  // `sampled` when those are a sample's weights.
  void on_alloc(uint32_t id, uint32_t row, uint64_t count, uint64_t bytes, bool sampled) {
    Slot& s = slot_of(id, row);
    // Row 0 (no stack, or a row out of range) is never claimed.
    if (s.id.load(std::memory_order_relaxed) != id && &s != slots_) [[unlikely]]
      claim(s, id, row);
    add(s, kAllocated, count);
    s.allocated_bytes.fetch_add(bytes, std::memory_order_relaxed);
    if (sampled && (s.flags.load(std::memory_order_relaxed) & MI_CHURN_SAMPLED) == 0) [[unlikely]]
      s.flags.fetch_or(MI_CHURN_SAMPLED, std::memory_order_relaxed);
  }
  // A block of stack `id` left the live table (freed, or moved by
  // realloc) after living `lifetime_ns`; it stands for `count` (fixed
  // point) blocks of `bytes` bytes; `temporary`: it was its thread's last
  // allocation.
  void on_free(uint32_t id, uint32_t row, uint64_t count, uint64_t bytes, uint64_t lifetime_ns,
               bool temporary) {
    Slot* s = &slot_of(id, row);
    // The row was claimed by a newer id meanwhile (the old stack was
    // reclaimed under a live block: a protocol failure, see tracker.h), or
    // never by this one: count the free with the unknown stacks.
    if (s->id.load(std::memory_order_relaxed) != id) [[unlikely]]
      s = &slots_[0];
    s->freed_bytes.fetch_add(bytes, std::memory_order_relaxed);
    add(*s, kLifetime0 + lifetime_bucket(lifetime_ns), count);
    if (temporary) add(*s, kTemporary, count);
  }

  // Calls f(const mi_abi_churn&) for every slot that counted something
  // (the unknown stacks' with stack_id 0). Returns how many.
  template <class F>
  uint64_t for_each(F&& f) const;

  // The stack table's compaction (StackTable::RowOwner), by the sweeper:
  // stack `id` moves from row `from` to row `to`; `to` becomes its row
  // (what another id counted there goes to the unknown row, as a claim
  // does) and takes over what `from` counted.
  void move_row(uint32_t id, uint32_t from, uint32_t to);
  // A sweep after move_row(): what hooks counted on `from` since goes to
  // row `to` if it is still `id`'s, else to the unknown row; `from` is
  // then nobody's.
  void settle_row(uint32_t id, uint32_t from, uint32_t to);
  // Rows [first, first + n) are free records' whose memory the stack
  // table gives back: what they counted goes to the unknown row and their
  // pages back to the kernel. A count landing there meanwhile (a hook
  // holding a reclaimed stack's row: see tracker.h) may be lost.
  void release_rows(uint32_t first, uint32_t n);
  // The stack id row `row` counts for now (0: none, or out of range).
  uint32_t row_id(uint32_t row) const {
    return valid_row(row) ? slots_[row].id.load(std::memory_order_relaxed) : 0;
  }

  // Zeroes every counter and gives the pages back (they cost nothing
  // until the next allocation of a site writes them).
  void clear();
  size_t bytes_reserved() const { return bytes_; }
  // What a row costs resident.
  static constexpr size_t kRowBytes = 128;
  size_t resident_bytes(const PageCounter& pages = PageCounter()) const;

 private:
  // A row's 32-bit block counts: allocated, temporary, then the lifetime
  // buckets (their sum is the freed count).
  enum : unsigned { kAllocated = 0, kTemporary = 1, kLifetime0 = 2 };
  static constexpr unsigned kCounts = kLifetime0 + kLifetimeBuckets;
  static constexpr uint32_t kCarry = uint32_t{1} << 31;
  // The largest count add() puts on the row itself (2^20 blocks: a
  // sampled block's weight is below that at the default interval); a
  // larger one goes to the spill entry.
  static constexpr uint64_t kMaxAdd = uint64_t{1} << 30;
  // Set in Slot::flags once the row has touched its spill entry.
  static constexpr uint32_t kSpilled = 2;
  // Slot::flags' carry counts: bits 8-15 count carries begun, bits 24-31
  // carries ended (bits 16-23 take the first's overflow); a carry runs
  // while they differ.
  static constexpr uint32_t kCarryIn = uint32_t{1} << 8;
  static constexpr uint32_t kCarryOut = uint32_t{1} << 24;
  static bool carrying(uint32_t flags) { return (flags >> 8 & 0xFF) != flags >> 24; }

  struct alignas(128) Slot {
    std::atomic<uint32_t> id;
    std::atomic<uint32_t> flags;  // MI_CHURN_SAMPLED, kSpilled, carry counts
    std::atomic<uint64_t> allocated_bytes;
    std::atomic<uint64_t> freed_bytes;
    std::atomic<uint32_t> counts[kCounts];  // below kCarry but for a moment: see add()
  };
  static_assert(sizeof(Slot) == kRowBytes, "a churn row is two cache lines");

  // A row's carried counts (see the header), at the row's index.
  struct Spill {
    std::atomic<uint64_t> counts[kCounts];
  };

  // Adds x (fixed point) to count i of s, carrying.
  void add(Slot& s, unsigned i, uint64_t x) {
    if (x >= kMaxAdd) [[unlikely]] {
      add_wide(s, i, x);
      return;
    }
    const auto v = static_cast<uint32_t>(x);
    const uint32_t old = s.counts[i].fetch_add(v, std::memory_order_relaxed);
    const uint32_t now = old + v;  // wraps past 2^32
    if ((now >= kCarry && old < kCarry) || now < old) [[unlikely]]
      carry(s, i, old, v);
  }
  // The add of v to count i of s found `old` there: it crossed kCarry
  // (carries it) or wrapped (adds 2^32 to the spill entry).
  [[gnu::noinline, gnu::cold]] void carry(Slot& s, unsigned i, uint32_t old, uint32_t v);
  // Adds a count of any size: to the row while it stays well below a
  // carry, else to its spill entry (the sweep's folds).
  void add_wide(Slot& s, unsigned i, uint64_t x);
  // The spill entry of s, flagged as touched (kSpilled).
  Spill* spill_for(Slot& s);
  // The spill entry of s when it touched it, else nullptr.
  const Spill* spill_of(const Slot& s, uint32_t flags) const {
    return (flags & kSpilled) != 0 ? &spills_[&s - slots_] : nullptr;
  }
  // Waits a little while a carry runs on s (the sweep's folds): a fold
  // that took a count between a carry's two steps would leave 2^31 behind.
  void await_carry(const Slot& s) const;
  // Count i of s: the row's and its spill's (fixed point).
  uint64_t count(const Slot& s, const Spill* sp, unsigned i) const {
    return s.counts[i].load(std::memory_order_acquire) +
           (sp != nullptr ? sp->counts[i].load(std::memory_order_acquire) : 0);
  }

  static uint64_t whole(uint64_t fixed) { return (fixed + kCountOne / 2) / kCountOne; }
  // The row of stack `id`: row 0 (no stack) for id 0 or a row out of range.
  Slot& slot_of(uint32_t id, uint32_t row) { return slots_[id != 0 && row < nslots_ ? row : 0]; }
  // Makes s (row `row`) the row of `id`, folding what an older id counted
  // into the unknown stacks' row.
  [[gnu::noinline, gnu::cold]] void claim(Slot& s, uint32_t id, uint32_t row);
  // Adds what `from` counted to `to` and zeroes `from` (its id stays).
  void fold(Slot& from, Slot& to);
  bool valid_row(uint32_t row) const { return row != 0 && row < nslots_; }

  void* mem_ = nullptr;      // the mapping: slots_ starts a row before its second page
  Slot* slots_ = nullptr;    // row 0 (unknown), then one per stack-table record
  Spill* spills_ = nullptr;  // one per row, after the rows (same mapping)
  size_t row_bytes_ = 0;     // the mapping's part before spills_
  // Per segment, its rows up to here may have counted (read by for_each).
  std::atomic<uint32_t> used_[kMaxSegments] = {};
  size_t base_[kMaxSegments + 1] = {};  // segment g: rows [base_[g], base_[g + 1])
  unsigned segments_ = 0;
  size_t nslots_ = 0;  // rows mapped, row 0 included
  size_t bytes_ = 0;
};

template <class F>
uint64_t ChurnTable::for_each(F&& f) const {
  uint64_t n = 0;
  // Row 0 and each segment's rows claimed so far: records are dense in
  // each class, nothing past them was written (reading it would map pages
  // for nothing).
  auto visit = [&](size_t i) {
    const Slot& s = slots_[i];
    mi_abi_churn row{};
    uint32_t flags = 0;
    uint64_t freed = 0;
    // Read again when a carry ran meanwhile (see the header). Acquire
    // loads keep the second read of the flags after the counts.
    for (int attempt = 0; attempt < 64; ++attempt) {
      flags = s.flags.load(std::memory_order_acquire);
      if (carrying(flags) && attempt < 63) {  // the last try reads anyway
        if (attempt >= 8) ::sched_yield();
        continue;
      }
      const Spill* sp = spill_of(s, flags);
      row.allocated_count = whole(count(s, sp, kAllocated));
      row.temporary_count = whole(count(s, sp, kTemporary));
      freed = 0;
      for (unsigned b = 0; b < kLifetimeBuckets; ++b) {
        const uint64_t v = count(s, sp, kLifetime0 + b);
        row.lifetimes[b] = whole(v);
        freed += v;
      }
      if (s.flags.load(std::memory_order_acquire) == flags) break;
    }
    row.allocated_bytes = s.allocated_bytes.load(std::memory_order_relaxed);
    row.freed_bytes = s.freed_bytes.load(std::memory_order_relaxed);
    if (row.allocated_count == 0 && freed == 0) return;
    row.stack_id = i == 0 ? 0 : s.id.load(std::memory_order_relaxed);
    row.flags = flags & MI_CHURN_SAMPLED;
    row.freed_count = whole(freed);
    f(static_cast<const mi_abi_churn&>(row));
    ++n;
  };
  if (slots_ == nullptr) return 0;
  visit(0);
  for (unsigned g = 0; g < segments_; ++g) {
    size_t used = used_[g].load(std::memory_order_acquire);
    if (used > base_[g + 1] - base_[g]) used = base_[g + 1] - base_[g];
    for (size_t i = 0; i < used; ++i) visit(base_[g] + i);
  }
  return n;
}

}  // namespace mi::track

#endif
