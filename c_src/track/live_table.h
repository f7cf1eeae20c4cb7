// The live table: one 32-byte slot per recorded live block, keyed by
// address, in chunks owned by the heap's pages.
//
// Layout. The heap's address space is cut into units of 1 KiB. A directory
// hashes each unit (in runs of 8 neighbouring units, so a dense heap
// touches few directory lines) to a word that owns a chain of chunks: the
// word holds the number of live entries in its chain (and of inserts in
// progress there) and the chain's head.
// A chunk is a run of slots, small (4 slots, 128 bytes) or big (16, 512
// bytes), with its header kept apart in a dense array: a tag byte per slot
// and the link to the next chunk. A chain starts with a small chunk, so a
// unit with one live block costs 128 bytes; when its chunks are full a big
// one is pushed at its head. Chunks come from two pools, bitmaps that hand
// out the lowest free chunk (record_map.h); a chain goes back to its pools
// when its last entry is removed.
//
// So what stays resident follows the live blocks, not the heap's spread
// (a touched heap page no longer takes 8 KiB of table, as the page-local
// layout did), and a lookup reads the directory word, then the headers of
// its chain (1.5 bytes a slot, so they stay in cache where the slots do
// not; tags rule out slots without reading them), then one slot.
//
// A slot packs its entry in four words: the key (the address divided by
// 8, and the size's top bits), the pid, the timestamp, and a word of the
// stack id, the size's low bits and the sequence number. So an entry
// holds an address that is a multiple of 8 (every malloc family result:
// glibc aligns to 16, jemalloc's smallest class to 8) below 2^48 - 24
// (user space ends at 2^47 without 5-level paging) and a size below 2^40
// (1 TiB); insert() refuses anything else (the caller counts it as
// dropped). The sequence number has 11 bits: a reader is fooled only by
// exactly 1024 writes of one slot (512 blocks come and gone: an insert
// and a remove each advance it by 2) between its two reads of the word.
//
// Concurrency: lock-free. Any number of threads insert and remove while any
// number of readers iterate.
//  - An insert first pins its chain: it raises the word's count by CAS (a
//    chain of count 0 gets its first chunk in the same CAS). A chain is
//    freed only by the CAS that takes its count to 0, so while a block is
//    live, or an insert is in progress, its chain and every link in it
//    stay as they are, except that chunks are pushed at the head.
//  - A slot is claimed by CAS on its key (EMPTY/TOMB -> BUSY), tagged,
//    written under a per-slot sequence lock, then published. A remove
//    takes the key by CAS (-> BUSY), clears the tag, frees the slot, then
//    lowers the count. So a published key always has its tag set.
//  - A free of an address that was never recorded may walk a chain being
//    freed and reused meanwhile: it reads only pool memory (chunk ids are
//    checked against the pools, walks are bounded), and no key there can
//    equal its address (that address is not in the table, and only its
//    owner can insert it).
//  - Readers walk the pools, not the chains, and retry a slot whose
//    sequence changed, so every entry a reader sees has address, size,
//    timestamp and stack from one allocation.
//
// Trimming. The pools keep the busiest moment's chunks (a node's start-up
// takes many more than it keeps), and the chunks still in use are scattered
// over the pages that moment touched. trim() gives back the pages of the
// slots only free chunks cover: it claims a bitmap word's free chunks (so
// no insert can take one and write it meanwhile), releases the whole pages
// inside their runs (MADV_DONTNEED: they read as zeros, an empty slot),
// and frees them again. Only words a chunk was given back to since their
// last trim (dirty) are looked at, and the table asks for a trim
// (wants_trim()) once enough are. With the lowest-first order, new chains
// fill the holes low in the pools, so the pages high up stay free and
// given back. Chunk headers (tags, links) stay: a free chunk's tags are
// zero and stale walks read its link.
//
// Capacity is fixed at init. An insert fails (the caller counts it as
// dropped; collisions never silently lose entries) when its chain has no
// free slot and either no chunk is free or the chain already has
// kMaxChain chunks (1,024 slots for one directory word: blocks of 8 or 16
// bytes crowding units that share a word). A chain keeps every chunk it
// grew to while any of its entries is live (a chunk cannot leave a chain
// that lock-free walks may be reading), so after a burst that is mostly
// freed, its chunks serve only its own units: the pools hold twice the
// capacity for that.
//
// Never allocates through malloc (memory from os_map). All methods are
// thread-safe unless noted.
#ifndef MALLOCINFO_TRACK_LIVE_TABLE_H
#define MALLOCINFO_TRACK_LIVE_TABLE_H

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "os_mem.h"
#include "record_map.h"

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
  // Reserves room for `capacity` entries (rounded up to a power of two, at
  // least 64): big chunks for twice as many slots (chains keep chunks; see
  // above) and a small chunk for every directory word. False when the
  // memory cannot be mapped. Not thread-safe.
  bool init(size_t capacity);
  // Unmaps. Not thread-safe; only for tests.
  void destroy();

  // Records a live block. False when its chain is full and no chunk is
  // free, or the entry cannot be held (an address that is not a multiple
  // of 8 or not below 2^48, a size not below 2^40). Precondition:
  // `address` is not already in the table (the allocator just returned it).
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

  // Calls f(uint32_t stack_id) for every slot position in [lo, hi) (of
  // positions(): the sweep cuts the walk into ranges) that holds a
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
  // The same, then gives every page back to the kernel and empties the
  // pools (the table then costs no resident memory until written again).
  // Precondition: no thread inserts or removes meanwhile (the tracker makes
  // sure of it); readers may run (a zeroed slot reads as empty, a slot
  // zeroed mid-read fails its sequence check and is retried).
  uint64_t clear_and_release(uint64_t* bytes, ClearFn each = nullptr, void* ctx = nullptr);
  // Resident bytes of the table's mappings (mincore). Thread-safe.
  size_t resident_bytes(const PageCounter& pages = PageCounter()) const;

  // --- trimming (see above): one trimmer at a time, the tracker's ---

  // True when enough words were dirtied since the last trim, or a trim
  // runs (it asks until trim_end(), so that hooks carry it). Two relaxed
  // loads.
  bool wants_trim() const {
    // Signed: a count a fork or a clear left a little low (see trim_end())
    // reads as "not yet", not as 4 billion dirty words.
    return static_cast<int32_t>(dirty_n_.load(std::memory_order_relaxed)) >=
           static_cast<int32_t>(trim_at_.load(std::memory_order_relaxed));
  }
  // Bitmap words dirtied since the last trim (0 when a fork or a clear
  // left the count a little low). One relaxed load.
  uint32_t dirty_words() const {
    const auto n = static_cast<int32_t>(dirty_n_.load(std::memory_order_relaxed));
    return n > 0 ? static_cast<uint32_t>(n) : 0;
  }
  // Tests only: the dirty words the next trim waits for (trim_end() sets
  // it after each trim).
  void set_trim_threshold(uint32_t words) { trim_at_.store(words, std::memory_order_relaxed); }
  // No trim will run (the tracker has nowhere to keep one's state).
  void never_trim() { trim_at_.store(INT32_MAX, std::memory_order_relaxed); }
  // Starts a trim: returns its number of chunks (kTrimWords bitmap words
  // each, of the pools' words handed out so far).
  size_t trim_begin();
  // Trims chunk k (< trim_begin()'s number): returns the bytes given back.
  // Safe while other threads insert and remove; chunks may run at once.
  size_t trim(size_t k);
  // Ends a trim that gave back `released` bytes in all: sets when the next
  // is wanted (dirty words, doubling while trims give nothing back, but
  // for one that was not asked for: `asked` false), counts the dirty words
  // again (a fork or a clear may have left the count off) and lowers the
  // pools' hints (a take that met a claimed word may have raised them).
  void trim_end(size_t released, bool asked = true);
  // Bitmap words a trim chunk covers (64 chunks a word: 32 KiB of big
  // chunks' slots), and the dirty words that make a trim wanted at first.
  static constexpr uint32_t kTrimWords = 8;
  static constexpr uint32_t kTrimAt = 4;

  // The number of entries init() promised room for.
  size_t capacity() const { return capacity_; }
  // Slot positions in the pools: the range of for_each_stack().
  size_t positions() const { return small_positions_ + big_positions_; }
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

  // Chunks: slots per chunk.
  static constexpr size_t kSmall = 4;
  static constexpr size_t kBig = 16;
  // A chunk id: 0 is none; else the chunk's number + 1, bit 31 set for a
  // big chunk.
  static constexpr uint32_t kNone = 0;
  static constexpr uint32_t kBigBit = 0x80000000u;
  // A chain is walked for at most this many chunks: a chain is rarely more
  // than a few chunks long (a 1 KiB unit holds at most 128 blocks), and a
  // walk of a chain being freed and reused must end.
  static constexpr unsigned kMaxChain = 64;
  // Directory: a word per unit of 1 KiB of heap, runs of 8 units hashed.
  static constexpr unsigned kUnitShift = 10;
  static constexpr unsigned kRunShift = 3;

  // A chunk's header, kept apart from its slots. Tag byte j is slot j's: 0
  // while the slot is free, else tag_of(its address). Only a slot's owner
  // (the thread holding its key at kBusy) writes its byte.
  struct Header {
    std::atomic<uint64_t> tags[kBig / 8];  // a small chunk uses tags[0]'s low 4 bytes
    std::atomic<uint32_t> next;            // the next chunk of the chain, or kNone
    uint32_t unused;
  };

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
  // The tag of an address: 1-255, from all its bits.
  static uint8_t tag_of(uint64_t address) {
    const uint64_t t = ((address >> 3) * 0xD6E8FEB86659FD93ull) >> 56;
    return t == 0 ? uint8_t{1} : static_cast<uint8_t>(t);
  }
  // The directory word of `address`'s unit.
  std::atomic<uint64_t>& dir_of(uint64_t address) const;
  static uint32_t count_of(uint64_t word) { return static_cast<uint32_t>(word >> 32); }
  static uint32_t head_of(uint64_t word) { return static_cast<uint32_t>(word); }

  // The first position of chunk `id` (valid).
  size_t first_position(uint32_t id) const {
    return (id & kBigBit) != 0 ? small_positions_ + size_t{(id & ~kBigBit) - 1} * kBig
                               : size_t{id - 1} * kSmall;
  }
  // True when `id` names a chunk of the pools (what a stale walk may read).
  bool valid(uint32_t id) const {
    const uint32_t n = id & ~kBigBit;
    return n != 0 && n <= ((id & kBigBit) != 0 ? big_chunks_ : small_chunks_);
  }
  Header& header(uint32_t id) const {
    return headers_[(id & kBigBit) != 0 ? small_chunks_ + (id & ~kBigBit) - 1 : id - 1];
  }
  // A mask with bit j set for each slot j of chunk `id` whose tag is
  // `tag` (tag 0: each free slot).
  uint32_t tagged(uint32_t id, uint8_t tag) const;
  void set_tag(uint32_t id, unsigned j, uint8_t tag) {
    // The owner's byte store; others read the tags a word at a time.
    __atomic_store_n(reinterpret_cast<uint8_t*>(header(id).tags) + j, tag, __ATOMIC_RELAXED);
  }

  // Takes the lowest free chunk of the big pool (big) or the small one
  // then the big one (!big). kNone when both are spent. Its tags are zero
  // and its slots free.
  uint32_t take_chunk(bool big);
  uint32_t take_from(bool big);
  // Chunks of a pool: every chunk ever taken is below.
  size_t chunks_used(bool big) const { return maps_[big ? 1 : 0].high(); }
  // The chunk that holds position p (< positions()).
  uint32_t chunk_at(size_t p) const {
    return p < small_positions_
               ? static_cast<uint32_t>(p / kSmall + 1)
               : kBigBit | static_cast<uint32_t>((p - small_positions_) / kBig + 1);
  }
  // Every chunk free, no word dirty: the maps over their zeroed words. Not
  // thread-safe.
  void reset_pools();
  // Frees a chain whose count went to 0.
  void give_chain(uint32_t head);
  // Puts chunk `id` back in its pool and marks its word dirty.
  void give_chunk(uint32_t id);
  // Gives back the pages only the chunks of `mask` (claimed, of word w of
  // pool `big`) cover; returns the bytes.
  size_t release_chunks(unsigned big, uint32_t w, uint64_t mask) const;
  // Raises the count of directory word d, giving it a first chunk if it
  // has none. False when no chunk is left.
  bool pin(std::atomic<uint64_t>& d);
  // Lowers it; the CAS that takes it to 0 frees the chain.
  void unpin(std::atomic<uint64_t>& d);
  // Claims a free slot of chunk `id` and tags it for `address`: true, with
  // the slot's position in *position, or false when the chunk is full.
  bool claim_in(uint32_t id, uint64_t address, size_t* position);
  void write_slot(Slot& s, uint64_t address, uint64_t size, uint64_t timestamp_ns,
                  uint32_t stack_id, uint64_t pid);
  bool read_slot(const Slot& s, LiveEntry* out) const;
  // Frees the slot at `position` of chunk `id`, which the caller holds
  // (kBusy) and whose key was `key`, then unpins its chain (d: the
  // directory word of the key's address).
  void release_slot(uint32_t id, size_t position, uint64_t key, std::atomic<uint64_t>& d,
                    LiveEntry* out);
  // Calls f(position) for every slot of the pools, below the bump
  // pointers, whose tag is set.
  template <class F>
  void for_each_tagged(size_t lo, size_t hi, F&& f) const;

  Slot* slots_ = nullptr;      // the small pool's positions, then the big pool's
  Header* headers_ = nullptr;  // the small chunks', then the big ones'
  std::atomic<uint64_t>* dir_ = nullptr;
  size_t capacity_ = 0;
  size_t small_positions_ = 0;
  size_t big_positions_ = 0;
  uint32_t small_chunks_ = 0;
  uint32_t big_chunks_ = 0;
  size_t dir_mask_ = 0;
  unsigned dir_shift_ = 64;
  size_t bytes_ = 0;
  // The small chunks' pool and the big ones' (ids 0-based: chunk id - 1,
  // without kBigBit), their words in the mapping after the directory.
  RecordMap maps_[2];
  std::atomic<uint64_t>* map_ = nullptr;  // their words: the small pool's, then the big one's
  // Per pool, a byte per bitmap word: 1 once a chunk was given back to
  // the word since its last trim; dirty_n_ counts them.
  std::atomic<uint8_t>* dirty_[2] = {nullptr, nullptr};
  // Read by every recorded allocation (wants_trim()): a line of their
  // own, apart from the maps' hints that every take and give writes.
  alignas(64) std::atomic<uint32_t> dirty_n_{0};
  std::atomic<uint32_t> trim_at_{kTrimAt};
  uint32_t trim_small_ = 0;          // the running trim's chunks over the small pool
  uint32_t trim_words_[2] = {0, 0};  // and the words it looks at, per pool
  uint32_t last_at_ = kTrimAt;       // the trimmer's: trim_at_ after the last trim
};

