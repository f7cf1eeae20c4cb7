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
  // Levels of a quarter, a quarter and a half (see "Levels"), each at
  // least four windows: a smaller table is one level.
  if (cap >= 16 * kWindow) {
    levels_ = 3;
    const size_t size[kMaxLevels] = {cap / 4, cap / 4, cap / 2};
    size_t at = 0;
    for (unsigned l = 0; l < levels_; ++l) {
      level_at_[l] = at;
      level_mask_[l] = size[l] - 1;
      at += size[l];
    }
  } else {
    levels_ = 1;
    level_at_[0] = 0;
    level_mask_[0] = cap - 1;
  }
  // find_tagged() reads a window's tags by the word: each level starts on
  // one and is at least a window (so a window wrapping round its level
  // starts a word there, and never meets itself).
  for (unsigned l = 0; l < levels_; ++l)
    if (level_at_[l] % 8 != 0 || level_mask_[l] + 1 < kWindow) return false;
  const size_t header_bytes = header_bytes_of(cap);
  // A record per slot in each class, and a window more: a record is lost
  // only when a process forks while a thread holds one between its pool
  // and a slot, or a compaction holds some claimed or mid-move (the child
  // never gives those back). Each pool starts on a page, so that its
  // resident part is its own records.
  const size_t rec_cap = cap + kWindow;
  size_t pool_at[kClasses], map_at[kClasses];
  size_t total = header_bytes;
  uint32_t rows = 0;
  for (unsigned c = 0; c < kClasses; ++c) {
    words_[c] = ((depth + kHeadWords) * (c + 1) + kClasses - 1) / kClasses;
    if (words_[c] < kHeadWords + 1) words_[c] = kHeadWords + 1;
    // Multiples of 32 records (a page of 128-byte churn rows): each
    // class's churn rows then start on a page (churn.cpp), and compaction
    // gives their pages back whole. rec_cap is a multiple of 64.
    caps_[c] =
        static_cast<uint32_t>(c + 1 == kClasses ? rec_cap : ((rec_cap + 3) / 4 + 31) / 32 * 32);
    row_base_[c] = rows;
    rows += caps_[c];
    pool_at[c] = total;
    total += os_page_up(size_t{caps_[c]} * words_[c] * sizeof(uint64_t));
  }
  // The pools' maps, then their retired bits, after the pools (a few KiB).
  maps_at_ = total;
  for (unsigned c = 0; c < kClasses; ++c) {
    map_at[c] = total;
    total += 2 * RecordMap::words_for(caps_[c]) * sizeof(uint64_t);
  }
  total = os_page_up(total);
  void* mem = os_map(total);
  if (mem == nullptr) return false;
  headers_ = static_cast<Header*>(mem);
  tags_ = reinterpret_cast<std::atomic<uint64_t>*>(headers_ + cap);
  for (unsigned c = 0; c < kClasses; ++c) {
    records_[c] = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(mem) + pool_at[c]);
    auto* map = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(mem) + map_at[c]);
    maps_[c].init(map, caps_[c]);
    retired_[c] = map + RecordMap::words_for(caps_[c]);
  }
  records_total_ = rows;
  chunk_base_[0] = 0;
  for (unsigned c = 0; c < kClasses; ++c)
    chunk_base_[c + 1] =
        chunk_base_[c] +
        static_cast<uint32_t>((RecordMap::words_for(caps_[c]) + kCompactWords - 1) / kCompactWords);
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
  tags_ = nullptr;
  for (std::atomic<uint64_t>*& r : records_) r = nullptr;
  for (std::atomic<uint64_t>*& r : retired_) r = nullptr;
  bytes_ = 0;
}

size_t StackTable::records_used() const {
  size_t n = 0;
  for (const RecordMap& m : maps_) n += m.high();
  return n;
}

size_t StackTable::records_taken() const {
  size_t n = 0;
  for (const RecordMap& m : maps_) n += m.count();
  return n;
}

