// Deduplicated call stacks: a stack (raw return addresses, innermost first)
// is stored once and named by a 31-bit id, so live entries carry 4 bytes of
// stack and aggregation by call site is a group-by on an integer.
//
// Layout. Open addressing on the stack's hash. Each slot has a 16-byte
// header (state word, epoch stamp, record, the hash's high 32 bits:
// enough to pass over another stack in a probe without reading its
// record; the whole hash is in the record). The state word packs the
// slot's kind, the stack's depth and a generation: ids are (generation <<
// slot_bits) | slot, generation >= 1, so id 0 never names a stack.
//
// Levels. The slots are three levels: a quarter of them, a quarter, then
// a half (one level when the table is smaller than 4 * 4 * kWindow). A
// stack's probe is a window of kWindow slots in each level in turn, each
// window's start from other bits of the hash; as a single window would,
// it stops at the first EMPTY slot, and a new stack takes the first
// reusable (EMPTY or FREE) slot it passed. So a stack goes to a level only
// when its window in every level before was full of stacks, and the slots
// written stay in the first quarter of the table until that fills: a
// table of 65,536 spread 16-byte slots kept all 1 MiB resident once a few
// thousand stacks had been stored (a preloaded RabbitMQ's 4,930: issue
// 26), a quarter keeps 272 KiB with its tags. The price is a longer probe
// for a stack in a later level: the tags of the windows before it (see
// "Tags"). The protocol below is the single window's: the levels only
// change which slots a probe visits, in an order fixed by the hash.
//
// Tags. Beside the headers, a byte per slot: 0 while the slot was never
// written, else a byte of the hash of the stack last stored there (never
// cleared). A probe checks its first slot's header, then reads its
// windows' tags, eight to a word (a window's are one or two cache lines),
// and looks only at the headers whose tag is its own, stopping at a 0: so
// a stack in a later level costs a few tag words more, not 64 headers a
// level (a table filled to 40,000 stacks, interned again in the order
// stored: 618 ns a stack without tags, 244 with). The tags are a hint: a
// probe that finds nothing through them (a new stack, or a tag not yet
// written) runs the whole probe over the headers, which alone decide.
//
// Records. A stack's words live in a record (its tail's token, its hash,
// then its words) from a pool beside the headers, not in its slot: the
// slots are spread by hash over the whole table, so frames kept per slot
// made every table page resident once a quarter of the slots had been used
// (23 MiB of a preloaded RabbitMQ's 52). Records come in kClasses sizes, a
// pool each: class c is ceil((c + 1) / kClasses * (depth + 2)) words, so a
// stack takes the smallest that fits it rather than room for the deepest
// (a preloaded RabbitMQ's stacks average 17 words of 46: issue 26). The
// largest size has a record for every slot; the others a quarter as many
// each, and a stack whose size is spent takes a larger one. A pool hands
// out its lowest free record (a bitmap: record_map.h). A new stack takes a
// record before it claims its slot and gives it back if the claim fails.
//
// Compaction. A node's start-up stores many more stacks at once than it
// keeps (a preloaded RabbitMQ: 12,000 at once, 3,400-6,300 kept), and the
// ones it keeps are scattered over the records its peak used, so a pool's
// pages would stay resident at the peak. After each sweep the sweeper
// compacts, in three steps:
//  - compact_move(): the stacks stored above a class's target (its
//    records in use, and an eighth more) move down into its free records
//    below. A move copies the record, then points the slot at the copy;
//    the slot's state word does not change (nor its id). Readers therefore
//    check the slot's record as well as its state after reading a record
//    (same_stack(), get()): a record moves only down, and only a free
//    changes the generation, so an unchanged (state, record) pair proves
//    the words read were the stack's. The record moved from is retired:
//    a hook that read the slot's record number (its churn row: row())
//    just before the move may still count there.
//  - compact_settle(), after a process-wide barrier: a retired record
//    whose stack no hook holds now (the caller knows: the tracker's pins)
//    is settled, its row's late counts carried to the new row
//    (RowOwner::settle()), and given back. The others wait for the next
//    compaction.
//  - compact_release(): the pages of the free records above the targets
//    go back to the kernel, churn rows included (RowOwner::released()).
// Record life cycle (the map's bit set from take to give):
//
//   free --take--> a slot's (WRITING, READY, FREEING)
//   a slot's --finish (the slot freed)--> free
//   a slot's --compact_move--> retired --compact_settle--> free
//   free --compact_release--> claimed --> free
//
//
// Slot life cycle (every transition is one CAS or release store on the
// state word; readers only trust READY and FREEING):
//
//   EMPTY --claim--> WRITING --publish--> READY <--revive-- FREEING
//   FREE(g+1) <--finish-- FREEING(g) <--condemn-- READY(g)
//   FREE --claim--> WRITING ...
//
// A slot never returns to EMPTY, so a probe that meets EMPTY can stop: no
// stack was ever stored beyond it in that probe sequence. FREE slots are
// reused by the next new stack whose probe passes them.
//
// Ids stay stable for readers: freeing a slot bumps its generation, so
// get(id) of a reclaimed stack answers 0 ("unknown"), never the frames of
// the stack that reuses the slot. A generation wraps after gen_period()
// reuses of one slot, at most one per sweep: a reader holding an id across
// fewer sweeps than that cannot be fooled (see tracker.h).
//
// Duplicates. If a racing thread is still writing the slot this stack
// would match, the inserter waits up to spin_limit() polls and then probes
// on, at worst storing the same stack twice (two ids for one stack). It
// never waits unboundedly, including in a child forked while another thread
// was mid-write. Duplicates are not merged here (that would need the
// writer's cooperation on the hot path); readers that group by call site
// merge stacks by content (c_src/sites/stack_merge.h).
//
// Reclamation (the sweep) is driven by Tracker, which knows which ids are
// referenced: it calls begin_sweep(), mark() for every referenced id, then
// condemn() and finish() over all slots, with process-wide memory barriers
// in between (see tracker.h). intern() and hold() stamp a slot with the
// epoch they read, and a sweep never frees a slot stamped with its own
// epoch: that is what protects a stack interned while a sweep runs, before
// the live entry that will reference it exists.
//
// Tails. A stack may end in words that are not return addresses (the
// Erlang context, common/mi_context.h): intern(frames, n, tail) stores them
// after the frames, as one stack of n + tail.n words (readers see no
// difference), but hashes the two parts apart and combines the hashes, so
// a caller that knows its tail's hash already (a per-thread cache of the
// last context) hashes only its frames. A tail may carry a token: a
// nonzero number its caller gives to one content only, ever. A slot keeps
// the token it was stored with, and a stack whose tail has the slot's token
// is compared on its frames alone (the tail words are equal by the token's
// contract); any other is compared word by word. Equal words still mean
// equal hashes and one id: a stack that ends in a tail must always be
// interned through the tail overload (the split is where the tail starts).
//
// Never allocates through malloc. Thread-safe unless noted.
#ifndef MALLOCINFO_TRACK_STACK_TABLE_H
#define MALLOCINFO_TRACK_STACK_TABLE_H

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "../common/mi_limits.h"
#include "os_mem.h"
#include "record_map.h"

