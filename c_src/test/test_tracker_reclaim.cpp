// Catch2 tests for the Tracker's stack reclamation (track/tracker_sweep):
// reset and reclaim, sweeps run by hooks chunk by chunk, a sweep racing a
// hook at each test point, concurrent sweeping, a child forked mid-sweep.
#include <sys/wait.h>
#include <unistd.h>

#include "catch.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "../track/tracker.h"
#include "track_fixture.h"

using namespace mi::track;
using namespace mi::test;

namespace {

// One thread inside on_alloc(malloc, address, size) with `stack` as its
// stack, parked at test point `at` until finish().
struct ParkedAlloc : Parking {
  TestPoint at;
  std::thread thread;
  ParkedAlloc(Tracker& t, TestPoint point, std::vector<uintptr_t> stack, uintptr_t address,
              size_t size)
      : at(point) {
    t.set_test_hook(&ParkedAlloc::hook, this);
    thread = std::thread([&t, stack, address, size] {
      t_fake_stack = stack;
      t.on_alloc(MI_FN_MALLOC, addr(address), size);
    });
    wait_parked();
  }
  static void hook(TestPoint p, void* ctx) {
    auto* self = static_cast<ParkedAlloc*>(ctx);
    if (p == self->at) Parking::hook(ctx);
  }
  void finish(Tracker& t) {
    release();
    thread.join();
    t.set_test_hook(nullptr, nullptr);
  }
  // A failed check between construction and finish() must not leave the
  // thread parked (std::thread's destructor would terminate the run).
  ~ParkedAlloc() {
    if (thread.joinable()) {
      release();
      thread.join();
    }
  }
};

// Live entries of a tracker grouped by call site as a reader does it: ids
// merged by content, unknown stacks under 0. Frames -> {count, bytes}.
std::map<std::vector<uint64_t>, std::pair<uint64_t, uint64_t>> sites_of(Tracker& t) {
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> by_id;
  t.for_each_live([&](const LiveEntry& e) {
    auto& s = by_id[e.stack_id & ~kSampledBit];
    s.first += 1;
    s.second += e.size;
  });
  std::map<std::vector<uint64_t>, std::pair<uint64_t, uint64_t>> out;
  for (const auto& [id, cb] : by_id) {
    uint64_t f[256];
    const unsigned n = t.stack(id, f, 256);
    auto& s = out[std::vector<uint64_t>(f, f + n)];
    s.first += cb.first;
    s.second += cb.second;
  }
  return out;
}

std::vector<uint64_t> stack_of(const Tracker& t, uint32_t id) {
  uint64_t f[256];
  const unsigned n = t.stack(id & ~kSampledBit, f, 256);
  return std::vector<uint64_t>(f, f + n);
}

// The fake stack of distinct call site number i.
std::vector<uintptr_t> site_stack(uint64_t i) {
  return {0x400000 + i * 16, 0x500000 + (i % 7) * 16, 0x600000, 0x700000};
}

// A tracker whose hooks run sweeps: by default 8 live-table chunks (1 <<
// 13 slots) and one stack-table chunk (256 stacks), so sweeps are wanted
// from 64 stacks on.
void init_sweeping(Tracker& t, size_t table = 1 << 13, size_t stacks = 256) {
  Config c;
  c.table_capacity = table;
  c.stack_capacity = stacks;
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  REQUIRE(t.hooks_sweep());
}

// A block of call site `site`, allocated and freed at once: its stack is
// stored, and no block keeps it.
void alloc_free(Tracker& t, uint64_t site) {
  t_fake_stack = site_stack(site);
  t.on_alloc(MI_FN_MALLOC, addr(0x100000), 8);
  t.on_free(MI_FN_FREE, addr(0x100000));
}

// A tracker on a live table of 64 Ki entries with `units` units of 64
// blocks of 16 bytes recorded (from kUnitBase, one call site).
// free_units() frees those not a multiple of `keep`: chunks given back
// all over the pools.
constexpr uint64_t kUnitBase = 0x7f0000000000ull;
void init_units(Tracker& t, uint64_t units, unsigned quiesce_rounds = 10000) {
  Config c;
  c.table_capacity = 1 << 16;
  c.stack_capacity = 1024;
  c.quiesce_rounds = quiesce_rounds;
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  t_fake_stack = site_stack(1);
  for (uint64_t u = 0; u < units; ++u)
    for (uint64_t j = 0; j < 64; ++j)
      t.on_alloc(MI_FN_MALLOC, addr(kUnitBase + u * 1024 + j * 16), 16);
}
// Frees units [0, n).
void free_units_below(Tracker& t, uint64_t n) {
  for (uint64_t u = 0; u < n; ++u)
    for (uint64_t j = 0; j < 64; ++j) t.on_free(MI_FN_FREE, addr(kUnitBase + u * 1024 + j * 16));
}
void free_units(Tracker& t, uint64_t units, uint64_t keep) {
  for (uint64_t u = 0; u < units; ++u)
    if (u % keep != 0)
      for (uint64_t j = 0; j < 64; ++j) t.on_free(MI_FN_FREE, addr(kUnitBase + u * 1024 + j * 16));
}

}  // namespace

