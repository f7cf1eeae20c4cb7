// Catch2 tests for the tracker core (track/): live table, stack table,
// sampler, glob, and the Tracker with a fake unwinder and a fake clock.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "../track/glob.h"
#include "../track/live_table.h"
#include "../track/sampler.h"
#include "../track/stack_table.h"
#include "../track/tracker.h"

using namespace mi::track;

namespace {

std::map<uint64_t, LiveEntry> live_of(const LiveTable& t) {
  std::map<uint64_t, LiveEntry> m;
  t.for_each([&](const LiveEntry& e) { m[e.address] = e; });
  return m;
}

}  // namespace

TEST_CASE("glob_match", "[track][glob]") {
  CHECK(glob_match("beam*", "beam.smp"));
  CHECK(glob_match("beam*", "beam"));
  CHECK_FALSE(glob_match("beam*", "erlexec"));
  CHECK(glob_match("*", "anything"));
  CHECK(glob_match("*", ""));
  CHECK(glob_match("b?am.smp", "beam.smp"));
  CHECK(glob_match("[bc]eam*", "ceam"));
  CHECK_FALSE(glob_match("[!b]eam*", "beam"));
  CHECK(glob_match("[a-c]*", "bash"));
  CHECK(glob_match("*.smp", "beam.smp"));
  CHECK_FALSE(glob_match("*.smp", "beam.smpx"));
  CHECK(glob_match("*a*b*c", "xxaxxbxxc"));
  CHECK(glob_match("\\*", "*"));
  CHECK_FALSE(glob_match("\\*", "x"));
  CHECK(glob_match("[", "["));
  CHECK_FALSE(glob_match("", "x"));
}

TEST_CASE("live table insert, remove, iterate", "[track][table]") {
  LiveTable t;
  REQUIRE(t.init(1000));
  CHECK(t.capacity() == 1024);
  CHECK(t.bytes_reserved() >= 1024 * 32);
  for (uint64_t i = 1; i <= 500; ++i)
    REQUIRE(t.insert(i * 16, i, 1000 + i, static_cast<uint32_t>(i)));
  auto m = live_of(t);
  REQUIRE(m.size() == 500);
  CHECK(m[16 * 7].size == 7);
  CHECK(m[16 * 7].timestamp_ns == 1007);
  CHECK(m[16 * 7].stack_id == 7);

  LiveEntry e{};
  CHECK(t.remove(16 * 7, &e));
  CHECK(e.address == 16 * 7);
  CHECK(e.size == 7);
  CHECK(e.stack_id == 7);
  CHECK_FALSE(t.remove(16 * 7, &e));     // already gone
  CHECK_FALSE(t.remove(16 * 9999, &e));  // never there
  CHECK(live_of(t).size() == 499);

  // Tombstones are reused: churn far beyond capacity keeps working.
  for (int round = 0; round < 50; ++round) {
    for (uint64_t i = 1; i <= 400; ++i) REQUIRE(t.remove(i * 16, nullptr) == (round > 0 || i != 7));
    for (uint64_t i = 1; i <= 400; ++i) REQUIRE(t.insert(i * 16, i, 0, 1));
  }
  uint64_t bytes = 0;
  CHECK(t.clear(&bytes) == 500);
  CHECK(bytes == 500 * 501 / 2);
  CHECK(live_of(t).empty());
  t.destroy();
}

TEST_CASE("live table: a full window drops and says so", "[track][table]") {
  LiveTable t;
  REQUIRE(t.init(64));
  size_t ok = 0, failed = 0;
  for (uint64_t i = 1; i <= 200; ++i) (t.insert(i * 16, 1, 0, 0) ? ok : failed)++;
  CHECK(ok == 64);
  CHECK(failed == 136);
  CHECK(live_of(t).size() == 64);
  t.destroy();
}

TEST_CASE("live table: evenly spaced blocks at 70% load drop nothing", "[track][table]") {
  // glibc chunks are at least 32 bytes apart; nearby blocks map to nearby
  // slots (page-local hashing), so dense pages make runs in the table.
  // Evenly spaced, up to 70% of capacity none of those runs overflows its
  // window; real heaps are uneven and drop earlier (glibc's layouts below).
  for (const uint64_t stride : {32u, 48u, 96u, 4096u}) {
    LiveTable t;
    REQUIRE(t.init(1 << 16));
    size_t drops = 0;
    const size_t n = (1 << 16) * 7 / 10;
    for (size_t i = 0; i < n; ++i)
      if (!t.insert(0x555555000000ull + i * stride, 1, 0, 0)) ++drops;
    INFO("stride " << stride);
    CHECK(drops == 0);
    t.destroy();
  }
}