namespace mi::track {

class StackTable {
 public:
  static constexpr size_t kWindow = 64;
  // Keeps at least 3 generation bits in a 31-bit id.
  static constexpr size_t kMaxCapacity = mi::limits::kStackTableSize.max;
  static constexpr unsigned kMaxDepth = 255;
  // Polls of a slot another thread is writing before probing on.
  static constexpr uint32_t kDefaultSpinLimit = 256;
  // Record sizes (see "Records" above); churn rows come in as many segments.
  static constexpr unsigned kClasses = 4;

  // Room for at least `capacity` stacks (rounded up to a power of two, at
  // least kWindow, at most kMaxCapacity) of up to `depth` frames (at most
  // kMaxDepth). Not thread-safe. False when memory cannot be mapped.
  bool init(size_t capacity, unsigned depth);
  void destroy();  // tests only

  // --- hot path (inside hooks): no lock, no allocation, bounded waits ---

  // The id of this stack, storing it if new; 0 when it cannot be stored
  // (no free slot in its probe windows; counted in dropped()). n is capped
  // to depth(). An empty stack (n == 0) has id 0. The slot is stamped with
  // the current epoch. A condemned (FREEING) copy is revived and reused.
  uint32_t intern(const uintptr_t* frames, unsigned n);

  // Words stored after a stack's frames (see "Tails" above).
  struct Tail {
    const uint64_t* words = nullptr;
    unsigned n = 0;      // at most depth() (else left out); the frames are cut to fit beside it
    uint64_t hash = 0;   // hash_words(words, n): the caller's, so it can keep it
    uint64_t token = 0;  // 0, or a number given to this content only
  };
  // The same, for frames followed by `tail` (one stack of n + tail.n words).
  uint32_t intern(const uintptr_t* frames, unsigned n, const Tail& tail);
  // The hash intern() gives n words (a tail's hash is this of its words).
  static uint64_t hash_words(const uint64_t* words, unsigned n);