TEST_CASE("tracker: reset frees every stack and reclaim frees unreferenced ones",
          "[track][tracker][reclaim]") {
  Tracker t;
  init_small(t);
  std::vector<uint32_t> ids;
  for (uint64_t i = 0; i < 100; ++i) {
    t_fake_stack = site_stack(i);
    t.on_alloc(MI_FN_MALLOC, addr(0x100000 + i * 64), 10);
  }
  t.for_each_live([&](const LiveEntry& e) { ids.push_back(e.stack_id); });
  REQUIRE(ids.size() == 100);
  CHECK(status_of(t).stacks == 100);
  // Nothing is unreferenced yet.
  CHECK(t.reclaim() == 0);
  CHECK(status_of(t).stacks == 100);
  // Free half: reclaim frees exactly those stacks; the others keep their
  // ids and frames.
  for (uint64_t i = 0; i < 100; i += 2) t.on_free(MI_FN_FREE, addr(0x100000 + i * 64));
  CHECK(t.reclaim() == 50);
  mi_abi_status s = status_of(t);
  CHECK(s.stacks == 50);
  CHECK(s.stacks_reclaimed == 50);
  CHECK(s.stack_sweeps == 2);
  t.for_each_live([&](const LiveEntry& e) {
    const uint64_t i = (e.address - 0x100000) / 64;
    const auto want = site_stack(i);
    CHECK(stack_of(t, e.stack_id) == std::vector<uint64_t>(want.begin(), want.end()));
  });
  CHECK(t.reset() == 50);
  s = status_of(t);
  CHECK(s.stacks == 0);
  CHECK(s.stacks_reclaimed == 100);
  for (uint32_t id : ids) CHECK(stack_of(t, id).empty());
  CHECK(t.stale_stacks() == 0);
  t.destroy();
}

TEST_CASE("tracker: a thread's memo of its last stack gives that stack's id, never a reclaimed one",
          "[track][tracker][reclaim]") {
  Tracker t;
  init_small(t);
  const auto a = site_stack(1);
  const std::vector<uint64_t> want_a(a.begin(), a.end());
  // One call site in a loop: one stack, one id (the memo's after the first).
  t_fake_stack = a;
  for (uint64_t i = 0; i < 100; ++i) t.on_alloc(MI_FN_MALLOC, addr(0x100000 + i * 64), 10);
  std::set<uint32_t> ids;
  t.for_each_live([&](const LiveEntry& e) { ids.insert(e.stack_id); });
  REQUIRE(ids.size() == 1);
  const uint32_t old = *ids.begin();
  CHECK(stack_of(t, old) == want_a);
  CHECK(status_of(t).stacks == 1);
  // Every block freed and the stack reclaimed while the thread's memo still
  // holds it: the next block of the same stack must get a stored stack,
  // not the memo's reclaimed id.
  for (uint64_t i = 0; i < 100; ++i) t.on_free(MI_FN_FREE, addr(0x100000 + i * 64));
  CHECK(t.reclaim() == 1);
  CHECK(stack_of(t, old).empty());
  t.on_alloc(MI_FN_MALLOC, addr(0x200000), 10);
  uint32_t again = 0;
  t.for_each_live([&](const LiveEntry& e) { again = e.stack_id; });
  CHECK(again != old);
  CHECK(stack_of(t, again) == want_a);
  t.on_free(MI_FN_FREE, addr(0x200000));
  // Call sites in turn (the memo misses, rests, refills), and runs of one
  // site between them: every block keeps its own site's frames.
  std::map<uint64_t, uint64_t> site_of;  // address -> site
  for (uint64_t i = 0; i < 2000; ++i) {
    const uint64_t site = (i / 50) % 2 == 0 ? 100 + i % 3 : 200 + (i / 50) % 5;
    t_fake_stack = site_stack(site);
    t.on_alloc(MI_FN_MALLOC, addr(0x300000 + i * 64), 10);
    site_of[0x300000 + i * 64] = site;
  }
  size_t checked = 0;
  t.for_each_live([&](const LiveEntry& e) {
    const auto want = site_stack(site_of.at(e.address));
    CHECK(stack_of(t, e.stack_id) == std::vector<uint64_t>(want.begin(), want.end()));
    ++checked;
  });
  CHECK(checked == 2000);
  CHECK(status_of(t).stacks == 9);  // the eight sites, and a's (stored again, not reclaimed since)
  t.destroy();
}

