// Catch2 tests for issue 12's guarantees of the tracker core: byte counters
// that balance (full, counters, sample), and a live table that gives its
// pages back on reset() and on mode switches.
#include <malloc.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include "catch.h"

#include "../common/mi_sampling.h"
#include "../track/tracker.h"
#include "track_fixture.h"

using namespace mi::track;
using mi::test::status_of;

namespace {

size_t no_unwind(UnwindCache*, uintptr_t* out, size_t max) {
  if (max > 0) out[0] = 0x1234;
  return max > 0 ? 1 : 0;
}
uint64_t zero_clock() {
  return 0;
}
size_t real_usable(void* p) {
  return ::malloc_usable_size(p);
}

// What the interposer's hooks do around the real calls (preload/hooks.cpp),
// with glibc (or the sanitizer's allocator) as the next allocator.
struct Hooks {
  Tracker& t;
  void* malloc_(size_t n) {
    void* p = ::malloc(n);
    t.on_alloc(MI_FN_MALLOC, p, n);
    return p;
  }
  void* calloc_(size_t n, size_t m) {
    void* p = ::calloc(n, m);
    t.on_alloc(MI_FN_CALLOC, p, n * m);
    return p;
  }
  void* memalign_(size_t a, size_t n) {
    void* p = nullptr;
    if (::posix_memalign(&p, a, n) != 0) p = nullptr;
    t.on_alloc(MI_FN_POSIX_MEMALIGN, p, n);
    return p;
  }
  void free_(void* p) {
    t.on_free(MI_FN_FREE, p);
    ::free(p);
  }
  void* realloc_(void* p, size_t n) {
    const size_t old_usable = t.usable(p);
    LiveEntry old{};
    const bool had = t.take(p, &old);
    void* r = ::realloc(p, n);
    if (r == nullptr && n != 0) {
      if (had) t.restore(old);
      t.count(MI_FN_REALLOC);
      return r;
    }
    if (p != nullptr) t.freed(MI_FN_REALLOC, had ? &old : nullptr, old_usable);
    if (r == nullptr) {
      t.count(MI_FN_REALLOC);
      return r;
    }
    t.on_alloc(MI_FN_REALLOC, r, n);
    return r;
  }
};

// A random mix of calls on one thread; returns the blocks it still holds.
std::vector<void*> churn(Hooks h, uint64_t seed, int ops) {
  std::vector<void*> held;
  uint64_t x = seed;
  auto rnd = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int i = 0; i < ops; ++i) {
    const uint64_t v = rnd();
    const size_t size = v % 7 == 0 ? 150000 + v % 100000 : 1 + v % 2000;
    if (!held.empty() && v % 3 == 0) {
      const size_t at = static_cast<size_t>(rnd() % held.size());
      switch (v % 5) {
        case 0: {  // realloc(p, 0): frees p
          void* r = h.realloc_(held[at], 0);
          if (r == nullptr) {
            held[at] = held.back();
            held.pop_back();
          } else {
            held[at] = r;
          }
          break;
        }
        case 1:  // grow: usually moves
          held[at] = h.realloc_(held[at], size + 5000);
          break;
        case 2:  // shrink: in place
          held[at] = h.realloc_(held[at], 1 + ::malloc_usable_size(held[at]) / 3);
          break;
        default:
          h.free_(held[at]);
          held[at] = held.back();
          held.pop_back();
          break;
      }
      continue;
    }
    void* p = v % 4 == 0   ? h.calloc_(1 + v % 3, size)
              : v % 4 == 1 ? h.realloc_(nullptr, size)
              : v % 4 == 2 ? h.memalign_(64, size)
                           : h.malloc_(size);
    if (p != nullptr) held.push_back(p);
  }
  return held;
}

}  // namespace

