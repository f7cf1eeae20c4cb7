// The allocation tracker core: what the malloc hooks call after (or before)
// forwarding to the next allocator, and what the ABI reads.
//
// One Tracker owns the live table, the stack table and the per-thread
// states; the interposer has exactly one (preload/), tests make their own
// with a fake unwinder and clock (STYLE.md §8).
//
// Hot-path methods (on_alloc, on_free, count, count_alloc, count_free,
// sample_due, sample_take, on_sampled_alloc, take, restore, freed) are
// called from inside malloc hooks: they never allocate through malloc,
// never lock, never throw, and spin only boundedly. Per-thread counters are
// plain loads and stores on the thread's own cache-line-aligned state;
// readers sum them (exact once writers are quiescent). Query methods
// (status, snapshot, stack, reset, set_mode) are thread-safe and may run
// concurrently with the hot path; they must not be called from inside a
// hook.
//
// What the byte counters mean (mi_abi_status):
//  - counters and full: bytes_allocated / bytes_freed are *usable* bytes
//    (the next allocator's malloc_usable_size, see set_usable_size) of every
//    block allocated / freed while the mode counts; a realloc counts the old
//    block freed and the new one allocated (moved, grown in place or
//    shrunk), realloc(p, 0) counts p freed. So bytes_allocated - bytes_freed
//    equals the usable bytes of the live blocks allocated in these modes.
//    Without a usable-size function (tests) requested sizes are counted, and
//    a free counts the recorded size of a block found in the table.
//  - sample: every counter (calls, bytes_allocated, bytes_freed) is an
//    unbiased estimate from the sample: a sampled block of n requested bytes
//    adds 1/p(n) calls and round(n/p(n)) bytes, and its free adds the same
//    again, so bytes_allocated - bytes_freed is the sample's estimate of the
//    live requested bytes. Unsampled calls touch no counter (that is what
//    makes sample mode cheap).
//  - live_entries / live_bytes: exactly what the table holds (requested
//    sizes), every mode.
#ifndef MALLOCINFO_TRACK_TRACKER_H
#define MALLOCINFO_TRACK_TRACKER_H

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../common/mi_abi.h"
#include "live_table.h"
#include "sampler.h"
#include "stack_table.h"
#include "unwind.h"

namespace mi::track {

constexpr unsigned kMaxStackDepth = 128;

struct Config {
  uint32_t mode = MI_MODE_FULL;
  // How long reset()/set_mode() wait for threads inside a table operation
  // before they clear the table without giving its pages back (a thread
  // stopped inside a hook must not hang them): sched_yield rounds.
  unsigned quiesce_rounds = 10000;
  size_t table_capacity = size_t{1} << 21;  // 2 Mi entries, 64 MiB reserved
  size_t stack_capacity = size_t{1} << 16;  // 64 Ki distinct stacks
  unsigned stack_depth = 32;
  uint64_t sample_bytes = 512 * 1024;
  bool cached_unwinder = true;
};

// Stack capture back end: writes up to max return addresses, innermost
// first; `cache` is the calling thread's (may be null).
using UnwindFn = size_t (*)(UnwindCache* cache, uintptr_t* out, size_t max);
// Clock for timestamps, in ns.
using ClockFn = uint64_t (*)();
// The next allocator's malloc_usable_size (never called with nullptr).
using UsableFn = size_t (*)(void*);

// Bytes this thread may still allocate before its next sample point (sample
// mode's hot path: one subtraction on initial-exec TLS, see sample_due).
// Shared by every Tracker of the process (there is one outside tests).
extern __thread int64_t t_sample_left;
// The calling thread's state (in whichever Tracker took it last).
extern __thread struct ThreadState* t_state;

uint64_t coarse_monotonic_ns();
size_t unwind_with_cache(UnwindCache* cache, uintptr_t* out, size_t max);
size_t unwind_libunwind_only(UnwindCache* cache, uintptr_t* out, size_t max);

struct alignas(64) ThreadState {
  std::atomic<uint32_t> in_use;
  uint32_t shared;  // 1 for the overflow state many threads share
  class Tracker* owner;
  std::atomic<uint64_t> calls[MI_FN_COUNT];
  std::atomic<uint64_t> bytes_allocated;
  std::atomic<uint64_t> bytes_freed;
  std::atomic<uint64_t> inserts, insert_bytes;
  std::atomic<uint64_t> removes, remove_bytes;
  std::atomic<uint64_t> dropped;
  std::atomic<uint64_t> frees_untracked;
  // Table operations in flight on this state (0 or 1 for an owned state;
  // any count on the shared one): reset() waits for 0 before it gives the
  // table's pages back.
  std::atomic<uint32_t> table_busy;
  SamplerState sampler;
  UnwindCache* unwind_cache;
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
  // be handed to another thread and recorded again.
  void on_free(mi_fn fn, void* p);
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

