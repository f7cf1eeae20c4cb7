// Deduplicated call stacks: a stack (raw return addresses, innermost first)
// is stored once and named by a 32-bit id, so live entries carry 4 bytes of
// stack and aggregation by call site is a group-by on an integer.
//
// Open addressing on the stack's hash, bounded probing. Lock-free: a slot is
// claimed by CAS (EMPTY -> WRITING), filled, then published (READY) with
// release order; readers only trust READY slots. Stacks are never removed,
// so an id stays valid, with the same content, for the life of the process:
// no reader can see "the stack of a reused slot".
//
// If a racing thread is still writing the slot this stack hashes to, the
// inserter waits a bounded number of spins and then probes on, at worst
// storing the same stack twice (two ids for one stack; readers that group
// by content merge them). It never spins unboundedly, including in a child
// forked while another thread was mid-write.
//
// Never allocates through malloc. Thread-safe unless noted.
#ifndef MALLOCINFO_TRACK_STACK_TABLE_H
#define MALLOCINFO_TRACK_STACK_TABLE_H

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mi::track {

class StackTable {
 public:
  static constexpr size_t kWindow = 64;

  // Room for at least `capacity` stacks of up to `depth` frames. Not
  // thread-safe. False when memory cannot be mapped.
  bool init(size_t capacity, unsigned depth);
  void destroy();  // tests only

  // The id of this stack (1-based), storing it if new; 0 when it cannot be
  // stored (table full around its hash; counted in dropped()). n is capped
  // to depth(). An empty stack (n == 0) has id 0.
  uint32_t intern(const uintptr_t* frames, unsigned n);

  // Copies up to `max` frames of stack `id` to out; returns the stack's
  // depth, or 0 for an unknown id.
  unsigned get(uint32_t id, uint64_t* out, unsigned max) const;

  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  size_t capacity() const { return mask_ + 1; }
  unsigned depth() const { return depth_; }
  size_t bytes_reserved() const { return bytes_; }

 private:
  struct Header {
    std::atomic<uint32_t> state;  // kEmpty, kWriting, kReady
    uint32_t depth;
    uint64_t hash;
  };
  static constexpr uint32_t kEmpty = 0;
  static constexpr uint32_t kWriting = 1;
  static constexpr uint32_t kReady = 2;

  bool equal(size_t slot, uint64_t hash, const uintptr_t* frames, unsigned n) const;

  Header* headers_ = nullptr;
  uintptr_t* frames_ = nullptr;
  size_t mask_ = 0;
  unsigned depth_ = 0;
  size_t bytes_ = 0;
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace mi::track

#endif
