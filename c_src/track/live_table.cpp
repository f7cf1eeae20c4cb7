#include "live_table.h"

#include <sched.h>

#include <cstdint>

#include "os_mem.h"

namespace mi::track {

bool LiveTable::init(size_t capacity) {
  size_t cap = 64;
  while (cap < capacity) cap <<= 1;
  // A word per 64 entries, at least two runs (dir_shift_ stays below 64);
  // a small chunk per word: a chain has at most one at a time.
  size_t words = cap / 64 < 16 ? 16 : cap / 64;
  unsigned run_bits = 0;
  while ((size_t{1} << (run_bits + kRunShift)) < words) ++run_bits;
  const size_t big = cap * 2 / kBig;
  if (big >= kBigBit || words >= kBigBit) return false;
  const size_t slot_bytes = os_page_up((words * kSmall + big * kBig) * sizeof(Slot));
  const size_t header_bytes = os_page_up((words + big) * sizeof(Header));
  const size_t dir_bytes = os_page_up(words * sizeof(std::atomic<uint64_t>));
  const size_t map_words[2] = {RecordMap::words_for(static_cast<uint32_t>(words)),
                               RecordMap::words_for(static_cast<uint32_t>(big))};
  const size_t map_bytes =
      os_page_up((map_words[0] + map_words[1]) * sizeof(std::atomic<uint64_t>));
  const size_t dirty_bytes = os_page_up(map_words[0] + map_words[1]);
  void* mem = os_map(slot_bytes + header_bytes + dir_bytes + map_bytes + dirty_bytes);
  if (mem == nullptr) return false;
  char* at = static_cast<char*>(mem);
  slots_ = reinterpret_cast<Slot*>(at);
  headers_ = reinterpret_cast<Header*>(at += slot_bytes);
  dir_ = reinterpret_cast<std::atomic<uint64_t>*>(at += header_bytes);
  map_ = reinterpret_cast<std::atomic<uint64_t>*>(at += dir_bytes);
  dirty_[0] = reinterpret_cast<std::atomic<uint8_t>*>(at + map_bytes);
  dirty_[1] = dirty_[0] + map_words[0];
  capacity_ = cap;
  small_chunks_ = static_cast<uint32_t>(words);
  big_chunks_ = static_cast<uint32_t>(big);
  small_positions_ = words * kSmall;
  big_positions_ = big * kBig;
  dir_mask_ = words - 1;
  dir_shift_ = 64 - run_bits;
  bytes_ = slot_bytes + header_bytes + dir_bytes + map_bytes + dirty_bytes;
  reset_pools();
  return true;
}

void LiveTable::reset_pools() {
  maps_[0].init(map_, small_chunks_);
  maps_[1].init(map_ + RecordMap::words_for(small_chunks_), big_chunks_);
  dirty_n_.store(0, std::memory_order_relaxed);
}

void LiveTable::destroy() {
  os_unmap(slots_, bytes_);
  slots_ = nullptr;
  headers_ = nullptr;
  dir_ = nullptr;
  dirty_[0] = dirty_[1] = nullptr;
  bytes_ = 0;
}

uint32_t LiveTable::take_from(bool big) {
  const uint32_t n = maps_[big ? 1 : 0].take();
  return n == RecordMap::kNone ? kNone : (big ? kBigBit : 0) | (n + 1);
}

uint32_t LiveTable::take_chunk(bool big) {
  if (!big) {
    const uint32_t c = take_from(false);
    if (c != kNone) return c;
  }
  return take_from(true);
}

void LiveTable::give_chunk(uint32_t id) {
  const unsigned big = (id & kBigBit) != 0 ? 1 : 0;
  const uint32_t i = (id & ~kBigBit) - 1;
  maps_[big].give(i);
  // Usually dirty already: one load, no store.
  std::atomic<uint8_t>& d = dirty_[big][i / 64];
  if (d.load(std::memory_order_relaxed) == 0 && d.exchange(1, std::memory_order_relaxed) == 0)
    dirty_n_.fetch_add(1, std::memory_order_relaxed);
}

void LiveTable::give_chain(uint32_t c) {
  // A chain is at most kMaxChain chunks (insert() pushes only after walking
  // fewer); the guard only keeps a corrupted link from looping.
  for (unsigned n = 0; c != kNone && valid(c) && n <= kMaxChain; ++n) {
    const uint32_t next = header(c).next.load(std::memory_order_relaxed);
    give_chunk(c);
    c = next;
  }
}

bool LiveTable::pin(std::atomic<uint64_t>& d) {
  uint64_t w = d.load(std::memory_order_acquire);
  for (;;) {
    if (count_of(w) != 0) {
      if (d.compare_exchange_weak(w, w + (uint64_t{1} << 32), std::memory_order_acq_rel,
                                  std::memory_order_acquire))
        return true;
      continue;
    }
    // An empty word (count 0 is always word 0): its first chunk goes in
    // with its first pin, so a pinned chain always has a head.
    const uint32_t fresh = take_chunk(false);
    if (fresh == kNone) return false;
    header(fresh).next.store(kNone, std::memory_order_relaxed);
    if (d.compare_exchange_strong(w, uint64_t{1} << 32 | fresh, std::memory_order_acq_rel,
                                  std::memory_order_acquire))
      return true;
    give_chunk(fresh);
  }
}

void LiveTable::unpin(std::atomic<uint64_t>& d) {
  uint64_t w = d.load(std::memory_order_relaxed);
  uint64_t n;
  do {
    n = count_of(w) == 1 ? 0 : w - (uint64_t{1} << 32);
  } while (!d.compare_exchange_weak(w, n, std::memory_order_acq_rel, std::memory_order_relaxed));
  // Count 0: no live entry and no insert in progress is in the chain (each
  // holds a pin), so nobody but stale walkers reads it any more.
  if (n == 0) give_chain(head_of(w));
}

bool LiveTable::claim_in(uint32_t id, uint64_t address, size_t* position) {
  for (uint32_t m = tagged(id, 0); m != 0; m &= m - 1) {
    const unsigned j = static_cast<unsigned>(__builtin_ctz(m));
    Slot& s = slots_[first_position(id) + j];
    uint64_t k = s.key.load(std::memory_order_relaxed);
    if (k != kEmpty && k != kTomb) continue;
    if (!s.key.compare_exchange_strong(k, kBusy, std::memory_order_acquire,
                                       std::memory_order_relaxed))
      continue;
    // Tagged before the key is published: a remove() that sees the key
    // also sees the tag that leads to it.
    set_tag(id, j, tag_of(address));
    *position = first_position(id) + j;
    return true;
  }
  return false;
}

void LiveTable::write_slot(Slot& s, uint64_t address, uint64_t size, uint64_t timestamp_ns,
                           uint32_t stack_id, uint64_t pid) {
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
  // number, or it would start from an odd one and leave the slot's parity
  // flipped for good.
  s.meta.store(meta_of(stack_id, size, q + 2), std::memory_order_release);
  s.key.store(key_of(address, size), std::memory_order_release);
}

bool LiveTable::insert(uint64_t address, uint64_t size, uint64_t timestamp_ns, uint32_t stack_id,
                       uint64_t pid) {
  if ((address & 7) != 0 || addr_key(address) > kAddrMask || size >= kMaxSize) [[unlikely]]
    return false;
  std::atomic<uint64_t>& d = dir_of(address);
  if (!pin(d)) return false;
  for (;;) {
    // Pinned: the chain only grows at its head while we walk it.
    const uint32_t first = head_of(d.load(std::memory_order_acquire));
    uint32_t c = first;
    unsigned n = 0;
    for (; c != kNone && valid(c) && n < kMaxChain; ++n) {
      size_t p;
      if (claim_in(c, address, &p)) {
        write_slot(slots_[p], address, size, timestamp_ns, stack_id, pid);
        return true;
      }
      c = header(c).next.load(std::memory_order_acquire);
    }
    if (n >= kMaxChain) break;
    const uint32_t fresh = take_chunk(true);
    if (fresh == kNone) break;
    header(fresh).next.store(first, std::memory_order_relaxed);
    uint64_t w = d.load(std::memory_order_relaxed);
    bool pushed = false;
    while (head_of(w) == first && !pushed)
      pushed = d.compare_exchange_weak(w, (w & ~uint64_t{0xFFFFFFFF}) | fresh,
                                       std::memory_order_acq_rel, std::memory_order_relaxed);
    // Another insert pushed a chunk first: give ours back, walk again.
    if (!pushed) give_chunk(fresh);
  }
  unpin(d);
  return false;
}

void LiveTable::release_slot(uint32_t id, size_t position, uint64_t key, std::atomic<uint64_t>& d,
                             LiveEntry* out) {
  Slot& s = slots_[position];
  const uint64_t m = s.meta.load(std::memory_order_relaxed);
  const uint64_t q = m & kSeqMask;
  s.meta.store(with_seq(m, q + 1), std::memory_order_relaxed);
  if (out != nullptr) {
    unpack(key, m, out);
    out->timestamp_ns = s.ts.load(std::memory_order_relaxed);
    out->pid = s.pid.load(std::memory_order_relaxed);
  }
  s.meta.store(with_seq(m, q + 2), std::memory_order_release);  // before the key: see write_slot()
  set_tag(id, static_cast<unsigned>(position - first_position(id)), 0);
  s.key.store(kTomb, std::memory_order_release);
  unpin(d);
}

bool LiveTable::remove(uint64_t address, LiveEntry* out) {
  std::atomic<uint64_t>& d = dir_of(address);
  const uint64_t w = d.load(std::memory_order_acquire);
  if (count_of(w) == 0) return false;
  // insert() holds only multiples of 8, and the key drops the low 3 bits:
  // a free of a pointer inside a block must not take the block's entry.
  if ((address & 7) != 0) [[unlikely]]
    return false;
  const uint64_t want = addr_key(address);
  const uint8_t tag = tag_of(address);
  uint32_t c = head_of(w);
  for (unsigned n = 0; c != kNone && valid(c) && n < kMaxChain; ++n) {
    for (uint32_t m = tagged(c, tag); m != 0; m &= m - 1) {
      const size_t p = first_position(c) + static_cast<unsigned>(__builtin_ctz(m));
      Slot& s = slots_[p];
      uint64_t k = s.key.load(std::memory_order_acquire);
      // want >= 3: kEmpty, kTomb and kBusy never match it.
      if ((k & kAddrMask) != want) continue;
      if (!s.key.compare_exchange_strong(k, kBusy, std::memory_order_acquire,
                                         std::memory_order_relaxed))
        return false;  // someone else removed it (a double free race)
      release_slot(c, p, k, d, out);
      return true;
    }
    c = header(c).next.load(std::memory_order_acquire);
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
      const uint64_t m2 = s.meta.load(std::memory_order_acquire);
      // The key again: a trim zeroes a free slot's sequence, so an entry
      // written there afresh may have the meta word of the one before it
      // (same stack, size bits and sequence); not its key.
      if (m1 == m2 && s.key.load(std::memory_order_relaxed) == k) {
        if (k <= kBusy) return false;
        unpack(k, m1, out);
        return true;
      }
    }
    if (attempt >= 8) ::sched_yield();
  }
  return false;
}

