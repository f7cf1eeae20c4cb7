// The allocation tracker core: what the malloc hooks call after (or before)
// forwarding to the next allocator, and what the ABI reads.
//
// One Tracker owns the live table, the stack table and the per-thread
// states; the interposer has exactly one (preload/), tests make their own
// with a fake unwinder and clock (STYLE.md §8).
//
// Hot-path methods (on_alloc, on_free, count, count_alloc, count_free,
// sample_due, sample_take, on_sampled_alloc, take, restore, freed) are
// called from inside malloc hooks with the caller's re-entrancy guard held:
// they never allocate through malloc, never lock, never throw, and spin
// only boundedly. Per-thread counters are plain loads and stores on the
// thread's own cache-line-aligned state; readers sum them (exact once
// writers are quiescent). Query methods (status, snapshot, stack, reset,
// reclaim, set_mode) are thread-safe and may run concurrently with the hot
// path; they must not be called from inside a hook.
//
// Stack reclamation (the sweep). The stack table would otherwise fill for
// good on a long-running node. A sweep frees every stack that no live entry
// references. It is a small state machine split into bounded chunks:
//   start    bump the stack table's epoch to E; process-wide barrier (M1,
//            membarrier(2)); mark every thread's pending id (the held
//            states': a thread takes its state, seq_cst, before it ever
//            publishes an id, so the barrier shows its bit too);
//   scan     mark the stack of every live-table entry (chunks of slots);
//   condemn  READY stacks not stamped E become FREEING (chunks);
//   barrier  M2; mark every thread's pending id again;
//   finish   FREEING stacks not stamped E become FREE, generation + 1;
//            the others READY again (chunks); the stack table counts
//            them (StackTable::swept(): it then asks for the sweep until
//            it ends, so hooks carry every chunk that follows);
//   move     (when the record pools have anything to compact) the stacks
//            stored above a pool's target move down, with their churn
//            rows (chunks of 512 records: StackTable::compact_move());
//   barrier  M3; collect every thread's pending id (the pins);
//   settle   the records moved from go back unless a hook pins their
//            stack; the pages of the free records above the targets go
//            back to the kernel, churn rows with them unless pinned
//            (chunks of 512 records); then the pools' high-water marks
//            come down, and the stack table sets when the next sweep is
//            wanted (end_sweep()).
// Marking a stack stamps it with E. A sweep starts when the table asks for
// one (StackTable::wants_sweep: at 4096 stacks or a quarter full, then
// once half as many as survived the last sweep are added, between a 64th
// and an eighth of the table, or a dropped stack; or after a trim of the
// live table that gave pages back: trim_finish()) and advances one chunk
// at the end of each recorded allocation while the table still asks, so
// no hook pauses for more than a chunk (1024 slots, a few us; a
// compaction chunk that moves or gives back 512 records, up to about
// 0.15 ms) or a membarrier call;
// reset() and reclaim() run a whole sweep from the caller's thread.
//
// The race with the hot path. Between interning a stack and inserting the
// entry that references it, a hook holds an id no table shows. It
// publishes that id in its thread state (`pending`, a plain store on its
// own cache line; no fence, no RMW) and then checks that the epoch has not
// moved since before it interned (intern stamps the slot with the epoch it
// read) and that the stack is still stored (hold(), which also revives a
// FREEING one). The two barriers make this enough: M1 splits every
// thread's execution in two. A hook whose pending store came before M1 is
// seen by start (or its entry, inserted before it cleared pending, is seen
// by the scan); one whose store came after M1 reads the new epoch E in its
// check, so it interned with a stamp of E (re-stamping if needed), which
// condemn and finish respect. M2 does the same for condemn: a hook whose
// hold() ran after M2 sees FREEING and revives the slot (finish's CAS then
// fails); one whose pending store or stamp came before M2 is seen by the
// second marking or by finish. If the stack was freed anyway (the hook was
// descheduled across a whole sweep) the check fails and the hook interns
// again. realloc's take/restore pin the taken entry's id the same way.
// M3 does it for churn rows: a hook counts on a stack's row (its record's
// number) while it pins the stack (record(), and churn_free() for a
// free), so a hook that read a moved stack's old row has its pin seen
// after M3, and the old row is kept for the next compaction to settle; a
// hook that pins after M3 reads the new row.
// Without membarrier (or MADV_WIPEONFORK for the sweep's control page) no
// hook starts a sweep; reset() and reclaim() still sweep, with the slower
// global barrier.
//
// Readers that hold ids across calls (snapshot, then stack()) get each
// id's own frames or nothing, as long as fewer than gen_period() sweeps
// complete meanwhile (a slot's generation moves once per sweep at most);
// they compare status' stack_sweeps before and after, and read again in
// the (for a default table: 32767 sweeps during one read) unlikely case.
//
// Giving the live table's pages back (reset, and the mode switches that
// empty it): every table operation of a hook is bracketed by its state's
// table_busy count (enter_table/leave_table); clear_table() closes the
// table, waits until no state is busy, empties it, madvise()s it away and
// reopens it. This is independent of the pins above: a pending id lives in
// the thread state, not in the table, so a hook that finds the table
// closed still clears its pin, and reset()'s sweep, run after the clear,
// frees every stack no pin holds. A realloc's pin is released by restore()
// (failure) or freed() (success: the old entry is gone for good).
//
// What the byte counters mean (mi_abi_status):
//  - full: bytes_allocated is the requested bytes of every block the table
//    recorded; bytes_freed the requested bytes of every recorded block that
//    left it: freed (found in the table: a free of a block the table never
//    held, allocated before attach() or dropped when the table was full,
//    counts nothing but frees_untracked), or forgotten by reset() or a mode
//    switch. So bytes_allocated - bytes_freed == live_bytes, exactly, in a
//    preloaded or an attached process alike.
//  - counters: usable bytes (the next allocator's malloc_usable_size, see
//    set_usable_size; requested sizes without one) of every block allocated
//    / freed while the mode counts; a realloc counts the old block freed and
//    the new one allocated, realloc(p, 0) counts p freed. There is no table
//    to tell whose block a free gives back: bytes_allocated - bytes_freed is
//    the live usable bytes only in a process that counted from its start
//    (preloaded in counters mode); an attached one also counts the frees of
//    blocks allocated before attach().
//  - sample: every counter (calls, bytes_allocated, bytes_freed) is an
//    unbiased estimate from the sample: a sampled block of n requested bytes
//    adds 1/p(n) calls and round(n/p(n)) bytes, and its free (or its being
//    forgotten) adds the same again, so bytes_allocated - bytes_freed is
//    the sample's estimate of the live requested bytes. Unsampled calls
//    touch no counter (that is what makes sample mode cheap).
//  - live_entries / live_bytes: exactly what the table holds (requested
//    sizes), every mode.
//  - self_calls / self_bytes: allocations made while the calling thread
//    was quiet (mallocinfo's own work, see on_free's `quiet`), counted
//    instead of being recorded: requested bytes, exact in full and counters
//    mode, weighted from the sample points that fell on them in sample mode.
#ifndef MALLOCINFO_TRACK_TRACKER_H
#define MALLOCINFO_TRACK_TRACKER_H

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../common/mi_abi.h"
#include "../common/mi_limits.h"
#include "churn.h"
#include "erlang_context.h"
#include "live_table.h"
#include "sampler.h"
#include "stack_table.h"
#include "unwind.h"