  // The current sweep epoch. Relaxed: callers that compare epochs rely on
  // the sweeper's process-wide barriers, not on this load's ordering.
  uint32_t epoch() const { return epoch_.load(std::memory_order_relaxed); }

  // True when `id` still names its stack (READY, or FREEING and revived
  // here); then stamps its slot with epoch `e` (never lowers a stamp).
  // False when the stack was reclaimed (or id is 0 or malformed).
  bool hold(uint32_t id, uint32_t e);
  // intern() of words interned before, without hashing or probing: `id`
  // and `hash` are what that intern() returned and hash_of(id) then
  // answered. True when `id` still names a stack of that hash; then its
  // slot is stamped with the current epoch (and revived if condemned), as
  // intern() of those words would have left it. False when the stack was
  // reclaimed: intern the words again. The hash check is what makes an id
  // kept for long safe: a slot whose generation wrapped round to the kept
  // one (gen_period() sweeps later) holds another stack, of another hash
  // (the slot's high half of it: but for a 2^-32 chance).
  bool reuse(uint32_t id, uint64_t hash);
  // True when `id` names a READY stack (one load; no stamp, no revival).
  bool ready(uint32_t id) const {
    const uint32_t w = headers_[id & mask_].state.load(std::memory_order_acquire);
    return kind(w) == kReady && gen(w) == id >> slot_bits_;
  }

  // True when the table asks for a sweep: enough new stacks since the last
  // one, or a stack was dropped. Two relaxed loads.
  bool wants_sweep() const {
    return count_.load(std::memory_order_relaxed) >= sweep_at_.load(std::memory_order_relaxed);
  }

  // --- readers ---

  // Copies up to `max` frames of stack `id` to out; returns the stack's
  // depth, or 0 when the id is unknown: never stored, malformed, or
  // reclaimed (a stale generation). Never returns another stack's frames.
  unsigned get(uint32_t id, uint64_t* out, unsigned max) const;
  // The hash of stack `id`'s frames (as intern computed it; never 0), or 0
  // when the id is unknown. Equal frames have equal hashes.
  uint64_t hash_of(uint32_t id) const;

  // --- the sweep (one sweeper at a time; see tracker.h for the order) ---

  // Starts a sweep: bumps the epoch and returns the new value E.
  uint32_t begin_sweep();
  // Keeps `id`'s stack through the sweep of epoch E. Returns false for an
  // id that no longer names a stored stack (a stale reference).
  bool mark(uint32_t id, uint32_t e) { return stamp_if_current(id, e, false); }
  // READY slots in [lo, hi) stamped before E become FREEING. Returns how many.
  size_t condemn(size_t lo, size_t hi, uint32_t e);
  // FREEING slots in [lo, hi): stamped E (marked or held meanwhile) back
  // to READY; the others FREE, with the next generation. Returns how many
  // were freed.
  size_t finish(size_t lo, size_t hi, uint32_t e);
  // Ends a sweep that freed `freed` stacks: counts them and sets when the
  // next sweep will be wanted.
  void end_sweep(uint64_t freed);
  // The same in two steps, for a sweep with a compaction after its finish:
  // swept() counts what it freed (so a process forked during the
  // compaction counts right) and makes the table ask for a sweep until
  // end_sweep(0), so that hooks carry the compaction's chunks.
  void swept(uint64_t freed);