bool StackTable::records_consistent(uint64_t* scratch, size_t scratch_words) const {
  // One bit per record ever handed out, the classes one after another:
  // set once a slot or the retired bits account for it.
  size_t base[kClasses], used = 0;
  for (unsigned c = 0; c < kClasses; ++c) {
    base[c] = used;
    used += maps_[c].high();
  }
  if (scratch_words < used / 64 + 1) return false;
  for (size_t i = 0; i < scratch_words; ++i) scratch[i] = 0;
  auto account = [&](unsigned c, uint32_t i) {
    if (i >= maps_[c].high() || !maps_[c].taken(i)) return false;
    const size_t bit = base[c] + i;
    if ((scratch[bit / 64] >> (bit % 64) & 1) != 0) return false;
    scratch[bit / 64] |= uint64_t{1} << (bit % 64);
    return true;
  };
  for (size_t slot = 0; slot <= mask_; ++slot) {
    const uint32_t k = kind(headers_[slot].state.load(std::memory_order_relaxed));
    if (k != kReady && k != kFreeing) continue;
    const uint32_t r = headers_[slot].rec.load(std::memory_order_relaxed);
    if (!valid_record(r)) return false;
    const unsigned c = record_class(r);
    if (retired(c, r - row_base_[c]) || !account(c, r - row_base_[c])) return false;
  }
  // Every other taken record is retired, and every retired one taken.
  for (unsigned c = 0; c < kClasses; ++c)
    for (uint32_t i = 0; i < maps_[c].size(); ++i) {
      const bool counted =
          i < maps_[c].high() && (scratch[(base[c] + i) / 64] >> ((base[c] + i) % 64) & 1) != 0;
      if (retired(c, i) && !account(c, i)) return false;
      if (maps_[c].taken(i) && !counted && !retired(c, i)) return false;
    }
  return true;
}

size_t StackTable::resident_slot_bytes(const PageCounter& pages) const {
  return headers_ != nullptr ? pages.count(headers_, header_bytes()) : 0;
}

size_t StackTable::resident_record_bytes(const PageCounter& pages) const {
  return headers_ != nullptr ? pages.count(records_[0], maps_at_ - header_bytes()) : 0;
}

size_t StackTable::resident_map_bytes(const PageCounter& pages) const {
  return headers_ != nullptr
             ? pages.count(reinterpret_cast<const char*>(headers_) + maps_at_, bytes_ - maps_at_)
             : 0;
}

uint32_t StackTable::take_record(unsigned c) {
  for (; c < kClasses; ++c) {
    const uint32_t i = maps_[c].take();
    if (i != kNoRecord) return row_base_[c] + i;
  }
  return kNoRecord;
}

void StackTable::give_record(uint32_t r) {
  const unsigned c = record_class(r);
  maps_[c].give(r - row_base_[c]);
}