uint64_t LiveTable::clear(uint64_t* bytes, ClearFn each, void* ctx) {
  uint64_t n = 0;
  uint64_t b = 0;
  for_each_tagged(0, positions(), [&](size_t p) {
    Slot& s = slots_[p];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k <= kBusy) return;
    if (!s.key.compare_exchange_strong(k, kBusy, std::memory_order_acquire,
                                       std::memory_order_relaxed))
      return;
    LiveEntry e;
    release_slot(chunk_at(p), p, k, dir_of(address_of(k)), &e);
    ++n;
    b += e.size;
    if (each != nullptr) each(e, ctx);
  });
  if (bytes != nullptr) *bytes = b;
  return n;
}

uint64_t LiveTable::clear_and_release(uint64_t* bytes, ClearFn each, void* ctx) {
  const uint64_t n = clear(bytes, each, ctx);
  // Every count is 0 now and no writer runs: the pools start afresh (their
  // bitmaps and dirty bytes zeroed with the rest).
  os_release(slots_, bytes_);
  reset_pools();
  return n;
}

size_t LiveTable::trim_begin() {
  // Asked for until trim_end(), whatever the dirty count: hooks carry
  // every chunk.
  trim_at_.store(static_cast<uint32_t>(INT32_MIN), std::memory_order_relaxed);
  for (unsigned p = 0; p < 2; ++p)
    trim_words_[p] = static_cast<uint32_t>(RecordMap::words_for(maps_[p].high()));
  trim_small_ = (trim_words_[0] + kTrimWords - 1) / kTrimWords;
  return trim_small_ + (trim_words_[1] + kTrimWords - 1) / kTrimWords;
}