TEST_CASE("live table: concurrent writers and a reader see only whole entries",
          "[track][table][concurrency]") {
  LiveTable t;
  REQUIRE(t.init(1 << 16));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> torn{0};
  // Each writer's entries satisfy size == address / 16 and ts == size * 3,
  // stack == size & 0xffff: a torn read would break the relation.
  auto writer = [&](uint64_t base) {
    std::vector<uint64_t> mine;
    for (int round = 0; round < 200; ++round) {
      for (uint64_t i = 0; i < 100; ++i) {
        const uint64_t a = (base + round * 1000 + i) * 16;
        const uint64_t s = a / 16;
        if (t.insert(a, s, s * 3, static_cast<uint32_t>(s & 0xffff))) mine.push_back(a);
      }
      for (size_t i = 0; i + 50 < mine.size(); ++i) t.remove(mine[i], nullptr);
      mine.erase(mine.begin(), mine.size() > 50 ? mine.end() - 50 : mine.begin());
    }
  };
  std::thread reader([&] {
    while (!stop.load()) {
      t.for_each([&](const LiveEntry& e) {
        const uint64_t s = e.address / 16;
        if (e.size != s || e.timestamp_ns != s * 3 || e.stack_id != (s & 0xffff)) ++torn;
      });
    }
  });
  std::thread w1(writer, 1'000'000), w2(writer, 5'000'000);
  w1.join();
  w2.join();
  stop = true;
  reader.join();
  CHECK(torn.load() == 0);
  CHECK(live_of(t).size() == 100);  // 50 left by each writer
  t.destroy();
}

TEST_CASE("stack table deduplicates and keeps ids stable", "[track][stacks]") {
  StackTable st;
  REQUIRE(st.init(1000, 8));
  const uintptr_t a[] = {1, 2, 3};
  const uintptr_t b[] = {1, 2, 4};
  const uintptr_t deep[] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
  const uint32_t ia = st.intern(a, 3);
  const uint32_t ib = st.intern(b, 3);
  CHECK(ia != 0);
  CHECK(ib != 0);
  CHECK(ia != ib);
  CHECK(st.intern(a, 3) == ia);
  CHECK(st.intern(a, 2) != ia);  // a prefix is another stack
  CHECK(st.intern(a, 0) == 0);
  CHECK(st.count() == 3);
  uint64_t out[16];
  REQUIRE(st.get(ia, out, 16) == 3);
  CHECK((out[0] == 1 && out[1] == 2 && out[2] == 3));
  // Deeper than the table's depth: truncated to it.
  const uint32_t id = st.intern(deep, 10);
  CHECK(st.get(id, out, 16) == 8);
  CHECK(out[7] == 2);
  CHECK(st.get(0, out, 16) == 0);
  CHECK(st.get(999999, out, 16) == 0);
  st.destroy();
}

TEST_CASE("stack table concurrent interning agrees on ids", "[track][stacks][concurrency]") {
  StackTable st;
  REQUIRE(st.init(4096, 4));
  std::vector<uint32_t> ids[2];
  auto work = [&](int w) {
    for (uintptr_t i = 1; i <= 2000; ++i) {
      const uintptr_t f[] = {i, i * 7, i * 13};
      ids[w].push_back(st.intern(f, 3));
    }
  };
  std::thread t1(work, 0), t2(work, 1);
  t1.join();
  t2.join();
  size_t same = 0;
  for (size_t i = 0; i < 2000; ++i) {
    REQUIRE(ids[0][i] != 0);
    if (ids[0][i] == ids[1][i]) ++same;
    uint64_t out[4];
    REQUIRE(st.get(ids[1][i], out, 4) == 3);
    CHECK(out[0] == i + 1);
  }
  // Duplicates are possible only when both threads race on one slot.
  CHECK(same >= 1990);
  CHECK(st.count() <= 2010);
  st.destroy();
}

TEST_CASE("sampler: p(n) and unbiased estimates", "[track][sampler]") {
  CHECK(sample_probability(0, 1000) == 0.0);
  CHECK(sample_probability(1000, 1000) == Approx(1 - std::exp(-1.0)));
  CHECK(sample_probability(1 << 30, 1000) == Approx(1.0));

  // 2,000,000 allocations of mixed sizes, mean interval 64 KiB: the
  // weighted sample must estimate count and bytes within a few percent.
  SamplerState s{};
  const uint64_t mean = 64 * 1024;
  sampler_seed(s, 12345, mean);
  const uint64_t sizes[] = {16, 48, 200, 1000, 4096, 100000};
  double est_count = 0, est_bytes = 0, true_count = 0, true_bytes = 0;
  uint64_t samples = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    const uint64_t n = sizes[i % 6];
    true_count += 1;
    true_bytes += static_cast<double>(n);
    if (sampler_hit(s, n, mean)) {
      const double p = sample_probability(n, mean);
      est_count += 1 / p;
      est_bytes += static_cast<double>(n) / p;
      ++samples;
    }
  }
  INFO("samples " << samples << " est_count " << est_count << " est_bytes " << est_bytes);
  CHECK(samples > 1000);
  CHECK(est_bytes == Approx(true_bytes).epsilon(0.05));
  CHECK(est_count == Approx(true_count).epsilon(0.10));
  // Intervals are exponential with the right mean.
  double sum = 0;
  for (int i = 0; i < 100000; ++i) sum += static_cast<double>(sampler_next_interval(s, mean));
  CHECK(sum / 100000 == Approx(static_cast<double>(mean)).epsilon(0.02));
}