namespace mi::track {

// Frames kept per stack at most: one limit for every reader (mi_limits.h).
constexpr unsigned kMaxStackDepth = mi::limits::kMaxStackDepth;

struct Config {
  uint32_t mode = MI_MODE_FULL;
  // How long reset()/set_mode() wait for threads inside a table operation
  // before they clear the table without giving its pages back (a thread
  // stopped inside a hook must not hang them): sched_yield rounds.
  unsigned quiesce_rounds = 10000;
  size_t table_capacity = mi::limits::kTableSize.default_value;       // 2 Mi entries
  size_t stack_capacity = mi::limits::kStackTableSize.default_value;  // 64 Ki stacks
  unsigned stack_depth = static_cast<unsigned>(mi::limits::kStackDepth.default_value);
  uint64_t sample_bytes = mi::limits::kSampleBytes.default_value;
};

// Stack capture back end: writes up to max return addresses, innermost
// first; `cache` is the calling thread's (may be null). The interposer's is
// capture_cached (unwind.h), whose contract (no lock, no allocation) every
// back end called from a hook must keep; tests install fakes.
using UnwindFn = size_t (*)(UnwindCache* cache, uintptr_t* out, size_t max);
// Clock for timestamps, in ns.
using ClockFn = uint64_t (*)();
// The next allocator's malloc_usable_size (never called with nullptr).
using UsableFn = size_t (*)(void*);
// The calling thread's name into out (16 bytes, NUL-terminated); false
// when it cannot be read. Hook-safe (the interposer's is one prctl call).
using ThreadNameFn = bool (*)(char out[16]);

// Bytes this thread may still allocate before its next sample point (sample
// mode's hot path: one subtraction on initial-exec TLS, see sample_due).
// Shared by every Tracker of the process (there is one outside tests).
extern __thread int64_t t_sample_left;
// The calling thread's state (in whichever Tracker took it last).
extern __thread struct ThreadState* t_state;

uint64_t coarse_monotonic_ns();

// The last stack a thread interned (StackTable::reuse): the words it
// handed to intern(), frames then tail, the id it got and that stack's
// hash. The next capture of the same words asks the table only whether
// the id still names that stack, instead of hashing and probing: a loop
// that allocates from one call site interns its stack once. Per thread,
// owned by it; never shared.
constexpr uint32_t kMemoRest = 8;
struct StackMemo {
  uint32_t id;      // 0: nothing kept
  uint32_t rest;    // captures left before the memo is used again
  uint32_t misses;  // misses in a row (the next rest is kMemoRest << misses)
  uint32_t n;       // frames
  uint32_t tail_n;
  uint64_t hash;
  uint64_t token;  // the tail's token (StackTable::Tail), or 0
  uint64_t words[kMaxStackDepth + MI_CONTEXT_MAX_WORDS];
};

struct alignas(64) ThreadState {
  uint32_t shared;  // 1 for the overflow state many threads share
  class Tracker* owner;
  // owner while this state has one writer (the thread that took it), else
  // nullptr (the shared state): count_call's one-compare fast path.
  class Tracker* solo;
  std::atomic<uint64_t> calls[MI_FN_COUNT];
  std::atomic<uint64_t> bytes_allocated;
  std::atomic<uint64_t> bytes_freed;
  std::atomic<uint64_t> inserts, insert_bytes;
  std::atomic<uint64_t> removes, remove_bytes;
  std::atomic<uint64_t> dropped;
  std::atomic<uint64_t> frees_untracked;
  std::atomic<uint64_t> self_calls, self_bytes;
  // Table operations in flight on this state (0 or 1 for an owned state;
  // any count on the shared one): reset() waits for 0 before it gives the
  // table's pages back.
  std::atomic<uint32_t> table_busy;
  SamplerState sampler;
  UnwindCache* unwind_cache;
  // The stack id this thread is about to insert (or re-insert) into the
  // live table, 0 when none; read by sweeps. Not used by the shared state.
  std::atomic<uint32_t> pending;
  // The thread's name as context words (erlang_context.h), read again
  // every kNameRefresh records (a thread may be named after it started):
  // recorded on threads that are not schedulers. Owned states only.
  uint64_t name[2];
  uint32_t name_left;
  // The last Erlang context captured on this thread (erlang_context.h).
  // Owned states only.
  ContextCache context;
  // Churn's temporary rule (churn.h): the address of this thread's last
  // recorded allocation (0 once freed), and in sample mode its position in
  // the thread's stream of allocated bytes (sample_base - t_sample_left,
  // sample_base moved at each sample point): a block is temporary when
  // its thread frees it while it is still the last allocation, and (in
  // sample mode) no byte was allocated since. Owned states only.
  uint64_t last_alloc;
  int64_t last_pos;
  int64_t sample_base;
  // The last stack interned on this thread. Owned states only; last in the
  // struct: a thread that never records leaves its pages untouched.
  StackMemo memo;
};

// Where a test can stop a recording thread (Tracker::set_test_hook).
enum class TestPoint {
  kInterned,  // stack interned, its id not yet published as pending
  kPinned,    // id pending and checked, entry not yet inserted
  kCounting,  // a free's stack pinned and its churn row read, its counts not yet added
  kTrimming,  // a trim chunk entered (counted busy for clear_table), not yet trimmed
};

class Tracker {
 public:
  // Maps the tables and the thread-state pool. Not thread-safe; call once.
  // False when memory cannot be mapped (the caller then stays passive).
  bool init(const Config& config, UnwindFn unwind, ClockFn clock);
  // Tests only: unmaps everything. No thread may use the tracker after.
  void destroy();

