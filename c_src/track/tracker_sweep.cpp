// The stack sweep: Tracker's reclamation of stacks no live entry
// references. The protocol and why it is safe are in tracker.h.
#include <errno.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "os_mem.h"
#include "tracker.h"

namespace mi::track {

namespace {

enum : uint32_t {
  kIdle = 0,
  kStarting = 1,
  kScan = 2,
  kCondemn = 3,
  kFinish = 4,
  kMove = 5,    // compaction: stacks stored high move down
  kSettle = 6,  // compaction: retired records back, free pages released
};
constexpr uint64_t kLowMask = (uint64_t{1} << 48) - 1;
// SweepControl::trim_cursor's states (0: idle).
constexpr uint64_t kTrimStarting = uint64_t{1} << 62;
constexpr uint64_t kTrimRunning = uint64_t{1} << 63;
// Slots per chunk: 1024 live-table slots are 32 KiB, a few us to scan.
constexpr size_t kChunk = 1024;
constexpr size_t kControlBytes = 4096;

constexpr uint64_t phase_word(uint32_t phase) {
  return uint64_t{phase} << 48;
}

size_t chunks_of(size_t slots) {
  return (slots + kChunk - 1) / kChunk;
}

// Which membarrier(2) this process can use, probed once.
enum : int { kBarrierUnknown, kBarrierExpedited, kBarrierGlobal, kBarrierNone };
std::atomic<int> g_barrier{kBarrierUnknown};

long membarrier(int cmd) {
  return ::syscall(__NR_membarrier, cmd, 0, 0);
}

int barrier_kind() {
  int k = g_barrier.load(std::memory_order_relaxed);
  if (k != kBarrierUnknown) return k;
  const int saved = errno;
  const long mask = membarrier(MEMBARRIER_CMD_QUERY);
  if (mask > 0 && (mask & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
      membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0)
    k = kBarrierExpedited;
  else if (mask > 0 && (mask & MEMBARRIER_CMD_GLOBAL) != 0)
    k = kBarrierGlobal;
  else
    k = kBarrierNone;
  errno = saved;
  g_barrier.store(k, std::memory_order_relaxed);
  return k;
}

// The churn table's rows follow the stack records compaction moves. A
// row whose stack a hook pins (the sorted pins the sweep collected after
// M3) is neither settled nor given back: the hook may still count there.
class ChurnRows final : public StackTable::RowOwner {
 public:
  // pins: the sorted pins (npins of them); known false when they are not
  // known (see pinned()).
  ChurnRows(ChurnTable& churn, const std::atomic<uint32_t>* pins, uint32_t npins, bool known)
      : churn_(churn), pins_(pins), npins_(npins), known_(known) {}
  void moved(uint32_t id, uint32_t from, uint32_t to) override { churn_.move_row(id, from, to); }
  void settle(uint32_t id, uint32_t from, uint32_t to) override { churn_.settle_row(id, from, to); }
  bool released(uint32_t first, uint32_t n) override {
    if (!known_) return false;  // keep them: see pinned()
    for (uint32_t r = first; r < first + n; ++r)
      if (const uint32_t id = churn_.row_id(r); id != 0 && pinned(id)) return false;
    churn_.release_rows(first, n);
    return true;
  }
  // True when a hook may be counting for stack `id` (or the pins are not
  // known: the barrier failed or there were too many).
  bool pinned(uint32_t id) const {
    if (!known_) return true;
    size_t lo = 0, hi = npins_;
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      const uint32_t v = pins_[mid].load(std::memory_order_relaxed);
      if (v == id) return true;
      if (v < id)
        lo = mid + 1;
      else
        hi = mid;
    }
    return false;
  }

 private:
  ChurnTable& churn_;
  const std::atomic<uint32_t>* pins_;
  uint32_t npins_;
  bool known_;
};

}  // namespace

bool Tracker::process_barrier(bool may_be_slow) {
  const int k = barrier_kind();
  // A hook may land here: leave errno as the caller's malloc found it.
  const int saved = errno;
  bool ok = false;
  if (k == kBarrierExpedited) {
    ok = membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
    // EPERM: not registered (a kernel that does not carry the
    // registration into a forked child); register and try again.
    if (!ok && errno == EPERM && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0)
      ok = membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
  }
  // The global barrier waits for an RCU grace period (ms): readers only.
  if (!ok && may_be_slow && k != kBarrierNone) ok = membarrier(MEMBARRIER_CMD_GLOBAL) == 0;
  errno = saved;
  return ok;
}

bool Tracker::sweep_init() {
  void* mem = os_map(kControlBytes);
  if (mem == nullptr) return false;
  // Without MADV_WIPEONFORK (Linux < 4.14) a child forked mid-sweep would
  // inherit chunks claimed by threads it does not have: no sweeps at all.
  if (::madvise(mem, kControlBytes, MADV_WIPEONFORK) != 0) {
    os_unmap(mem, kControlBytes);
    sweep_ = nullptr;
    hooks_sweep_ = false;
    return true;
  }
  sweep_ = static_cast<SweepControl*>(mem);
  hooks_sweep_ = barrier_kind() == kBarrierExpedited;
  return true;
}

void Tracker::sweep_destroy() {
  os_unmap(sweep_, kControlBytes);
  sweep_ = nullptr;
}

void Tracker::mark_pending(uint32_t e) {
  // A pending id may already be stale (its hook is about to notice and
  // intern again): mark() then does nothing, and that is no error.
  // Only held states: a thread publishes pending ids only while it holds
  // its state, and took it (held_, seq_cst) before its first one.
  each_held_state([&](ThreadState& st) {
    const uint32_t id = st.pending.load(std::memory_order_acquire);
    if (id != 0) stacks_.mark(id, e);
  });
  for (const std::atomic<uint32_t>& p : shared_pending_) {
    const uint32_t id = p.load(std::memory_order_acquire);
    if (id != 0 && id != kPendingClaimed) stacks_.mark(id, e);
  }
}

bool Tracker::sweep_start(bool from_hook) {
  if (sweep_ == nullptr || (from_hook && !hooks_sweep_)) return false;
  SweepControl& c = *sweep_;
  uint64_t cur = c.cursor.load(std::memory_order_relaxed);
  if ((cur >> 48) != kIdle) return false;
  if (!c.cursor.compare_exchange_strong(cur, phase_word(kStarting), std::memory_order_acq_rel,
                                        std::memory_order_relaxed))
    return false;
  const uint32_t e = stacks_.begin_sweep();
  // M1. On failure the epoch moved for nothing: hooks re-stamp and go on.
  // A hook's barrier that failed asks again only a step of new stacks
  // later, not at the next allocation.
  if (!process_barrier(!from_hook)) {
    if (from_hook) stacks_.defer_sweep();
    c.cursor.store(phase_word(kIdle), std::memory_order_release);
    return false;
  }
  mark_pending(e);
  // Counted before the scan is published: a reclaim() that read the count
  // before this waits for this sweep. This exchange and reclaim()'s
  // fetch_add(0) are read-modify-writes of one atomic, so one comes first
  // in its order: either reclaim() reads this count, or this exchange
  // reads reclaim()'s write (acquire of its release) and this sweep's scan
  // sees the table as reclaim()'s caller left it. RMWs rather than seq_cst
  // fences: the same argument in the C++ model, and one ThreadSanitizer
  // models (GCC refuses fences under -fsanitize=thread, -Werror=tsan).
  // Stored rather than added: only one sweep starts at a time, and a child
  // forked between a start and its end (the control page wiped, the counts
  // not) is back in step at its first sweep.
  sweeps_started_.exchange(sweeps_.load(std::memory_order_acquire) + 1, std::memory_order_acq_rel);
  c.epoch.store(e, std::memory_order_relaxed);
  c.freed.store(0, std::memory_order_relaxed);
  c.done.store(phase_word(kScan), std::memory_order_relaxed);
  c.cursor.store(phase_word(kScan), std::memory_order_release);
  return true;
}

bool Tracker::sweep_chunk(bool from_hook) {
  SweepControl& c = *sweep_;
  if ((c.cursor.load(std::memory_order_relaxed) >> 48) < kScan) return false;
  // The phase travels with the chunk number, so a thread that read an old
  // phase still does the work of the phase its chunk belongs to.
  const uint64_t cur = c.cursor.fetch_add(1, std::memory_order_acq_rel);
  const uint32_t phase = static_cast<uint32_t>(cur >> 48);
  const size_t k = static_cast<size_t>(cur & kLowMask);
  const size_t total = phase_chunks(phase);
  if (phase < kScan || k >= total) return false;
  const uint32_t e = c.epoch.load(std::memory_order_relaxed);
  const size_t lo = k * kChunk;
  const size_t hi = lo + kChunk;
  if (phase == kScan) {
    table_.for_each_stack(lo, hi, [&](uint32_t id) {
      id &= ~kSampledBit;
      if (id != 0 && !stacks_.mark(id, e)) stale_.fetch_add(1, std::memory_order_relaxed);
    });
  } else if (phase == kCondemn) {
    stacks_.condemn(lo, hi, e);
  } else if (phase == kFinish) {
    c.freed.fetch_add(stacks_.finish(lo, hi, e), std::memory_order_relaxed);
  } else {
    uint32_t target[StackTable::kClasses];
    for (unsigned i = 0; i < StackTable::kClasses; ++i)
      target[i] = c.target[i].load(std::memory_order_relaxed);
    ChurnRows rows(churn_, c.pins, c.npins.load(std::memory_order_relaxed),
                   phase == kSettle && c.pins_known.load(std::memory_order_relaxed));
    const auto chunk = static_cast<uint32_t>(k);
    if (phase == kMove) {
      c.moved.fetch_add(stacks_.compact_move(chunk, target, &rows), std::memory_order_relaxed);
    } else {
      stacks_.compact_settle(chunk, &rows, [&](uint32_t id) { return rows.pinned(id); });
      uint32_t kept = 0;
      stacks_.compact_release(chunk, target, &rows, &kept);
      if (kept != 0) c.rows_kept.fetch_or(kept, std::memory_order_relaxed);
    }
  }
  const uint64_t d = c.done.fetch_add(1, std::memory_order_acq_rel) + 1;
  if ((d & kLowMask) == total) sweep_advance(phase, e, from_hook);
  return true;
}

void Tracker::sweep_advance(uint32_t phase, uint32_t e, bool from_hook) {
  SweepControl& c = *sweep_;
  if (phase == kScan) {
    c.done.store(phase_word(kCondemn), std::memory_order_relaxed);
    c.cursor.store(phase_word(kCondemn), std::memory_order_release);
  } else if (phase == kCondemn) {
    // M2: every condemnation is now visible to hooks, and every pending id
    // and stamp a hook published before it is visible here. Without it,
    // finish must keep everything (epoch 0: every stamp is >= 0).
    uint32_t finish_epoch = 0;
    if (process_barrier(!from_hook)) {
      mark_pending(e);
      finish_epoch = e;
    }
    c.epoch.store(finish_epoch, std::memory_order_relaxed);
    c.done.store(phase_word(kFinish), std::memory_order_relaxed);
    c.cursor.store(phase_word(kFinish), std::memory_order_release);
  } else if (phase == kFinish) {
    // The compaction, still inside the sweep: no other sweep frees or
    // condemns while records move, and the table asks for the sweep
    // (swept(), end_sweep() only at the end) until it ends, so hooks
    // carry its chunks.
    stacks_.swept(c.freed.load(std::memory_order_relaxed));
    uint32_t target[StackTable::kClasses];
    stacks_.compact_begin(target);
    if (!stacks_.compact_wanted(target)) {
      sweep_end();
      return;
    }
    for (unsigned i = 0; i < StackTable::kClasses; ++i)
      c.target[i].store(target[i], std::memory_order_relaxed);
    c.moved.store(0, std::memory_order_relaxed);
    c.rows_kept.store(0, std::memory_order_relaxed);
    c.done.store(phase_word(kMove), std::memory_order_relaxed);
    c.cursor.store(phase_word(kMove), std::memory_order_release);
  } else if (phase == kMove) {
    // M3: a hook counts on a stack's churn row while it pins the stack's
    // id (record() and churn_free()). One that read a moved stack's old
    // row, or the row of a stack the sweep freed, has its pin visible
    // now; one that pins later reads the new row (or finds the old one
    // given up). Pinned stacks keep their old rows until the next
    // compaction.
    collect_pins(from_hook);
    c.done.store(phase_word(kSettle), std::memory_order_relaxed);
    c.cursor.store(phase_word(kSettle), std::memory_order_release);
  } else {
    uint32_t target[StackTable::kClasses];
    for (unsigned i = 0; i < StackTable::kClasses; ++i)
      target[i] = c.target[i].load(std::memory_order_relaxed);
    stacks_.compact_end(target, c.rows_kept.load(std::memory_order_relaxed));
    stacks_moved_.fetch_add(c.moved.load(std::memory_order_relaxed), std::memory_order_relaxed);
    sweep_end();
  }
}

void Tracker::sweep_end() {
  SweepControl& c = *sweep_;
  // A sweep a trim asked for that freed less than an eighth of the
  // stacks: the trims were churn's, ask half as often (see trim_finish()).
  if (c.trim_sweep.exchange(false, std::memory_order_relaxed)) {
    const uint64_t freed = c.freed.load(std::memory_order_relaxed);
    const uint64_t gap = c.trim_sweep_gap.load(std::memory_order_relaxed);
    uint64_t next = kTrimSweepGapNs;
    if (freed * 8 < stacks_.count() + freed) {
      next = gap != 0 ? gap * 2 : kTrimSweepGapNs * 2;
      if (next > kTrimSweepGapMaxNs) next = kTrimSweepGapMaxNs;
    }
    c.trim_sweep_gap.store(next, std::memory_order_relaxed);
  }
  c.swept_at.store(clock_(), std::memory_order_relaxed);
  // What the sweep freed was counted at its finish (swept()).
  stacks_.end_sweep(0);
  // A trim asked while this sweep ran, perhaps after its scan passed the
  // blocks it saw freed: the next sweep is for it.
  if (c.trim_sweep_again.exchange(false, std::memory_order_relaxed)) {
    c.trim_sweep.store(true, std::memory_order_relaxed);
    stacks_.want_sweep_now();
  }
  // Records left retired go back only at the next compaction.
  if (stacks_.retired_count() != 0) stacks_.want_sweep_soon();
  sweeps_.fetch_add(1, std::memory_order_release);
  sweep_->cursor.store(phase_word(kIdle), std::memory_order_release);
}

size_t Tracker::phase_chunks(uint32_t phase) const {
  if (phase == kScan) return chunks_of(table_.positions());
  if (phase == kMove || phase == kSettle) return stacks_.compact_chunks();
  return chunks_of(stacks_.capacity());
}

void Tracker::collect_pins(bool from_hook) {
  SweepControl& c = *sweep_;
  c.pins_known.store(false, std::memory_order_relaxed);
  if (!process_barrier(!from_hook)) return;
  uint32_t* pins = c.scratch;  // sorted here, then published
  size_t n = 0;
  bool overflow = false;
  auto add = [&](uint32_t id) {
    if (id == 0 || id == kPendingClaimed) return;
    if (n == kSettlePins)
      overflow = true;
    else
      pins[n++] = id;
  };
  each_held_state([&](ThreadState& st) { add(st.pending.load(std::memory_order_acquire)); });
  for (const std::atomic<uint32_t>& p : shared_pending_) add(p.load(std::memory_order_acquire));
  if (overflow) return;
  std::sort(pins, pins + n);
  for (size_t i = 0; i < n; ++i) c.pins[i].store(pins[i], std::memory_order_relaxed);
  c.npins.store(static_cast<uint32_t>(n), std::memory_order_relaxed);
  c.pins_known.store(true, std::memory_order_relaxed);
}

void Tracker::sweep_hook_step() {
  if (sweep_active())
    sweep_chunk(true);
  else if (stacks_.wants_sweep())
    sweep_start(true);
}

void Tracker::trim_due(uint64_t now) {
  // One caller a second: the others see the new time (a lost race only
  // means two threads look at the dirty count).
  trim_due_ns_.store(now + kTrimGapNs, std::memory_order_relaxed);
  if (table_.dirty_words() >= LiveTable::kTrimAt) trim_step(true, true);
}

bool Tracker::trim_step(bool start, bool asked) {
  if (sweep_ == nullptr) return false;
  SweepControl& c = *sweep_;
  uint64_t cur = c.trim_cursor.load(std::memory_order_acquire);
  if (cur == 0) {
    if (!start && !table_.wants_trim()) return false;
    if (!c.trim_cursor.compare_exchange_strong(cur, kTrimStarting, std::memory_order_acq_rel,
                                               std::memory_order_relaxed))
      return false;
    const size_t total = table_.trim_begin();
    c.trim_total.store(total, std::memory_order_relaxed);
    c.trim_done.store(0, std::memory_order_relaxed);
    c.trim_released.store(0, std::memory_order_relaxed);
    c.trim_asked.store(asked, std::memory_order_relaxed);
    if (total == 0) {
      trim_finish(0);
      return true;
    }
    // Release: a thread that claims a chunk sees trim_begin()'s bounds.
    c.trim_cursor.store(kTrimRunning, std::memory_order_release);
    cur = kTrimRunning;
  }
  // Chunks are claimed by CAS, never by an add: an add by a thread that
  // read an older trim's cursor would turn an idle cursor into garbage.
  // A CAS that meets a newer trim's cursor at the same chunk claims that
  // trim's chunk, which is as good.
  uint64_t k;
  for (;;) {
    if ((cur & kTrimRunning) == 0) return false;  // idle or starting
    k = cur & ~kTrimRunning;
    if (k >= c.trim_total.load(std::memory_order_acquire)) return false;  // all claimed
    if (c.trim_cursor.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel,
                                            std::memory_order_acquire))
      break;
  }
  // This trim's (the CAS acquired its cursor, published after its total).
  const uint64_t total = c.trim_total.load(std::memory_order_relaxed);
  if (k >= total) return false;
  // With the table closed the chunk is skipped, and still counts as done,
  // so the trim ends.
  size_t released = 0;
  trim_busy([&] {
    if (test_hook_ != nullptr) [[unlikely]]
      test_hook_(TestPoint::kTrimming, test_ctx_);
    released = table_.trim(static_cast<size_t>(k));
  });
  if (released != 0) c.trim_released.fetch_add(released, std::memory_order_relaxed);
  if (c.trim_done.fetch_add(1, std::memory_order_acq_rel) + 1 == total)
    trim_finish(c.trim_released.load(std::memory_order_relaxed));
  return true;
}