inline std::atomic<uint64_t>& LiveTable::dir_of(uint64_t address) const {
  const uint64_t unit = address >> kUnitShift;
  const uint64_t run = ((unit >> kRunShift) * 0x9E3779B97F4A7C15ull) >> dir_shift_;
  return dir_[((run << kRunShift) | (unit & ((1u << kRunShift) - 1))) & dir_mask_];
}

inline uint32_t LiveTable::tagged(uint32_t id, uint8_t tag) const {
  const Header& h = header(id);
  constexpr uint64_t kLow7 = 0x7F7F7F7F7F7F7F7Full;
  const uint64_t want = uint64_t{tag} * 0x0101010101010101ull;
  auto zero_bytes = [&](uint64_t x) {
    // 0x80 in each byte of x that is zero, exactly (no borrow between
    // bytes), then those 8 bits gathered into the low byte.
    const uint64_t y = ~(((x & kLow7) + kLow7) | x | kLow7);
    return static_cast<uint32_t>(((y >> 7) * 0x0102040810204080ull) >> 56);
  };
  if ((id & kBigBit) == 0)
    return zero_bytes(h.tags[0].load(std::memory_order_acquire) ^ want) & ((1u << kSmall) - 1);
  uint32_t mask = 0;
  for (size_t w = 0; w < kBig / 8; ++w)
    mask |= zero_bytes(h.tags[w].load(std::memory_order_acquire) ^ want) << (w * 8);
  return mask;
}

