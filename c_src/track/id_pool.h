// A pool of ids 0 .. limit - 1 for a table's fixed array of records: a
// lock-free free list (a Treiber stack) in front of a bump pointer. The
// live table's chunks come from two (the stack table's records from
// bitmaps instead, which a sweep can shrink: record_map.h).
//
// The free list's links live in the records themselves: take() and give()
// are passed link(id), the caller's atomic word (32 bits or more) that
// holds a free id's successor while it is on the list. Its head carries a
// count of head changes above the id (an ABA stamp), so a thread that read
// a head and its link cannot install a link that went stale meanwhile. A
// link read from a record another thread took meanwhile may be anything:
// the records' memory must stay mapped (it does: tables never unmap while
// in use), and then the stamp has moved and the CAS fails.
//
// Never allocates, never blocks: callable from a malloc hook. Thread-safe
// except reset().
#ifndef MALLOCINFO_TRACK_ID_POOL_H
#define MALLOCINFO_TRACK_ID_POOL_H

#include <atomic>
#include <cstdint>

namespace mi::track {

class IdPool {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // Empties the free list and rewinds the bump pointer. Not thread-safe.
  void reset(uint32_t limit) {
    limit_ = limit;
    head_.store(kNone, std::memory_order_relaxed);
    bumped_.store(0, std::memory_order_release);
  }

  // A free id (the free list's first, else the next never handed out), or
  // kNone when all are taken.
  template <class Link>
  uint32_t take(Link&& link) {
    // Acquire: the link read next is the one the id's giver stored before
    // its release CAS.
    uint64_t head = head_.load(std::memory_order_acquire);
    while (static_cast<uint32_t>(head) != kNone) {
      const uint32_t id = static_cast<uint32_t>(head);
      const auto next = static_cast<uint32_t>(link(id).load(std::memory_order_relaxed));
      const uint64_t want = ((head >> 32) + 1) << 32 | next;
      if (head_.compare_exchange_weak(head, want, std::memory_order_acquire,
                                      std::memory_order_acquire))
        return id;
    }
    uint32_t b = bumped_.load(std::memory_order_relaxed);
    while (b < limit_)
      if (bumped_.compare_exchange_weak(b, b + 1, std::memory_order_release,
                                        std::memory_order_relaxed))
        return b;
    return kNone;
  }

  // Puts `id` (taken before) back; link(id) is overwritten. Release: a
  // taker then sees the link, and everything done to the record before.
  template <class Link>
  void give(uint32_t id, Link&& link) {
    uint64_t head = head_.load(std::memory_order_relaxed);
    uint64_t want;
    do {
      link(id).store(static_cast<uint32_t>(head), std::memory_order_release);
      want = ((head >> 32) + 1) << 32 | id;
    } while (!head_.compare_exchange_weak(head, want, std::memory_order_release,
                                          std::memory_order_relaxed));
  }

  // Ids the bump pointer has handed out: every id ever taken is below.
  uint32_t bumped() const { return bumped_.load(std::memory_order_acquire); }
  // The free list's first id, or kNone (for consistency checks on a
  // quiescent table).
  uint32_t first_free() const {
    return static_cast<uint32_t>(head_.load(std::memory_order_relaxed));
  }

 private:
  alignas(64) std::atomic<uint64_t> head_{kNone};
  std::atomic<uint32_t> bumped_{0};
  uint32_t limit_ = 0;
};

}  // namespace mi::track

#endif