  // What the owner of a row per record (the churn table: row()) is told
  // as compaction moves and frees records. Called by the sweeper only.
  class RowOwner {
   public:
    // Stack `id` moves from row `from` to row `to`: make `to` its row and
    // carry what `from` counted over. Called before row(id) answers `to`;
    // hooks may still count on `from` for a while (settle()).
    virtual void moved(uint32_t id, uint32_t from, uint32_t to) = 0;
    // A sweep later: what was counted on `from` for `id` since its move
    // goes to row `to` (0: the stack was freed meanwhile), and `from` is
    // free for the next record.
    virtual void settle(uint32_t id, uint32_t from, uint32_t to) = 0;
    // Rows [first, first + n) belong to free records whose memory goes
    // back to the kernel: release theirs. No hook writes them meanwhile
    // (their records are claimed; a stale count is lost, see churn.h).
    // False when the owner kept them (a hook may still count there): the
    // pool's high-water mark then stays above them (compact_end()), so a
    // later compaction gives them back.
    virtual bool released(uint32_t first, uint32_t n) = 0;

   protected:
    ~RowOwner() = default;
  };
  // Compaction's steps (see "Compaction" above), by the sweeper after
  // end_sweep(), one step at a time (every chunk of a step before the
  // next step); a step's chunks may run on several threads at once, and
  // hooks may intern, hold and read meanwhile. Never allocate; releasing
  // makes a few syscalls (madvise). owner may be nullptr.
  //
  // A chunk is kCompactWords words of a pool's map (512 records), the
  // pools one after another, so a hook that carries one pauses at most
  // about 0.1 ms (512 moves, their pages faulted in: BENCHMARKS.md). 512
  // records of any size are whole pages (512 * 8 bytes * words), and so
  // are their churn rows (churn.cpp), so a chunk gives its pages back
  // whole.
  static constexpr uint32_t kCompactWords = 8;
  uint32_t compact_chunks() const { return chunk_base_[kClasses]; }
  // Starts a compaction: each class's target now (its records taken and
  // an eighth more, in whole words of its map: room for the stacks the
  // next sweeps store without taking records above it), which the
  // compaction's steps share; and the retired records counted again from
  // their bits (a process forked mid-compaction may have left the count
  // apart from them).
  void compact_begin(uint32_t* target);
  // True when there is anything to do: a record taken above a target, or
  // one retired.
  bool compact_wanted(const uint32_t* target) const;
  // Moves the stacks of chunk `k` stored above their target down; returns
  // how many moved (their old records are retired).
  uint32_t compact_move(uint32_t k, const uint32_t* target, RowOwner* owner);
  // Gives back the retired records of chunk `k` whose stack `held(id)`
  // says no hook may be counting on (the caller made every hook's view of
  // the moves and pins visible first); returns how many. held: bool(uint32_t).
  template <class Held>
  uint32_t compact_settle(uint32_t k, RowOwner* owner, Held&& held);
  // Gives the pages of chunk `k`'s free records above their target back;
  // returns the record bytes given back. Sets bit c of *kept when the
  // owner kept rows of class c.
  size_t compact_release(uint32_t k, const uint32_t* target, RowOwner* owner, uint32_t* kept);
  // Ends a compaction: a pool whose records are all free from some point
  // above its target up has its high-water mark lowered there, so the next
  // compaction looks no further; not a pool of `kept` (a bit per class:
  // rows the owner kept above its target).
  void compact_end(const uint32_t* target, uint32_t kept);
  // Records retired and not settled yet.
  uint32_t retired_count() const { return retired_n_.load(std::memory_order_relaxed); }
  // Asks for a sweep after the smallest step (a 64th of the table): for
  // records left retired, which only a compaction gives back.
  void want_sweep_soon();
  // Asks for a sweep now: blocks were freed in bulk (the live table gave
  // pages back), so stacks stored may be referenced by none (see
  // Tracker::trim_finish()).
  void want_sweep_now() { sweep_at_.store(0, std::memory_order_relaxed); }
  // Asks for the next sweep only after the smallest step of new stacks (a
  // 64th of the table): a sweep that could not start.
  void defer_sweep() {
    sweep_at_.store(count_.load(std::memory_order_relaxed) + (mask_ + 1) / 64,
                    std::memory_order_relaxed);
  }