template <class F>
void LiveTable::for_each_tagged(size_t lo, size_t hi, F&& f) const {
  // Only chunks below the pools' high-water marks were ever written: a walk never
  // reads (and so never makes resident) the rest of the pools.
  auto walk = [&](size_t base, size_t chunks, size_t step, uint32_t big) {
    const size_t from = lo > base ? lo : base;
    const size_t end = base + chunks * step;
    const size_t to = hi < end ? hi : end;
    for (size_t c = (from - base) / step, p = base + c * step; p < to; ++c, p += step) {
      const uint32_t id = big | static_cast<uint32_t>(c + 1);
      for (size_t w = 0; w < (step + 7) / 8; ++w) {
        const uint64_t t = header(id).tags[w].load(std::memory_order_acquire);
        if (t == 0) continue;
        for (size_t j = w * 8; j < w * 8 + 8 && j < step; ++j)
          if (((t >> ((j & 7) * 8)) & 0xFF) != 0 && p + j >= from && p + j < to) f(p + j);
      }
    }
  };
  walk(0, chunks_used(false), kSmall, 0);
  walk(small_positions_, chunks_used(true), kBig, kBigBit);
}

template <class F>
uint64_t LiveTable::for_each(F&& f) const {
  uint64_t n = 0;
  LiveEntry e;
  for_each_tagged(0, positions(), [&](size_t p) {
    if (slots_[p].key.load(std::memory_order_relaxed) <= kBusy) return;
    if (read_slot(slots_[p], &e)) {
      f(static_cast<const LiveEntry&>(e));
      ++n;
    }
  });
  return n;
}

template <class F>
void LiveTable::for_each_stack(size_t lo, size_t hi, F&& f) const {
  for_each_tagged(lo, hi, [&](size_t p) {
    // Acquire on the key: the stack field written before it was published
    // is visible (or a later one, if the slot was reused meanwhile).
    if (slots_[p].key.load(std::memory_order_acquire) <= kBusy) return;
    f(static_cast<uint32_t>(slots_[p].meta.load(std::memory_order_relaxed) >> 32));
  });
}

}  // namespace mi::track

#endif
