// The live table: one 32-byte slot per recorded live block, keyed by
// address, in buckets of 64 slots, in levels that fill smallest first.
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
// Where an entry goes (issue 26: what the table keeps resident follows the
// number of live blocks, not the table's capacity or how the heap is
// spread). The capacity is cut into levels: kFirstLevel slots, then each
// about 1.5 times the one before. Each level is an array of buckets of 64
// slots, and each 4 KiB page of memory has one bucket in every level,
// picked by that level's own hash of the page. A page's first entry takes
// any free slot of the page's bucket in level 0, else in level 1, and so
// on (later ones start from the level the page's last insert used: see the
// directory below), so a level takes entries only where the smaller ones
// are full: N live blocks touch about N / 0.9 slots of the small levels
// plus the buckets of the level being filled. The mapping is reserved with
// MAP_NORESERVE and untouched pages cost nothing. One bucket per page
// keeps what the page-local layout this replaced gave: a thread's blocks
// (its arena's pages) meet another thread's in few buckets, and a block's
// neighbours share its cache lines.
//
// Tags: a byte per slot, 64 to a bucket in one cache line (0: free, else a
// fingerprint of the live key), so a bucket is searched a word at a time
// and a level that does not hold the address costs no slot reads. The key
// is the authority; a tag is a hint changed only by the slot's owner (see
// insert and remove for why a stale one is safe). A byte per bucket marks
// the buckets written since the table was last released, so walks read
// nothing else.
//
// Concurrency: lock-free. Any number of threads insert and remove while any
// number of readers iterate. A slot is claimed by CAS on its key
// (EMPTY/TOMB -> BUSY), written under a per-slot sequence lock, then
// published; readers retry a slot whose sequence changed, so every entry a
// reader sees has address, size, timestamp and stack from one allocation.
//
// The page directory: which levels hold a page's entries. Levels alone
// would make every lookup search each level the node's long-lived blocks
// have filled (measured: a short-lived pair behind 1M long-lived blocks
// cost 1 us, a free of an unrecorded address after a 1M peak 2 us). So
// each 4 KiB page also has a directory word: a count of its live entries,
// a bit for each level they are in, and the level its last insert used.
// remove() searches only the levels whose bit is set (one, for most
// pages), and answers "not here" from that one word when none is (sample
// mode's common case); insert() tries the page's last level first, so a
// page whose blocks come and go finds its bucket at once, and only a page
// new to the table walks the levels from the smallest. The word changes by
// CAS: an insert adds one to the count and its level's bit after it claims
// the slot and before it publishes the key; a remove takes one off after
// the slot is free, and clears the bits with the count's last one. So the
// bits cover every entry a lookup can be looking for (that entry's insert
// happened before the lookup: the allocator returned the block first). A
// bit can outlive its level's last entry of the page while others remain:
// a lookup then searches a level in vain, never misses one. The words of 8
// consecutive pages share a cache line, at a hashed place in a directory
// of a word per 64 slots (256 KiB for the default table, so even a heap
// spread thin keeps at most that much of it); pages whose words collide
// share them, with the same effect as a stale bit.
//
// Capacity is fixed at init. An insert whose bucket is full in every level
// fails (the caller counts it as dropped): collisions never silently lose
// entries, and the first drop comes only when the table is about full
// (above 80% with every heap layout tested).
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
  static constexpr size_t kBucket = 64;  // slots in a bucket
  static constexpr unsigned kSpan = 4;   // buckets a page may use in a level
  // Slots of level 0: a node with 10k live blocks keeps 520 KiB of table.
  static constexpr size_t kFirstLevel = 16384;
  static constexpr unsigned kMaxLevels = 24;

  // Reserves at least `capacity` slots (rounded up to a multiple of 64, at
  // least 64). False when the memory cannot be mapped. Not thread-safe.
  bool init(size_t capacity);
  // Unmaps. Not thread-safe; only for tests.
  void destroy();

  // Records a live block. False when its bucket is full in every level,
  // or the entry cannot be held (an address that is not a multiple of 8 or
  // not below 2^48, a size not below 2^40). Precondition: `address` is not
  // already in the table (the allocator just returned it).
  bool insert(uint64_t address, uint64_t size, uint64_t timestamp_ns, uint32_t stack_id,
              uint64_t pid = 0);
  // Removes `address` if present, copying its entry to *out. False if absent.
  bool remove(uint64_t address, LiveEntry* out);

  // Calls f(const LiveEntry&) for every live entry, each read consistently.
  // Entries inserted or removed during the walk may or may not be seen.
  // Returns the number of entries passed to f.
  template <class F>
  uint64_t for_each(F&& f) const;

  // Calls f(uint32_t stack_id) for every slot in [lo, hi) (of capacity())
  // that holds a published entry, with the stack field as last written
  // (bit 31 is kSampledBit). Cheaper than for_each: no per-slot
  // consistency check, which the stack sweep does not need (an entry being
  // rewritten is covered by its writer's pending id, see tracker.h).
  // Thread-safe.
  template <class F>
  void for_each_stack(size_t lo, size_t hi, F&& f) const;

  // Called by clear() with every entry it removes (ctx is the caller's).
  using ClearFn = void (*)(const LiveEntry& e, void* ctx);
  // Removes every live entry; returns how many, and their bytes in *bytes.
  // each (may be nullptr) sees every removed entry. Safe while other
  // threads insert and remove.
  uint64_t clear(uint64_t* bytes, ClearFn each = nullptr, void* ctx = nullptr);
  // The same, then gives every page back to the kernel (the table then
  // costs no resident memory until written again) and marks every level
  // unused. Precondition: no thread inserts or removes meanwhile (the
  // tracker makes sure of it); readers may run (a zeroed slot reads as
  // empty, a slot zeroed mid-read fails its sequence check and is retried).
  uint64_t clear_and_release(uint64_t* bytes, ClearFn each = nullptr, void* ctx = nullptr);
  // Resident bytes of the table's mapping (mincore). Thread-safe.
  size_t resident_bytes() const;

  // Slots in all levels.
  size_t capacity() const { return capacity_; }
  size_t bytes_reserved() const { return bytes_; }
  // For tests and benchmarks: the number of levels, level k's slots, and
  // how many levels have held an entry since init or the last release.
  unsigned levels() const { return levels_; }
  size_t level_slots(unsigned k) const { return level_[k].buckets * kBucket; }
  unsigned levels_used() const;
  // For tests: the levels a lookup of `address` would search now (bit k:
  // level k), from its page's directory word.
  uint32_t levels_searched(uint64_t address) const;

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

  // A page's directory word: count (bits 0-34: at most the capacity,
  // 2^32) | last level (bits 35-39) << 35 | level bits (40-63) << 40.
  static constexpr unsigned kLastShift = 35;
  static constexpr unsigned kBitsShift = 40;
  static constexpr uint64_t kCountMask = (uint64_t{1} << kLastShift) - 1;
  static_assert(kMaxLevels <= 64 - kBitsShift, "a directory bit per level");
  static constexpr unsigned kDirRun = 3;  // 2^3 pages have words in one cache line

  // A level: buckets [first, first + buckets) of the one array.
  struct Level {
    size_t first;
    size_t buckets;
    uint64_t mul;  // odd: this level's multiplicative hash of the page
  };

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
  static constexpr size_t kTagWords = kBucket / 8;  // a bucket's tags, 8 to a word
  static constexpr uint64_t kOnes = 0x0101010101010101ull;
  static constexpr uint64_t kHighs = 0x8080808080808080ull;
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
  // The tag of an address: 1-255, from all its bits (the bucket is the page's).
  static uint64_t tag_of(uint64_t address) {
    const uint64_t t = ((address >> 3) * 0xD6E8FEB86659FD93ull) >> 56;
    return t == 0 ? 1 : t;
  }
  // Sets slot j's tag. Only the slot's owner writes its tag byte (the
  // word's other bytes are other slots'), so a byte store does what a
  // locked fetch_or or fetch_and on the word would, for a plain move (two
  // locked instructions a malloc+free pair saved); readers load whole
  // words, and an aligned byte store is single-copy atomic within them.
  void set_tag(size_t j, uint8_t tag) {
    __atomic_store_n(reinterpret_cast<uint8_t*>(tags_) + j, tag, __ATOMIC_RELAXED);
  }
  // 0x80 in every byte of w that is zero, and maybe in bytes above one that
  // is (never in one below, never missing one): callers check the key.
  static uint64_t zero_bytes(uint64_t w) { return (w - kOnes) & ~w & kHighs; }

  // The first bucket of the page of `address` in level l (an index into
  // the bucket arrays), and the b-th of its kSpan (wrapping in the level).
  static size_t bucket_of(const Level& l, uint64_t address) {
    const uint64_t f = ((address >> 12) * l.mul) >> 32;
    return l.first + static_cast<size_t>((f * l.buckets) >> 32);
  }
  // The slot of a bucket claim() tries first for `address`: its 16-byte
  // granule in the page, modulo the bucket (distinct for up to 64 blocks
  // of a page 80 bytes apart, 32 of 32 bytes), turned by an offset of the
  // page's own, so that the pages sharing a bucket (their first blocks at
  // the same granules) do not all start at the same slots.
  static size_t home_slot(uint64_t address) {
    return static_cast<size_t>((address >> 4) + ((address >> 12) * 0x9E3779B97F4A7C15ull >> 58)) %
           kBucket;
  }
  static size_t next_bucket(const Level& l, size_t g, unsigned b) {
    const size_t x = g + b;
    return x < l.first + l.buckets ? x : x - l.buckets;
  }
  // Bits of a bucket's mark: written since the last release; found full by
  // an insert that went on to the next bucket of its span (so a search
  // for an address whose first bucket has no such bit stops there).
  static constexpr uint8_t kWritten = 1;
  static constexpr uint8_t kOverflowed = 2;
  void mark(size_t g, uint8_t bit) {
    // Each bit is set once between releases: a load first keeps the line
    // shared between threads.
    if ((marks_[g].load(std::memory_order_relaxed) & bit) == 0)
      marks_[g].fetch_or(bit, std::memory_order_relaxed);
  }
  // The directory word of the page of `address`.
  std::atomic<uint64_t>& dir_of(uint64_t address) const {
    const uint64_t page = address >> 12;
    const uint64_t run = ((page >> kDirRun) * 0x9E3779B97F4A7C15ull) >> dir_shift_;
    return dir_[((run << kDirRun) | (page & ((uint64_t{1} << kDirRun) - 1))) & dir_mask_];
  }
  // The page's word counts one more entry, in level k (its last).
  static void dir_add(std::atomic<uint64_t>& d, unsigned k);
  // The page's word counts one entry fewer.
  static void dir_sub(std::atomic<uint64_t>& d);
  // insert() past its first try, from level `start`.
  bool insert_slow(std::atomic<uint64_t>& d, unsigned start, uint64_t address, uint64_t size,
                   uint64_t timestamp_ns, uint32_t stack_id, uint64_t pid);
  // Searches level k (the page's buckets in it) for `address`; removes it
  // and returns true when found there (d: the page's directory word).
  bool remove_in(std::atomic<uint64_t>& d, unsigned k, uint64_t address, LiveEntry* out);
  // Claims a free slot of bucket g (of level `level`) for the entry and
  // publishes it; false when the bucket has none.
  bool claim(std::atomic<uint64_t>& d, unsigned level, size_t g, uint64_t address, uint64_t size,
             uint64_t timestamp_ns, uint32_t stack_id, uint64_t pid);
  // CAS of slot j's key from kEmpty or kTomb to kBusy; true if it is ours.
  bool take(size_t j);
  // Fills slot j (ours, of bucket g in level `level`), counts it in the
  // page's directory word d, and publishes it.
  void publish(std::atomic<uint64_t>& d, unsigned level, size_t g, size_t j, uint64_t address,
               uint64_t size, uint64_t timestamp_ns, uint32_t stack_id, uint64_t pid);
  // Claims slot j, whose key was `key` (this address's), frees it and
  // uncounts it in d, its page's directory word.
  bool remove_at(std::atomic<uint64_t>& d, size_t j, uint64_t key, LiveEntry* out);
  bool read_slot(const Slot& s, LiveEntry* out) const;
  // Frees slot j, which the caller holds (kBusy) and whose key was `key`.
  void release_slot(size_t j, uint64_t key, LiveEntry* out);
  // Calls f(slot index) for every slot of [lo, hi) whose tag is set, in
  // buckets written since the last release.
  template <class F>
  void for_each_tagged(size_t lo, size_t hi, F&& f) const;

  Slot* slots_ = nullptr;
  std::atomic<uint64_t>* tags_ = nullptr;  // kTagWords per bucket
  std::atomic<uint8_t>* marks_ = nullptr;  // one per bucket: kWritten, kOverflowed
  std::atomic<uint64_t>* dir_ = nullptr;   // dir_mask_ + 1 words
  size_t dir_mask_ = 0;
  unsigned dir_shift_ = 64;  // 64 - the bits of a run's place
  Level level_[kMaxLevels] = {};
  unsigned levels_ = 0;
  size_t capacity_ = 0;
  size_t bytes_ = 0;
};

