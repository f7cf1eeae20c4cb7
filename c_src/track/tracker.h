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
// quiescent). Query methods (status, snapshot, stack, reset) are
// thread-safe and may run concurrently with the hot path; they must not be
// called from inside a hook.
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
  size_t table_capacity = size_t{1} << 21;  // 2 Mi entries, 64 MiB reserved
  size_t stack_capacity = size_t{1} << 16;  // 64 Ki distinct stacks
  unsigned stack_depth = 32;
  uint64_t sample_bytes = 512 * 1024;
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

  // --- queries ---
  void status(mi_abi_status* out) const;
  template <class F>
  uint64_t for_each_live(F&& f) const {
    return table_.for_each(static_cast<F&&>(f));
  }
  unsigned stack(uint32_t id, uint64_t* out, unsigned max) const {
    return stacks_.get(id, out, max);
  }
  uint64_t reset();
  uint64_t now_ns() const { return clock_(); }
  const Config& config() const { return config_; }

 private:
  ThreadState* thread_state();
  ThreadState* acquire_state();
  static void release_state(void* p);
  uint32_t capture(ThreadState* ts);
  void record(ThreadState* ts, uint64_t address, uint64_t size, bool sampled);
  void forget(ThreadState* ts, uint64_t address, bool count_untracked);

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
};

}  // namespace mi::track

#endif