  // Frames whose address lies in [lo, hi) are dropped from the top of every
  // captured stack (the interposer's own hook frames).
  void set_self_range(uintptr_t lo, uintptr_t hi) {
    self_lo_ = lo;
    self_hi_ = hi;
  }

  // The next allocator's malloc_usable_size: the byte counters then count
  // usable bytes (see the top of this file). Set before recording starts.
  void set_usable_size(UsableFn f) { usable_ = f; }

  // The Erlang context (erlang_context.h): from the first accepted layout
  // on, every recorded stack ends in the allocating thread's context and
  // every entry carries its process's pid. False for an invalid layout, or
  // one different from the layout already in use. Thread-safe; not for
  // hooks. `sd` and `name` are the test seams (nullptr: the real ones).
  bool set_erlang_layout(const mi_erlang_layout& layout, SchedulerDataFn sd = nullptr,
                         ThreadNameFn name = nullptr);
  bool erlang_context_on() const { return erlang_on_.load(std::memory_order_acquire); }

  uint32_t mode() const { return mode_.load(std::memory_order_relaxed); }
  // Switching to MI_MODE_OFF or MI_MODE_COUNTERS forgets the live table
  // and gives its pages back (blocks freed while off could not be removed;
  // counters mode does not look at the table). Switching from full to
  // sample does too: sample mode finds only sampled blocks on free (see
  // sampled_address). False for an unknown mode.
  bool set_mode(uint32_t mode);

