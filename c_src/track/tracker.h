// The allocation tracker core: what the malloc hooks call after (or before)
// forwarding to the next allocator, and what the ABI reads.
//
// One Tracker owns the live table, the stack table and the per-thread
// states; the interposer has exactly one (preload/), tests make their own
// with a fake unwinder and clock (STYLE.md §8).
//
// Hot-path methods (on_alloc, on_free, count) are called from inside malloc
// hooks with the caller's re-entrancy guard held: they never allocate
// through malloc, never lock, never throw, and spin only boundedly.
// Per-thread counters are plain loads and stores on the thread's own
// cache-line-aligned state; readers sum them (exact once writers are
// quiescent). Query methods (status, snapshot, stack, reset, reclaim) are
// thread-safe and may run concurrently with the hot path; they must not be
// called from inside a hook.
//
// Stack reclamation (the sweep). The stack table would otherwise fill for
// good on a long-running node. A sweep frees every stack that no live entry
// references. It is a small state machine split into bounded chunks:
//   start    bump the stack table's epoch to E; process-wide barrier (M1,
//            membarrier(2)); mark every thread's pending id;
//   scan     mark the stack of every live-table entry (chunks of slots);
//   condemn  READY stacks not stamped E become FREEING (chunks);
//   barrier  M2; mark every thread's pending id again;
//   finish   FREEING stacks not stamped E become FREE, generation + 1;
//            the others READY again (chunks).
// Marking a stack stamps it with E. A sweep starts when the table asks for
// one (StackTable::wants_sweep: a quarter full, then every eighth of the
// table added, or a dropped stack) and advances one chunk at the end of
// each recorded allocation while the table still asks, so no hook pauses
// for more than a chunk (1024 slots, a few us) or a membarrier call;
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
// Without membarrier (or MADV_WIPEONFORK for the sweep's control page) no
// hook starts a sweep; reset() and reclaim() still sweep, with the slower
// global barrier.
//
// Readers that hold ids across calls (snapshot, then stack()) get each
// id's own frames or nothing, as long as fewer than gen_period() sweeps
// complete meanwhile (a slot's generation moves once per sweep at most);
// they compare status' stack_sweeps before and after, and read again in
// the (for a default table: 32767 sweeps during one read) unlikely case.
#ifndef MALLOCINFO_TRACK_TRACKER_H
#define MALLOCINFO_TRACK_TRACKER_H

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../common/mi_abi.h"
#include "../common/mi_limits.h"
#include "live_table.h"
#include "sampler.h"
#include "stack_table.h"
#include "unwind.h"

namespace mi::track {

// Frames kept per stack at most: one limit for every reader (mi_limits.h).
constexpr unsigned kMaxStackDepth = mi::limits::kMaxStackDepth;

struct Config {
  uint32_t mode = MI_MODE_FULL;
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

uint64_t coarse_monotonic_ns();

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
  SamplerState sampler;
  UnwindCache* unwind_cache;
  // The stack id this thread is about to insert (or re-insert) into the
  // live table, 0 when none; read by sweeps. Not used by the shared state.
  std::atomic<uint32_t> pending;
};

// Where a test can stop a recording thread (Tracker::set_test_hook).
enum class TestPoint {
  kInterned,  // stack interned, its id not yet published as pending
  kPinned,    // id pending and checked, entry not yet inserted
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

  uint32_t mode() const { return mode_.load(std::memory_order_relaxed); }
  // Switching to MI_MODE_OFF forgets the live table: blocks freed while off
  // could not be removed, so keeping the old entries would report freed
  // memory as live. False for an unknown mode.
  bool set_mode(uint32_t mode);

  // --- hot path (inside hooks) ---
  // A block of `size` bytes at p was just returned by the next allocator.
  void on_alloc(mi_fn fn, void* p, size_t size);
  // p is about to be given back to the next allocator (free, or realloc
  // moving it). Must run BEFORE the real free: once freed, the address can
  // be handed to another thread and recorded again.
  void on_free(mi_fn fn, void* p);
  // realloc/reallocarray: forget p before the real call; if the real call
  // fails, restore() puts the entry back unchanged.
  bool take(void* p, LiveEntry* out);
  void restore(const LiveEntry& e);
  // Counts a call that records nothing itself (strdup, strndup, free(NULL)).
  void count(mi_fn fn);

  // Mapping hooks (issue 14): the calling thread's stack, innermost first,
  // with the interposer's own frames cut, into out (at most
  // min(max, stack_depth) frames); returns how many. Does not intern:
  // regions keep their frames themselves (region_table.h). Hook-safe like
  // on_alloc (the thread's unwind cache, no lock, no malloc).
  unsigned capture_frames(uint64_t* out, unsigned max);

  // --- queries ---
  void status(mi_abi_status* out) const;
  template <class F>
  uint64_t for_each_live(F&& f) const {
    return table_.for_each(static_cast<F&&>(f));
  }
  unsigned stack(uint32_t id, uint64_t* out, unsigned max) const {
    return stacks_.get(id, out, max);
  }
  uint64_t stack_hash(uint32_t id) const { return stacks_.hash_of(id); }
  // Forgets every live entry, then reclaims every stack (reclaim()).
  // Returns how many entries were forgotten.
  uint64_t reset();
  uint64_t now_ns() const { return clock_(); }
  const Config& config() const { return config_; }

  // Runs a whole sweep that starts after this call: every stack no live
  // entry references when it starts is freed. Helps a sweep already
  // running to its end first. Returns the stacks freed meanwhile (0 when
  // this process cannot sweep, see above).
  uint64_t reclaim();
  // Stale ids the sweeps met in the live table (a protocol failure; 0).
  uint64_t stale_stacks() const { return stale_.load(std::memory_order_relaxed); }
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
  ThreadState* thread_state();
  ThreadState* acquire_state();
  static void release_state(void* p);
  uint32_t capture(ThreadState* ts);
  void record(ThreadState* ts, uint64_t address, uint64_t size, bool sampled);
  void forget(ThreadState* ts, uint64_t address, bool count_untracked);

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
  struct SweepControl {
    std::atomic<uint64_t> cursor;  // phase << 48 | next chunk to claim
    std::atomic<uint64_t> done;    // phase << 48 | chunks completed
    std::atomic<uint32_t> epoch;   // the running sweep's epoch
    std::atomic<uint64_t> freed;   // stacks the running sweep freed so far
  };
  bool sweep_init();
  void sweep_destroy();
  bool sweep_active() const {
    return sweep_ != nullptr && (sweep_->cursor.load(std::memory_order_relaxed) >> 48) != 0;
  }
  void sweep_hook_step();
  bool sweep_start(bool from_hook, uint64_t* sweeps_before);
  bool sweep_chunk(bool from_hook);
  void sweep_advance(uint32_t phase, uint32_t e, bool from_hook);
  void mark_pending(uint32_t e);
  bool process_barrier(bool may_be_slow);

  Config config_;
  UnwindFn unwind_ = nullptr;
  ClockFn clock_ = nullptr;
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
  std::atomic<uint64_t> stale_{0};
  TestHook test_hook_ = nullptr;
  void* test_ctx_ = nullptr;
};

}  // namespace mi::track

#endif
