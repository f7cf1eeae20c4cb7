#include "live_table.h"

#include <sched.h>

#include "os_mem.h"

namespace mi::track {

namespace {

// splitmix64's output step: a distinct odd multiplier per level, so pages
// that share a full bucket in one level do not share one in the next.
uint64_t level_multiplier(unsigned k) {
  uint64_t z = (k + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) | 1;
}

}  // namespace

bool LiveTable::init(size_t capacity) {
  const size_t buckets = capacity <= kBucket ? 1 : (capacity + kBucket - 1) / kBucket;
  // Level sizes: kFirstLevel slots, then 1.5 times the one before. A
  // remainder smaller than half the next level joins the last one, so no
  // level is a runt that fills at once.
  unsigned n = 0;
  size_t first = 0;
  size_t want = kFirstLevel / kBucket;
  while (first < buckets) {
    const size_t left = buckets - first;
    size_t size = want < left ? want : left;
    if (left - size < want / 2 || n == kMaxLevels - 1) size = left;
    level_[n] = Level{first, size, level_multiplier(n)};
    first += size;
    ++n;
    want += want / 2;
  }
  // A directory word per bucket (a power of two, at least two runs): as
  // many as the pages a full table holds at 64 blocks a page.
  unsigned dir_bits = kDirRun + 1;
  while ((size_t{1} << dir_bits) < buckets) ++dir_bits;
  const size_t slot_bytes = os_page_up(buckets * kBucket * sizeof(Slot));
  const size_t tag_bytes = os_page_up(buckets * kTagWords * sizeof(uint64_t));
  const size_t mark_bytes = os_page_up(buckets);
  const size_t dir_bytes = os_page_up((size_t{1} << dir_bits) * sizeof(uint64_t));
  void* mem = os_map(slot_bytes + tag_bytes + mark_bytes + dir_bytes);
  if (mem == nullptr) return false;
  char* p = static_cast<char*>(mem);
  slots_ = reinterpret_cast<Slot*>(p);
  tags_ = reinterpret_cast<std::atomic<uint64_t>*>(p + slot_bytes);
  marks_ = reinterpret_cast<std::atomic<uint8_t>*>(p + slot_bytes + tag_bytes);
  dir_ = reinterpret_cast<std::atomic<uint64_t>*>(p + slot_bytes + tag_bytes + mark_bytes);
  dir_mask_ = (size_t{1} << dir_bits) - 1;
  dir_shift_ = 64 - (dir_bits - kDirRun);
  levels_ = n;
  capacity_ = buckets * kBucket;
  bytes_ = slot_bytes + tag_bytes + mark_bytes + dir_bytes;
  return true;
}

void LiveTable::destroy() {
  os_unmap(slots_, bytes_);
  slots_ = nullptr;
  tags_ = nullptr;
  marks_ = nullptr;
  dir_ = nullptr;
  levels_ = 0;
  capacity_ = 0;
  bytes_ = 0;
}

unsigned LiveTable::levels_used() const {
  // A level is used when one of its buckets is marked written (tests only:
  // it reads every mark).
  unsigned n = 0;
  for (unsigned k = 0; k < levels_; ++k) {
    const Level& l = level_[k];
    for (size_t g = l.first; g < l.first + l.buckets; ++g) {
      if (marks_[g].load(std::memory_order_relaxed) != 0) {
        ++n;
        break;
      }
    }
  }
  return n;
}

uint32_t LiveTable::levels_searched(uint64_t address) const {
  return static_cast<uint32_t>(dir_of(address).load(std::memory_order_relaxed) >> kBitsShift);
}

void LiveTable::dir_add(std::atomic<uint64_t>& d, unsigned k) {
  uint64_t w = d.load(std::memory_order_relaxed);
  uint64_t next;
  do {
    next = ((w & kCountMask) + 1) | uint64_t{k} << kLastShift |
           ((w >> kBitsShift) | uint64_t{1} << k) << kBitsShift;
  } while (!d.compare_exchange_weak(w, next, std::memory_order_relaxed, std::memory_order_relaxed));
}

void LiveTable::dir_sub(std::atomic<uint64_t>& d) {
  uint64_t w = d.load(std::memory_order_relaxed);
  uint64_t next;
  do {
    // The last entry takes the level bits with it (the last level stays,
    // for the page's next insert).
    const uint64_t count = (w & kCountMask) - 1;
    next = count == 0 ? w & (uint64_t{0x1F} << kLastShift) : (w & ~kCountMask) | count;
  } while (!d.compare_exchange_weak(w, next, std::memory_order_relaxed, std::memory_order_relaxed));
}

[[gnu::always_inline]] inline bool LiveTable::take(size_t j) {
  uint64_t key = slots_[j].key.load(std::memory_order_relaxed);
  return (key == kEmpty || key == kTomb) &&
         slots_[j].key.compare_exchange_strong(key, kBusy, std::memory_order_acquire,
                                               std::memory_order_relaxed);
}

[[gnu::always_inline]] inline void LiveTable::publish(std::atomic<uint64_t>& d, unsigned level,
                                                      size_t g, size_t j, uint64_t address,
                                                      uint64_t size, uint64_t timestamp_ns,
                                                      uint32_t stack_id, uint64_t pid) {
  // The slot is ours, and its tag is zero (release_slot cleared it before
  // the kTomb our CAS read). The page's count, the bucket's mark and the
  // tag come before the key is published: a remove() of this address
  // (which follows this insert: the allocator returned the block first)
  // looks in this level and finds the tag, and a walk that sees the key
  // sees the mark.
  dir_add(d, level);
  mark(g, kWritten);
  set_tag(j, static_cast<uint8_t>(tag_of(address)));
  // Sequence lock without fences (which TSan cannot model): the field
  // stores are release, so a reader that sees any of them also sees the
  // odd sequence number stored before; on x86 these are plain moves.
  Slot& s = slots_[j];
  const uint64_t m = s.meta.load(std::memory_order_relaxed);
  const uint64_t q = m & kSeqMask;
  s.meta.store(with_seq(m, q + 1), std::memory_order_relaxed);
  s.pid.store(pid, std::memory_order_release);
  s.ts.store(timestamp_ns, std::memory_order_release);
  // Even sequence, with the new stack and size, before the key: the next
  // owner claims the slot by CAS on the key, and must then read this even
  // number, or it would start from an odd one and leave the slot's parity
  // flipped for good.
  s.meta.store(meta_of(stack_id, size, q + 2), std::memory_order_release);
  s.key.store(key_of(address, size), std::memory_order_release);
}

[[gnu::always_inline]] inline void LiveTable::release_slot(size_t j, uint64_t key, LiveEntry* out) {
  Slot& s = slots_[j];
  const uint64_t m = s.meta.load(std::memory_order_relaxed);
  const uint64_t q = m & kSeqMask;
  s.meta.store(with_seq(m, q + 1), std::memory_order_relaxed);
  if (out != nullptr) {
    unpack(key, m, out);
    out->timestamp_ns = s.ts.load(std::memory_order_relaxed);
    out->pid = s.pid.load(std::memory_order_relaxed);
  }
  s.meta.store(with_seq(m, q + 2), std::memory_order_release);  // before the key: see insert()
  // The tag is cleared before the key is freed, so the next owner finds it
  // zero; an inserter that reads the zero tag early fails its CAS on kBusy.
  set_tag(j, 0);
  s.key.store(kTomb, std::memory_order_release);
}

[[gnu::always_inline]] inline bool LiveTable::remove_at(std::atomic<uint64_t>& d, size_t j,
                                                        uint64_t key, LiveEntry* out) {
  if (!slots_[j].key.compare_exchange_strong(key, kBusy, std::memory_order_acquire,
                                             std::memory_order_relaxed))
    return false;  // someone else removed it (a double free race)
  release_slot(j, key, out);
  // After the slot is free: the count covers the entry as long as a
  // lookup could find it.
  dir_sub(d);
  return true;
}

bool LiveTable::insert(uint64_t address, uint64_t size, uint64_t timestamp_ns, uint32_t stack_id,
                       uint64_t pid) {
  if ((address & 7) != 0 || addr_key(address) > kAddrMask || size >= kMaxSize) [[unlikely]]
    return false;
  // The common case inline: the home slot of the page's last level is free
  // (a page's blocks come and go in the bucket its last insert used).
  std::atomic<uint64_t>& d = dir_of(address);
  const unsigned start = (d.load(std::memory_order_relaxed) >> kLastShift) & 0x1F;
  const size_t g = bucket_of(level_[start], address);
  const size_t home = g * kBucket + home_slot(address);
  if (take(home)) [[likely]] {
    publish(d, start, g, home, address, size, timestamp_ns, stack_id, pid);
    return true;
  }
  return insert_slow(d, start, address, size, timestamp_ns, stack_id, pid);
}

bool LiveTable::insert_slow(std::atomic<uint64_t>& d, unsigned start, uint64_t address,
                            uint64_t size, uint64_t timestamp_ns, uint32_t stack_id, uint64_t pid) {
  // From the page's last level up, then the smaller ones: a page new to the
  // table starts at level 0, so levels fill smallest first; a page already
  // in a level stays there while its buckets have room, and does not
  // search the full levels below it again.
  for (unsigned i = 0; i < levels_; ++i) {
    const unsigned k = start + i < levels_ ? start + i : start + i - levels_;
    const Level& l = level_[k];
    const size_t first = bucket_of(l, address);
    const unsigned span = l.buckets < kSpan ? static_cast<unsigned>(l.buckets) : kSpan;
    for (unsigned b = 0; b < span; ++b) {
      const size_t g = next_bucket(l, first, b);
      if (claim(d, k, g, address, size, timestamp_ns, stack_id, pid)) return true;
      // Full: say so before going on, so a search that follows this
      // insert's entry does not stop at this bucket (see remove_in).
      mark(g, kOverflowed);
    }
  }
  return false;
}

bool LiveTable::claim(std::atomic<uint64_t>& d, unsigned level, size_t g, uint64_t address,
                      uint64_t size, uint64_t timestamp_ns, uint32_t stack_id, uint64_t pid) {
  // The slot the address picks first: a page's blocks are at distinct
  // 16-byte granules, so in a bucket that is not crowded it is free, and
  // remove() finds the entry there without reading a tag.
  const size_t home = g * kBucket + home_slot(address);
  if (take(home)) {
    publish(d, level, g, home, address, size, timestamp_ns, stack_id, pid);
    return true;
  }
  for (size_t w = 0; w < kTagWords; ++w) {
    // A zero tag says where to try; the CAS on the key decides (a slot
    // another thread has just claimed, not yet tagged, fails it).
    const uint64_t t = tags_[g * kTagWords + w].load(std::memory_order_relaxed);
    for (uint64_t z = zero_bytes(t); z != 0; z &= z - 1) {
      const size_t j = g * kBucket + w * 8 + (static_cast<unsigned>(__builtin_ctzll(z)) >> 3);
      if (j == home || !take(j)) continue;
      publish(d, level, g, j, address, size, timestamp_ns, stack_id, pid);
      return true;
    }
  }
  return false;
}

bool LiveTable::remove(uint64_t address, LiveEntry* out) {
  // The page's directory word names the levels to search. The common case:
  // the level of the page's last insert, which holds the entry.
  std::atomic<uint64_t>& d = dir_of(address);
  const uint64_t w = d.load(std::memory_order_relaxed);
  uint64_t bits = w >> kBitsShift;
  if (bits == 0) return false;  // nothing of this page is recorded
  const unsigned last = (w >> kLastShift) & 0x1F;
  if ((bits >> last & 1) != 0) {
    // Inline, the entry at its home slot there (where claim() tried first).
    const size_t home = bucket_of(level_[last], address) * kBucket + home_slot(address);
    const uint64_t key = slots_[home].key.load(std::memory_order_acquire);
    if ((key & kAddrMask) == addr_key(address)) [[likely]]
      return remove_at(d, home, key, out);
    if (remove_in(d, last, address, out)) return true;
    bits &= ~(uint64_t{1} << last);
  }
  for (; bits != 0; bits &= bits - 1)
    if (remove_in(d, static_cast<unsigned>(__builtin_ctzll(bits)), address, out)) return true;
  return false;
}

bool LiveTable::remove_in(std::atomic<uint64_t>& d, unsigned k, uint64_t address, LiveEntry* out) {
  const uint64_t want = addr_key(address);
  const Level& l = level_[k];
  const size_t first = bucket_of(l, address);
  // Where claim() tried first.
  const size_t home = first * kBucket + home_slot(address);
  uint64_t key = slots_[home].key.load(std::memory_order_acquire);
  if ((key & kAddrMask) == want) return remove_at(d, home, key, out);
  const uint64_t tags = tag_of(address) * kOnes;
  const unsigned span = l.buckets < kSpan ? static_cast<unsigned>(l.buckets) : kSpan;
  for (unsigned b = 0; b < span; ++b) {
    const size_t g = next_bucket(l, first, b);
    for (size_t w = 0; w < kTagWords; ++w) {
      // This address's entry was tagged before it was published (claim),
      // and that happened before this remove: its slot shows its own tag.
      const uint64_t t = tags_[g * kTagWords + w].load(std::memory_order_relaxed);
      for (uint64_t z = zero_bytes(t ^ tags); z != 0; z &= z - 1) {
        const size_t j = g * kBucket + w * 8 + (static_cast<unsigned>(__builtin_ctzll(z)) >> 3);
        key = slots_[j].key.load(std::memory_order_acquire);
        // want >= 3: kTomb and kBusy never match it.
        if ((key & kAddrMask) == want) return remove_at(d, j, key, out);
      }
    }
    // An entry goes past a bucket only after marking it overflowed
    // (insert), before it is published: none went past this one.
    if ((marks_[g].load(std::memory_order_relaxed) & kOverflowed) == 0) break;
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
  for_each_tagged(0, capacity_, [&](size_t i) {
    Slot& s = slots_[i];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k <= kBusy) return;
    if (!s.key.compare_exchange_strong(k, kBusy, std::memory_order_acquire,
                                       std::memory_order_relaxed))
      return;
    LiveEntry e;
    release_slot(i, k, &e);
    dir_sub(dir_of(e.address));
    ++n;
    b += e.size;
    if (each != nullptr) each(e, ctx);
  });
  if (bytes != nullptr) *bytes = b;
  return n;
}

}  // namespace mi::track
