// Which records of a pool are taken: a bitmap, one bit per record (set:
// taken), handed out lowest first: the stack table's records and the live
// table's chunks. It replaces free lists (issue 26) because the
// lowest-first order is what lets a pool shrink: new stacks fill the holes
// low in the pool, the sweep moves the stacks stored high down into the
// rest (StackTable::compact_move()), and what is above is all free, so its
// pages can go back to the kernel (the live table's chunks do not move,
// but new chains fill the low holes and the free chunks' pages go back:
// LiveTable::trim()). A free list hands records out in the order they
// were freed, scattered over the whole pool, and keeps its links in the
// free records' own memory, which therefore could never be given back.
//
// take() starts at a hint: the lowest word that may have a free bit. give()
// lowers it; take() raises it past words it finds full. A take that raises
// it past a bit given back meanwhile leaves that bit unused until the hint
// comes down again (a later give(), or reset_hint(), which the sweep calls):
// a record lost for a while, never one handed out twice.
//
// claim_free() lets the sweep take every free record of a range at once,
// give their memory back, then return them with unclaim(): while claimed,
// no take() can hand them out and write them.
//
// The bitmap's words are the caller's (zeroed memory, in the table's own
// mapping). Never allocates, never blocks: callable from a malloc hook.
// Thread-safe except init().
#ifndef MALLOCINFO_TRACK_RECORD_MAP_H
#define MALLOCINFO_TRACK_RECORD_MAP_H

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mi::track {

class RecordMap {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // Words a map of n records needs.
  static constexpr size_t words_for(uint32_t n) { return (size_t{n} + 63) / 64; }

  // A map of n records, every one free, over `words` (words_for(n) zeroed
  // words). Not thread-safe.
  void init(std::atomic<uint64_t>* words, uint32_t n) {
    bits_ = words;
    n_ = n;
    nwords_ = static_cast<uint32_t>(words_for(n));
    hint_.store(0, std::memory_order_relaxed);
    high_.store(0, std::memory_order_relaxed);
  }

  // The lowest free record at or above the hint, now taken; kNone when
  // every record is taken. Acquire: the taker sees what the giver did to
  // the record before give().
  uint32_t take() {
    uint32_t w = hint_.load(std::memory_order_relaxed);
    for (; w < nwords_; ++w) {
      uint64_t v = bits_[w].load(std::memory_order_relaxed);
      while (v != ~uint64_t{0}) {
        const unsigned b = static_cast<unsigned>(__builtin_ctzll(~v));
        const uint32_t i = w * 64 + b;
        if (i >= n_) return kNone;
        if (bits_[w].compare_exchange_weak(v, v | uint64_t{1} << b, std::memory_order_acquire,
                                           std::memory_order_relaxed)) {
          raise_high(i + 1);
          return i;
        }
      }
      // Full: later takes may start past it.
      uint32_t h = w;
      hint_.compare_exchange_strong(h, w + 1, std::memory_order_relaxed);
    }
    return kNone;
  }

  // Puts record i (taken before) back. Release: a taker sees what was done
  // to the record before.
  void give(uint32_t i) {
    bits_[i / 64].fetch_and(~(uint64_t{1} << (i % 64)), std::memory_order_release);
    lower_hint(i / 64);
  }

  // True when record i is taken (a snapshot).
  bool taken(uint32_t i) const {
    return (bits_[i / 64].load(std::memory_order_acquire) >> (i % 64) & 1) != 0;
  }

  // Takes every free record of word w (records w * 64 .. w * 64 + 63) and
  // returns which were free (bit set: claimed now); the caller gives them
  // back with unclaim(w, mask) after using their memory.
  uint64_t claim_free(uint32_t w) {
    const uint64_t old = bits_[w].fetch_or(~uint64_t{0}, std::memory_order_acquire);
    return ~old;
  }
  void unclaim(uint32_t w, uint64_t mask) {
    bits_[w].fetch_and(~mask, std::memory_order_release);
    lower_hint(w);
  }

  // Lowers the hint to the lowest word with a free bit (the sweep's, after
  // it moved records: undoes hints raised past bits given back meanwhile).
  void reset_hint() {
    uint32_t w = 0;
    while (w < nwords_ && bits_[w].load(std::memory_order_relaxed) == ~uint64_t{0}) ++w;
    // Only ever lowered: a store could undo a give() that lowered it
    // further meanwhile.
    lower_hint(w);
  }

  // Taken records now (a snapshot, exact on a quiescent map).
  uint32_t count() const {
    uint32_t n = 0;
    const uint32_t top = static_cast<uint32_t>(words_for(high()));
    for (uint32_t w = 0; w < top; ++w)
      n += static_cast<uint32_t>(__builtin_popcountll(bits_[w].load(std::memory_order_relaxed)));
    return n;
  }
  // One more than the highest record taken since init() or the last
  // lower_high(): every record taken is below.
  uint32_t high() const { return high_.load(std::memory_order_acquire); }
  // Lowers high() from `seen` to `n` when no take raised it meanwhile.
  // Only for a caller that holds every record from n up to `seen` (claimed
  // or known free): none is taken then.
  void lower_high(uint32_t seen, uint32_t n) {
    high_.compare_exchange_strong(seen, n, std::memory_order_acq_rel, std::memory_order_relaxed);
  }
  // Word w of the map (a snapshot): bit b set when record w * 64 + b is taken.
  uint64_t word(uint32_t w) const { return bits_[w].load(std::memory_order_acquire); }
  uint32_t size() const { return n_; }
  uint32_t words() const { return nwords_; }

 private:
  void lower_hint(uint32_t w) {
    uint32_t h = hint_.load(std::memory_order_relaxed);
    while (w < h && !hint_.compare_exchange_weak(h, w, std::memory_order_relaxed)) {
    }
  }
  void raise_high(uint32_t n) {
    uint32_t h = high_.load(std::memory_order_relaxed);
    while (n > h && !high_.compare_exchange_weak(h, n, std::memory_order_release,
                                                 std::memory_order_relaxed)) {
    }
  }

  std::atomic<uint64_t>* bits_ = nullptr;
  uint32_t n_ = 0;
  uint32_t nwords_ = 0;
  std::atomic<uint32_t> hint_{0};
  std::atomic<uint32_t> high_{0};
};

}  // namespace mi::track

#endif
