#include "stack_table.h"

#include <bit>

#include "os_mem.h"

namespace mi::track {

namespace {
// Four independent lanes (multiply, add, rotate) so the CPU overlaps the
// multiplications: a stack of 16-32 frames hashes in a few ns instead of a
// serial multiply chain. Lanes are mixed at the end; the rotation keeps the
// order of frames within a lane significant. Inlined into intern (the hot
// path): a call of its own costs more than the words it hashes.
[[gnu::always_inline]] inline uint64_t hash_frames(const uint64_t* frames, unsigned n) {
  constexpr uint64_t k0 = 0x9E3779B97F4A7C15ull, k1 = 0xC2B2AE3D27D4EB4Full,
                     k2 = 0x165667B19E3779F9ull, k3 = 0xD6E8FEB86659FD93ull;
  // Four scalars rather than an array: kept in registers.
  uint64_t a = n, b = n ^ k0, c = n ^ k1, d = n ^ k2;
  unsigned i = 0;
  for (; i + 4 <= n; i += 4) {
    a = std::rotl(a + frames[i] * k0, 29);
    b = std::rotl(b + frames[i + 1] * k1, 29);
    c = std::rotl(c + frames[i + 2] * k2, 29);
    d = std::rotl(d + frames[i + 3] * k3, 29);
  }
  if (i < n) a = std::rotl(a + frames[i] * k0, 29);
  if (i + 1 < n) b = std::rotl(b + frames[i + 1] * k1, 29);
  if (i + 2 < n) c = std::rotl(c + frames[i + 2] * k2, 29);
  uint64_t h = a ^ std::rotl(b, 16) ^ std::rotl(c, 32) ^ std::rotl(d, 48);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

// A stack's hash from its frames' and its tail's: both are mixed already.
inline uint64_t combine(uint64_t frames_hash, uint64_t tail_hash) {
  return frames_hash ^ std::rotl(tail_hash * 0x9E3779B97F4A7C15ull, 31);
}

// n words at f (a slot's) equal to n at w. Four a branch: atomic loads are
// not vectorized, and this is the hot path of every recorded allocation.
inline bool same_words(const std::atomic<uintptr_t>* f, const uint64_t* w, unsigned n) {
  unsigned i = 0;
  for (; i + 4 <= n; i += 4) {
    const uintptr_t d = (f[i].load(std::memory_order_acquire) ^ w[i]) |
                        (f[i + 1].load(std::memory_order_acquire) ^ w[i + 1]) |
                        (f[i + 2].load(std::memory_order_acquire) ^ w[i + 2]) |
                        (f[i + 3].load(std::memory_order_acquire) ^ w[i + 3]);
    if (d != 0) return false;
  }
  for (; i < n; ++i)
    if (f[i].load(std::memory_order_acquire) != w[i]) return false;
  return true;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Claiming a slot can lose a race to another new stack; each loss means
// another thread made progress, so a few retries of the whole probe bound
// the work without dropping stacks under ordinary contention.
constexpr int kClaimAttempts = 4;
}  // namespace

uint64_t StackTable::hash_words(const uint64_t* words, unsigned n) {
  return hash_frames(words, n);
}

bool StackTable::init(size_t capacity, unsigned depth) {
  if (capacity > kMaxCapacity) capacity = kMaxCapacity;
  if (depth > kMaxDepth) depth = kMaxDepth;
  if (depth == 0) depth = 1;
  size_t cap = kWindow;
  unsigned bits = 6;
  while (cap < capacity) {
    cap <<= 1;
    ++bits;
  }
  const size_t header_bytes = header_bytes_of(cap);
  // A record per slot in each class, and a window more: a record is lost
  // only when a process forks while a thread holds one between the free
  // list and a slot (the child never gives it back). Each pool starts on a
  // page, so that its resident part is its own records.
  const size_t rec_cap = cap + kWindow;
  size_t pool_at[kClasses];
  size_t total = header_bytes;
  uint32_t rows = 0;
  for (unsigned c = 0; c < kClasses; ++c) {
    words_[c] = ((depth + kHeadWords) * (c + 1) + kClasses - 1) / kClasses;
    if (words_[c] < kHeadWords + 1) words_[c] = kHeadWords + 1;
    caps_[c] = static_cast<uint32_t>(c + 1 == kClasses ? rec_cap : (rec_cap + 3) / 4);
    row_base_[c] = rows;
    rows += caps_[c];
    pool_at[c] = total;
    total += os_page_up(size_t{caps_[c]} * words_[c] * sizeof(uint64_t));
  }
  void* mem = os_map(total);
  if (mem == nullptr) return false;
  headers_ = static_cast<Header*>(mem);
  for (unsigned c = 0; c < kClasses; ++c) {
    records_[c] = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(mem) + pool_at[c]);
    pools_[c].reset(caps_[c]);
  }
  records_total_ = rows;
  mask_ = cap - 1;
  slot_bits_ = bits;
  // The state word has 21 bits of generation; an id has 31 - slot_bits.
  const unsigned gen_bits = 31 - bits < 21 ? 31 - bits : 21;
  gen_max_ = (uint32_t{1} << gen_bits) - 1;
  depth_ = depth;
  bytes_ = total;
  sweep_at_.store(first_sweep(), std::memory_order_relaxed);
  return true;
}

void StackTable::destroy() {
  os_unmap(headers_, bytes_);
  headers_ = nullptr;
  for (std::atomic<uint64_t>*& r : records_) r = nullptr;
  bytes_ = 0;
}

size_t StackTable::records_used() const {
  size_t n = 0;
  for (const IdPool& p : pools_) n += p.bumped();
  return n;
}

bool StackTable::records_consistent(uint64_t* scratch, size_t scratch_words) const {
  // One bit per record ever handed out, the classes one after another.
  size_t base[kClasses], used = 0;
  for (unsigned c = 0; c < kClasses; ++c) {
    base[c] = used;
    used += pools_[c].bumped();
  }
  if (scratch_words < used / 64 + 1) return false;
  for (size_t i = 0; i < scratch_words; ++i) scratch[i] = 0;
  auto take = [&](uint32_t r) {
    if (r >= records_total_) return false;
    const unsigned c = record_class(r);
    const uint32_t i = r - row_base_[c];
    if (i >= pools_[c].bumped()) return false;
    const size_t bit = base[c] + i;
    if ((scratch[bit / 64] >> (bit % 64) & 1) != 0) return false;
    scratch[bit / 64] |= uint64_t{1} << (bit % 64);
    return true;
  };
  for (size_t slot = 0; slot <= mask_; ++slot) {
    const uint32_t k = kind(headers_[slot].state.load(std::memory_order_relaxed));
    if ((k == kReady || k == kFreeing) && !take(headers_[slot].rec.load(std::memory_order_relaxed)))
      return false;
  }
  for (unsigned c = 0; c < kClasses; ++c) {
    uint32_t i = pools_[c].first_free();
    for (size_t n = 0; i != kNoRecord; ++n) {
      const uint32_t r = row_base_[c] + i;
      if (n > used || i >= caps_[c] || !take(r)) return false;
      i = static_cast<uint32_t>(record_in(c, i)[0].load(std::memory_order_relaxed));
    }
  }
  return true;
}

size_t StackTable::resident_slot_bytes(const PageCounter& pages) const {
  return headers_ != nullptr ? pages.count(headers_, header_bytes()) : 0;
}

size_t StackTable::resident_record_bytes(const PageCounter& pages) const {
  return headers_ != nullptr ? pages.count(records_[0], bytes_ - header_bytes()) : 0;
}

uint32_t StackTable::take_record(unsigned c) {
  for (; c < kClasses; ++c) {
    const uint32_t i =
        pools_[c].take([ this, c ](uint32_t j) -> auto& { return record_in(c, j)[0]; });
    if (i != kNoRecord) return row_base_[c] + i;
  }
  return kNoRecord;
}

void StackTable::give_record(uint32_t r) {
  // The link overwrites the token: a release store like every rewrite of a
  // record's words, so a reader that loads it sees the free (see
  // same_stack()).
  const unsigned c = record_class(r);
  pools_[c].give(
      r - row_base_[c], [ this, c ](uint32_t j) -> auto& { return record_in(c, j)[0]; });
}

template <bool kTail>
bool StackTable::same_stack(size_t slot, uint32_t w, uint64_t hash, const uintptr_t* frames,
                            unsigned n, const Tail& tail) const {
  const Header& h = headers_[slot];
  const unsigned depth = kTail ? n + tail.n : n;
  if (depth_of(w) != depth || h.hash_hi.load(std::memory_order_acquire) != hash_high(hash))
    return false;
  const std::atomic<uint64_t>* rec = record_of(h);
  if (rec == nullptr || rec[1].load(std::memory_order_acquire) != hash) return false;
  const std::atomic<uintptr_t>* f = rec + kHeadWords;
  if (!same_words(f, frames, n)) return false;
  // A tail with the record's own token is its tail (Tail's contract).
  if (kTail && (tail.token == 0 || rec[0].load(std::memory_order_acquire) != tail.token) &&
      !same_words(f + n, tail.words, tail.n))
    return false;
  // The slot may have been freed and rewritten while we compared, or its
  // record given to another slot: only a state word unchanged since `w`
  // proves the record and its words were this stack's. A sequence lock
  // without fences (which TSan cannot model): a rewriter's record, word
  // and token stores are release and come after its WRITING CAS, or (a
  // record reused by another slot) after its take_record()'s acquire of
  // the release that gave the record back, which finish() did after
  // freeing this slot; so an acquire load that saw one of them makes this
  // load see the free or later.
  return h.state.load(std::memory_order_relaxed) == w;
}

void StackTable::stamp(Header& h, uint32_t e) {
  // Raised at most once per slot per epoch: an RMW only when a sweep has
  // started since the stack was last interned.
  uint32_t s = h.stamp.load(std::memory_order_relaxed);
  while (s < e && !h.stamp.compare_exchange_weak(s, e, std::memory_order_relaxed)) {
  }
}

uint32_t StackTable::store(size_t slot, uint32_t w, uint64_t hash, const uintptr_t* frames,
                           unsigned n, const Tail& tail) {
  Header& h = headers_[slot];
  const uint32_t g = kind(w) == kEmpty ? 1 : gen(w);
  // The record first: a slot never waits in WRITING for one, and a spent
  // pool loses no slot.
  const uint32_t r = take_record(class_of(n + tail.n));
  if (r == kNoRecord) return 0;
  if (!h.state.compare_exchange_strong(w, word(kWriting, 0, g), std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
    give_record(r);
    return 0;
  }
  // Release stores (plain moves on x86): see same_stack().
  h.rec.store(r, std::memory_order_release);
  h.hash_hi.store(hash_high(hash), std::memory_order_release);
  h.stamp.store(epoch(), std::memory_order_relaxed);
  std::atomic<uint64_t>* rec = record(r);
  rec[1].store(hash, std::memory_order_release);
  std::atomic<uintptr_t>* f = rec + kHeadWords;
  for (unsigned j = 0; j < n; ++j) f[j].store(frames[j], std::memory_order_release);
  for (unsigned j = 0; j < tail.n; ++j) f[n + j].store(tail.words[j], std::memory_order_release);
  rec[0].store(tail.token, std::memory_order_release);
  if (park_hook_ != nullptr) [[unlikely]]
    park_hook_(park_ctx_);
  h.state.store(word(kReady, n + tail.n, g), std::memory_order_release);
  count_.fetch_add(1, std::memory_order_relaxed);
  return make_id(slot, g);
}

uint32_t StackTable::intern(const uintptr_t* frames, unsigned n) {
  if (n == 0) return 0;
  if (n > depth_) n = depth_;
  return intern_hashed<false>(frames, n, Tail{}, hash_frames(frames, n));
}

uint32_t StackTable::intern(const uintptr_t* frames, unsigned n, const Tail& tail) {
  // A tail that cannot be stored is left out; the frames are cut to fit
  // beside the tail.
  if (tail.n == 0 || tail.n > depth_) return intern(frames, n);
  if (n > depth_ - tail.n) n = depth_ - tail.n;
  return intern_hashed<true>(frames, n, tail, combine(hash_frames(frames, n), tail.hash));
}

template <bool kTail>
uint32_t StackTable::intern_hashed(const uintptr_t* frames, unsigned n, const Tail& tail,
                                   uint64_t hash) {
  const size_t start = static_cast<size_t>(hash * 0x9E3779B97F4A7C15ull >> 17) & mask_;
  const uint32_t e = epoch();
  const uint32_t spin_limit = spin_limit_.load(std::memory_order_relaxed);
  for (int attempt = 0; attempt < kClaimAttempts; ++attempt) {
    size_t claim = SIZE_MAX;  // the first reusable slot of the probe
    uint32_t claim_word = 0;
    for (size_t i = 0; i < kWindow; ++i) {
      const size_t slot = (start + i) & mask_;
      Header& h = headers_[slot];
      uint32_t w = h.state.load(std::memory_order_acquire);
      // A writer holds a slot for a few dozen instructions, but can be
      // preempted there: wait a bounded time, then treat it as another
      // stack (at worst this stack gets a second slot).
      for (uint32_t spin = 0; kind(w) == kWriting && spin < spin_limit; ++spin) {
        cpu_relax();
        w = h.state.load(std::memory_order_acquire);
      }
      const uint32_t k = kind(w);
      if (k == kEmpty) {
        if (claim == SIZE_MAX) {
          claim = slot;
          claim_word = w;
        }
        break;  // nothing was ever stored past an EMPTY slot
      }
      if (k == kFree) {
        if (claim == SIZE_MAX) {
          claim = slot;
          claim_word = w;
        }
        continue;
      }
      if ((k == kReady || k == kFreeing) && same_stack<kTail>(slot, w, hash, frames, n, tail)) {
        // A condemned copy is revived rather than duplicated; if the sweep
        // finished it first, the CAS fails and hold() says so.
        const uint32_t id = make_id(slot, gen(w));
        if (k == kReady) {
          stamp(h, e);
          return id;
        }
        if (stamp_if_current(id, e, true)) return id;
      }
    }
    if (claim == SIZE_MAX) break;
    if (const uint32_t id = store(claim, claim_word, hash, frames, n, tail); id != 0) return id;
  }
  dropped_.fetch_add(1, std::memory_order_relaxed);
  // A drop asks for a sweep, unless one ran since fewer than a window's
  // worth of stacks ago (then the table is full of live stacks, and
  // sweeping again would free nothing).
  const uint64_t c = count_.load(std::memory_order_relaxed);
  if (c >= count_after_sweep_.load(std::memory_order_relaxed) + kWindow &&
      sweep_at_.load(std::memory_order_relaxed) > c)
    sweep_at_.store(c, std::memory_order_relaxed);
  return 0;
}

bool StackTable::stamp_if_current(uint32_t id, uint32_t e, bool revive) {
  const size_t slot = id & mask_;
  const uint32_t g = id >> slot_bits_;
  if (g == 0 || g > gen_max_) return false;
  Header& h = headers_[slot];
  uint32_t w = h.state.load(std::memory_order_acquire);
  for (;;) {
    if (gen(w) != g) return false;
    const uint32_t k = kind(w);
    if (k == kFreeing && revive) {
      if (!h.state.compare_exchange_weak(w, word(kReady, depth_of(w), g), std::memory_order_acq_rel,
                                         std::memory_order_acquire))
        continue;
    } else if (k != kReady && k != kFreeing) {
      return false;
    }
    stamp(h, e);
    return true;
  }
}

bool StackTable::hold(uint32_t id, uint32_t e) {
  return stamp_if_current(id, e, true);
}

bool StackTable::reuse(uint32_t id, uint64_t hash) {
  // hold(), then the slot's half of the hash (not the record's whole
  // one: this runs on every recorded allocation whose stack a thread
  // remembers, and the record is another cache line): the stamp checked
  // the generation; the half read after it is this stack's if the slot
  // still holds it afterwards (acquire loads: see get()).
  if (!stamp_if_current(id, epoch(), true)) return false;
  const Header& h = headers_[id & mask_];
  const uint32_t got = h.hash_hi.load(std::memory_order_acquire);
  uint32_t w;
  // hash_of() answers 1 for a hash of 0: both have a high half of 0.
  return still_holds(h, id >> slot_bits_, &w) && got == hash_high(hash);
}

const StackTable::Header* StackTable::holding(uint32_t id, uint32_t* w) const {
  const uint32_t g = id >> slot_bits_;
  if (g == 0 || g > gen_max_ || headers_ == nullptr) return nullptr;
  const Header& h = headers_[id & mask_];
  return still_holds(h, g, w) ? &h : nullptr;
}

// Acquire, so that a reader's frame or hash loads that follow a first call
// are not reordered before it; a second call after those loads (acquire
// loads themselves) sees any free that overlapped them (see same_stack()).
bool StackTable::still_holds(const Header& h, uint32_t id_gen, uint32_t* w) {
  *w = h.state.load(std::memory_order_acquire);
  return gen(*w) == id_gen && (kind(*w) == kReady || kind(*w) == kFreeing);
}

unsigned StackTable::get(uint32_t id, uint64_t* out, unsigned max) const {
  uint32_t w;
  const Header* h = holding(id, &w);
  if (h == nullptr) return 0;
  const unsigned n = depth_of(w);
  const std::atomic<uint64_t>* rec = record_of(*h);
  if (rec == nullptr) return 0;
  const std::atomic<uintptr_t>* f = rec + kHeadWords;
  for (unsigned i = 0; i < n && i < max; ++i) out[i] = f[i].load(std::memory_order_acquire);
  // Frames change only after the slot is freed, which changes the
  // generation: READY and FREEING of the same generation hold the same
  // frames. Acquire frame loads keep this check after them.
  return still_holds(*h, id >> slot_bits_, &w) ? n : 0;
}

uint64_t StackTable::hash_of(uint32_t id) const {
  uint32_t w;
  const Header* h = holding(id, &w);
  if (h == nullptr) return 0;
  const std::atomic<uint64_t>* rec = record_of(*h);
  if (rec == nullptr) return 0;
  const uint64_t hash = rec[1].load(std::memory_order_acquire);
  if (!still_holds(*h, id >> slot_bits_, &w)) return 0;
  return hash != 0 ? hash : 1;
}

uint32_t StackTable::begin_sweep() {
  return epoch_.fetch_add(1, std::memory_order_seq_cst) + 1;
}

size_t StackTable::condemn(size_t lo, size_t hi, uint32_t e) {
  size_t n = 0;
  for (size_t slot = lo; slot < hi && slot <= mask_; ++slot) {
    Header& h = headers_[slot];
    uint32_t w = h.state.load(std::memory_order_acquire);
    if (kind(w) != kReady || h.stamp.load(std::memory_order_relaxed) >= e) continue;
    if (h.state.compare_exchange_strong(w, word(kFreeing, depth_of(w), gen(w)),
                                        std::memory_order_acq_rel, std::memory_order_relaxed))
      ++n;
  }
  return n;
}

size_t StackTable::finish(size_t lo, size_t hi, uint32_t e) {
  size_t freed = 0;
  for (size_t slot = lo; slot < hi && slot <= mask_; ++slot) {
    Header& h = headers_[slot];
    uint32_t w = h.state.load(std::memory_order_acquire);
    if (kind(w) != kFreeing) continue;
    const bool keep = h.stamp.load(std::memory_order_relaxed) >= e;
    const uint32_t next =
        keep ? word(kReady, depth_of(w), gen(w)) : word(kFree, 0, next_gen(gen(w)));
    // The record is read before the free: once FREE, the slot may be
    // claimed by a new stack, which stores its own record there (a review
    // found the read after the CAS giving that new record back while the
    // new stack used it). While the slot is FREEING of `w`'s generation its
    // record does not change, so a CAS from `w` proves `r` was its.
    const uint32_t r = h.rec.load(std::memory_order_relaxed);
    // A failed CAS means a hook revived the slot meanwhile: it stays. A
    // freed slot's record goes back to the pool after the free, so that a
    // reader of the old stack that sees the record's next words also sees
    // the free (same_stack()).
    if (h.state.compare_exchange_strong(w, next, std::memory_order_acq_rel,
                                        std::memory_order_relaxed) &&
        !keep) {
      if (finish_hook_ != nullptr) [[unlikely]]
        finish_hook_(finish_ctx_);
      if (valid_record(r)) give_record(r);
      ++freed;
    }
  }
  return freed;
}

void StackTable::end_sweep(uint64_t freed) {
  const uint64_t c = count_.fetch_sub(freed, std::memory_order_relaxed) - freed;
  reclaimed_.fetch_add(freed, std::memory_order_relaxed);
  count_after_sweep_.store(c, std::memory_order_relaxed);
  // The next sweep once half as many stacks as survived this one have been
  // added (at least a 64th of the table, at most an eighth), and never
  // before the first sweep's point. What the pool keeps resident is the
  // most stacks stored at once: about 1.5 times the stacks in use, rather
  // than whatever a fixed step let pile up (a preloaded RabbitMQ kept
  // 18,450 records for 7,500 stacks with a step of an eighth). The step
  // grows with the survivors, so a table full of live stacks is not swept
  // over and over for nothing.
  const uint64_t cap = mask_ + 1;
  uint64_t step = c / 2;
  if (step < cap / 64) step = cap / 64;
  if (step > cap / 8) step = cap / 8;
  const uint64_t first = first_sweep();
  sweep_at_.store(c + step > first ? c + step : first, std::memory_order_relaxed);
}

}  // namespace mi::track