  // --- counters and shape ---

  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t reclaimed() const { return reclaimed_.load(std::memory_order_relaxed); }
  // Interns the tags did not answer, which probed the headers (see
  // "Tags"): new stacks, mostly.
  uint64_t header_probes() const { return header_probes_.load(std::memory_order_relaxed); }
  size_t capacity() const { return mask_ + 1; }
  unsigned depth() const { return depth_; }
  size_t bytes_reserved() const { return bytes_; }
  // The churn row of stack `id` (track/churn.h): its record's number + 1,
  // dense like each class's records; 0 for id 0. Not checked against the
  // id's generation (a row is claimed by id, so a stale one only misfiles
  // counts into another row, which folds them into the unknown row). One
  // relaxed load and a compare: it runs on every recorded malloc and free.
  uint32_t row(uint32_t id) const {
    if (id == 0) return 0;
    // Acquire (a plain load on x86): a row a compaction moved the stack to
    // is seen claimed for it (ChurnTable::move_row() before the move).
    const uint32_t r = headers_[id & mask_].rec.load(std::memory_order_acquire);
    return r < records_total_ ? r + 1 : 0;
  }
  // Rows row() answers: 0, then a segment per class of segment_rows(c)
  // rows (its pool's size).
  size_t segment_rows(unsigned c) const { return caps_[c]; }
  // The pools' high-water marks, all classes: records handed out since
  // init() or since compaction last gave back the top of a pool.
  size_t records_used() const;
  // Records taken now, all classes: stored stacks, retired ones, and those
  // being written (a snapshot; exact on a quiescent table).
  size_t records_taken() const;
  // The bytes of the record a stack of `words` words (tail included) is
  // stored in: the smallest size that holds it (a larger one when that
  // size's pool is spent).
  size_t record_bytes(unsigned words) const { return words_[class_of(words)] * sizeof(uint64_t); }
  // Resident bytes of the slots, of the record pools, and of the pools'
  // maps (mincore, or what `pages` counts: os_mem.h). Never allocates.
  size_t resident_slot_bytes(const PageCounter& pages = PageCounter()) const;
  size_t resident_record_bytes(const PageCounter& pages = PageCounter()) const;
  size_t resident_map_bytes(const PageCounter& pages = PageCounter()) const;
  unsigned slot_bits() const { return slot_bits_; }
  // Distinct generations an id cycles through before repeating.
  uint32_t gen_period() const { return gen_max_; }
  // The probe's levels (see "Levels"), and slot i (< kWindow) of the
  // window in level l of a stack of this hash (hash_of()'s, or
  // hash_words() of its words). For tests: what the probe visits.
  unsigned levels() const { return levels_; }
  size_t probe_slot_of(uint64_t hash, unsigned l, size_t i) const {
    return probe_slot(scramble(hash), l, i);
  }

  // --- tests only ---

  // Polls of a WRITING slot before probing on (0: never wait).
  void set_spin_limit(uint32_t n) { spin_limit_.store(n, std::memory_order_relaxed); }
  uint32_t spin_limit() const { return spin_limit_.load(std::memory_order_relaxed); }
  // Called by a new stack's writer between claiming its slot and
  // publishing it, so a test can hold a writer mid-write. Not thread-safe
  // against concurrent interns; nullptr (the default) disables it.
  using ParkHook = void (*)(void* ctx);
  void set_park_hook(ParkHook hook, void* ctx) {
    park_ctx_ = ctx;
    park_hook_ = hook;
  }
  // True when every taken record is in exactly one place: a READY or
  // FREEING slot, or retired (and no slot's record is free). Only on a
  // quiescent table; never allocates (a bitmap of `scratch_words` words
  // from the caller, at least records_used() / 64 + 1).
  bool records_consistent(uint64_t* scratch, size_t scratch_words) const;
  // Called by finish() between freeing a slot and giving its record back,
  // so a test can hold a sweeper there. Same rules as set_park_hook().
  void set_finish_hook(ParkHook hook, void* ctx) {
    finish_ctx_ = ctx;
    finish_hook_ = hook;
  }

