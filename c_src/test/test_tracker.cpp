// Catch2 tests for the Tracker (track/tracker) on a fake unwinder and a
// fake clock: recording in full mode, the modes, per-thread counters.
// Stack reclamation is test_tracker_reclaim.cpp's.
#include "catch.h"

#include <cstdint>
#include <thread>
#include <vector>

#include "../track/tracker.h"
#include "track_fixture.h"

using namespace mi::track;
using namespace mi::test;

TEST_CASE("tracker full mode records blocks with stack and time", "[track][tracker]") {
  Tracker t;
  Config c;
  c.table_capacity = 4096;
  c.stack_capacity = 256;
  c.stack_depth = 4;
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  t.set_self_range(0x100, 0x200);  // "hook frames" to be cut from the top
  t_fake_stack = {0x150, 0x180, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000};

  t.on_alloc(MI_FN_MALLOC, addr(0x10000), 100);
  g_fake_now += 5'000'000;
  t.on_alloc(MI_FN_CALLOC, addr(0x20000), 200);
  t.on_alloc(MI_FN_MALLOC, nullptr, 300);  // failed allocation: counted, not recorded

  auto live = live_of(t);
  REQUIRE(live.size() == 2);
  CHECK(live[0x10000].size == 100);
  CHECK(live[0x20000].timestamp_ns - live[0x10000].timestamp_ns == 5'000'000);
  uint64_t frames[8];
  REQUIRE(t.stack(live[0x10000].stack_id, frames, 8) == 4);
  CHECK(frames[0] == 0x1000);  // own frames skipped, depth capped at 4
  CHECK(frames[3] == 0x4000);

  t.on_free(MI_FN_FREE, addr(0x10000));
  t.on_free(MI_FN_FREE, addr(0x99999));  // never recorded
  t.count(MI_FN_STRDUP);
  mi_abi_status s = status_of(t);
  CHECK(s.calls[MI_FN_MALLOC] == 2);
  CHECK(s.calls[MI_FN_CALLOC] == 1);
  CHECK(s.calls[MI_FN_FREE] == 2);
  CHECK(s.calls[MI_FN_STRDUP] == 1);
  CHECK(s.bytes_allocated == 300);
  CHECK(s.bytes_freed == 100);
  CHECK(s.live_entries == 1);
  CHECK(s.live_bytes == 200);
  CHECK(s.frees_untracked == 1);
  CHECK(s.stacks == 1);

  // realloc path: take, then restore on failure.
  LiveEntry old{};
  REQUIRE(t.take(addr(0x20000), &old));
  CHECK(live_of(t).empty());
  t.restore(old);
  CHECK(live_of(t).at(0x20000).size == 200);

  CHECK(t.reset() == 1);
  s = status_of(t);
  CHECK(s.live_entries == 0);
  CHECK(s.live_bytes == 0);
  t.destroy();
}

TEST_CASE("tracker modes", "[track][tracker]") {
  Tracker t;
  Config c;
  c.table_capacity = 1 << 16;
  c.stack_capacity = 256;
  c.mode = MI_MODE_COUNTERS;
  c.sample_bytes = 4096;
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  t_fake_stack = {0x1000};
  t.on_alloc(MI_FN_MALLOC, addr(0x10000), 100);
  CHECK(live_of(t).empty());
  CHECK(status_of(t).calls[MI_FN_MALLOC] == 1);

  REQUIRE(t.set_mode(MI_MODE_FULL));
  t.on_alloc(MI_FN_MALLOC, addr(0x20000), 100);
  CHECK(live_of(t).size() == 1);
  // counters mode still forgets freed blocks (else they would look leaked)
  REQUIRE(t.set_mode(MI_MODE_COUNTERS));
  t.on_free(MI_FN_FREE, addr(0x20000));
  CHECK(live_of(t).empty());

  REQUIRE(t.set_mode(MI_MODE_SAMPLE));
  uint64_t sampled_bytes = 0;
  for (uint64_t i = 0; i < 10000; ++i) t.on_alloc(MI_FN_MALLOC, addr(0x100000 + i * 64), 64);
  t.for_each_live([&](const LiveEntry& e) {
    CHECK((e.stack_id & kSampledBit) != 0);
    sampled_bytes += e.size;
  });
  // 640000 bytes at one sample per ~4096: about 156 samples.
  CHECK(sampled_bytes / 64 > 80);
  CHECK(sampled_bytes / 64 < 260);

  REQUIRE(t.set_mode(MI_MODE_OFF));
  CHECK(live_of(t).empty());  // off forgets the table
  const uint64_t before = status_of(t).calls[MI_FN_MALLOC];
  t.on_alloc(MI_FN_MALLOC, addr(0x30000), 1);
  CHECK(status_of(t).calls[MI_FN_MALLOC] == before);  // off records nothing
  CHECK_FALSE(t.set_mode(7));
  t.destroy();
}