void Tracker::trim_finish(uint64_t released) {
  // trim_end() reads the pools' maps. With the table closed it is
  // skipped: the table keeps asking (trim_begin() set that), and a later
  // trim ends it.
  trim_busy([&] {
    table_.trim_end(static_cast<size_t>(released),
                    sweep_->trim_asked.load(std::memory_order_relaxed));
  });
  live_trimmed_.fetch_add(released, std::memory_order_relaxed);
  // Pages given back by a hooks' trim may mean blocks freed in bulk,
  // whose stacks no live block uses now. Sweeps come with new stacks only
  // (StackTable::wants_sweep()), so a node whose start-up freed most of
  // what it allocated would keep those stacks, their records and churn
  // rows until it stored more (a preloaded RabbitMQ, drained: 4,930
  // stacks stored, 980 of them used). So such a trim asks for a sweep
  // too, in a table with stacks enough to matter, at most one a gap (a
  // sweep reads every live entry and stack slot). The pages may also be
  // churn's (released counts pages a trim gave back before): a sweep that
  // then frees little doubles the gap (sweep_end()).
  SweepControl& c = *sweep_;
  const uint64_t swept_at = c.swept_at.load(std::memory_order_relaxed);
  const uint64_t now = clock_();
  const uint64_t gap = c.trim_sweep_gap.load(std::memory_order_relaxed);
  if (released != 0 && hooks_sweep_ && c.trim_asked.load(std::memory_order_relaxed) &&
      stacks_.count() >= kTrimSweepStacks && now >= swept_at &&
      now - swept_at >= (gap != 0 ? gap : kTrimSweepGapNs)) {
    if (sweep_active()) {
      c.trim_sweep_again.store(true, std::memory_order_relaxed);
    } else {
      c.trim_sweep.store(true, std::memory_order_relaxed);
      stacks_.want_sweep_now();
    }
  }
  trim_due_ns_.store(now + kTrimGapNs, std::memory_order_relaxed);
  live_trims_.fetch_add(1, std::memory_order_release);
  c.trim_cursor.store(0, std::memory_order_release);
}