TEST_CASE("tracker: cycling 10x the stack capacity of call sites leaves a new leak named exactly",
          "[track][tracker][reclaim]") {
  Tracker t;
  Config c;
  c.table_capacity = 1 << 16;
  c.stack_capacity = 1 << 16;  // the default 64K stacks
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  REQUIRE(t.hooks_sweep());  // membarrier and MADV_WIPEONFORK are available
  // Every 4096th site stays referenced by a long-lived block: its id must
  // keep naming its own frames through every sweep.
  const uint64_t sites = 10 * c.stack_capacity;
  std::map<uint64_t, uint64_t> kept;  // address -> site
  for (uint64_t i = 0; i < sites; ++i) {
    t_fake_stack = site_stack(i);
    const uint64_t a = 0x10000000 + (i % 1024) * 64;
    if (i % 4096 == 0) {
      const uint64_t k = 0x90000000 + i * 16;
      t.on_alloc(MI_FN_MALLOC, addr(k), 24);
      kept[k] = i;
    }
    t.on_alloc(MI_FN_MALLOC, addr(a), 16);
    t.on_free(MI_FN_FREE, addr(a));
  }
  mi_abi_status s = status_of(t);
  INFO("stacks " << s.stacks << " reclaimed " << s.stacks_reclaimed << " sweeps "
                 << s.stack_sweeps);
  CHECK(s.stacks_dropped == 0);
  CHECK(s.stacks_reclaimed >= sites - c.stack_capacity);
  CHECK(s.stacks <= c.stack_capacity / 2);
  CHECK(s.dropped == 0);
  // The leak that starts in week three.
  t_fake_stack = {0xdead00, 0xbeef00, 0x600000, 0x700000};
  for (uint64_t i = 0; i < 1000; ++i) t.on_alloc(MI_FN_MALLOC, addr(0xa0000000 + i * 64), 100);
  const auto by_site = sites_of(t);
  const auto leak = by_site.find({0xdead00, 0xbeef00, 0x600000, 0x700000});
  REQUIRE(leak != by_site.end());
  CHECK(leak->second == std::make_pair(uint64_t{1000}, uint64_t{100000}));
  CHECK(by_site.count({}) == 0);  // every live block has its stack
  size_t checked = 0;
  t.for_each_live([&](const LiveEntry& e) {
    auto it = kept.find(e.address);
    if (it == kept.end()) return;
    const auto want = site_stack(it->second);
    CHECK(stack_of(t, e.stack_id) == std::vector<uint64_t>(want.begin(), want.end()));
    ++checked;
  });
  CHECK(checked == kept.size());
  CHECK(t.stale_stacks() == 0);
  CHECK(status_of(t).stacks_dropped == 0);
  t.destroy();
}