TEST_CASE(
    "byte counters: allocated - freed is the live requested bytes (full) and the live usable "
    "bytes (counters)",
    "[track][counters]") {
  for (const uint32_t mode : {uint32_t{MI_MODE_FULL}, uint32_t{MI_MODE_COUNTERS}}) {
    INFO("mode " << mode);
    Tracker t;
    Config c;
    c.mode = mode;
    // ~28,000 live blocks; room to spare for sanitizer allocators, which
    // pack blocks of one size class densely (page-local hashing clusters).
    c.table_capacity = 1 << 18;
    c.stack_capacity = 64;
    REQUIRE(t.init(c, no_unwind, zero_clock));
    t.set_usable_size(real_usable);
    std::vector<void*> held[3];
    std::vector<std::thread> ts;
    for (int w = 0; w < 3; ++w)
      ts.emplace_back(
          [&, w] { held[w] = churn(Hooks{t}, 0x9E3779B97F4A7C15ull * (w + 1), 20000); });
    for (auto& th : ts) th.join();
    uint64_t live = 0, n = 0;
    for (auto& v : held)
      for (void* p : v) {
        live += ::malloc_usable_size(p);
        ++n;
      }
    mi_abi_status s = status_of(t);
    CHECK(s.calls[MI_FN_REALLOC] > 0);
    if (mode == MI_MODE_FULL) {
      // Full mode counts what the table recorded: its entries' requested
      // sizes, summed here from the entries themselves.
      uint64_t recorded = 0;
      t.for_each_live([&](const mi::track::LiveEntry& e) { recorded += e.size; });
      CHECK(s.bytes_allocated - s.bytes_freed == recorded);
      CHECK(s.live_bytes == recorded);
      CHECK(s.live_entries == n);
      CHECK(s.dropped == 0);
    } else {
      CHECK(s.bytes_allocated - s.bytes_freed == live);
    }
    Hooks h{t};
    for (auto& v : held)
      for (void* p : v) h.free_(p);
    s = status_of(t);
    CHECK(s.bytes_allocated == s.bytes_freed);
    CHECK(s.live_entries == 0);
    t.destroy();
  }
}

TEST_CASE("byte counters: realloc moves, shrinks and realloc(p, 0) count the old block freed",
          "[track][counters]") {
  for (const uint32_t mode : {uint32_t{MI_MODE_FULL}, uint32_t{MI_MODE_COUNTERS}}) {
    INFO("mode " << mode);
    Tracker t;
    Config c;
    c.mode = mode;
    c.table_capacity = 4096;
    c.stack_capacity = 64;
    REQUIRE(t.init(c, no_unwind, zero_clock));
    t.set_usable_size(real_usable);
    Hooks h{t};
    void* p = h.malloc_(100);
    void* q = h.malloc_(100);  // keeps p from growing in place
    p = h.realloc_(p, 1 << 20);
    p = h.realloc_(p, 10);
    mi_abi_status s = status_of(t);
    if (mode == MI_MODE_FULL) {
      CHECK(s.bytes_allocated - s.bytes_freed == 110);  // requested: 10 + 100
      CHECK(s.live_bytes == 110);
    } else {
      CHECK(s.bytes_allocated - s.bytes_freed == ::malloc_usable_size(p) + ::malloc_usable_size(q));
    }
    CHECK(h.realloc_(p, 0) == nullptr);
    h.free_(q);
    s = status_of(t);
    CHECK(s.bytes_allocated == s.bytes_freed);
    CHECK(s.live_entries == 0);
    t.destroy();
  }
}

TEST_CASE("full mode: freeing a block the table never held counts nothing but frees_untracked",
          "[track][counters]") {
  // The attached node's case: blocks allocated before attach() are freed
  // after it. They must not lower allocated - freed below the live bytes.
  Tracker t;
  Config c;
  c.table_capacity = 4096;
  c.stack_capacity = 64;
  REQUIRE(t.init(c, no_unwind, zero_clock));
  t.set_usable_size(real_usable);
  void* before = ::malloc(10000);  // "before attach": never recorded
  Hooks h{t};
  void* kept = h.malloc_(300);
  h.free_(before);
  const mi_abi_status s = status_of(t);
  CHECK(s.frees_untracked == 1);
  CHECK(s.calls[MI_FN_FREE] == 1);
  CHECK(s.bytes_allocated == 300);
  CHECK(s.bytes_freed == 0);
  CHECK(s.bytes_allocated - s.bytes_freed == s.live_bytes);
  h.free_(kept);
  t.destroy();
}