size_t Tracker::trim_live() {
  if (sweep_ == nullptr) return 0;
  // Help a running trim to its end, then run one of our own. A thread
  // stopped holding a chunk (a debugger) must not hang the caller: give up
  // after quiesce_rounds yields in a row.
  auto drive = [this](bool start, auto&& more) {
    for (unsigned idle = 0; more() && idle <= config_.quiesce_rounds;) {
      if (trim_step(start, !start)) {
        idle = 0;
      } else {
        ++idle;
        ::sched_yield();
      }
    }
  };
  drive(false, [&] { return sweep_->trim_cursor.load(std::memory_order_acquire) != 0; });
  const uint64_t before = live_trimmed_.load(std::memory_order_relaxed);
  const uint64_t trims = live_trims_.load(std::memory_order_relaxed);
  drive(true, [&] { return live_trims_.load(std::memory_order_acquire) == trims; });
  return static_cast<size_t>(live_trimmed_.load(std::memory_order_relaxed) - before);
}

uint64_t Tracker::reclaim() {
  if (sweep_ == nullptr) return 0;
  if (barrier_kind() == kBarrierNone) {
    trim_live();
    return 0;
  }
  const uint64_t freed_before = stacks_.reclaimed();
  // Wait for the first sweep counted after this point, whoever starts it:
  // its scan reads the table as the caller left it (this RMW releases the
  // caller's writes, a clear, to sweep_start()'s exchange: see there).
  // Waiting for a sweep of our own instead could starve: a hook may start
  // the next one each time the last ends, before this thread runs again.
  const uint64_t target = sweeps_started_.fetch_add(0, std::memory_order_acq_rel) + 1;
  while (sweeps_.load(std::memory_order_acquire) < target) {
    if (sweep_active()) {
      // Help whichever sweep runs; when every chunk is claimed, the
      // threads holding them finish in a few us.
      if (!sweep_chunk(false)) ::sched_yield();
      continue;
    }
    // Idle: start one. When that fails and nothing runs, the barrier
    // failed: nothing more to do here.
    if (!sweep_start(false) && !sweep_active()) break;
  }
  // The entries the caller freed may have left chunks free too.
  trim_live();
  return stacks_.reclaimed() - freed_before;
}

}  // namespace mi::track