TEST_CASE(
    "tracker: a sweep between intern and pending publication frees the stack; the hook "
    "interns it again",
    "[track][tracker][reclaim][concurrency]") {
  Tracker t;
  init_small(t);
  ParkedAlloc parked(t, TestPoint::kInterned, {0x1234, 0x5678}, 0x40000, 77);
  // The stack is stored, referenced by nothing a sweep can see: no entry,
  // no pending id. The sweep frees it.
  CHECK(status_of(t).stacks == 1);
  CHECK(t.reclaim() == 1);
  CHECK(status_of(t).stacks == 0);
  parked.finish(t);
  // The hook saw the epoch move and its stack gone, and interned it again.
  const auto live = live_of(t);
  REQUIRE(live.size() == 1);
  CHECK(stack_of(t, live.at(0x40000).stack_id) == std::vector<uint64_t>{0x1234, 0x5678});
  CHECK(status_of(t).stacks == 1);
  CHECK(status_of(t).stacks_dropped == 0);
  CHECK(t.reclaim() == 0);  // now referenced by the entry
  CHECK(t.stale_stacks() == 0);
  t.destroy();
}

TEST_CASE("tracker: a sweep while a hook's id is pending keeps the stack",
          "[track][tracker][reclaim][concurrency]") {
  Tracker t;
  init_small(t);
  ParkedAlloc parked(t, TestPoint::kPinned, {0xabc0, 0xdef0}, 0x50000, 88);
  // Not in the live table yet, but pending: the sweep must keep it.
  CHECK(t.reclaim() == 0);
  CHECK(status_of(t).stacks == 1);
  parked.finish(t);
  const auto live = live_of(t);
  REQUIRE(live.size() == 1);
  const uint32_t id = live.at(0x50000).stack_id;
  CHECK(stack_of(t, id) == std::vector<uint64_t>{0xabc0, 0xdef0});
  t.on_free(MI_FN_FREE, addr(0x50000));
  CHECK(t.reclaim() == 1);
  CHECK(stack_of(t, id).empty());
  CHECK(t.stale_stacks() == 0);
  t.destroy();
}

TEST_CASE("tracker: realloc's taken entry keeps its stack through a sweep",
          "[track][tracker][reclaim]") {
  Tracker t;
  init_small(t);
  t_fake_stack = {0x7100, 0x7200};
  t.on_alloc(MI_FN_MALLOC, addr(0x60000), 40);
  LiveEntry taken{};
  REQUIRE(t.take(addr(0x60000), &taken));
  // Out of the table, pinned by this thread: a sweep keeps it.
  CHECK(t.reclaim() == 0);
  t.restore(taken);  // the realloc failed
  CHECK(stack_of(t, live_of(t).at(0x60000).stack_id) == std::vector<uint64_t>{0x7100, 0x7200});
  // A successful realloc drops the pin: the old stack can go.
  REQUIRE(t.take(addr(0x60000), &taken));
  t_fake_stack = {0x7300};
  t.on_alloc(MI_FN_REALLOC, addr(0x61000), 80);
  CHECK(t.reclaim() == 1);
  CHECK(stack_of(t, live_of(t).at(0x61000).stack_id) == std::vector<uint64_t>{0x7300});
  CHECK(t.stale_stacks() == 0);
  t.destroy();
}

TEST_CASE("tracker: hooks carry a sweep chunk by chunk; reclaim helps it finish, then runs its own",
          "[track][tracker][reclaim]") {
  Tracker t;
  init_sweeping(t);
  for (uint64_t i = 0; i < 63; ++i) alloc_free(t, i);
  CHECK(status_of(t).stack_sweeps == 0);
  // The 64th stack makes the table want a sweep: that allocation starts it
  // (barrier, pending ids), the next ones each scan one chunk.
  alloc_free(t, 63);
  for (uint64_t i = 0; i < 4; ++i) alloc_free(t, 0);
  mi_abi_status s = status_of(t);
  CHECK(s.stack_sweeps == 0);  // 4 of 8 scan chunks done, then condemn, finish
  CHECK(s.stacks == 64);
  // reclaim() helps that sweep to its end (site 0, re-interned while it
  // ran, is kept), then runs a sweep of its own, which frees site 0.
  CHECK(t.reclaim() == 64);
  s = status_of(t);
  CHECK(s.stack_sweeps == 2);
  CHECK(s.stacks == 0);
  CHECK(s.stacks_reclaimed == 64);
  CHECK(s.stacks_dropped == 0);
  t.destroy();
}