TEST_CASE("full and sample mode: what reset() and mode switches forget counts as freed",
          "[track][counters]") {
  for (const uint32_t mode : {uint32_t{MI_MODE_FULL}, uint32_t{MI_MODE_SAMPLE}}) {
    INFO("mode " << mode);
    Tracker t;
    Config c;
    c.mode = mode;
    c.table_capacity = 1 << 14;
    c.stack_capacity = 64;
    c.sample_bytes = 4096;
    REQUIRE(t.init(c, no_unwind, zero_clock));
    t.set_usable_size(real_usable);
    Hooks h{t};
    std::vector<void*> old;
    for (int i = 0; i < 2000; ++i) old.push_back(h.malloc_(100 + i));
    REQUIRE(t.reset() > 0);
    mi_abi_status s = status_of(t);
    CHECK(s.live_bytes == 0);
    CHECK(s.bytes_allocated == s.bytes_freed);
    // The forgotten blocks' frees find nothing; new blocks count as usual.
    for (void* p : old) h.free_(p);
    std::vector<void*> fresh;
    for (int i = 0; i < 2000; ++i) fresh.push_back(h.malloc_(200 + i));
    s = status_of(t);
    // What the live entries stand for: their sizes (full), their weights
    // (sample: each sampled block counted size / p(size)).
    uint64_t expected = 0;
    t.for_each_live([&](const LiveEntry& e) {
      expected += mode == MI_MODE_FULL
                      ? e.size
                      : static_cast<uint64_t>(std::llround(
                            static_cast<double>(e.size) / mi::sampling::probability(e.size, 4096)));
    });
    CHECK(s.bytes_allocated - s.bytes_freed == expected);
    if (mode == MI_MODE_FULL) CHECK(s.live_entries == 2000);
    REQUIRE(t.set_mode(MI_MODE_OFF));
    s = status_of(t);
    CHECK(s.bytes_allocated == s.bytes_freed);
    for (void* p : fresh) ::free(p);
    t.destroy();
  }
}

TEST_CASE("quiet: mallocinfo's own blocks are counted apart, never recorded or counted freed",
          "[track][counters]") {
  for (const uint32_t mode : {uint32_t{MI_MODE_FULL}, uint32_t{MI_MODE_COUNTERS}}) {
    INFO("mode " << mode);
    Tracker t;
    Config c;
    c.mode = mode;
    c.table_capacity = 4096;
    c.stack_capacity = 64;
    REQUIRE(t.init(c, no_unwind, zero_clock));
    t.set_usable_size(real_usable);
    Hooks h{t};
    void* node = h.malloc_(500);  // the node's
    // What the hooks do for a quiet thread (preload/hooks.cpp): forward,
    // count_self; its frees pass quiet = true.
    void* own = ::malloc(700);
    t.count_self(700);
    mi_abi_status s = status_of(t);
    CHECK(s.self_calls == 1);
    CHECK(s.self_bytes == 700);
    CHECK(s.calls[MI_FN_MALLOC] == 1);
    if (mode == MI_MODE_FULL) {
      CHECK(s.live_entries == 1);
      CHECK(s.live_bytes == 500);
      CHECK(s.bytes_allocated == 500);
    }
    const uint64_t freed_before = s.bytes_freed;
    t.on_free(MI_FN_FREE, own, true);
    ::free(own);
    s = status_of(t);
    CHECK(s.bytes_freed == freed_before);
    CHECK(s.frees_untracked == 0);
    CHECK(s.calls[MI_FN_FREE] == 0);  // nor is it a call of the node's
    // A quiet thread freeing a block of the node's (the table holds it):
    // it leaves the live set as always (full mode; counters mode cannot
    // tell whose it is and counts nothing).
    t.on_free(MI_FN_FREE, node, true);
    ::free(node);
    s = status_of(t);
    if (mode == MI_MODE_FULL) {
      CHECK(s.live_entries == 0);
      CHECK(s.bytes_freed == 500);
      CHECK(s.bytes_allocated == s.bytes_freed);
    }
    t.destroy();
  }
}

TEST_CASE("sample mode: counters are the sample's estimates and balance", "[track][counters]") {
  Tracker t;
  Config c;
  c.mode = MI_MODE_SAMPLE;
  c.sample_bytes = 8192;
  c.table_capacity = 1 << 16;
  c.stack_capacity = 64;
  REQUIRE(t.init(c, no_unwind, zero_clock));
  // Page-aligned fake addresses, as the hooks place sampled blocks.
  const uint64_t sizes[] = {16, 100, 3000, 50000};
  for (uint64_t i = 0; i < 40000; ++i)
    t.on_alloc(MI_FN_MALLOC, reinterpret_cast<void*>(0x10000000 + i * 4096), sizes[i % 4]);
  for (uint64_t i = 0; i < 40000; i += 2)
    t.on_free(MI_FN_FREE, reinterpret_cast<void*>(0x10000000 + i * 4096));
  double est_calls = 0;
  uint64_t weighted = 0, weighted_calls = 0;
  t.for_each_live([&](const LiveEntry& e) {
    REQUIRE((e.stack_id & kSampledBit) != 0);
    const double p = mi::sampling::probability(e.size, c.sample_bytes);
    est_calls += 1 / p;
    weighted += static_cast<uint64_t>(std::llround(static_cast<double>(e.size) / p));
    weighted_calls += static_cast<uint64_t>(std::llround(1 / p));
  });
  const mi_abi_status s = status_of(t);
  // Exactly the weights of the live sampled blocks...
  CHECK(s.bytes_allocated - s.bytes_freed == weighted);
  CHECK(s.calls[MI_FN_MALLOC] - s.calls[MI_FN_FREE] == weighted_calls);
  // ...which estimate the truth: the 20000 blocks of 100 and 50000 bytes
  // left live (the 50000-byte ones, sampled with p = 0.998, dominate).
  const double truth = 10000.0 * (100 + 50000);
  CHECK(static_cast<double>(s.bytes_allocated - s.bytes_freed) == Approx(truth).epsilon(0.05));
  CHECK(est_calls == Approx(20000).epsilon(0.3));
  CHECK(s.frees_untracked == 0);  // unsampled frees are not seen in sample mode
  t.destroy();
}