 private:
  struct Header {
    std::atomic<uint32_t> state;    // kind | depth << 3 | gen << 11
    std::atomic<uint32_t> stamp;    // the latest epoch that interned or held it
    std::atomic<uint32_t> rec;      // the record holding its words (WRITING and later)
    std::atomic<uint32_t> hash_hi;  // hash_high(its hash)
  };
  // 16 bytes, not 24 with the whole hash: the slots are spread by hash
  // over the whole table, so every page of them is resident once a few
  // thousand stacks are stored (1 MiB at the default 65,536, not 1.5).
  static_assert(sizeof(Header) == 16, "a stack slot's header costs 16 bytes");
  static uint32_t hash_high(uint64_t hash) { return static_cast<uint32_t>(hash >> 32); }

  static constexpr uint32_t kEmpty = 0;
  static constexpr uint32_t kWriting = 1;
  static constexpr uint32_t kReady = 2;
  static constexpr uint32_t kFreeing = 3;
  static constexpr uint32_t kFree = 4;

  static uint32_t kind(uint32_t w) { return w & 7u; }
  static uint32_t depth_of(uint32_t w) { return (w >> 3) & 0xFFu; }
  static uint32_t gen(uint32_t w) { return w >> 11; }
  static uint32_t word(uint32_t k, uint32_t depth, uint32_t g) { return k | depth << 3 | g << 11; }
  uint32_t next_gen(uint32_t g) const { return g >= gen_max_ ? 1 : g + 1; }
  uint32_t make_id(size_t slot, uint32_t g) const {
    return g << slot_bits_ | static_cast<uint32_t>(slot);
  }

  // intern()'s probe, for a stack of the given hash; without a tail when
  // kTail is false (the compiler then drops the tail's branches).
  template <bool kTail>
  uint32_t intern_hashed(const uintptr_t* frames, unsigned n, const Tail& tail, uint64_t hash);
  // Both inlined into intern_hashed(): they run on every recorded
  // allocation whose stack the thread's memo did not answer.
  template <bool kTail>
  [[gnu::always_inline]] bool same_stack(size_t slot, uint32_t w, uint64_t hash,
                                         const uintptr_t* frames, unsigned n,
                                         const Tail& tail) const;
  // The header of `id`'s slot while it holds that id's stack (READY or
  // FREEING of its generation), its state word in *w; else nullptr. A reader
  // reads the record (record_of()), copies what it needs, then asks
  // still_holds() with the record's number: a stack's words change only
  // after its slot is freed, which changes the generation, or its record
  // moved (compact_move()), which changes the slot's record. Lock-free; no
  // allocation.
  const Header* holding(uint32_t id, uint32_t* w) const;
  static bool still_holds(const Header& h, uint32_t id_gen, uint32_t* w);
  static bool still_holds(const Header& h, uint32_t id_gen, uint32_t rec) {
    uint32_t w;
    return still_holds(h, id_gen, &w) && h.rec.load(std::memory_order_relaxed) == rec;
  }
  static void stamp(Header& h, uint32_t e);
  bool stamp_if_current(uint32_t id, uint32_t e, bool revive);
  uint32_t store(size_t slot, uint32_t w, uint64_t hash, const uintptr_t* frames, unsigned n,
                 const Tail& tail);

  // Where the first sweep is wanted: at a quarter full, or at 4096 stacks
  // if that comes first. Early enough that the probe windows stay short
  // and that stacks a node's start-up used once give their records back
  // before many more pile up; late enough that a node with few call sites
  // never sweeps.
  uint64_t first_sweep() const {
    const uint64_t quarter = (mask_ + 1) / 4;
    return quarter < 4096 ? quarter : 4096;
  }
  // The slots' bytes: headers then tags, rounded to a page so that the
  // pool starts on one.
  static size_t header_bytes_of(size_t cap) { return os_page_up(cap * (sizeof(Header) + 1)); }
  size_t header_bytes() const { return header_bytes_of(mask_ + 1); }

