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
// estimate; rows are rounded once, when read. 48 integer bits: 2.8e14
// blocks per site.
//
// Counters are relaxed atomic adds on shared cache lines: lock-free and
// allocation-free, exact once writers are quiescent, but contended when
// many threads allocate from one site (see BENCHMARKS.md). In sample mode
// every figure is a sampled block's weight (common/mi_sampling.h): an
// unbiased estimate.
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

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../common/mi_abi.h"
#include "os_mem.h"

namespace mi::track {

constexpr unsigned kLifetimeBuckets = MI_LIFETIME_BUCKETS;
// One block, in ChurnTable's fixed-point counts.
constexpr uint64_t kCountOne = uint64_t{1} << 16;

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
    s.allocated_count.fetch_add(count, std::memory_order_relaxed);
    s.allocated_bytes.fetch_add(bytes, std::memory_order_relaxed);
    if (sampled && s.flags.load(std::memory_order_relaxed) == 0) [[unlikely]]
      s.flags.store(MI_CHURN_SAMPLED, std::memory_order_relaxed);
  }
  // A block of stack `id` left the live table (freed, or moved by
  // realloc) after living `lifetime_ns`; it stands for `count` (fixed
  // point) blocks of
  // `bytes` bytes; `temporary`: it was its thread's last allocation.
  void on_free(uint32_t id, uint32_t row, uint64_t count, uint64_t bytes, uint64_t lifetime_ns,
               bool temporary) {
    Slot* s = &slot_of(id, row);
    // The row was claimed by a newer id meanwhile (the old stack was
    // reclaimed under a live block: a protocol failure, see tracker.h), or
    // never by this one: count the free with the unknown stacks.
    if (s->id.load(std::memory_order_relaxed) != id) [[unlikely]]
      s = &slots_[0];
    s->freed_bytes.fetch_add(bytes, std::memory_order_relaxed);
    s->lifetimes[lifetime_bucket(lifetime_ns)].fetch_add(count, std::memory_order_relaxed);
    if (temporary) s->temporary.fetch_add(count, std::memory_order_relaxed);
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
  size_t resident_bytes(const PageCounter& pages = PageCounter()) const;

 private:
  struct alignas(64) Slot {
    std::atomic<uint32_t> id;
    std::atomic<uint32_t> flags;  // MI_CHURN_SAMPLED
    std::atomic<uint64_t> allocated_count;
    std::atomic<uint64_t> allocated_bytes;
    std::atomic<uint64_t> freed_bytes;
    std::atomic<uint64_t> temporary;
    std::atomic<uint64_t> lifetimes[kLifetimeBuckets];  // their sum is the freed count
  };
  static_assert(sizeof(Slot) == 256, "a churn slot is four cache lines");

  static uint64_t whole(uint64_t fixed) { return (fixed + kCountOne / 2) / kCountOne; }
  // The row of stack `id`: row 0 (no stack) for id 0 or a row out of range.
  Slot& slot_of(uint32_t id, uint32_t row) { return slots_[id != 0 && row < nslots_ ? row : 0]; }
  // Makes s (row `row`) the row of `id`, folding what an older id counted
  // into the unknown stacks' row.
  [[gnu::noinline, gnu::cold]] void claim(Slot& s, uint32_t id, uint32_t row);
  // Adds what `from` counted to `to` and zeroes `from` (its id stays).
  static void fold(Slot& from, Slot& to);
  bool valid_row(uint32_t row) const { return row != 0 && row < nslots_; }

  void* mem_ = nullptr;    // the mapping: slots_ starts 256 bytes before its second page
  Slot* slots_ = nullptr;  // row 0 (unknown), then one per stack-table record
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
    row.allocated_count = whole(s.allocated_count.load(std::memory_order_relaxed));
    row.allocated_bytes = s.allocated_bytes.load(std::memory_order_relaxed);
    row.freed_bytes = s.freed_bytes.load(std::memory_order_relaxed);
    uint64_t freed = 0;
    for (unsigned b = 0; b < kLifetimeBuckets; ++b) {
      const uint64_t v = s.lifetimes[b].load(std::memory_order_relaxed);
      row.lifetimes[b] = whole(v);
      freed += v;
    }
    if (row.allocated_count == 0 && freed == 0) return;
    row.stack_id = i == 0 ? 0 : s.id.load(std::memory_order_relaxed);
    row.flags = s.flags.load(std::memory_order_relaxed);
    row.freed_count = whole(freed);
    row.temporary_count = whole(s.temporary.load(std::memory_order_relaxed));
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