TEST_CASE("sample mode: a sampled block is found on free only at offset 0 or 16 of a page",
          "[track][sampler]") {
  CHECK(Tracker::sampled_address(reinterpret_cast<void*>(0x7f0000001000)));
  CHECK(Tracker::sampled_address(reinterpret_cast<void*>(0x7f0000001010)));  // glibc mmapped chunk
  CHECK_FALSE(Tracker::sampled_address(reinterpret_cast<void*>(0x7f0000001020)));
  CHECK_FALSE(Tracker::sampled_address(reinterpret_cast<void*>(0x7f0000001ff0)));
  CHECK_FALSE(Tracker::sampled_address(reinterpret_cast<void*>(0x7f0000001810)));
}

TEST_CASE("live table: reset() and mode switches give the pages back", "[track][memory]") {
  Tracker t;
  Config c;
  c.table_capacity = 1 << 20;  // 32 MiB reserved
  c.stack_capacity = 64;
  REQUIRE(t.init(c, no_unwind, zero_clock));
  auto fill = [&t] {
    // 100,000 blocks spread over 400 MiB of address space: a slot each at
    // least, and chunks for 25,000 units.
    for (uint64_t i = 0; i < 100000; ++i)
      t.on_alloc(MI_FN_MALLOC, reinterpret_cast<void*>(0x100000000 + i * 4096 + 64), 64);
  };
  fill();
  const size_t full = t.table_resident_bytes();
  INFO("resident with 100,000 entries: " << full);
  CHECK(full >= 100000 * 32);
  CHECK(t.reset() == 100000);
  // reset() then sweeps the stacks: the sweep reads the pools' chunks below
  // their bump pointers, which reset() put back to 0, so no page is mapped
  // again.
  CHECK(t.table_resident_bytes() == 0);
  CHECK(status_of(t).live_entries == 0);

  fill();
  CHECK(t.table_resident_bytes() >= 100000 * 32);
  REQUIRE(t.set_mode(MI_MODE_COUNTERS));
  CHECK(t.table_resident_bytes() == 0);

  REQUIRE(t.set_mode(MI_MODE_FULL));
  fill();
  REQUIRE(t.set_mode(MI_MODE_SAMPLE));  // full entries would never be freed in sample mode
  CHECK(t.table_resident_bytes() == 0);
  CHECK(status_of(t).live_entries == 0);

  REQUIRE(t.set_mode(MI_MODE_FULL));
  fill();
  REQUIRE(t.set_mode(MI_MODE_OFF));
  CHECK(t.table_resident_bytes() == 0);
  CHECK(t.unreleased_clears() == 0);
  t.destroy();
}

TEST_CASE("live table: reset() while threads insert and remove keeps whole entries",
          "[track][memory][concurrency]") {
  Tracker t;
  Config c;
  c.table_capacity = 1 << 18;
  c.stack_capacity = 64;
  REQUIRE(t.init(c, no_unwind, zero_clock));
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int w = 0; w < 2; ++w)
    ts.emplace_back([&, w] {
      // size == address / 16: a torn entry (half zeroed by madvise) would break it.
      for (uint64_t round = 0; !stop.load(); ++round)
        for (uint64_t i = 0; i < 1000; ++i) {
          const uint64_t a = (static_cast<uint64_t>(w + 1) << 36) + (round % 64) * 65536 + i * 64;
          t.on_alloc(MI_FN_MALLOC, reinterpret_cast<void*>(a), a / 16);
          if (i % 2 == 0) t.on_free(MI_FN_FREE, reinterpret_cast<void*>(a));
        }
    });
  uint64_t torn = 0;
  for (int i = 0; i < 200; ++i) {
    t.reset();
    t.for_each_live([&](const LiveEntry& e) {
      if (e.size != e.address / 16) ++torn;
    });
  }
  stop = true;
  for (auto& th : ts) th.join();
  CHECK(torn == 0);
  t.destroy();
}