size_t LiveTable::trim(size_t k) {
  const unsigned big = k < trim_small_ ? 0 : 1;
  const auto lo = static_cast<uint32_t>((big == 0 ? k : k - trim_small_) * kTrimWords);
  const uint32_t hi = lo + kTrimWords < trim_words_[big] ? lo + kTrimWords : trim_words_[big];
  const uint32_t n = maps_[big].size();
  size_t released = 0;
  for (uint32_t w = lo; w < hi; ++w) {
    std::atomic<uint8_t>& d = dirty_[big][w];
    // Cleared before the claim: a chunk given back after the claim dirties
    // the word again, for the next trim.
    if (d.load(std::memory_order_relaxed) == 0 || d.exchange(0, std::memory_order_relaxed) == 0)
      continue;
    dirty_n_.fetch_sub(1, std::memory_order_relaxed);
    const uint64_t claimed = maps_[big].claim_free(w);
    // The last word's bits past the pool name no chunk.
    const uint64_t real = n - w * 64 >= 64 ? ~uint64_t{0} : (uint64_t{1} << (n - w * 64)) - 1;
    if ((claimed & real) != 0) released += release_chunks(big, w, claimed & real);
    maps_[big].unclaim(w, claimed);
  }
  return released;
}

size_t LiveTable::release_chunks(unsigned big, uint32_t w, uint64_t mask) const {
  // Claimed: no insert writes these slots until unclaim(); stale walks
  // only read them (zeros: empty slots). Whole pages inside each run.
  const size_t step = big != 0 ? kBig : kSmall;
  const Slot* base = slots_ + (big != 0 ? small_positions_ : 0);
  size_t released = 0;
  while (mask != 0) {
    const unsigned a = static_cast<unsigned>(__builtin_ctzll(mask));
    const uint64_t from_a = mask >> a;
    const unsigned len = ~from_a == 0 ? 64 - a : static_cast<unsigned>(__builtin_ctzll(~from_a));
    const size_t first = size_t{w} * 64 + a;
    released += os_release_within(base + first * step, base + (first + len) * step);
    mask = a + len >= 64 ? 0 : mask & ~((uint64_t{1} << (a + len)) - 1);
  }
  return released;
}