// --- Tracker with a fake unwinder and clock --------------------------------

namespace {

thread_local std::vector<uintptr_t> t_fake_stack;
std::atomic<uint64_t> g_fake_now{1'000'000'000};

size_t fake_unwind(UnwindCache*, uintptr_t* out, size_t max) {
  size_t n = 0;
  for (; n < t_fake_stack.size() && n < max; ++n) out[n] = t_fake_stack[n];
  return n;
}
uint64_t fake_clock() {
  return g_fake_now.load();
}

mi_abi_status status_of(const Tracker& t) {
  mi_abi_status s{};
  t.status(&s);
  return s;
}

std::map<uint64_t, LiveEntry> live_of(const Tracker& t) {
  std::map<uint64_t, LiveEntry> m;
  t.for_each_live([&](const LiveEntry& e) { m[e.address] = e; });
  return m;
}

void* addr(uint64_t a) {
  return reinterpret_cast<void*>(a);
}

}  // namespace

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

TEST_CASE("tracker: per-thread counters are exact after threads finish",
          "[track][tracker][concurrency]") {
  Tracker t;
  Config c;
  c.table_capacity = 1 << 18;
  c.stack_capacity = 1024;
  REQUIRE(t.init(c, fake_unwind, fake_clock));
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

// --- How full the live table gets before it drops ---------------------------
//
// The table hashes each 4 KiB page to a run of 256 slots (one per 16-byte
// granule), so a page dense with blocks fills a dense run, and runs of
// different pages overlap at random. How full the table can get before some
// probe window overflows therefore depends on how blocks sit in pages. The
// layouts below are glibc's: chunks of request + 8 bytes rounded up to 16
// (at least 32), packed one after another from the top of the heap, user
// pointers 16 bytes into each chunk; optionally a share of live blocks
// freed at random as the heap grows (holes, and tombstones in the table).
// Every block goes through the Tracker (fake unwinder and clock), as a
// malloc hook would record it, until the first one is dropped.

namespace {

// xorshift64*: the same sequence on every platform and standard library.
struct XorShift {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  uint64_t below(uint64_t n) { return next() % n; }
};

struct HeapLayout {
  const char* name;
  uint64_t min_request, max_request;
  unsigned free_per_mille;  // chance, after each allocation, to free a random live block
};

// Live entries per slot right before the first drop.
double load_at_first_drop(const HeapLayout& l, uint64_t seed, size_t capacity) {
  Tracker t;
  Config c;
  c.table_capacity = capacity;
  c.stack_capacity = 64;
  c.stack_depth = 4;
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  t_fake_stack = {0x1000, 0x2000};
  XorShift rng{seed * 0x9E3779B97F4A7C15ull + 1};
  uint64_t top = 0x555555a00000ull;
  std::vector<uint64_t> live;
  double load = 0;
  for (;;) {
    const uint64_t request = l.min_request + rng.below(l.max_request - l.min_request + 1);
    const uint64_t chunk = std::max<uint64_t>(32, (request + 8 + 15) & ~uint64_t{15});
    const uint64_t user = top + 16;
    top += chunk;
    const mi_abi_status before = status_of(t);
    t.on_alloc(MI_FN_MALLOC, addr(user), request);
    if (status_of(t).dropped > before.dropped) {
      load = static_cast<double>(before.live_entries) / static_cast<double>(capacity);
      break;
    }
    live.push_back(user);
    if (rng.below(1000) < l.free_per_mille) {
      const size_t i = rng.below(live.size());
      t.on_free(MI_FN_FREE, addr(live[i]));
      live[i] = live.back();
      live.pop_back();
    }
  }
  t.destroy();
  return load;
}

}  // namespace

TEST_CASE("live table: with glibc's layouts the first drop comes above 60% load",
          "[track][table]") {
  const HeapLayout layouts[] = {
      {"small blocks (32-byte chunks, 128 a page)", 1, 24, 0},
      {"small blocks, a quarter freed as the heap grows", 1, 24, 250},
      {"blocks of 1-256 bytes", 1, 256, 0},
      {"blocks of 1-256 bytes, a quarter freed", 1, 256, 250},
      {"blocks of 1-1024 bytes, half freed", 1, 1024, 500},
  };
  constexpr size_t kCapacity = size_t{1} << 16;
  double lowest = 1;
  for (const auto& l : layouts) {
    for (uint64_t seed = 1; seed <= 2; ++seed) {
      const double load = load_at_first_drop(l, seed, kCapacity);
      INFO(l.name << ", seed " << seed << ": first drop at " << load * 100 << "% load");
      // README ("MALLOCINFO_TABLE_SIZE"): nothing is dropped below 60% full.
      CHECK(load >= 0.60);
      lowest = std::min(lowest, load);
    }
  }
  // And that is where drops begin: dense pages of small blocks overflow
  // their windows well before 70% (which README used to promise).
  INFO("lowest load at a first drop: " << lowest * 100 << "%");
  CHECK(lowest < 0.70);
}