template <class F>
void LiveTable::for_each_tagged(size_t lo, size_t hi, F&& f) const {
  if (hi > capacity_) hi = capacity_;
  for (size_t g = lo / kBucket; g * kBucket < hi; ++g) {
    // Buckets never written are skipped unread: a walk over a sparse (or
    // just released) table must not map the pages it never wrote back in
    // (the read faults would cost the table's full size in RSS where the
    // kernel does not map the zero page). An insert marks the bucket and
    // tags the slot before it publishes the key, so nothing visible is lost.
    if (marks_[g].load(std::memory_order_relaxed) == 0) continue;
    for (size_t w = 0; w < kTagWords; ++w) {
      uint64_t t = tags_[g * kTagWords + w].load(std::memory_order_relaxed);
      while (t != 0) {
        const size_t j = g * kBucket + w * 8 + (static_cast<unsigned>(__builtin_ctzll(t)) >> 3);
        t &= ~(uint64_t{0xFF} << ((j & 7) * 8));
        if (j >= lo && j < hi) f(j);
      }
    }
  }
}

template <class F>
uint64_t LiveTable::for_each(F&& f) const {
  uint64_t n = 0;
  LiveEntry e;
  for_each_tagged(0, capacity_, [&](size_t i) {
    if (slots_[i].key.load(std::memory_order_relaxed) <= kBusy) return;
    if (read_slot(slots_[i], &e)) {
      f(static_cast<const LiveEntry&>(e));
      ++n;
    }
  });
  return n;
}

template <class F>
void LiveTable::for_each_stack(size_t lo, size_t hi, F&& f) const {
  for_each_tagged(lo, hi, [&](size_t i) {
    // Acquire on the key: the stack field written before it was published
    // is visible (or a later one, if the slot was reused meanwhile).
    if (slots_[i].key.load(std::memory_order_acquire) <= kBusy) return;
    f(static_cast<uint32_t>(slots_[i].meta.load(std::memory_order_relaxed) >> 32));
  });
}

}  // namespace mi::track

#endif