  // Counters mode: one call of fn, `usable` bytes allocated (0 for a failed
  // call) or freed. The hooks measure `usable` with usable().
  void count_alloc(mi_fn fn, size_t usable) {
    count_call(fn, thread_state()->bytes_allocated, usable);
  }
  void count_free(mi_fn fn, size_t usable) { count_call(fn, thread_state()->bytes_freed, usable); }
  // Full and counters modes: bytes only, no call, nothing recorded, for
  // blocks the tracker's own machinery allocates or frees inside a hook
  // (libunwind, dlsym): such a block may be freed outside one, and the
  // byte counters must still balance.
  void count_bytes(bool allocated, size_t usable) {
    const uint32_t m = mode();
    if (m != MI_MODE_FULL && m != MI_MODE_COUNTERS) return;
    ThreadState* ts = thread_state();
    std::atomic<uint64_t>& c = allocated ? ts->bytes_allocated : ts->bytes_freed;
    if (ts->shared == 0)
      c.store(c.load(std::memory_order_relaxed) + usable, std::memory_order_relaxed);
    else
      c.fetch_add(usable, std::memory_order_relaxed);
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
  template <class F>
  uint64_t for_each_live(F&& f) const {
    return table_.for_each(static_cast<F&&>(f));
  }
  unsigned stack(uint32_t id, uint64_t* out, unsigned max) const {
    return stacks_.get(id, out, max);
  }
  // Forgets every live entry and gives the table's pages back (madvise);
  // returns how many entries were forgotten.
  uint64_t reset();
  uint64_t now_ns() const { return clock_(); }
  // Resident bytes of the live table (mincore), for tests and benchmarks.
  size_t table_resident_bytes() const { return table_.resident_bytes(); }
  // How many clears kept the table's pages (see Config::quiesce_rounds).
  uint64_t unreleased_clears() const { return unreleased_clears_.load(std::memory_order_relaxed); }
  const Config& config() const { return config_; }

 private:
  ThreadState* thread_state() {
    ThreadState* ts = t_state;
    if (ts != nullptr && ts->owner == this) [[likely]]
      return ts;
    return acquire_state();
  }
  // Takes a free state for the calling thread (or the shared one) and
  // makes it t_state. Out of line: once per thread.
  [[gnu::noinline, gnu::cold]] ThreadState* acquire_state();
  // One call of fn and `bytes` more in `counter`, on the calling thread's state.
  void count_call(mi_fn fn, std::atomic<uint64_t>& counter, uint64_t bytes) {
    ThreadState* ts = t_state;  // thread_state() was just called
    if (ts->shared == 0) [[likely]] {
      // The owner is the only writer: plain loads and stores, no lock prefix.
      ts->calls[fn].store(ts->calls[fn].load(std::memory_order_relaxed) + 1,
                          std::memory_order_relaxed);
      counter.store(counter.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
    } else {
      ts->calls[fn].fetch_add(1, std::memory_order_relaxed);
      counter.fetch_add(bytes, std::memory_order_relaxed);
    }
  }
  static void release_state(void* p);
  uint32_t capture(ThreadState* ts);
  void record(ThreadState* ts, uint64_t address, uint64_t size, bool sampled);
  // Brackets a table operation (see ThreadState::table_busy): false when
  // reset() has closed the table, and then nothing may be touched.
  bool enter_table(ThreadState* ts);
  void leave_table(ThreadState* ts);
  bool table_remove(ThreadState* ts, uint64_t address, LiveEntry* out);
  // Counts a free of the block `e` (nullptr: not in the table) whose
  // usable size is `usable`, in mode `mode`.
  void account_free(ThreadState* ts, uint32_t mode, mi_fn fn, const LiveEntry* e, size_t usable);
  // Empties the table; gives its pages back when every thread is out of it.
  uint64_t clear_table();
  int64_t draw_interval(ThreadState* ts);

  Config config_;
  UnwindFn unwind_ = nullptr;
  ClockFn clock_ = nullptr;
  UsableFn usable_ = nullptr;
  std::atomic<bool> table_open_{true};
  pthread_mutex_t clear_lock_ = PTHREAD_MUTEX_INITIALIZER;  // serialises clear_table()
  std::atomic<uint32_t> mode_{MI_MODE_OFF};
  LiveTable table_;
  StackTable stacks_;
  ThreadState* states_ = nullptr;  // pool; states_[0] is the shared overflow
  size_t nstates_ = 0;
  size_t states_bytes_ = 0;
  std::atomic<size_t> state_hint_{1};
  pthread_key_t key_{};
  bool key_ok_ = false;
  uintptr_t self_lo_ = 0, self_hi_ = 0;
  // Removals done by reset() and set_mode(off), outside any thread state.
  std::atomic<uint64_t> cleared_{0}, cleared_bytes_{0};
  // Clears that could not give the pages back (a thread stayed in the table).
  std::atomic<uint64_t> unreleased_clears_{0};
};

}  // namespace mi::track

#endif