void LiveTable::trim_end(size_t released, bool asked) {
  uint32_t dirty = 0;
  for (unsigned p = 0; p < 2; ++p) {
    // An empty pool's map is not read: after a clear it is unmapped, and
    // reading it would map it again.
    const auto words = static_cast<uint32_t>(RecordMap::words_for(maps_[p].high()));
    if (words == 0) continue;
    maps_[p].reset_hint();
    for (uint32_t w = 0; w < words; ++w) dirty += dirty_[p][w].load(std::memory_order_relaxed);
  }
  dirty_n_.store(dirty, std::memory_order_relaxed);
  // A trim that gave nothing back waits for twice as many dirty words
  // next time (churn in a full pool dirties words with no free page): at
  // most every word the pools have handed out.
  uint32_t at = kTrimAt;
  if (!asked) {
    at = last_at_;
  } else if (released == 0) {
    const uint32_t most = trim_words_[0] + trim_words_[1];
    at = last_at_ * 2 < most ? last_at_ * 2 : most;
    if (at < kTrimAt) at = kTrimAt;
  }
  last_at_ = at;
  trim_at_.store(at, std::memory_order_relaxed);
}

size_t LiveTable::resident_bytes(const PageCounter& pages) const {
  return pages.count(slots_, bytes_);
}

}  // namespace mi::track