  // The record pools. A record of class c is words_[c] words: the token (a
  // free record's link to the next free one), the stack's hash, then its
  // words (from kHeadWords on). A record is named by its number: the
  // smaller classes' records, then its index in its class's pool (so the
  // churn row is the number + 1, without asking the class).
  static constexpr unsigned kHeadWords = 2;
  static constexpr uint32_t kNoRecord = RecordMap::kNone;
  // The smallest class whose records hold `words` words after the token
  // and the hash.
  unsigned class_of(unsigned words) const {
    unsigned c = 0;
    while (c + 1 < kClasses && words_[c] < words + kHeadWords) ++c;
    return c;
  }
  // The class of record number r (< records_total_).
  unsigned record_class(uint32_t r) const {
    unsigned c = 0;
    while (c + 1 < kClasses && r >= row_base_[c + 1]) ++c;
    return c;
  }
  // Record i of class c's pool (i < caps_[c]); its word 0 is the free
  // list's link while it is free.
  std::atomic<uint64_t>* record_in(unsigned c, uint32_t i) const {
    return records_[c] + size_t{i} * words_[c];
  }
  // Record r's words; r must be a valid number.
  std::atomic<uint64_t>* record(uint32_t r) const {
    const unsigned c = record_class(r);
    return record_in(c, r - row_base_[c]);
  }
  // The record of slot `h`'s stack, its number in *r; nullptr when that is
  // out of range (only if the slot was rewritten meanwhile: the caller's
  // state check then fails anyway).
  const std::atomic<uint64_t>* record_of(const Header& h, uint32_t* r) const {
    *r = h.rec.load(std::memory_order_acquire);
    return valid_record(*r) ? record(*r) : nullptr;
  }
  bool valid_record(uint32_t r) const { return r < records_total_; }
  // The lowest free record of class c, else one of the next larger class
  // (a record holds any shorter stack); kNoRecord when the largest pool is
  // spent too. Lock-free, hook-safe.
  uint32_t take_record(unsigned c);
  // Gives record r back to its class's pool. Lock-free.
  void give_record(uint32_t r);
  // The records of word wi of class c's map taken now, those below record
  // `from` left out.
  uint64_t taken_from(unsigned c, uint32_t wi, uint32_t from) const {
    const uint64_t bits = maps_[c].word(wi);
    return wi == from / 64 ? bits & ~uint64_t{0} << (from % 64) : bits;
  }
  // get()'s and hash_of()'s read of stack `id`: read(record, depth) until
  // one read was of the stack's own words. False when the id names no
  // stored stack (then what read() saw means nothing).
  template <class Read>
  bool read_stable(uint32_t id, Read&& read) const;
  // Chunk k's pool, and its words [*lo, *hi) of that pool's map (hi
  // capped at the words the pool's high-water mark spans).
  unsigned chunk_words(uint32_t k, uint32_t* lo, uint32_t* hi) const;
  // Settles retired record i of class c (its stack's id in its word 0).
  void settle(unsigned c, uint32_t i, RowOwner* owner);
  // Moves the stack in record i of class c (if a READY slot holds it)
  // into the lowest free record below `target`: 1 when it moved, 0 when
  // no READY slot holds it, -1 when no record below the target is free.
  int move_record(unsigned c, uint32_t i, uint32_t target, RowOwner* owner);
  static constexpr unsigned kMaxLevels = 3;
  // A hash as the probe uses it (probe_slot()).
  static uint64_t scramble(uint64_t hash) { return hash * 0x9E3779B97F4A7C15ull; }
  // Slot i (< kWindow) of the probe window in level `l` of a stack whose
  // hash scrambled (scramble()) is `s`. Each level's window starts at
  // other bits of it (17 apart: at most a few bits shared, in the largest
  // tables).
  size_t probe_slot(uint64_t s, unsigned l, size_t i) const {
    const auto start = static_cast<size_t>(std::rotr(s, static_cast<int>(17 + 17 * l)));
    return level_at_[l] + ((start + i) & level_mask_[l]);
  }
  // A stack's tag: a byte of its hash the slot's hash_hi does not hold,
  // never 0 (an unwritten slot's).
  static uint8_t tag_of(uint64_t hash) {
    const auto t = static_cast<uint8_t>(hash >> 24);
    return t != 0 ? t : 1;
  }
  // The id of the stack the probe found in `slot` (header h, state w: READY
  // or FREEING), stamped with epoch e; a condemned one revived, or 0 when
  // a sweep freed it meanwhile.
  [[gnu::always_inline]] inline uint32_t found(Header& h, size_t slot, uint32_t w, uint32_t e);
  // Sets slot's tag (a CAS on its word: the other seven are other slots').
  void set_tag(size_t slot, uint8_t tag);
  // The probe through the tags (see "Tags"): the id of the stack, found in
  // a READY slot (or a FREEING one, revived), else 0.
  template <bool kTail>
  [[gnu::always_inline]] uint32_t find_tagged(uint64_t s, uint64_t hash, const uintptr_t* frames,
                                              unsigned n, const Tail& tail, uint32_t e);
  // Retired records, a bit each per class (the sweeper's alone).
  bool retired(unsigned c, uint32_t i) const {
    return (retired_[c][i / 64].load(std::memory_order_relaxed) >> (i % 64) & 1) != 0;
  }