template <bool kTail>
inline bool StackTable::same_stack(size_t slot, uint32_t w, uint64_t hash, const uintptr_t* frames,
                                   unsigned n, const Tail& tail) const {
  const Header& h = headers_[slot];
  const unsigned depth = kTail ? n + tail.n : n;
  if (depth_of(w) != depth || h.hash_hi.load(std::memory_order_acquire) != hash_high(hash))
    return false;
  // The record's words against ours.
  auto equal = [&](const std::atomic<uint64_t>* rec) {
    if (rec == nullptr || rec[1].load(std::memory_order_acquire) != hash) return false;
    const std::atomic<uintptr_t>* f = rec + kHeadWords;
    if (!same_words(f, frames, n)) return false;
    // A tail with the record's own token is its tail (Tail's contract).
    return !kTail || (tail.token != 0 && rec[0].load(std::memory_order_acquire) == tail.token) ||
           same_words(f + n, tail.words, tail.n);
  };
  for (int attempt = 0;; ++attempt) {
    uint32_t r;
    const bool same = equal(record_of(h, &r));
    // The slot may have been freed and rewritten while we compared, or its
    // record given to another slot: only a state word unchanged since `w`
    // and the same record prove the words were this stack's. A sequence
    // lock without fences (which TSan cannot model): a rewriter's record,
    // word and token stores are release and come after its WRITING CAS, or
    // (a record reused by another slot) after its take_record()'s acquire
    // of the release that gave the record back, which came after finish()
    // freed this slot or compact_move() pointed it at another record; so
    // an acquire load that saw one of them makes these loads see the free
    // (a new generation) or the move (a record moves only down, so it
    // never comes back to `r` within a generation) or later.
    if (h.state.load(std::memory_order_relaxed) != w) return false;
    if (h.rec.load(std::memory_order_relaxed) == r) return same;
    // The stack moved while we compared: compare its copy (once; a second
    // move needs another sweep). Without this, an intern racing a move
    // would store the stack a second time.
    if (attempt == 1) return false;
  }
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
  set_tag(slot, tag_of(hash));
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

void StackTable::set_tag(size_t slot, uint8_t tag) {
  std::atomic<uint64_t>& word = tags_[slot / 8];
  const unsigned shift = 8 * (slot % 8);
  uint64_t old = word.load(std::memory_order_relaxed);
  while (!word.compare_exchange_weak(old,
                                     (old & ~(uint64_t{0xFF} << shift)) | uint64_t{tag} << shift,
                                     std::memory_order_relaxed)) {
  }
}

inline uint32_t StackTable::found(Header& h, size_t slot, uint32_t w, uint32_t e) {
  const uint32_t id = make_id(slot, gen(w));
  if (kind(w) == kReady) {
    stamp(h, e);
    return id;
  }
  // A condemned copy is revived rather than duplicated; if the sweep
  // finished it first, the CAS fails and hold() says so.
  return stamp_if_current(id, e, true) ? id : 0;
}

namespace {
// A bit 7 in each byte of x that is 0 (exact, no borrow between bytes).
inline uint64_t zero_bytes(uint64_t x) {
  constexpr uint64_t k7f = 0x7F7F7F7F7F7F7F7Full;
  return ~(((x & k7f) + k7f) | x | k7f);
}
}  // namespace

template <bool kTail>
inline uint32_t StackTable::find_tagged(uint64_t s, uint64_t hash, const uintptr_t* frames,
                                        unsigned n, const Tail& tail, uint32_t e) {
  // The probe's first slot, before any tag: where most stacks are (the
  // first level is at most about a third full on the nodes measured), so
  // this costs a header's load, as the probe did before there were tags.
  {
    const size_t at = probe_slot(s, 0, 0);
    Header& h = headers_[at];
    const uint32_t w = h.state.load(std::memory_order_acquire);
    if (kind(w) == kReady && same_stack<kTail>(at, w, hash, frames, n, tail))
      return found(h, at, w, e);
  }
  const uint64_t pattern = uint64_t{tag_of(hash)} * 0x0101010101010101ull;
  for (unsigned l = 0; l < levels_; ++l) {
    // The window's tags, a word at a time: the first word from the
    // window's start, the last cut at its end (a level is whole words, so
    // a window wrapping round its level starts a word there).
    size_t i = 0;
    while (i < kWindow) {
      const size_t slot = probe_slot(s, l, i);
      const size_t first = slot % 8;
      size_t n_bytes = 8 - first;
      if (n_bytes > kWindow - i) n_bytes = kWindow - i;
      const uint64_t in_window = (n_bytes == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * n_bytes)) - 1)
                                 << (8 * first);
      const uint64_t x = tags_[slot / 8].load(std::memory_order_relaxed);
      const uint64_t empty = zero_bytes(x) & in_window;
      uint64_t match = zero_bytes(x ^ pattern) & in_window;
      // Only the matches before the first unwritten slot (past it, no
      // stack was ever stored in this probe).
      if (empty != 0) match &= (empty & -empty) - 1;
      for (; match != 0; match &= match - 1) {
        const size_t at = slot - first + static_cast<size_t>(__builtin_ctzll(match)) / 8;
        Header& h = headers_[at];
        const uint32_t w = h.state.load(std::memory_order_acquire);
        const uint32_t k = kind(w);
        if ((k == kReady || k == kFreeing) && same_stack<kTail>(at, w, hash, frames, n, tail))
          if (const uint32_t id = found(h, at, w, e); id != 0) return id;
      }
      if (empty != 0) return 0;
      i += n_bytes;
    }
  }
  return 0;
}

