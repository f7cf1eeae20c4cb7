#include "tracker.h"

#include <sched.h>
#include <sys/prctl.h>
#include <time.h>

#include <cmath>
#include <cstring>

#include "../common/mi_sampling.h"
#include "os_mem.h"

namespace mi::track {

namespace {

// The calling thread's state. initial-exec TLS (set for all of track/ by
// the Makefile): no allocation, no lazy TLS resolution inside malloc.
// Whether t_sample_left holds a drawn countdown (0 at thread start).
__thread bool t_sample_armed = false;

// Publishing a pending id and checking the epoch must stay in program
// order: the sweeper's membarrier makes that order the one that counts.
inline void compiler_barrier() {
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

// A realloc that took an entry and then did not put it back (success, or
// realloc(p, 0)) releases the id it pinned.
inline void unpin_taken(ThreadState* ts) {
  if (ts->pending.load(std::memory_order_relaxed) != 0) [[unlikely]]
    ts->pending.store(0, std::memory_order_release);
}

// A thread's name is read again after this many of its records.
constexpr uint32_t kNameRefresh = 4096;

const void* scheduler_data(uint32_t key) {
  return ::pthread_getspecific(static_cast<pthread_key_t>(key));
}

bool prctl_name(char out[16]) {
  return ::prctl(PR_GET_NAME, out, 0, 0, 0) == 0;
}

// Rounds of pin_id: each failed round means a sweep started meanwhile.
constexpr int kPinRounds = 4;

inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// What one sampled block of `size` bytes stands for: 1/p calls, size/p
// bytes; and 1/p in churn's fixed point (churn.h).
struct Weight {
  uint64_t calls, bytes, fixed_calls;
};
Weight weight_of(uint64_t size, uint64_t mean) {
  const mi::sampling::Weight w = mi::sampling::weight(size, mean);
  return {static_cast<uint64_t>(std::llround(w.count)),
          static_cast<uint64_t>(std::llround(w.bytes)),
          static_cast<uint64_t>(std::llround(w.count * static_cast<double>(kCountOne)))};
}

}  // namespace

__thread int64_t t_sample_left = 0;
__thread ThreadState* t_state = nullptr;

uint64_t coarse_monotonic_ns() {
  // Ages are reported in ms: the coarse clock (a few ms resolution, a vDSO
  // read without rdtsc) is plenty and cheaper on the hot path.
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

bool Tracker::init(const Config& config, UnwindFn unwind, ClockFn clock) {
  config_ = config;
  if (config_.stack_depth == 0) config_.stack_depth = 1;
  if (config_.stack_depth > kMaxStackDepth) config_.stack_depth = kMaxStackDepth;
  if (config_.sample_bytes == 0) config_.sample_bytes = 1;
  unwind_ = unwind;
  clock_ = clock;
  if (!table_.init(config_.table_capacity)) return false;
  // Room for an Erlang context after the native frames (erlang_context.h).
  if (!stacks_.init(config_.stack_capacity, config_.stack_depth + MI_CONTEXT_MAX_WORDS)) {
    table_.destroy();
    return false;
  }
  // A churn row per record: a segment per record class.
  static_assert(StackTable::kClasses <= ChurnTable::kMaxSegments);
  size_t rows[StackTable::kClasses];
  for (unsigned c = 0; c < StackTable::kClasses; ++c) rows[c] = stacks_.segment_rows(c);
  if (!churn_.init(rows, StackTable::kClasses)) {
    table_.destroy();
    stacks_.destroy();
    return false;
  }
  if (!sweep_init()) {
    table_.destroy();
    stacks_.destroy();
    churn_.destroy();
    return false;
  }
  // The trim's state lives in the sweep's control page: none, no trims
  // (and no hook asks for one).
  if (sweep_ == nullptr) table_.never_trim();
  states_bytes_ = kThreadStates * sizeof(ThreadState);
  static_assert(kThreadStates % 64 == 0);
  states_ = static_cast<ThreadState*>(os_map(states_bytes_));
  if (states_ == nullptr) {
    table_.destroy();
    stacks_.destroy();
    churn_.destroy();
    sweep_destroy();
    return false;
  }
  nstates_ = kThreadStates;
  churn_since_.store(clock_(), std::memory_order_relaxed);
  // Only the shared state is written now: a state's page becomes resident
  // when a thread first takes it (acquire_state), not at start.
  states_[0].owner = this;
  states_[0].shared = 1;
  for (std::atomic<uint64_t>& w : held_) w.store(0, std::memory_order_relaxed);
  held_[0].store(1, std::memory_order_seq_cst);
  states_seen_.store(1, std::memory_order_release);
  // pthread_key_create does not allocate; the destructor hands a thread's
  // state back to the pool when the thread exits.
  key_ok_ = ::pthread_key_create(&key_, &Tracker::release_state) == 0;
  mode_.store(config_.mode <= MI_MODE_FULL ? config_.mode : uint32_t{MI_MODE_FULL},
              std::memory_order_release);
  return true;
}

void Tracker::destroy() {
  mode_.store(MI_MODE_OFF, std::memory_order_release);
  if (key_ok_) ::pthread_key_delete(key_);
  key_ok_ = false;
  if (t_state != nullptr && t_state->owner == this) t_state = nullptr;
  const size_t seen = states_seen_.load(std::memory_order_acquire);
  for (size_t i = 0; i < seen && i < nstates_; ++i)
    if (states_[i].unwind_cache != nullptr) os_unmap(states_[i].unwind_cache, unwind_cache_bytes());
  os_unmap(states_, states_bytes_);
  states_ = nullptr;
  nstates_ = 0;
  for (std::atomic<uint64_t>& w : held_) w.store(0, std::memory_order_relaxed);
  states_seen_.store(0, std::memory_order_relaxed);
  table_.destroy();
  stacks_.destroy();
  churn_.destroy();
  sweep_destroy();
}

ThreadState* Tracker::acquire_state() {
  // The lowest free state: a pool reused from the bottom keeps the held
  // states and states_seen_ as few as the threads alive at once.
  for (size_t w = 0; w < nstates_ / 64; ++w) {
    uint64_t bits = held_[w].load(std::memory_order_relaxed);
    while (~bits != 0) {
      const unsigned b = static_cast<unsigned>(__builtin_ctzll(~bits));
      const uint64_t bit = uint64_t{1} << b;
      bits = held_[w].fetch_or(bit, std::memory_order_seq_cst);
      if ((bits & bit) != 0) continue;  // another thread took it first
      const size_t i = w * 64 + b;
      size_t seen = states_seen_.load(std::memory_order_relaxed);
      while (seen <= i && !states_seen_.compare_exchange_weak(
                              seen, i + 1, std::memory_order_release, std::memory_order_relaxed)) {
      }
      ThreadState& s = states_[i];
      s.owner = this;
      s.solo = this;
      if (s.sampler.rng == 0) {
        sampler_seed(s.sampler, mix(reinterpret_cast<uintptr_t>(&s) ^ clock_()),
                     config_.sample_bytes);
        // Once per state (its first taker): its own range of context
        // tokens, never handed to another state.
        s.context.next_token = first_token(i);
      }
      // t_state first: pthread_setspecific may calloc (keys past the first
      // 32), and that call must find this state rather than take another.
      t_state = &s;
      if (key_ok_) ::pthread_setspecific(key_, &s);
      return &s;
    }
  }
  t_state = &states_[0];
  return &states_[0];
}

void Tracker::count_self_sampled(size_t size) {
  ThreadState* ts = thread_state();
  const Weight w = weight_of(size, config_.sample_bytes);
  bump_own(ts, ts->self_calls, w.calls);
  bump_own(ts, ts->self_bytes, w.bytes);
}

void Tracker::count_call_slow(mi_fn fn, bool freed, uint64_t bytes) {
  ThreadState* ts = thread_state();
  bump_own(ts, ts->calls[fn], 1);
  bump_own(ts, freed ? ts->bytes_freed : ts->bytes_allocated, bytes);
}

void Tracker::release_state(void* p) {
  auto* ts = static_cast<ThreadState*>(p);
  // Whatever this thread still frees or allocates during the rest of its
  // exit goes to the shared state, never to a state another thread may be
  // handed next.
  Tracker* t = ts->owner;
  t_state = &t->states_[0];
  const size_t i = static_cast<size_t>(ts - t->states_);
  t->held_[i / 64].fetch_and(~(uint64_t{1} << (i % 64)), std::memory_order_seq_cst);
}

bool Tracker::set_mode(uint32_t mode) {
  if (mode > MI_MODE_FULL) return false;
  const uint32_t before = mode_.exchange(mode, std::memory_order_seq_cst);
  // The mode is stored before the table closes: a thread that enters the
  // table after clear_table() reopened it sees the new mode (record()).
  if (mode == MI_MODE_OFF || mode == MI_MODE_COUNTERS ||
      (mode == MI_MODE_SAMPLE && before == MI_MODE_FULL))
    clear_table();
  return true;
}

bool Tracker::set_erlang_layout(const mi_erlang_layout& layout, SchedulerDataFn sd,
                                ThreadNameFn name) {
  if (!erlang_layout_valid(layout)) return false;
  ::pthread_mutex_lock(&erlang_lock_);
  bool ok = true;
  if (erlang_on_.load(std::memory_order_relaxed)) {
    ok = std::memcmp(&erlang_, &layout, sizeof layout) == 0;
  } else {
    erlang_ = layout;
    sd_fn_ = sd != nullptr ? sd : scheduler_data;
    name_fn_ = name != nullptr ? name : prctl_name;
    erlang_on_.store(true, std::memory_order_release);
  }
  ::pthread_mutex_unlock(&erlang_lock_);
  return ok;
}

const uint64_t* Tracker::thread_name(ThreadState* ts) {
  if (ts->shared != 0) return nullptr;
  if (ts->name_left == 0) {
    char raw[16] = {};
    if (!name_fn_(raw)) raw[0] = '\0';
    raw[15] = '\0';
    normalize_thread_name(raw, ts->name);
    ts->name_left = kNameRefresh;
  }
  --ts->name_left;
  return ts->name;
}

uint32_t Tracker::capture(ThreadState* ts, uint64_t* pid) {
  uintptr_t buf[kMaxStackDepth + 8];
  size_t skip = 0;
  const size_t keep = unwind_here(ts, buf, &skip);
  *pid = 0;
  uint64_t words[MI_CONTEXT_MAX_WORDS];
  ContextWords c;
  // The context is stored after the frames, as the stack's tail: hashed
  // once per context (the cache keeps its hash), and compared by token.
  if (erlang_on_.load(std::memory_order_acquire))
    c = read_erlang_context(erlang_, sd_fn_, thread_name(ts), words, pid,
                            ts->shared != 0 ? nullptr : &ts->context);
  return intern_memo(ts, buf + skip, static_cast<unsigned>(keep), c);
}

uint32_t Tracker::intern_memo(ThreadState* ts, const uintptr_t* frames, unsigned n,
                              const StackTable::Tail& tail) {
  const auto intern = [&] {
    return tail.n != 0 ? stacks_.intern(frames, n, tail) : stacks_.intern(frames, n);
  };
  // The shared state's memo would have many writers.
  if (ts->shared != 0) return intern();
  StackMemo& m = ts->memo;
  // A memo that missed rests before it is used again, for kMemoRest
  // captures, twice as long after each further miss in a row (up to 32
  // times): a thread whose allocations come from call sites in turn pays a
  // compare and a refill once per rest, not at each capture.
  if (m.rest != 0) {
    --m.rest;
    return intern();
  }
  // The same words as last time, and their stack still stored: its id.
  // (Words, not what intern() makes of them: it cuts them the same way
  // each time, so the same words always make the same stack.)
  if (m.id != 0) {
    if (m.n == n && m.tail_n == tail.n && std::memcmp(m.words, frames, n * 8) == 0 &&
        // A tail with the memo's token has the memo's words (Tail's contract).
        (tail.n == 0 || (tail.token != 0 && tail.token == m.token) ||
         std::memcmp(m.words + n, tail.words, tail.n * 8) == 0) &&
        stacks_.reuse(m.id, m.hash)) {
      m.misses = 0;
      return m.id;
    }
    m.id = 0;
    m.rest = kMemoRest << m.misses;
    if (m.misses < 5) ++m.misses;
    return intern();
  }
  const uint32_t id = intern();
  if (id == 0 || n + tail.n > kMaxStackDepth + MI_CONTEXT_MAX_WORDS) return id;
  std::memcpy(m.words, frames, n * 8);
  if (tail.n != 0) std::memcpy(m.words + n, tail.words, tail.n * 8);
  m.n = n;
  m.tail_n = tail.n;
  m.token = tail.token;
  m.hash = stacks_.hash_of(id);
  // A stack reclaimed already (hash 0) is not kept.
  if (m.hash != 0) m.id = id;
  return id;
}

// Inlined into both callers: the full-mode hot path must not pay a call.
__attribute__((always_inline)) inline size_t Tracker::unwind_here(ThreadState* ts, uintptr_t* buf,
                                                                  size_t* skip) {
  // The shared overflow state has no cache (many threads use it at once):
  // its captures derive every rule, slower but just as lock-free.
  if (ts->unwind_cache == nullptr && ts->shared == 0) {
    void* mem = os_map(unwind_cache_bytes());
    // Atomic for resident(), which reads it from other threads.
    if (mem != nullptr)
      __atomic_store_n(&ts->unwind_cache, unwind_cache_init(mem), __ATOMIC_RELEASE);
  }
  const size_t n =
      unwind_(ts->shared != 0 ? nullptr : ts->unwind_cache, buf, config_.stack_depth + 8);
  size_t s = 0;
  while (s < n && buf[s] >= self_lo_ && buf[s] < self_hi_) ++s;
  *skip = s;
  const size_t keep = n - s;
  return keep > config_.stack_depth ? config_.stack_depth : keep;
}

std::atomic<uint32_t>* Tracker::pending_slot(ThreadState* ts) {
  if (ts->shared == 0) [[likely]]
    return &ts->pending;
  for (std::atomic<uint32_t>& p : shared_pending_) {
    uint32_t expected = 0;
    if (p.load(std::memory_order_relaxed) == 0 &&
        p.compare_exchange_strong(expected, kPendingClaimed, std::memory_order_relaxed))
      return &p;
  }
  return nullptr;
}

uint32_t Tracker::pin_id(std::atomic<uint32_t>* pin, uint32_t id, uint32_t e,
                         ThreadState* recapture) {
  if (id == 0) return 0;  // nothing to pin (a dropped stack is counted as such)
  for (int round = 0; id != 0; ++round) {
    pin->store(id, std::memory_order_relaxed);
    compiler_barrier();
    const uint32_t now = stacks_.epoch();
    // hold() also revives a FREEING stack.
    if (now == e && stacks_.hold(id, e)) return id;
    if (round == kPinRounds) break;
    // A sweep started since e was read: stamp the stack with its epoch
    // (the stamp must precede the next pending store), or, if the sweep
    // freed it already, intern it again.
    e = now;
    uint64_t pid = 0;  // the entry keeps the pid of the first capture
    if (!stacks_.hold(id, e)) id = recapture != nullptr ? capture(recapture, &pid) : 0;
  }
  pin->store(0, std::memory_order_relaxed);
  stacks_lost_.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

bool Tracker::enter_table(ThreadState* ts) {
  // Dekker with clear_table(): either it sees this thread busy and waits,
  // or this thread sees the table closed. Both sides are seq_cst.
  ts->table_busy.fetch_add(1, std::memory_order_seq_cst);
  if (table_open_.load(std::memory_order_seq_cst)) [[likely]]
    return true;
  ts->table_busy.fetch_sub(1, std::memory_order_release);
  return false;
}

void Tracker::leave_table(ThreadState* ts) {
  ts->table_busy.fetch_sub(1, std::memory_order_release);
}

bool Tracker::record(ThreadState* ts, uint64_t address, uint64_t size, bool sampled) {
  std::atomic<uint32_t>* pin = pending_slot(ts);
  const uint32_t e = stacks_.epoch();
  uint64_t pid = 0;
  uint32_t id = capture(ts, &pid);
  if (test_hook_ != nullptr) [[unlikely]]
    test_hook_(TestPoint::kInterned, test_ctx_);
  if (pin != nullptr && id != 0) [[likely]] {
    // pin_id()'s first round, inline: no sweep started since e was read
    // and the stack still READY (intern stamped it) is the common case.
    pin->store(id, std::memory_order_relaxed);
    compiler_barrier();
    if (stacks_.epoch() != e || !stacks_.ready(id)) [[unlikely]]
      id = pin_id(pin, id, e, ts);
  } else if (id != 0) {
    id = 0;  // no pending slot: the id could be reclaimed before insertion
    stacks_lost_.fetch_add(1, std::memory_order_relaxed);
  }
  if (test_hook_ != nullptr) [[unlikely]]
    test_hook_(TestPoint::kPinned, test_ctx_);
  // Closed table: reset() in progress, it forgets this block anyway. A
  // full-mode block must not land after a switch to sample mode emptied the
  // table either: sample mode would never see its free (sampled_address).
  int inserted = -1;  // -1 not tried, else whether it fit
  const uint64_t now = clock_();
  if (enter_table(ts)) {
    if (sampled || mode_.load(std::memory_order_seq_cst) == MI_MODE_FULL)
      inserted = table_.insert(address, size, now, id | (sampled ? kSampledBit : 0u), pid) ? 1 : 0;
    leave_table(ts);
  }
  if (inserted == 1) {
    bump_own(ts, ts->inserts, 1);
    bump_own(ts, ts->insert_bytes, size);
    // Counted before the pin is released: the id is still protected.
    if (sampled) {
      const Weight w = weight_of(size, config_.sample_bytes);
      churn_.on_alloc(id, stacks_.row(id), w.fixed_calls, w.bytes, true);
    } else {
      churn_.on_alloc(id, stacks_.row(id), kCountOne, size, false);
    }
  } else if (inserted == 0) {
    bump_own(ts, ts->dropped, 1);
  }
  // Release: a sweep that reads the cleared slot also sees the entry.
  if (pin != nullptr) pin->store(0, std::memory_order_release);
  // Hooks help only sweeps the table asked for (it keeps asking until the
  // sweep ends); a sweep reclaim() started is carried by its caller.
  if (hooks_sweep_ && stacks_.wants_sweep()) [[unlikely]]
    sweep_hook_step();
  // The live table's trim needs no barrier: any process trims.
  if (table_.wants_trim()) [[unlikely]]
    trim_step(false, true);
  else if (now >= trim_due_ns_.load(std::memory_order_relaxed)) [[unlikely]]
    trim_due(now);
  return inserted == 1;
}

// Inlined into on_free and freed: full mode's free path must not pay a
// call's prologue for it (15 instructions a pair under callgrind).
__attribute__((always_inline)) inline void Tracker::churn_free(ThreadState* ts,
                                                               const LiveEntry& e) {
  const uint64_t now = clock_();
  const uint64_t lifetime = now > e.timestamp_ns ? now - e.timestamp_ns : 0;
  const bool sampled = (e.stack_id & kSampledBit) != 0;
  bool temporary = false;
  if (ts->shared == 0 && ts->last_alloc == e.address) {
    // Sample mode: and no byte allocated on this thread since.
    temporary = !sampled || ts->sample_base - t_sample_left == ts->last_pos;
    ts->last_alloc = 0;
  }
  const uint32_t id = e.stack_id & ~kSampledBit;
  // Pinned while it counts, as record() pins an allocation's: the sweep's
  // compaction may move the stack's churn row meanwhile, and keeps the old
  // row of a pinned stack for the next one (tracker_sweep.cpp, M3). A
  // shared state has no pin of its own: a free counted there just as its
  // row moves may go to the unknown row or to the site that takes the row
  // next (the totals still add up), or be lost if the row's page is given
  // back at that moment.
  std::atomic<uint32_t>* pin = ts->shared == 0 ? &ts->pending : nullptr;
  if (pin != nullptr) {
    pin->store(id, std::memory_order_relaxed);
    compiler_barrier();
  }
  const uint32_t row = stacks_.row(id);
  if (test_hook_ != nullptr) [[unlikely]]
    test_hook_(TestPoint::kCounting, test_ctx_);
  if (sampled) {
    const Weight w = weight_of(e.size, config_.sample_bytes);
    churn_.on_free(id, row, w.fixed_calls, w.bytes, lifetime, temporary);
  } else {
    churn_.on_free(id, row, kCountOne, e.size, lifetime, temporary);
  }
  if (pin != nullptr) pin->store(0, std::memory_order_release);
}

bool Tracker::table_remove(ThreadState* ts, uint64_t address, LiveEntry* out) {
  if (!enter_table(ts)) return false;
  const bool found = table_.remove(address, out);
  leave_table(ts);
  if (found) {
    bump_own(ts, ts->removes, 1);
    bump_own(ts, ts->remove_bytes, out->size);
  }
  return found;
}

void Tracker::on_alloc(mi_fn fn, void* p, size_t size) {
  const uint32_t mode = mode_.load(std::memory_order_relaxed);
  if (mode == MI_MODE_OFF) return;
  if (mode == MI_MODE_SAMPLE) {
    if (p != nullptr && sample_due(size) && sample_take(size)) on_sampled_alloc(fn, p, size);
    return;
  }
  ThreadState* ts = thread_state();
  bump_own(ts, ts->calls[fn], 1);
  if (p == nullptr) {
    unpin_taken(ts);
    return;
  }
  if (mode == MI_MODE_COUNTERS) {
    bump_own(ts, ts->bytes_allocated, usable_ != nullptr ? usable_(p) : size);
    unpin_taken(ts);
    return;
  }
  if (ts->shared == 0) ts->last_alloc = reinterpret_cast<uintptr_t>(p);
  if (record(ts, reinterpret_cast<uintptr_t>(p), size, false))
    bump_own(ts, ts->bytes_allocated, size);
}

int64_t Tracker::draw_interval(ThreadState* ts) {
  if (ts->shared == 0) return sampler_next_interval(ts->sampler, config_.sample_bytes);
  // Many threads share this state's generator: draw from a private one
  // seeded from this thread's stack address and the clock.
  SamplerState local{};
  int here = 0;
  local.rng = mix(reinterpret_cast<uintptr_t>(&here) ^ clock_()) | 1;
  return sampler_next_interval(local, config_.sample_bytes);
}

bool Tracker::sample_take(size_t size) {
  ThreadState* ts = thread_state();
  if (!t_sample_armed) [[unlikely]] {
    // First allocation of this thread: the sample points are a Poisson
    // process, memoryless, so starting the countdown here is exact.
    t_sample_armed = true;
    const int64_t draw = draw_interval(ts);
    t_sample_left = draw - static_cast<int64_t>(size);
    if (ts->shared == 0) ts->sample_base = draw;  // byte position: sample_base - t_sample_left
    if (t_sample_left > 0) return false;
  } else if (t_sample_left > 0) {
    return false;  // the countdown was not run for this call (mode changed meanwhile)
  }
  // Several sample points may fall inside one large block: it is still one
  // sample, and p(size) accounts for that. The next interval starts afresh
  // (memoryless), as sampler_hit() does. The byte position stays.
  const int64_t draw = draw_interval(ts);
  if (ts->shared == 0) ts->sample_base = ts->sample_base - t_sample_left + draw;
  t_sample_left = draw;
  return true;
}

void Tracker::on_sampled_alloc(mi_fn fn, void* p, size_t size) {
  if (p == nullptr) return;
  ThreadState* ts = thread_state();
  if (ts->shared == 0) {
    ts->last_alloc = reinterpret_cast<uintptr_t>(p);
    ts->last_pos = ts->sample_base - t_sample_left;
  }
  const Weight w = weight_of(size, config_.sample_bytes);
  bump_own(ts, ts->calls[fn], w.calls);
  if (record(ts, reinterpret_cast<uintptr_t>(p), size, true))
    bump_own(ts, ts->bytes_allocated, w.bytes);
}

void Tracker::account_free(ThreadState* ts, uint32_t mode, mi_fn fn, const LiveEntry* e,
                           size_t usable) {
  if (mode == MI_MODE_SAMPLE) {
    // Only sampled blocks are seen: count what their allocation counted.
    if (e == nullptr || (e->stack_id & kSampledBit) == 0) return;
    const Weight w = weight_of(e->size, config_.sample_bytes);
    bump_own(ts, ts->calls[fn], w.calls);
    bump_own(ts, ts->bytes_freed, w.bytes);
    return;
  }
  bump_own(ts, ts->calls[fn], 1);
  if (mode == MI_MODE_COUNTERS)
    bump_own(ts, ts->bytes_freed, usable_ != nullptr ? usable : (e != nullptr ? e->size : 0));
  else if (e != nullptr)  // full: only what the table recorded
    bump_own(ts, ts->bytes_freed, e->size);
}

void Tracker::on_free(mi_fn fn, void* p, bool quiet) {
  const uint32_t mode = mode_.load(std::memory_order_relaxed);
  if (mode == MI_MODE_OFF) return;
  ThreadState* ts = thread_state();
  if (p == nullptr) {
    if (mode != MI_MODE_SAMPLE && !quiet) bump_own(ts, ts->calls[fn], 1);
    return;
  }
  if (mode == MI_MODE_COUNTERS) {
    if (!quiet) account_free(ts, mode, fn, nullptr, usable(p));
    return;
  }
  LiveEntry e;
  const bool found = table_remove(ts, reinterpret_cast<uintptr_t>(p), &e);
  if (found) churn_free(ts, e);
  if (!found && quiet) return;  // mallocinfo's own block: never counted
  if (!found && mode == MI_MODE_FULL) bump_own(ts, ts->frees_untracked, 1);
  account_free(ts, mode, fn, found ? &e : nullptr, 0);
}

bool Tracker::take(void* p, LiveEntry* out) {
  if (p == nullptr) return false;
  const uint32_t mode = mode_.load(std::memory_order_relaxed);
  if (mode == MI_MODE_OFF || mode == MI_MODE_COUNTERS) return false;
  ThreadState* ts = thread_state();
  const uint32_t e = stacks_.epoch();
  if (!table_remove(ts, reinterpret_cast<uintptr_t>(p), out)) return false;
  // Until restore() re-inserts it, the entry's stack is referenced only
  // from here: pin it like a freshly interned one (stamp first). The
  // shared state does not pin (its slots would leak on the success path);
  // restore() then checks the id instead.
  const uint32_t id = out->stack_id & ~kSampledBit;
  if (id != 0 && ts->shared == 0) {
    const uint32_t kept = stacks_.hold(id, e) ? pin_id(&ts->pending, id, e, nullptr) : 0;
    out->stack_id = kept | (out->stack_id & kSampledBit);
  }
  return true;
}

void Tracker::freed(mi_fn fn, const LiveEntry* e, size_t usable) {
  // The realloc succeeded: the taken entry is gone for good and its stack
  // needs no pin (released before the mode test: a switch to off meanwhile
  // must not leave it pinned).
  if (t_state != nullptr && t_state->owner == this) unpin_taken(t_state);
  const uint32_t mode = mode_.load(std::memory_order_relaxed);
  if (mode == MI_MODE_OFF) return;
  ThreadState* ts = thread_state();
  if (e != nullptr && mode != MI_MODE_COUNTERS) churn_free(ts, *e);
  if (mode == MI_MODE_SAMPLE) {
    // The realloc's own call is counted with its new block, if sampled.
    if (e == nullptr || (e->stack_id & kSampledBit) == 0) return;
    bump_own(ts, ts->bytes_freed, weight_of(e->size, config_.sample_bytes).bytes);
    return;
  }
  if (mode == MI_MODE_COUNTERS)
    bump_own(ts, ts->bytes_freed, usable_ != nullptr ? usable : (e != nullptr ? e->size : 0));
  else if (e != nullptr)  // full: only what the table recorded
    bump_own(ts, ts->bytes_freed, e->size);
  (void)fn;
}

void Tracker::restore(const LiveEntry& e) {
  // Switched off meanwhile: the table was cleared and frees are not seen.
  const uint32_t mode = mode_.load(std::memory_order_relaxed);
  if (mode == MI_MODE_OFF || mode == MI_MODE_COUNTERS) return;
  ThreadState* ts = thread_state();
  LiveEntry entry = e;
  const uint32_t id = e.stack_id & ~kSampledBit;
  if (id != 0 && ts->shared != 0 && !stacks_.hold(id, stacks_.epoch()))
    entry.stack_id &= kSampledBit;
  int inserted = -1;  // -1 not tried (reset() closed the table), else whether it fit
  if (enter_table(ts)) {
    inserted =
        table_.insert(entry.address, entry.size, entry.timestamp_ns, entry.stack_id, entry.pid) ? 1
                                                                                                : 0;
    leave_table(ts);
  }
  if (inserted == 1) {
    bump_own(ts, ts->inserts, 1);
    bump_own(ts, ts->insert_bytes, e.size);
  } else if (inserted == 0) {
    bump_own(ts, ts->dropped, 1);
  }
  unpin_taken(ts);
}

void Tracker::count(mi_fn fn) {
  const uint32_t mode = mode_.load(std::memory_order_relaxed);
  if (mode == MI_MODE_OFF || mode == MI_MODE_SAMPLE) return;
  ThreadState* ts = thread_state();
  bump_own(ts, ts->calls[fn], 1);
  unpin_taken(ts);
}

uint64_t Tracker::clear_table() {
  ::pthread_mutex_lock(&clear_lock_);
  table_open_.store(false, std::memory_order_seq_cst);
  // Wait for the threads inside a table operation (a few hundred
  // instructions each) to leave it; then nobody writes the table and its
  // pages can be given back. A thread stopped inside one (a debugger) must
  // not hang us: after quiesce_rounds yields, clear without releasing.
  bool settled = false;
  for (unsigned round = 0; !settled; ++round) {
    settled = trim_busy_.load(std::memory_order_seq_cst) == 0;
    each_held_state([&](ThreadState& st) {
      if (st.table_busy.load(std::memory_order_seq_cst) != 0) settled = false;
    });
    if (settled || round >= config_.quiesce_rounds) break;
    ::sched_yield();
  }
  uint64_t bytes = 0;
  // What bytes_freed gains: each forgotten entry's bytes as its allocation
  // counted them (a sampled one's weight).
  struct Forgotten {
    uint64_t mean, bytes;
  } forgotten{config_.sample_bytes, 0};
  const LiveTable::ClearFn each = [](const LiveEntry& e, void* ctx) {
    auto* f = static_cast<Forgotten*>(ctx);
    f->bytes += (e.stack_id & kSampledBit) != 0 ? weight_of(e.size, f->mean).bytes : e.size;
  };
  const uint64_t n = settled ? table_.clear_and_release(&bytes, each, &forgotten)
                             : table_.clear(&bytes, each, &forgotten);
  cleared_.fetch_add(n, std::memory_order_relaxed);
  cleared_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  forgotten_bytes_.fetch_add(forgotten.bytes, std::memory_order_relaxed);
  if (!settled) unreleased_clears_.fetch_add(1, std::memory_order_relaxed);
  table_open_.store(true, std::memory_order_seq_cst);
  ::pthread_mutex_unlock(&clear_lock_);
  return n;
}

uint64_t Tracker::reset() {
  // Also the moment to drop cached unwind rules: code may have been
  // unloaded (a purged NIF) since they were learned.
  unwind_code_unmapped();
  const uint64_t n = clear_table();
  churn_.clear();
  churn_since_.store(clock_(), std::memory_order_relaxed);
  reclaim();
  return n;
}

void Tracker::status(mi_abi_status* out) const {
  mi_abi_status s{};
  s.mode = mode();
  s.stack_depth = config_.stack_depth;
  s.unwinder = MI_UNWINDER_CACHED;
  s.table_capacity = table_.capacity();
  s.table_bytes = table_.bytes_reserved();
  s.stacks = stacks_.count();
  s.stack_capacity = stacks_.capacity();
  s.stack_bytes = stacks_.bytes_reserved();
  // The region table is the interposer's, not the tracker's: abi_status()
  // adds it.
  s.tables_bytes =
      table_.bytes_reserved() + stacks_.bytes_reserved() + churn_.bytes_reserved() + states_bytes_;
  s.stacks_dropped = stacks_.dropped() + stacks_lost_.load(std::memory_order_relaxed);
  s.stacks_reclaimed = stacks_.reclaimed();
  s.stack_sweeps = sweeps_.load(std::memory_order_relaxed);
  s.stack_generations = stacks_.gen_period();
  s.sample_bytes = config_.sample_bytes;
  s.erlang_context = erlang_on_.load(std::memory_order_acquire) ? 1 : 0;
  s.churn_since_ns = churn_since_.load(std::memory_order_relaxed);
  uint64_t inserts = 0, insert_bytes = 0, removes = 0, remove_bytes = 0;
  const size_t seen = states_seen_.load(std::memory_order_acquire);
  for (size_t i = 0; i < seen && i < nstates_; ++i) {
    const ThreadState& t = states_[i];
    for (int f = 0; f < MI_FN_COUNT; ++f) s.calls[f] += t.calls[f].load(std::memory_order_relaxed);
    s.bytes_allocated += t.bytes_allocated.load(std::memory_order_relaxed);
    s.bytes_freed += t.bytes_freed.load(std::memory_order_relaxed);
    s.dropped += t.dropped.load(std::memory_order_relaxed);
    s.frees_untracked += t.frees_untracked.load(std::memory_order_relaxed);
    s.self_calls += t.self_calls.load(std::memory_order_relaxed);
    s.self_bytes += t.self_bytes.load(std::memory_order_relaxed);
    inserts += t.inserts.load(std::memory_order_relaxed);
    insert_bytes += t.insert_bytes.load(std::memory_order_relaxed);
    removes += t.removes.load(std::memory_order_relaxed);
    remove_bytes += t.remove_bytes.load(std::memory_order_relaxed);
  }
  s.bytes_freed += forgotten_bytes_.load(std::memory_order_relaxed);
  const uint64_t cleared = cleared_.load(std::memory_order_relaxed);
  const uint64_t cleared_bytes = cleared_bytes_.load(std::memory_order_relaxed);
  // Counters are read one by one while other threads run: clamp rather than
  // wrap when a remove is seen before its insert.
  s.live_entries = inserts > removes + cleared ? inserts - removes - cleared : 0;
  s.live_bytes =
      insert_bytes > remove_bytes + cleared_bytes ? insert_bytes - remove_bytes - cleared_bytes : 0;
  *out = s;
}

void Tracker::resident(mi_abi_resident* out) const {
  mi_abi_resident r{};
  const PageCounter pages = PageCounter::pagemap();
  r.live = table_.resident_bytes(pages);
  r.stacks = stacks_.resident_slot_bytes(pages) + stacks_.resident_record_bytes(pages) +
             stacks_.resident_map_bytes(pages);
  r.churn = churn_.resident_bytes(pages);
  r.threads = pages.count(states_, states_bytes_);
  const size_t seen = states_seen_.load(std::memory_order_acquire);
  for (size_t i = 0; i < seen && i < nstates_; ++i) {
    // A cache, once mapped, stays with its state until destroy().
    const UnwindCache* c = __atomic_load_n(&states_[i].unwind_cache, __ATOMIC_ACQUIRE);
    if (c != nullptr) r.threads += pages.count(c, unwind_cache_bytes());
  }
  *out = r;
}

// --- mapping hooks (issue 14) ---

unsigned Tracker::capture_frames(uint64_t* out, unsigned max) {
  uintptr_t buf[kMaxStackDepth + 8];
  size_t skip = 0;
  size_t keep = unwind_here(thread_state(), buf, &skip);
  if (keep > max) keep = max;
  for (size_t i = 0; i < keep; ++i) out[i] = buf[skip + i];
  return static_cast<unsigned>(keep);
}

}  // namespace mi::track
