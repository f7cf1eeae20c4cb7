#include "live_table.h"

#include <sched.h>

#include "os_mem.h"

namespace mi::track {

bool LiveTable::init(size_t capacity) {
  size_t cap = kWindow;
  unsigned bits = 6;
  while (cap < capacity) {
    cap <<= 1;
    ++bits;
  }
  const size_t slot_bytes = cap * sizeof(Slot);
  const size_t group_bytes = ((cap >> kGroupShift) + 1) * sizeof(std::atomic<uint32_t>);
  void* mem = os_map(slot_bytes + group_bytes);
  if (mem == nullptr) return false;
  slots_ = static_cast<Slot*>(mem);
  groups_ = reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(mem) + slot_bytes);
  mask_ = cap - 1;
  shift_ = 64 - bits;
  bytes_ = slot_bytes + group_bytes;
  return true;
}

void LiveTable::destroy() {
  os_unmap(slots_, bytes_);
  slots_ = nullptr;
  groups_ = nullptr;
  bytes_ = 0;
}

bool LiveTable::insert(uint64_t address, uint64_t size, uint64_t timestamp_ns, uint32_t stack_id,
                       uint64_t pid) {
  if ((address & 7) != 0 || addr_key(address) > kAddrMask || size >= kMaxSize) [[unlikely]]
    return false;
  const size_t h = home(address);
  for (size_t i = 0; i < kWindow; ++i) {
    Slot& s = slots_[(h + i) & mask_];
    uint64_t k = s.key.load(std::memory_order_relaxed);
    if (k != kEmpty && k != kTomb) continue;
    if (!s.key.compare_exchange_strong(k, kBusy, std::memory_order_acquire,
                                       std::memory_order_relaxed))
      continue;
    // The slot is ours. Count it in its group before publishing, so a
    // concurrent remove() of this address cannot skip the window.
    groups_[h >> kGroupShift].fetch_add(1, std::memory_order_relaxed);
    // Sequence lock without fences (which TSan cannot model): the field
    // stores are release, so a reader that sees any of them also sees the
    // odd sequence number stored before; on x86 these are plain moves.
    const uint64_t m = s.meta.load(std::memory_order_relaxed);
    const uint64_t q = m & kSeqMask;
    s.meta.store(with_seq(m, q + 1), std::memory_order_relaxed);
    s.pid.store(pid, std::memory_order_release);
    s.ts.store(timestamp_ns, std::memory_order_release);
    // Even sequence, with the new stack and size, before the key: the next
    // owner claims the slot by CAS on the key, and must then read this even
    // number, or it would start from an odd one and leave the slot's
    // parity flipped for good.
    s.meta.store(meta_of(stack_id, size, q + 2), std::memory_order_release);
    s.key.store(key_of(address, size), std::memory_order_release);
    return true;
  }
  return false;
}

void LiveTable::release_slot(Slot& s, uint64_t key, size_t home_index, LiveEntry* out) {
  const uint64_t m = s.meta.load(std::memory_order_relaxed);
  const uint64_t q = m & kSeqMask;
  s.meta.store(with_seq(m, q + 1), std::memory_order_relaxed);
  if (out != nullptr) {
    unpack(key, m, out);
    out->timestamp_ns = s.ts.load(std::memory_order_relaxed);
    out->pid = s.pid.load(std::memory_order_relaxed);
  }
  s.meta.store(with_seq(m, q + 2), std::memory_order_release);  // before the key: see insert()
  s.key.store(kTomb, std::memory_order_release);
  groups_[home_index >> kGroupShift].fetch_sub(1, std::memory_order_relaxed);
}

bool LiveTable::remove(uint64_t address, LiveEntry* out) {
  const size_t h = home(address);
  if (groups_[h >> kGroupShift].load(std::memory_order_relaxed) == 0) return false;
  // insert() holds only multiples of 8, and the key drops the low 3 bits:
  // a free of a pointer inside a block must not take the block's entry.
  if ((address & 7) != 0) [[unlikely]]
    return false;
  const uint64_t want = addr_key(address);
  for (size_t i = 0; i < kWindow; ++i) {
    Slot& s = slots_[(h + i) & mask_];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == kEmpty) return false;
    // want >= 3: kTomb and kBusy never match it.
    if ((k & kAddrMask) != want) continue;
    if (!s.key.compare_exchange_strong(k, kBusy, std::memory_order_acquire,
                                       std::memory_order_relaxed))
      return false;  // someone else removed it (a double free race)
    release_slot(s, k, h, out);
    return true;
  }
  return false;
}

bool LiveTable::read_slot(const Slot& s, LiveEntry* out) const {
  // A writer holds a slot for a handful of instructions, but it can be
  // preempted there: retry a little, yield, and give up on the slot rather
  // than spin for long (readers run on dirty schedulers, never in hooks).
  for (int attempt = 0; attempt < 64; ++attempt) {
    const uint64_t m1 = s.meta.load(std::memory_order_acquire);
    if ((m1 & 1) == 0) {
      // Acquire loads keep the second meta read after the field reads.
      const uint64_t k = s.key.load(std::memory_order_acquire);
      out->timestamp_ns = s.ts.load(std::memory_order_acquire);
      out->pid = s.pid.load(std::memory_order_acquire);
      const uint64_t m2 = s.meta.load(std::memory_order_relaxed);
      if (m1 == m2) {
        if (k <= kBusy) return false;
        unpack(k, m1, out);
        return true;
      }
    }
    if (attempt >= 8) ::sched_yield();
  }
  return false;
}

uint64_t LiveTable::clear_and_release(uint64_t* bytes, ClearFn each, void* ctx) {
  const uint64_t n = clear(bytes, each, ctx);
  os_release(slots_, bytes_);
  return n;
}

size_t LiveTable::resident_bytes() const {
  return os_resident(slots_, bytes_);
}

uint64_t LiveTable::clear(uint64_t* bytes, ClearFn each, void* ctx) {
  uint64_t n = 0;
  uint64_t b = 0;
  for (size_t i = 0; i <= mask_; ++i) {
    if ((i & kGroupMask) == 0 && group_unused(i)) {  // as for_each: leave unwritten pages unread
      i += kGroupMask;
      continue;
    }
    Slot& s = slots_[i];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k <= kBusy) continue;
    if (!s.key.compare_exchange_strong(k, kBusy, std::memory_order_acquire,
                                       std::memory_order_relaxed))
      continue;
    LiveEntry e;
    release_slot(s, k, home(address_of(k)), &e);
    ++n;
    b += e.size;
    if (each != nullptr) each(e, ctx);
  }
  if (bytes != nullptr) *bytes = b;
  return n;
}

}  // namespace mi::track
