// The live table: one 32-byte slot per recorded live block, keyed by
// address, open addressing with linear probing bounded to kWindow slots.
//
// A slot packs its entry in four words: the key (the address divided by
// 8, and the size's top bits), the pid, the timestamp, and a word of the
// stack id, the size's low bits and the sequence number. So an entry
// holds an address that is a multiple of 8 (every malloc family result:
// glibc aligns to 16, jemalloc's smallest class to 8) below 2^48 - 24
// (user space ends at 2^47 without 5-level paging) and a size below 2^40
// (1 TiB); insert() refuses anything else (the caller counts it as
// dropped). The sequence number has 11 bits: a reader is fooled only by
// exactly 1024 rewrites of one slot between its two reads of the word.
//
// Concurrency: lock-free. Any number of threads insert and remove while any
// number of readers iterate. A slot is claimed by CAS on its key
// (EMPTY/TOMB -> BUSY), written under a per-slot sequence lock, then
// published; readers retry a slot whose sequence changed, so every entry a
// reader sees has address, size, timestamp and stack from one allocation.
//
// Capacity is fixed at init. An insert whose window is full fails (the
// caller counts it as dropped): collisions never silently lose entries.
// Removed slots become tombstones, reused by later inserts; a slot never
// returns to EMPTY (except through reset_all on a quiescent table), which is
// what lets a lookup stop at the first EMPTY slot.
//
// A small array of per-group counters (one per 64 home slots) lets remove()
// answer "not here" with one load when no live entry hashes near the
// address: the common case in sample mode, where most freed blocks were
// never recorded.
//
// Never allocates through malloc (memory from os_map). All methods are
// thread-safe unless noted.
#ifndef MALLOCINFO_TRACK_LIVE_TABLE_H
#define MALLOCINFO_TRACK_LIVE_TABLE_H

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mi::track {

struct LiveEntry {
  uint64_t address;
  uint64_t size;
  uint64_t timestamp_ns;
  uint32_t stack_id;  // bit 31: kSampledBit; bits 0-30: the stack's id
  uint64_t pid;       // the Erlang process that allocated it (mi_abi_entry.pid), or 0
};

// Set in LiveEntry::stack_id when the block was recorded by the sampler, so
// estimates stay right when the mode changes while blocks are live.
constexpr uint32_t kSampledBit = 0x80000000u;

class LiveTable {
 public:
  static constexpr size_t kWindow = 64;

  // Reserves at least `capacity` slots (rounded up to a power of two, at
  // least kWindow). False when the memory cannot be mapped. Not thread-safe.
  bool init(size_t capacity);
  // Unmaps. Not thread-safe; only for tests.
  void destroy();

  // Records a live block. False when the probe window is full, or the
  // entry cannot be held (an address that is not a multiple of 8 or not
  // below 2^48, a size not below 2^40). Precondition: `address` is not
  // already in the table (the allocator just returned it).
  bool insert(uint64_t address, uint64_t size, uint64_t timestamp_ns, uint32_t stack_id,
              uint64_t pid = 0);
  // Removes `address` if present, copying its entry to *out. False if absent
  // (an address that is not a multiple of 8 always is).
  bool remove(uint64_t address, LiveEntry* out);

  // Calls f(const LiveEntry&) for every live entry, each read consistently.
  // Entries inserted or removed during the walk may or may not be seen.
  // Returns the number of entries passed to f.
  template <class F>
  uint64_t for_each(F&& f) const;

  // Calls f(uint32_t stack_id) for every slot in [lo, hi) that holds a
  // published entry, with the stack field as last written (bit 31 is
  // kSampledBit). Cheaper than for_each: no per-slot consistency check,
  // which the stack sweep does not need (an entry being rewritten is
  // covered by its writer's pending id, see tracker.h). Thread-safe.
  template <class F>
  void for_each_stack(size_t lo, size_t hi, F&& f) const;

  // Called by clear() with every entry it removes (ctx is the caller's).
  using ClearFn = void (*)(const LiveEntry& e, void* ctx);
  // Removes every live entry; returns how many, and their bytes in *bytes.
  // each (may be nullptr) sees every removed entry. Safe while other
  // threads insert and remove.
  uint64_t clear(uint64_t* bytes, ClearFn each = nullptr, void* ctx = nullptr);
  // The same, then gives every page back to the kernel (the table then
  // costs no resident memory until written again). Precondition: no thread
  // inserts or removes meanwhile (the tracker makes sure of it); readers may
  // run (a zeroed slot reads as empty, a slot zeroed mid-read fails its
  // sequence check and is retried).
  uint64_t clear_and_release(uint64_t* bytes, ClearFn each = nullptr, void* ctx = nullptr);
  // Resident bytes of the table's mapping (mincore). Thread-safe.
  size_t resident_bytes() const;

  size_t capacity() const { return mask_ + 1; }
  size_t bytes_reserved() const { return bytes_; }

 private:
  struct Slot {
    // kEmpty, kTomb, kBusy, or addr_key(address) (45 bits) | the size's
    // top 19 bits << 45.
    std::atomic<uint64_t> key;
    std::atomic<uint64_t> pid;
    std::atomic<uint64_t> ts;
    // stack id << 32 | the size's low 21 bits << 11 | sequence (11 bits,
    // odd while a writer owns the slot's fields).
    std::atomic<uint64_t> meta;
  };
  static_assert(sizeof(Slot) == 32, "a live entry costs 32 bytes");

  static constexpr uint64_t kEmpty = 0;
  static constexpr uint64_t kTomb = 1;
  static constexpr uint64_t kBusy = 2;
  static constexpr unsigned kAddrBits = 45;  // addr_key(): address / 8 + 3
  static constexpr uint64_t kAddrMask = (uint64_t{1} << kAddrBits) - 1;
  static constexpr unsigned kSizeLoBits = 21;
  static constexpr uint64_t kSizeLoMask = (uint64_t{1} << kSizeLoBits) - 1;
  static constexpr unsigned kSeqBits = 11;
  static constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
  static constexpr uint64_t kMaxSize = uint64_t{1} << 40;
  // The key of `address` without its size bits: address / 8 + 3, so that
  // no key is kEmpty, kTomb or kBusy (address 0 included).
  static uint64_t addr_key(uint64_t address) { return (address >> 3) + 3; }
  static uint64_t key_of(uint64_t address, uint64_t size) {
    return addr_key(address) | (size >> kSizeLoBits) << kAddrBits;
  }
  static uint64_t address_of(uint64_t key) { return ((key & kAddrMask) - 3) << 3; }
  static uint64_t meta_of(uint32_t stack, uint64_t size, uint64_t seq) {
    return uint64_t{stack} << 32 | (size & kSizeLoMask) << kSeqBits | (seq & kSeqMask);
  }
  static uint64_t with_seq(uint64_t meta, uint64_t seq) {
    return (meta & ~kSeqMask) | (seq & kSeqMask);
  }
  // An entry from its key and meta words.
  static void unpack(uint64_t key, uint64_t meta, LiveEntry* out) {
    out->address = address_of(key);
    out->size = (key >> kAddrBits) << kSizeLoBits | ((meta >> kSeqBits) & kSizeLoMask);
    out->stack_id = static_cast<uint32_t>(meta >> 32);
  }
  static constexpr unsigned kGroupShift = 6;
  static constexpr size_t kGroupMask = (size_t{1} << kGroupShift) - 1;
  static_assert(kWindow <= (size_t{1} << kGroupShift), "for_each_stack skips by two groups");

  size_t home(uint64_t address) const;
  // True when no entry can sit in the slots of slot i's group (i is a
  // group's first slot): its group and the one before count no entries.
  bool group_unused(size_t i) const;
  bool read_slot(const Slot& s, LiveEntry* out) const;
  // Frees slot s, which the caller holds (kBusy) and whose key was `key`.
  void release_slot(Slot& s, uint64_t key, size_t home_index, LiveEntry* out);

  Slot* slots_ = nullptr;
  std::atomic<uint32_t>* groups_ = nullptr;
  size_t mask_ = 0;
  unsigned shift_ = 64;
  size_t bytes_ = 0;
};

inline size_t LiveTable::home(uint64_t address) const {
  // Each 4 KiB page of memory maps to a run of 256 consecutive slots (one
  // per 16-byte granule; blocks are 16-byte aligned) at a hashed base:
  // blocks near each other in memory are near each other in the table, so a
  // working set of live blocks touches few table pages and cache lines,
  // while pages far apart (arenas, mmapped blocks) still scatter.
  const size_t base = static_cast<size_t>(((address >> 12) * 0x9E3779B97F4A7C15ull) >> shift_);
  return (base + ((address >> 4) & 0xFF)) & mask_;
}

inline bool LiveTable::group_unused(size_t i) const {
  // A slot holds an entry whose home is at most kWindow - 1 slots before
  // it: in its own group or the one before. Both groups empty, no entry can
  // be in this group's slots. An insert counts its group before it
  // publishes the key (see insert), so nothing visible is lost.
  const size_t g = i >> kGroupShift;
  return groups_[g].load(std::memory_order_relaxed) == 0 &&
         groups_[(g - 1) & (mask_ >> kGroupShift)].load(std::memory_order_relaxed) == 0;
}

template <class F>
uint64_t LiveTable::for_each(F&& f) const {
  uint64_t n = 0;
  LiveEntry e;
  for (size_t i = 0; i <= mask_; ++i) {
    // Whole groups that cannot hold an entry are skipped unread: a walk
    // over a sparse (or just released) table must not map the pages it
    // never wrote back in (the read faults would cost the table's full
    // size in RSS where the kernel does not map the zero page).
    if ((i & kGroupMask) == 0 && group_unused(i)) {
      i += kGroupMask;
      continue;
    }
    if (slots_[i].key.load(std::memory_order_relaxed) <= kBusy) continue;
    if (read_slot(slots_[i], &e)) {
      f(static_cast<const LiveEntry&>(e));
      ++n;
    }
  }
  return n;
}

template <class F>
void LiveTable::for_each_stack(size_t lo, size_t hi, F&& f) const {
  for (size_t i = lo; i < hi && i <= mask_; ++i) {
    // As for_each: a sweep over a sparse table reads only the pages that
    // hold entries.
    if ((i & kGroupMask) == 0 && group_unused(i)) {
      i += kGroupMask;
      continue;
    }
    // Acquire on the key: the stack field written before it was published
    // is visible (or a later one, if the slot was reused meanwhile).
    if (slots_[i].key.load(std::memory_order_acquire) <= kBusy) continue;
    f(static_cast<uint32_t>(slots_[i].meta.load(std::memory_order_relaxed) >> 32));
  }
}

}  // namespace mi::track

#endif