TEST_CASE("tracker: hooks carry a sweep's compaction to its end", "[track][tracker][reclaim]") {
  // 256 call sites (a 1,024-stack table wants a sweep there), the last 20
  // with a block live: their records are 235-254, above the compaction's
  // target (20 stacks, an eighth more and 64, in words of 64: 128). The
  // hooks that go on recording carry the sweep and its compaction chunk by
  // chunk, and the 20 move down, ids and frames unchanged.
  Tracker t;
  init_sweeping(t, 1 << 13, 1024);
  for (uint64_t i = 0; i < 235; ++i) alloc_free(t, i);
  for (uint64_t i = 235; i < 255; ++i) {
    t_fake_stack = site_stack(i);
    t.on_alloc(MI_FN_MALLOC, addr(0x200000 + 64 * i), 8);
  }
  CHECK(status_of(t).stack_sweeps == 0);
  alloc_free(t, 255);  // the 256th stack: the sweep starts
  for (int i = 0; i < 1000 && status_of(t).stack_sweeps == 0; ++i) alloc_free(t, 0);
  CHECK(status_of(t).stack_sweeps == 1);
  CHECK(t.stacks_moved() == 20);
  const auto live = live_of(t);
  REQUIRE(live.size() == 20);
  for (uint64_t i = 235; i < 255; ++i) {
    const std::vector<uintptr_t> want = site_stack(i);
    CHECK(stack_of(t, live.at(0x200000 + 64 * i).stack_id) ==
          std::vector<uint64_t>(want.begin(), want.end()));
  }
  t.destroy();
}

TEST_CASE("tracker: hooks trim the live table once a burst is freed; reclaim trims too",
          "[track][tracker][reclaim][memory]") {
  // 600 units of 64 blocks (2,400 big chunks, 300 pages), every sixth
  // kept. Freeing the rest dirties the pools' words; the next recorded
  // allocation starts a trim, and the ones after carry it to its end.
  constexpr uint64_t kBase = kUnitBase;
  Tracker t;
  init_units(t, 600);
  const uint64_t trims = t.live_trims();
  const size_t full = t.table_resident_bytes();
  free_units(t, 600, 6);
  CHECK(t.live_trims() == trims);  // frees never trim
  for (int i = 0; i < 100 && t.live_trims() == trims; ++i) alloc_free(t, 1);
  CHECK(t.live_trims() == trims + 1);
  // Half the pages at least (the kept units' share a page with a freed
  // one's, less what shared chains keep).
  CHECK(t.live_trimmed_bytes() >= 150 * 4096);
  CHECK(full - t.table_resident_bytes() >= 150 * 4096);  // resident, not only madvised
  CHECK(live_of(t).size() == 100 * 64);
  // Nothing freed since: quiet. reclaim() still trims, and finds nothing.
  const uint64_t bytes = t.live_trimmed_bytes();
  for (int i = 0; i < 100; ++i) alloc_free(t, 1);
  CHECK(t.live_trims() == trims + 1);
  t.reclaim();
  CHECK(t.live_trims() == trims + 2);
  CHECK(t.live_trimmed_bytes() == bytes);
  // A freed kept unit: reclaim() gives its pages back.
  for (uint64_t u = 0; u < 600; u += 6)
    for (uint64_t j = 0; j < 64; ++j) t.on_free(MI_FN_FREE, addr(kBase + u * 1024 + j * 16));
  t.reclaim();
  CHECK(t.live_trimmed_bytes() - bytes >= 100 * 4096);
  CHECK(live_of(t).empty());
  t.destroy();
}