  // --- hot path (inside hooks) ---
  // A block of `size` bytes at p was just returned by the next allocator.
  // In sample mode it runs the thread's sample countdown itself (tests, and
  // hooks that did not).
  void on_alloc(mi_fn fn, void* p, size_t size);
  // p is about to be given back to the next allocator (free, or realloc
  // moving it). Must run BEFORE the real free: once freed, the address can
  // be handed to another thread and recorded again. `quiet`: the calling
  // thread works for mallocinfo (mi_preload_abi.quiet): a block the table
  // holds is still the node's and counted freed, any other counts nothing.
  void on_free(mi_fn fn, void* p, bool quiet = false);
  // An allocation of `size` requested bytes that a quiet thread made: not
  // recorded, counted in self_calls / self_bytes (full and counters mode).
  void count_self(size_t size) {
    const uint32_t m = mode();
    if (m != MI_MODE_FULL && m != MI_MODE_COUNTERS) return;
    ThreadState* ts = thread_state();
    bump_own(ts, ts->self_calls, 1);
    bump_own(ts, ts->self_bytes, size);
  }
  // Sample mode: a quiet thread's allocation of `size` bytes was a sample
  // point; counted, with its weight, in self_calls / self_bytes.
  void count_self_sampled(size_t size);
  // realloc/reallocarray: forget p before the real call (counting nothing);
  // if the real call fails, restore() puts the entry back unchanged; if it
  // succeeds, freed() counts p as having left the live set.
  bool take(void* p, LiveEntry* out);
  void restore(const LiveEntry& e);
  // p (whose entry take() returned in *e, or nullptr when it had none) left
  // the live set through realloc; `usable` is its usable size measured
  // before the call (0 when unknown).
  void freed(mi_fn fn, const LiveEntry* e, size_t usable);
  // Counts a call that records nothing itself (strdup, strndup, free(NULL)).
  void count(mi_fn fn);

  // Mapping hooks (issue 14): the calling thread's stack, innermost first,
  // with the interposer's own frames cut, into out (at most
  // min(max, stack_depth) frames); returns how many. Does not intern:
  // regions keep their frames themselves (region_table.h). Hook-safe like
  // on_alloc (the thread's unwind cache, no lock, no malloc).
  unsigned capture_frames(uint64_t* out, unsigned max);
  // Counters mode: one call of fn, `usable` bytes allocated (0 for a failed
  // call) or freed. The hooks measure `usable` with usable().
  void count_alloc(mi_fn fn, size_t usable) { count_call(fn, false, usable); }
  void count_free(mi_fn fn, size_t usable) { count_call(fn, true, usable); }
  // Full and counters modes: bytes only, no call, nothing recorded, for
  // blocks the tracker's own machinery allocates or frees inside a hook
  // (dlsym at start-up): such a block may be freed outside one, and the
  // byte counters must still balance.
  void count_bytes(bool allocated, size_t usable) {
    if (mode() != MI_MODE_COUNTERS) return;  // full mode counts recorded blocks only
    ThreadState* ts = thread_state();
    bump_own(ts, allocated ? ts->bytes_allocated : ts->bytes_freed, usable);
  }
  size_t usable(void* p) const { return usable_ != nullptr && p != nullptr ? usable_(p) : 0; }

  // Sample mode. sample_due(size) is the whole per-call cost of an
  // unsampled allocation: true when the thread's countdown ran out (or was
  // never armed), and only then sample_take(size) decides whether this
  // allocation is a sample point (and re-arms the countdown). A sampled
  // block must be placed so that sampled_address() holds for it, and
  // recorded with on_sampled_alloc().
  static bool sample_due(size_t size) {
    t_sample_left -= static_cast<int64_t>(size);
    return t_sample_left <= 0;
  }
  bool sample_take(size_t size);
  void on_sampled_alloc(mi_fn fn, void* p, size_t size);
  // Sample mode's free test. A sampled block starts at offset 0 or 16 of a
  // 4 KiB page (the hooks allocate it page-aligned, or keep a block the
  // next allocator already placed there: glibc's mmapped chunks start 16
  // bytes into a page). Any other pointer cannot be in the table, so its
  // free leaves after one AND and a branch, without touching the table.
  // This is jemalloc's design (sampled objects are page-aligned), rather
  // than tcmalloc's (a tagged address range: not ours to choose behind
  // another allocator) or a table/Bloom lookup (a likely cache miss on
  // every free); the price is up to a page of padding per live sampled
  // block, about 1% at the default 512 KiB interval.
  static bool sampled_address(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 0xFEFu) == 0;
  }