template <bool kTail>
uint32_t StackTable::intern_hashed(const uintptr_t* frames, unsigned n, const Tail& tail,
                                   uint64_t hash) {
  const uint64_t s = scramble(hash);
  const uint32_t e = epoch();
  // Most interns are of stacks stored before: found through the tags.
  if (const uint32_t id = find_tagged<kTail>(s, hash, frames, n, tail, e); id != 0) return id;
  header_probes_.fetch_add(1, std::memory_order_relaxed);
  const uint32_t spin_limit = spin_limit_.load(std::memory_order_relaxed);
  for (int attempt = 0; attempt < kClaimAttempts; ++attempt) {
    size_t claim = SIZE_MAX;  // the first reusable slot of the probe
    uint32_t claim_word = 0;
    // The probe: a window in each level, as one sequence (see "Levels").
    for (size_t p = 0; p < levels_ * kWindow; ++p) {
      const size_t slot = probe_slot(s, static_cast<unsigned>(p / kWindow), p % kWindow);
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
      if ((k == kReady || k == kFreeing) && same_stack<kTail>(slot, w, hash, frames, n, tail))
        if (const uint32_t id = found(h, slot, w, e); id != 0) return id;
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

template <class Read>
bool StackTable::read_stable(uint32_t id, Read&& read) const {
  uint32_t w;
  const Header* h = holding(id, &w);
  if (h == nullptr) return false;
  // A stack's words change only after its slot is freed, which changes the
  // generation, or after its record moved: READY and FREEING of the same
  // generation and record hold the same words. The reader's acquire loads
  // keep the check after them. A stack that moved meanwhile is read again
  // from its copy (once: a second move needs another sweep).
  for (int attempt = 0; attempt < 2; ++attempt) {
    uint32_t r;
    const std::atomic<uint64_t>* rec = record_of(*h, &r);
    if (rec == nullptr) return false;
    read(rec, depth_of(w));
    if (still_holds(*h, id >> slot_bits_, r)) return true;
    if (!still_holds(*h, id >> slot_bits_, &w)) return false;
  }
  return false;
}

unsigned StackTable::get(uint32_t id, uint64_t* out, unsigned max) const {
  unsigned depth = 0;
  const bool ok = read_stable(id, [&](const std::atomic<uint64_t>* rec, unsigned n) {
    const std::atomic<uintptr_t>* f = rec + kHeadWords;
    for (unsigned i = 0; i < n && i < max; ++i) out[i] = f[i].load(std::memory_order_acquire);
    depth = n;
  });
  return ok ? depth : 0;
}

uint64_t StackTable::hash_of(uint32_t id) const {
  uint64_t hash = 0;
  const bool ok = read_stable(id, [&](const std::atomic<uint64_t>* rec, unsigned) {
    hash = rec[1].load(std::memory_order_acquire);
  });
  if (!ok) return 0;
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

void StackTable::swept(uint64_t freed) {
  const uint64_t c = count_.fetch_sub(freed, std::memory_order_relaxed) - freed;
  reclaimed_.fetch_add(freed, std::memory_order_relaxed);
  count_after_sweep_.store(c, std::memory_order_relaxed);
  sweep_at_.store(0, std::memory_order_relaxed);
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

void StackTable::compact_begin(uint32_t* target) {
  uint32_t retired = 0;
  for (unsigned c = 0; c < kClasses; ++c) {
    const auto words = static_cast<uint32_t>(RecordMap::words_for(maps_[c].high()));
    for (uint32_t wi = 0; wi < words; ++wi)
      retired += static_cast<uint32_t>(
          __builtin_popcountll(retired_[c][wi].load(std::memory_order_relaxed)));
  }
  retired_n_.store(retired, std::memory_order_relaxed);
  for (unsigned c = 0; c < kClasses; ++c) {
    const uint32_t n = maps_[c].count();
    const uint64_t t = (uint64_t{n} + n / 8 + 64 + 63) / 64 * 64;
    target[c] = t < caps_[c] ? static_cast<uint32_t>(t) : caps_[c];
  }
}

bool StackTable::compact_wanted(const uint32_t* target) const {
  if (headers_ == nullptr) return false;
  if (retired_count() != 0) return true;
  for (unsigned c = 0; c < kClasses; ++c) {
    const auto words = static_cast<uint32_t>(RecordMap::words_for(maps_[c].high()));
    for (uint32_t wi = target[c] / 64; wi < words; ++wi)
      if (taken_from(c, wi, target[c]) != 0) return true;
    // Free records above the target not given back yet.
    if (maps_[c].high() > target[c] + 64) return true;
  }
  return false;
}

unsigned StackTable::chunk_words(uint32_t k, uint32_t* lo, uint32_t* hi) const {
  unsigned c = 0;
  while (c + 1 < kClasses && k >= chunk_base_[c + 1]) ++c;
  *lo = (k - chunk_base_[c]) * kCompactWords;
  const auto top = static_cast<uint32_t>(RecordMap::words_for(maps_[c].high()));
  *hi = *lo + kCompactWords < top ? *lo + kCompactWords : top;
  if (*hi < *lo) *hi = *lo;
  return c;
}

void StackTable::want_sweep_soon() {
  const uint64_t soon = count_.load(std::memory_order_relaxed) + (mask_ + 1) / 64;
  if (soon < sweep_at_.load(std::memory_order_relaxed))
    sweep_at_.store(soon, std::memory_order_relaxed);
}

void StackTable::settle(unsigned c, uint32_t i, RowOwner* owner) {
  const uint32_t r = row_base_[c] + i;
  const auto id = static_cast<uint32_t>(record_in(c, i)[0].load(std::memory_order_relaxed));
  // The stack's row now, unless it was freed since it moved.
  uint32_t to = 0;
  uint32_t w;
  if (const Header* h = holding(id, &w); h != nullptr) {
    const uint32_t now = h->rec.load(std::memory_order_acquire);
    if (valid_record(now) && now != r) to = now + 1;
  }
  if (owner != nullptr) owner->settle(id, r + 1, to);
  retired_[c][i / 64].fetch_and(~(uint64_t{1} << (i % 64)), std::memory_order_relaxed);
  retired_n_.fetch_sub(1, std::memory_order_relaxed);
  maps_[c].give(i);
}

uint32_t StackTable::compact_move(uint32_t k, const uint32_t* target, RowOwner* owner) {
  if (headers_ == nullptr || k >= compact_chunks()) return 0;
  uint32_t lo, hi;
  const unsigned c = chunk_words(k, &lo, &hi);
  const uint32_t t = target[c];
  if (lo < t / 64) lo = t / 64;
  uint32_t moved = 0;
  // The records taken above the target, from the map: a record's slot is
  // found from its hash (within its probe windows), so the
  // work follows the stacks to move, not the table's size.
  for (uint32_t wi = lo; wi < hi; ++wi) {
    uint64_t bits = taken_from(c, wi, t) & ~retired_[c][wi].load(std::memory_order_relaxed);
    for (; bits != 0; bits &= bits - 1) {
      const uint32_t i = wi * 64 + static_cast<uint32_t>(__builtin_ctzll(bits));
      const int more = move_record(c, i, t, owner);
      if (more < 0) return moved;  // no free record below the target
      moved += static_cast<uint32_t>(more);
    }
  }
  return moved;
}

int StackTable::move_record(unsigned c, uint32_t i, uint32_t target, RowOwner* owner) {
  const uint32_t r = row_base_[c] + i;
  std::atomic<uint64_t>* from = record_in(c, i);
  // The record's slot: READY, pointing at it. Only READY slots move:
  // nothing but a sweep (this thread's) changes a READY slot's state or
  // record, so both stay as read here. A record being written (its slot
  // WRITING, its hash not yet stored) is not found, and stays.
  const uint64_t s = scramble(from[1].load(std::memory_order_relaxed));
  Header* h = nullptr;
  uint32_t w = 0;
  for (size_t p = 0; p < levels_ * kWindow; ++p) {
    Header& x = headers_[probe_slot(s, static_cast<unsigned>(p / kWindow), p % kWindow)];
    w = x.state.load(std::memory_order_acquire);
    if (kind(w) == kEmpty) break;  // the stack is never past one
    if (kind(w) == kReady && x.rec.load(std::memory_order_relaxed) == r) {
      h = &x;
      break;
    }
  }
  if (h == nullptr) return 0;
  const uint32_t j = maps_[c].take();
  if (j == kNoRecord || j >= target) {
    // No free record below the target (new stacks took them meanwhile).
    if (j != kNoRecord) maps_[c].give(j);
    return -1;
  }
  // The copy, then the slot: a reader that finds the new record in the
  // slot (acquire) finds its words (release).
  std::atomic<uint64_t>* to = record_in(c, j);
  const unsigned words = kHeadWords + depth_of(w);
  for (unsigned k = 0; k < words; ++k)
    to[k].store(from[k].load(std::memory_order_relaxed), std::memory_order_release);
  const uint32_t id = make_id(static_cast<size_t>(h - headers_), gen(w));
  const uint32_t nr = row_base_[c] + j;
  if (owner != nullptr) owner->moved(id, r + 1, nr + 1);
  h->rec.store(nr, std::memory_order_release);
  // Retired with the id in its word 0, for settle(). A reader still
  // comparing the old record fails its record check.
  from[0].store(id, std::memory_order_release);
  retired_[c][i / 64].fetch_or(uint64_t{1} << (i % 64), std::memory_order_relaxed);
  retired_n_.fetch_add(1, std::memory_order_relaxed);
  return 1;
}

size_t StackTable::compact_release(uint32_t k, const uint32_t* target, RowOwner* owner,
                                   uint32_t* kept) {
  if (headers_ == nullptr || k >= compact_chunks()) return 0;
  uint32_t lo, hi;
  const unsigned c = chunk_words(k, &lo, &hi);
  const uint32_t first = (target[c] + 63) / 64;
  if (lo < first) lo = first;
  RecordMap& m = maps_[c];
  size_t released = 0;
  uint32_t run = lo;  // the first word of the run of free words so far
  // Gives back the pages wholly inside records [run * 64, end * 64),
  // claimed free (no take can hand them out meanwhile), then the records.
  auto flush = [&](uint32_t end) {
    if (end == run) return;
    const uint32_t a = run * 64;
    const uint32_t b = end * 64 < caps_[c] ? end * 64 : caps_[c];
    released += os_release_within(record_in(c, a), record_in(c, b));
    if (owner != nullptr && !owner->released(row_base_[c] + a + 1, b - a)) *kept |= 1u << c;
    for (uint32_t wi = run; wi < end; ++wi) m.unclaim(wi, ~uint64_t{0});
  };
  for (uint32_t wi = lo; wi < hi; ++wi) {
    const uint64_t claimed = m.claim_free(wi);
    if (claimed == ~uint64_t{0}) continue;
    // A record here is in use (or retired): give back the run before it.
    m.unclaim(wi, claimed);
    flush(wi);
    run = wi + 1;
  }
  flush(hi > run ? hi : run);
  return released;
}

void StackTable::compact_end(const uint32_t* target, uint32_t kept) {
  if (headers_ == nullptr) return;
  for (unsigned c = 0; c < kClasses; ++c) {
    RecordMap& m = maps_[c];
    if ((kept >> c & 1) != 0) {
      m.reset_hint();
      continue;
    }
    // One read: the words claimed reach as far as this, no further.
    const uint32_t high = m.high();
    const auto top = static_cast<uint32_t>(RecordMap::words_for(high));
    const uint32_t first = (target[c] + 63) / 64;
    // The run of free words at the top of the pool, claimed while the mark
    // comes down (a take then can only raise it again, or the CAS fails).
    uint32_t from = top;
    while (from > first && m.word(from - 1) == 0) {
      const uint64_t claimed = m.claim_free(from - 1);
      if (claimed != ~uint64_t{0}) {  // taken meanwhile
        m.unclaim(from - 1, claimed);
        break;
      }
      --from;
    }
    if (from < top) {
      m.lower_high(high, from * 64);
      for (uint32_t wi = from; wi < top; ++wi) m.unclaim(wi, ~uint64_t{0});
    }
    m.reset_hint();
  }
}

}  // namespace mi::track