  Header* headers_ = nullptr;
  std::atomic<uint64_t>* tags_ = nullptr;  // slot i's tag: byte i % 8 of word i / 8
  std::atomic<uint64_t>* records_[kClasses] = {};
  size_t words_[kClasses] = {};
  // Records per class: the largest class has one for every slot (and a
  // window more), so no stack waits for a smaller one; the others a
  // quarter of that each, enough for the stacks nodes store at once
  // (a preloaded RabbitMQ's boot: 12,000), without reserving four times
  // the records and churn rows.
  uint32_t caps_[kClasses] = {};
  uint32_t row_base_[kClasses] = {};  // records of the smaller classes
  uint32_t records_total_ = 0;        // records of all classes
  size_t mask_ = 0;
  unsigned slot_bits_ = 0;
  unsigned levels_ = 1;
  size_t level_at_[kMaxLevels] = {};    // each level's first slot
  size_t level_mask_[kMaxLevels] = {};  // each level's size - 1
  uint32_t gen_max_ = 0;
  unsigned depth_ = 0;
  size_t bytes_ = 0;
  size_t maps_at_ = 0;  // where the maps start in the mapping (the pools end)
  std::atomic<uint32_t> spin_limit_{kDefaultSpinLimit};
  ParkHook park_hook_ = nullptr;
  void* park_ctx_ = nullptr;
  ParkHook finish_hook_ = nullptr;
  void* finish_ctx_ = nullptr;
  // Read on every intern; written by sweeps only.
  alignas(64) std::atomic<uint32_t> epoch_{1};
  std::atomic<uint64_t> sweep_at_{0};
  // Written when a stack is stored or dropped (rare once warm).
  alignas(64) std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> reclaimed_{0};
  std::atomic<uint64_t> count_after_sweep_{0};
  std::atomic<uint64_t> header_probes_{0};
  // Which records are taken, per class (written when a new stack is stored
  // or a sweep frees or moves one), and which of those are retired.
  RecordMap maps_[kClasses];
  std::atomic<uint64_t>* retired_[kClasses] = {};
  std::atomic<uint32_t> retired_n_{0};
  uint32_t chunk_base_[kClasses + 1] = {};  // compaction chunks of the smaller classes
};

template <class Held>
uint32_t StackTable::compact_settle(uint32_t k, RowOwner* owner, Held&& held) {
  if (retired_count() == 0) return 0;
  uint32_t lo, hi;
  const unsigned c = chunk_words(k, &lo, &hi);
  uint32_t n = 0;
  for (uint32_t wi = lo; wi < hi; ++wi)
    for (uint64_t bits = retired_[c][wi].load(std::memory_order_relaxed); bits != 0;
         bits &= bits - 1) {
      const uint32_t i = wi * 64 + static_cast<uint32_t>(__builtin_ctzll(bits));
      if (held(static_cast<uint32_t>(record_in(c, i)[0].load(std::memory_order_relaxed)))) continue;
      settle(c, i, owner);
      ++n;
    }
  return n;
}

}  // namespace mi::track

#endif