  // --- queries ---
  void status(mi_abi_status* out) const;
  // What each table keeps resident (os_mem.h's PageCounter on pagemap).
  // Opens a file: never from a hook.
  void resident(mi_abi_resident* out) const;
  // Calls f(const mi_abi_churn&) for every call site's churn since start
  // or reset() (churn.h); returns how many.
  template <class F>
  uint64_t for_each_churn(F&& f) const {
    return churn_.for_each(static_cast<F&&>(f));
  }
  // Resident bytes of the churn table (mincore), for tests and benchmarks.
  size_t churn_resident_bytes() const { return churn_.resident_bytes(); }
  template <class F>
  uint64_t for_each_live(F&& f) const {
    return table_.for_each(static_cast<F&&>(f));
  }
  unsigned stack(uint32_t id, uint64_t* out, unsigned max) const {
    return stacks_.get(id, out, max);
  }
  uint64_t stack_hash(uint32_t id) const { return stacks_.hash_of(id); }
  // Forgets every live entry and gives the table's pages back (madvise),
  // zeroes the churn counters, then reclaims every stack (reclaim()).
  // Returns how many entries were forgotten.
  uint64_t reset();
  uint64_t now_ns() const { return clock_(); }
  // Resident bytes of the live table (mincore), for tests and benchmarks.
  size_t table_resident_bytes() const { return table_.resident_bytes(); }
  // One past the highest thread state ever handed out: about the most
  // threads that took a state at once (a thread may take a higher state
  // while a lower one is being given back), plus the shared state. For
  // tests.
  size_t states_seen() const { return states_seen_.load(std::memory_order_acquire); }
  // How many clears kept the table's pages (see Config::quiesce_rounds).
  uint64_t unreleased_clears() const { return unreleased_clears_.load(std::memory_order_relaxed); }
  const Config& config() const { return config_; }

  // Runs a whole sweep that starts after this call: every stack no live
  // entry references when it starts is freed. Helps a sweep already
  // running to its end first. Returns the stacks freed meanwhile (0 when
  // this process cannot sweep, see above).
  uint64_t reclaim();
  // Runs a whole trim of the live table (LiveTable::trim()) from the
  // caller's thread, wanted or not, after helping one that runs to its
  // end. Returns the bytes it gave back. reclaim() ends with one.
  size_t trim_live();
  // Trims of the live table, and the bytes they gave back (pages whose
  // chunks were all free, counted whether or not they were resident).
  uint64_t live_trims() const { return live_trims_.load(std::memory_order_relaxed); }
  uint64_t live_trimmed_bytes() const { return live_trimmed_.load(std::memory_order_relaxed); }
  // Tests only: the live table waits for `words` dirty words before it
  // asks for a trim (as trims that gave nothing back leave it).
  void set_trim_threshold(uint32_t words) { table_.set_trim_threshold(words); }
  // Stale ids the sweeps met in the live table (a protocol failure; 0).
  uint64_t stale_stacks() const { return stale_.load(std::memory_order_relaxed); }
  // Stacks the sweeps' compaction moved down their record pools
  // (StackTable::compact_move()).
  uint64_t stacks_moved() const { return stacks_moved_.load(std::memory_order_relaxed); }
  // False when no hook may start a sweep here (see above).
  bool hooks_sweep() const { return hooks_sweep_; }

  // --- tests only ---
  using TestHook = void (*)(TestPoint point, void* ctx);
  // Called by every recording thread at each TestPoint. Not thread-safe
  // against recording threads; nullptr disables it.
  void set_test_hook(TestHook hook, void* ctx) {
    test_ctx_ = ctx;
    test_hook_ = hook;
  }
  StackTable& stack_table() { return stacks_; }