TEST_CASE("tracker: a thread takes the lowest free state; an exited thread's counts stay",
          "[track][tracker][concurrency]") {
  Tracker t;
  init_small(t, 1 << 14);
  REQUIRE(t.hooks_sweep());     // reset() sweeps below (as the reclaim tests require)
  CHECK(t.states_seen() == 1);  // the shared state
  uint64_t next = 0x100000;
  const auto record_in_a_thread = [&] {
    const uint64_t a = next;
    next += 64;
    std::thread([&t, a] {
      t_fake_stack = {0x2000};
      t.on_alloc(MI_FN_MALLOC, addr(a), 16);
    }).join();
  };
  for (int i = 0; i < 20; ++i) record_in_a_thread();
  // Each thread gave its state back on exit and the next took it again.
  CHECK(t.states_seen() == 2);
  CHECK(status_of(t).calls[MI_FN_MALLOC] == 20);

  constexpr int kTogether = 6;
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kTogether; ++w) {
    threads.emplace_back([&, w] {
      t_fake_stack = {static_cast<uintptr_t>(0x3000 + w)};
      t.on_alloc(MI_FN_MALLOC, addr(0x200000 + static_cast<uint64_t>(w) * 64), 16);
      arrived.fetch_add(1);
      while (arrived.load() < kTogether) std::this_thread::yield();
    });
  }
  for (auto& th : threads) th.join();
  CHECK(t.states_seen() == 1 + kTogether);
  for (int i = 0; i < 5; ++i) record_in_a_thread();
  CHECK(t.states_seen() == 1 + kTogether);  // the lowest free state again
  mi_abi_status s = status_of(t);
  CHECK(s.calls[MI_FN_MALLOC] == 20 + kTogether + 5);
  CHECK(s.live_entries == 20 + kTogether + 5);
  CHECK(s.stacks == 1 + kTogether);
  // With every thread gone, reset() still forgets the table and frees
  // every stack (its sweep marks only held states' pending ids).
  CHECK(t.reset() == 20 + kTogether + 5);
  s = status_of(t);
  CHECK(s.live_entries == 0);
  CHECK(s.stacks == 0);
  t.destroy();
}

TEST_CASE("tracker: per-thread counters are exact after threads finish",
          "[track][tracker][concurrency]") {
  Tracker t;
  init_small(t, 1 << 18);
  constexpr int kThreads = 4, kOps = 20000;
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&, w] {
      t_fake_stack = {static_cast<uintptr_t>(0x1000 + w)};
      for (int i = 0; i < kOps; ++i) {
        const uint64_t a = (static_cast<uint64_t>(w + 1) << 32) + static_cast<uint64_t>(i) * 16;
        t.on_alloc(MI_FN_MALLOC, addr(a), 32);
        if (i % 2 == 0) t.on_free(MI_FN_FREE, addr(a));
      }
    });
  }
  std::thread reader([&] {
    for (int i = 0; i < 50; ++i) {
      mi_abi_status s{};
      t.status(&s);
      t.for_each_live([](const LiveEntry&) {});
    }
  });
  for (auto& th : threads) th.join();
  reader.join();
  const mi_abi_status s = status_of(t);
  CHECK(s.calls[MI_FN_MALLOC] == kThreads * kOps);
  CHECK(s.calls[MI_FN_FREE] == kThreads * kOps / 2);
  CHECK(s.live_entries == kThreads * kOps / 2);
  CHECK(s.live_bytes == kThreads * kOps / 2 * 32);
  CHECK(live_of(t).size() == kThreads * kOps / 2);
  CHECK(s.stacks == kThreads);
  CHECK(s.dropped == 0);
  t.destroy();
}