TEST_CASE("tracker: a trim after a burst of frees asks for a stack sweep, at most one a second",
          "[track][tracker][reclaim][memory]") {
  // 600 units of 64 blocks from 1,200 call sites (two a unit), every
  // sixth unit kept:
  // the trim the frees bring on asks for a sweep (no new stack would: the
  // table wants one at 4,096), and the hooks after it free the stacks no
  // kept block uses. A second burst's trim within the second asks for
  // none; one a second later does.
  Tracker t;
  init_sweeping(t, 1 << 16, 65536);
  auto record = [&](uint64_t base) {
    for (uint64_t u = 0; u < 600; ++u)
      for (uint64_t j = 0; j < 64; ++j) {
        t_fake_stack = site_stack(100 + 2 * u + (j & 1));
        t.on_alloc(MI_FN_MALLOC, addr(base + u * 1024 + j * 16), 16);
      }
  };
  auto free_burst = [&](uint64_t base, bool kept) {
    for (uint64_t u = 0; u < 600; ++u)
      if ((u % 6 == 0) == kept)
        for (uint64_t j = 0; j < 64; ++j) t.on_free(MI_FN_FREE, addr(base + u * 1024 + j * 16));
  };
  // Hooks go on recording until a trim ends and the sweep it may have
  // asked for with it.
  auto settle = [&] {
    const uint64_t trims = t.live_trims();
    for (int i = 0; i < 100 && t.live_trims() == trims; ++i) alloc_free(t, 1);
    REQUIRE(t.live_trims() == trims + 1);
    for (int i = 0; i < 1000; ++i) alloc_free(t, 1);
  };
  constexpr uint64_t kB1 = kUnitBase, kB2 = kUnitBase + (uint64_t{1} << 30);
  const size_t kept_sites = 200;  // two a kept unit
  record(kB1);
  REQUIRE(status_of(t).stacks == 1200);
  free_burst(kB1, false);
  settle();
  mi_abi_status s = status_of(t);
  CHECK(s.stack_sweeps == 1);
  // The kept blocks' stacks, and site 1 (alloc_free()'s, re-interned).
  CHECK(s.stacks <= kept_sites + 1);
  CHECK(s.stacks >= kept_sites);
  // A second burst within the second: its trim asks for no sweep.
  record(kB2);
  REQUIRE(status_of(t).stacks >= 1024);
  const uint64_t trimmed = t.live_trimmed_bytes();
  free_burst(kB2, false);
  settle();
  CHECK(t.live_trimmed_bytes() > trimmed);
  CHECK(status_of(t).stack_sweeps == 1);
  // A second later, the next trim does.
  g_fake_now.fetch_add(1'000'000'000);
  free_burst(kB2, true);
  settle();
  s = status_of(t);
  CHECK(s.stack_sweeps == 2);
  CHECK(s.stacks <= kept_sites + 1);
  t.destroy();
}

TEST_CASE("tracker: sweeps that trims ask for and that free little come half as often",
          "[track][tracker][reclaim]") {
  // 1,200 call sites, a block each kept live: their stacks stay. Bursts
  // of 38,400 blocks from those sites, recorded and freed: each trim
  // gives pages back, but a sweep then frees nothing, so the next may
  // come only after twice the gap (2 s, then 4 s).
  Tracker t;
  init_sweeping(t, 1 << 16, 65536);
  for (uint64_t i = 0; i < 1200; ++i) {
    t_fake_stack = site_stack(100 + i);
    t.on_alloc(MI_FN_MALLOC, addr(0x200000 + 64 * i), 8);
  }
  constexpr uint64_t kBurst = kUnitBase;
  auto burst = [&] {
    for (uint64_t u = 0; u < 600; ++u)
      for (uint64_t j = 0; j < 64; ++j) {
        t_fake_stack = site_stack(100 + 2 * u + (j & 1));
        t.on_alloc(MI_FN_MALLOC, addr(kBurst + u * 1024 + j * 16), 16);
      }
    free_units_below(t, 600);
    const uint64_t trims = t.live_trims();
    for (int i = 0; i < 100 && t.live_trims() == trims; ++i) alloc_free(t, 1);
    REQUIRE(t.live_trims() == trims + 1);
    for (int i = 0; i < 1000; ++i) alloc_free(t, 1);
  };
  burst();
  CHECK(status_of(t).stack_sweeps == 1);  // asked for; freed next to nothing
  g_fake_now.fetch_add(1'000'000'000);
  burst();
  CHECK(status_of(t).stack_sweeps == 1);  // 1 s: the gap is 2 s now
  g_fake_now.fetch_add(1'000'000'000);
  burst();
  CHECK(status_of(t).stack_sweeps == 2);
  g_fake_now.fetch_add(2'000'000'000);
  burst();
  CHECK(status_of(t).stack_sweeps == 2);  // 2 s: the gap is 4 s now
  CHECK(status_of(t).stacks >= 1200);
  t.destroy();
}

TEST_CASE("tracker: a trim comes within a second of frees, however high the threshold",
          "[track][tracker][reclaim][memory]") {
  // Trims that gave nothing back leave the table waiting for twice as
  // many dirty words each time, up to every word. A burst of frees below
  // that (the first 80 of 600 units: whole pages, 5 words) brings on no
  // trim by the threshold; a second after the last trim, the next
  // recorded allocation trims anyway.
  Tracker t;
  init_units(t, 600);
  t.set_trim_threshold(1000);
  const uint64_t trims = t.live_trims(), bytes = t.live_trimmed_bytes();
  free_units_below(t, 80);
  for (int i = 0; i < 100; ++i) alloc_free(t, 1);
  CHECK(t.live_trims() == trims);
  g_fake_now.fetch_add(1'000'000'000);
  for (int i = 0; i < 100 && t.live_trims() == trims; ++i) alloc_free(t, 1);
  CHECK(t.live_trims() == trims + 1);
  CHECK(t.live_trimmed_bytes() - bytes >= 30 * 4096);
  // Within the next second, fewer words than the threshold: no trim.
  t.set_trim_threshold(1000);
  free_units_below(t, 160);
  for (int i = 0; i < 100; ++i) alloc_free(t, 1);
  CHECK(t.live_trims() == trims + 1);
  t.destroy();
}

TEST_CASE("tracker: a reset waits for a trim chunk, and keeps the pages if it cannot",
          "[track][tracker][reclaim]") {
  // A hook parked inside a trim chunk (claimed words in hand): clear_table()
  // must not empty and release the pools under it (it would re-initialize
  // the bitmaps the trim then unclaims: chunks handed out twice). It waits
  // its quiesce rounds, then clears without releasing; the trim goes on.
  constexpr uint64_t kBase = kUnitBase;
  Tracker t;
  init_units(t, 60, 50);
  free_units(t, 60, 6);
  // Only the first trim chunk parks (reset() helps the trim on, and
  // must not park itself).
  struct Once {
    Parking park;
    std::atomic<bool> taken{false};
  } once;
  Parking& park = once.park;
  t.set_test_hook(
      [](TestPoint p, void* ctx) {
        auto* o = static_cast<Once*>(ctx);
        if (p == TestPoint::kTrimming && !o->taken.exchange(true)) Parking::hook(&o->park);
      },
      &once);
  std::thread trimmer([&] {
    t_fake_stack = site_stack(1);
    t.on_alloc(MI_FN_MALLOC, addr(0x100000), 8);  // starts the trim: parks in its first chunk
  });
  park.wait_parked();
  const uint64_t unreleased = t.unreleased_clears();
  t.reset();
  CHECK(t.unreleased_clears() == unreleased + 1);
  park.release();
  trimmer.join();
  t.set_test_hook(nullptr, nullptr);
  // The table works: what is recorded now is there, once.
  CHECK(live_of(t).empty());
  for (uint64_t u = 0; u < 60; ++u)
    for (uint64_t j = 0; j < 64; ++j) t.on_alloc(MI_FN_MALLOC, addr(kBase + u * 1024 + j * 16), 16);
  CHECK(live_of(t).size() == 60 * 64);
  CHECK(status_of(t).dropped == 0);
  t.destroy();
}

TEST_CASE("tracker: concurrent recording, freeing and sweeping keep every id's own frames",
          "[track][tracker][reclaim][concurrency]") {
  Tracker t;
  Config c;
  c.table_capacity = 1 << 16;
  c.stack_capacity = 16384;  // 20000 sites: hooks sweep often
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  constexpr int kThreads = 3;
  constexpr uint64_t kOps = 30000;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> wrong{0}, reads{0};
  // A reader checks, while everything runs, that every live entry's stack
  // reads as its own frames or as nothing.
  std::thread reader([&] {
    while (!stop.load()) {
      t.for_each_live([&](const LiveEntry& e) {
        const uint64_t site = (e.address >> 4) & 0xFFFFF;
        const auto got = stack_of(t, e.stack_id);
        const auto want = site_stack(site);
        if (!got.empty() && got != std::vector<uint64_t>(want.begin(), want.end())) ++wrong;
        ++reads;
      });
      t.reclaim();
    }
  });
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&, w] {
      uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(w + 1);
      std::vector<uint64_t> held;
      for (uint64_t i = 0; i < kOps; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Addresses encode the site; each thread its own address range.
        const uint64_t site = x % 20000;
        t_fake_stack = site_stack(site);
        const uint64_t a = (static_cast<uint64_t>(w + 1) << 40) | (i << 24) | (site << 4);
        t.on_alloc(MI_FN_MALLOC, addr(a), 32);
        held.push_back(a);
        if (held.size() > 64) {
          const size_t at = x % held.size();
          t.on_free(MI_FN_FREE, addr(held[at]));
          held[at] = held.back();
          held.pop_back();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  reader.join();
  INFO("reads " << reads.load());
  CHECK(wrong.load() == 0);
  // Quiescent: every live entry names its own stack, or none when its
  // stack could not be stored: four threads on two cores can stall a sweep
  // (a thread descheduled inside a chunk) long enough for three others to
  // fill the table; such blocks are counted, never given a wrong stack.
  t.reclaim();
  size_t live = 0, unknown = 0;
  t.for_each_live([&](const LiveEntry& e) {
    const uint64_t site = (e.address >> 4) & 0xFFFFF;
    const auto want = site_stack(site);
    const auto got = stack_of(t, e.stack_id);
    if (got.empty())
      ++unknown;
    else
      CHECK(got == std::vector<uint64_t>(want.begin(), want.end()));
    ++live;
  });
  CHECK(live == kThreads * 64);
  const mi_abi_status s = status_of(t);
  CHECK(unknown <= s.stacks_dropped);
  CHECK(s.stack_sweeps > 0);
  CHECK(t.stale_stacks() == 0);
  // Only referenced stacks survive a quiescent sweep.
  CHECK(s.stacks <= live);
  t.destroy();
}

TEST_CASE("tracker: a child forked mid-sweep starts with no sweep and frees what was condemned",
          "[track][tracker][reclaim]") {
  Tracker t;
  init_sweeping(t);
  t_fake_stack = site_stack(5);
  t.on_alloc(MI_FN_MALLOC, addr(0x200000), 8);
  const uint32_t condemned_id = live_of(t).at(0x200000).stack_id;
  t.on_free(MI_FN_FREE, addr(0x200000));
  for (uint64_t i = 0; i < 64; ++i) alloc_free(t, i);  // the 64th starts a sweep
  for (int k = 0; k < 9; ++k) alloc_free(t, 0);        // 8 scan chunks, 1 condemn chunk
  // The sweep now waits in its finish phase with 63 stacks condemned (all
  // but site 0, interned during the sweep).
  uint64_t f[8];
  REQUIRE(status_of(t).stack_sweeps == 0);
  REQUIRE(t.stack(condemned_id, f, 8) == 4);  // FREEING still reads
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: no sweep in progress (its control page was wiped), so
    // reclaim() runs one of its own, which resolves the parent's
    // condemned stacks. Every stack is unreferenced here.
    int code = 0;
    if (t.reclaim() != 64) code |= 1;
    mi_abi_status s{};
    t.status(&s);
    if (s.stacks != 0) code |= 2;
    if (t.stack(condemned_id, f, 8) != 0) code |= 4;
    ::_exit(code);
  }
  REQUIRE(pid > 0);
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  // The parent's sweep goes on where it was (63 freed, site 0 kept), then
  // reclaim() runs its own (site 0 freed).
  CHECK(t.reclaim() == 64);
  CHECK(status_of(t).stack_sweeps == 2);
  CHECK(status_of(t).stacks == 0);
  t.destroy();
}