 private:
  // The owner is the only writer of its own state: a plain load and store
  // (no lock prefix) is enough, readers tolerate a slightly stale value.
  // The shared overflow state has many writers and needs the atomic add.
  static void bump_own(ThreadState* ts, std::atomic<uint64_t>& c, uint64_t v) {
    if (ts->shared != 0)
      c.fetch_add(v, std::memory_order_relaxed);
    else
      c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
  ThreadState* thread_state() {
    ThreadState* ts = t_state;
    if (ts != nullptr && ts->owner == this) [[likely]]
      return ts;
    return acquire_state();
  }
  // Takes a free state for the calling thread (or the shared one) and
  // makes it t_state. Out of line: once per thread.
  [[gnu::noinline, gnu::cold]] ThreadState* acquire_state();
  // One call of fn and `bytes` more allocated (or freed), on the calling
  // thread's state. The fast path is one TLS load and one compare: `solo`
  // is this tracker only on a state with one writer, so neither the owner
  // nor the shared flag needs a test of its own (counters mode's whole
  // per-call cost, see hooks.cpp).
  void count_call(mi_fn fn, bool freed, uint64_t bytes) {
    ThreadState* ts = t_state;
    if (ts != nullptr && ts->solo == this) [[likely]] {
      // The owner is the only writer: plain loads and stores, no lock prefix.
      std::atomic<uint64_t>& c = freed ? ts->bytes_freed : ts->bytes_allocated;
      ts->calls[fn].store(ts->calls[fn].load(std::memory_order_relaxed) + 1,
                          std::memory_order_relaxed);
      c.store(c.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
      return;
    }
    count_call_slow(fn, freed, bytes);
  }
  // count_call for a thread without a state yet, or on the shared one.
  [[gnu::noinline, gnu::cold]] void count_call_slow(mi_fn fn, bool freed, uint64_t bytes);
  static void release_state(void* p);
  // Interns the calling thread's stack (with its Erlang context when on);
  // *pid gets the context's pid, or 0.
  uint32_t capture(ThreadState* ts, uint64_t* pid);
  // stacks_.intern(frames, n[, tail]) through ts's StackMemo (owned states).
  uint32_t intern_memo(ThreadState* ts, const uintptr_t* frames, unsigned n,
                       const StackTable::Tail& tail);
  // The calling thread's name words, or nullptr (the shared state).
  const uint64_t* thread_name(ThreadState* ts);
  // The calling thread's stack into buf (kMaxStackDepth + 8 slots): returns
  // how many frames to keep from buf[*skip] (the interposer's own frames
  // skipped, at most stack_depth). Hook-safe: no lock, no malloc.
  size_t unwind_here(ThreadState* ts, uintptr_t* buf, size_t* skip);
  // Records a block; true when the table took it (then, and only then, its
  // bytes count as allocated: see the byte counters above).
  bool record(ThreadState* ts, uint64_t address, uint64_t size, bool sampled);
  // Brackets a table operation (see ThreadState::table_busy): false when
  // reset() has closed the table, and then nothing may be touched.
  bool enter_table(ThreadState* ts);
  void leave_table(ThreadState* ts);
  bool table_remove(ThreadState* ts, uint64_t address, LiveEntry* out);
  // Counts the block `e` (just removed from the table) as freed in its
  // site's churn, by the calling thread.
  void churn_free(ThreadState* ts, const LiveEntry& e);
  // Counts a free of the block `e` (nullptr: not in the table) whose
  // usable size is `usable`, in mode `mode`.
  void account_free(ThreadState* ts, uint32_t mode, mi_fn fn, const LiveEntry* e, size_t usable);
  // Empties the table; gives its pages back when every thread is out of it.
  uint64_t clear_table();
  int64_t draw_interval(ThreadState* ts);

  // The pending slot for a recording thread: its own, or one of the shared
  // state's (nullptr when all are taken).
  std::atomic<uint32_t>* pending_slot(ThreadState* ts);
  // Publishes `id` (stamped with an epoch >= e, e read before the id was
  // obtained) in *pin and checks it is safe from sweeps (see above).
  // Returns the id, possibly re-interned through `recapture` (when not
  // nullptr), or 0 with *pin cleared when it was reclaimed.
  uint32_t pin_id(std::atomic<uint32_t>* pin, uint32_t id, uint32_t e, ThreadState* recapture);
  // The sweep (tracker_sweep.cpp). Its control block lives in one page of
  // MADV_WIPEONFORK memory: a child forked mid-sweep starts with no sweep
  // in progress (stacks left FREEING are resolved by its next sweep, and
  // stay readable meanwhile).
  static constexpr size_t kSettlePins = 256;
  struct SweepControl {
    std::atomic<uint64_t> cursor;  // phase << 48 | next chunk to claim
    std::atomic<uint64_t> done;    // phase << 48 | chunks completed
    std::atomic<uint32_t> epoch;   // the running sweep's epoch
    std::atomic<uint64_t> freed;   // stacks the running sweep freed so far
    // The compaction's: the pools' targets, the stacks moved so far, and
    // the ids hooks pinned at M3 (sorted; pins_known false when the
    // barrier failed or more than kSettlePins were pinned: then nothing
    // pinned may be settled or given back, so nothing is).
    std::atomic<uint32_t> target[StackTable::kClasses];
    std::atomic<uint64_t> moved;
    std::atomic<uint32_t> rows_kept;  // a bit per record class: churn rows kept
    std::atomic<bool> pins_known;
    std::atomic<uint32_t> npins;
    std::atomic<uint32_t> pins[kSettlePins];
    uint32_t scratch[kSettlePins];  // collect_pins()'s, by the thread that advances
    // The live table's trim (trim_step()), apart from the sweep: 0 idle,
    // kTrimStarting, else kTrimRunning | the next chunk to claim.
    std::atomic<uint64_t> trim_cursor;
    std::atomic<uint64_t> trim_total;     // the running trim's chunks
    std::atomic<uint64_t> trim_done;      // and how many are done
    std::atomic<uint64_t> trim_released;  // bytes they gave back
    std::atomic<bool> trim_asked;         // hooks started it (not trim_live())
    // The sweeps trims ask for (trim_finish()): clock_() when the last
    // sweep ended (0: none since init or a fork); how long after it a
    // trim may ask (0: kTrimSweepGapNs); whether the running sweep, or
    // the next, is one a trim asked for; whether a trim asked while a
    // sweep ran (sweep_end() then asks again).
    std::atomic<uint64_t> swept_at;
    std::atomic<uint64_t> trim_sweep_gap;
    std::atomic<bool> trim_sweep;
    std::atomic<bool> trim_sweep_again;
  };
  // A trim that gave pages back asks for a sweep when the stack table
  // holds this many stacks, and no sweep ended for the gap: a second,
  // doubled (up to a minute) after each such sweep that freed fewer than
  // an eighth of the stacks, back to a second after one that freed more.
  // See trim_finish().
  static constexpr uint64_t kTrimSweepStacks = 1024;
  static constexpr uint64_t kTrimSweepGapNs = 1'000'000'000;
  static constexpr uint64_t kTrimSweepGapMaxNs = 64'000'000'000;
  static_assert(sizeof(SweepControl) <= 4096, "the sweep's control block is one page");
  bool sweep_init();
  void sweep_destroy();
  bool sweep_active() const {
    return sweep_ != nullptr && (sweep_->cursor.load(std::memory_order_relaxed) >> 48) != 0;
  }
  void sweep_hook_step();
  // Does one step of the live table's trim: starts one (when `start`, or
  // the table wants one) or trims its next chunk. False when there was
  // nothing to do (another thread starts one, or every chunk is claimed).
  // `asked`: a trim it starts is the hooks' (it moves the table's
  // threshold, and may ask for a sweep: trim_finish()), not trim_live()'s.
  bool trim_step(bool start, bool asked);
  // A recorded allocation at `now` (clock_()) past trim_due_ns_: at least
  // a trim a second while LiveTable::kTrimAt words are dirty, whatever the
  // threshold. Trims that gave nothing back double it; without this, a
  // burst of frees that dirtied fewer words than that would keep its
  // pages until the next burst.
  void trim_due(uint64_t now);
  static constexpr uint64_t kTrimGapNs = 1'000'000'000;
  // Ends the running trim, which gave back `released` bytes; asks for a
  // stack sweep when that was from frees (see the definition).
  void trim_finish(uint64_t released);
  // Runs f (a trim's work on the pools) unless the table is closed,
  // counted in trim_busy_: a Dekker with clear_table(), as enter_table()
  // (either it sees the trim busy and waits, or the trim sees the table
  // closed).
  template <class F>
  void trim_busy(F f) {
    trim_busy_.fetch_add(1, std::memory_order_seq_cst);
    if (table_open_.load(std::memory_order_seq_cst)) f();
    trim_busy_.fetch_sub(1, std::memory_order_release);
  }
  bool sweep_start(bool from_hook);
  // Calls f(state) for every state a thread holds (and the shared one).
  template <class F>
  void each_held_state(F f);
  bool sweep_chunk(bool from_hook);
  void sweep_advance(uint32_t phase, uint32_t e, bool from_hook);
  void mark_pending(uint32_t e);
  bool process_barrier(bool may_be_slow);
  // Ends a sweep (its compaction included): the stack table sets when the
  // next is wanted (end_sweep()), the sweep is counted, idle again.
  void sweep_end();
  // Chunks of a sweep phase.
  size_t phase_chunks(uint32_t phase) const;
  // M3 and the ids hooks pin then, into the control block (see there).
  void collect_pins(bool from_hook);

  Config config_;
  UnwindFn unwind_ = nullptr;
  ClockFn clock_ = nullptr;
  UsableFn usable_ = nullptr;
  std::atomic<bool> table_open_{true};
  pthread_mutex_t clear_lock_ = PTHREAD_MUTEX_INITIALIZER;  // serialises clear_table()
  std::atomic<uint32_t> mode_{MI_MODE_OFF};
  LiveTable table_;
  StackTable stacks_;
  ChurnTable churn_;
  std::atomic<uint64_t> churn_since_{0};  // clock_() at init and at each reset()
  // clock_() after which a recorded allocation calls trim_due(): a second
  // after the last trim ended or the last trim_due() call. Read by every
  // recorded allocation; written about once a second.
  alignas(64) std::atomic<uint64_t> trim_due_ns_{0};
  static constexpr size_t kThreadStates = 1024;
  ThreadState* states_ = nullptr;  // pool; states_[0] is the shared overflow
  size_t nstates_ = 0;
  size_t states_bytes_ = 0;
  // Which states a thread holds, one bit each (bit 0, the shared state,
  // always set while initialised). Sweeps and clears visit only these:
  // the pool is 1024 states of 2 KiB, and where a cold page costs
  // microseconds (a VM's shadow page tables) walking it all in every
  // sweep made reset() take seconds. Set and cleared seq_cst: clear_table()
  // reads it between closing the table and reading table_busy.
  std::atomic<uint64_t> held_[kThreadStates / 64]{};
  // One past the highest state ever handed out (the lowest free one is
  // taken first, so this is about the most threads at once, plus one). status()
  // and destroy() read up to here: a state keeps its counters after its
  // thread exits.
  std::atomic<size_t> states_seen_{0};
  pthread_key_t key_{};
  bool key_ok_ = false;
  uintptr_t self_lo_ = 0, self_hi_ = 0;
  // Removals done by reset() and set_mode(off), outside any thread state;
  // forgotten_bytes_ is what they add to bytes_freed (requested bytes, or
  // a sampled entry's weight).
  std::atomic<uint64_t> cleared_{0}, cleared_bytes_{0}, forgotten_bytes_{0};
  // Pending ids of threads on the shared overflow state; kPendingClaimed
  // marks a slot taken before its id is known (not an id: its generation
  // bits exceed any table's).
  static constexpr size_t kSharedPending = 64;
  static constexpr uint32_t kPendingClaimed = 0xFFFFFFFFu;
  std::atomic<uint32_t> shared_pending_[kSharedPending]{};
  // Stacks captured but not recorded: no pending slot, or reclaimed under
  // a descheduled hook more than once (counted in stacks_dropped).
  std::atomic<uint64_t> stacks_lost_{0};
  SweepControl* sweep_ = nullptr;
  bool hooks_sweep_ = false;
  std::atomic<uint64_t> sweeps_{0};
  // Sweeps that passed their start (M1, pending ids marked). Sweeps run one
  // at a time, so the n-th started is the n-th to complete (sweeps_).
  std::atomic<uint64_t> sweeps_started_{0};
  std::atomic<uint64_t> stale_{0};
  std::atomic<uint64_t> stacks_moved_{0};
  std::atomic<uint64_t> live_trims_{0};
  // Trim chunks running now: clear_table() waits for them as for the
  // threads inside a table operation (a trim writes the pools' bitmaps).
  std::atomic<uint32_t> trim_busy_{0};
  std::atomic<uint64_t> live_trimmed_{0};
  TestHook test_hook_ = nullptr;
  void* test_ctx_ = nullptr;
  // The Erlang context: written once, before erlang_on_ is released.
  std::atomic<bool> erlang_on_{false};
  mi_erlang_layout erlang_{};
  SchedulerDataFn sd_fn_ = nullptr;
  ThreadNameFn name_fn_ = nullptr;
  pthread_mutex_t erlang_lock_ = PTHREAD_MUTEX_INITIALIZER;
  // Clears that could not give the pages back (a thread stayed in the table).
  std::atomic<uint64_t> unreleased_clears_{0};
};

template <class F>
void Tracker::each_held_state(F f) {
  for (size_t w = 0; w < nstates_ / 64; ++w)
    for (uint64_t bits = held_[w].load(std::memory_order_seq_cst); bits != 0; bits &= bits - 1)
      f(states_[w * 64 + static_cast<size_t>(__builtin_ctzll(bits))]);
}

}  // namespace mi::track

#endif
