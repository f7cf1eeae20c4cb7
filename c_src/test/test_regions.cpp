// Catch2 tests for the region table (track/region_table.h): exact interval
// arithmetic for mmap/munmap/mremap, a full table, concurrent writers.
// The real hooks are tested under the interposer by test/stress/stress_mmap.
#include "catch.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "../track/region_table.h"

using namespace mi::track;

namespace {

constexpr uint64_t kPage = 4096;

Region region(uint64_t start, uint64_t pages, uint64_t tag) {
  Region r{};
  r.start = start;
  r.length = pages * kPage;
  r.timestamp_ns = tag;
  r.flags = MI_REGION_ANONYMOUS;
  r.depth = 1;
  r.frames[0] = tag;
  return r;
}

// start -> {end, tag}: the table's view, sorted.
struct Span {
  uint64_t end, tag;
  bool operator==(const Span& o) const { return end == o.end && tag == o.tag; }
};
std::map<uint64_t, Span> view(const RegionTable& t) {
  std::vector<Region> all(t.capacity());
  const size_t n = t.copy(all.data(), all.size());
  std::map<uint64_t, Span> m;
  for (size_t i = 0; i < n; ++i) m[all[i].start] = Span{region_end(all[i]), all[i].frames[0]};
  return m;
}

using View = std::map<uint64_t, Span>;

}  // namespace

TEST_CASE("region table: map, unmap head, tail and middle", "[track][regions]") {
  RegionTable t;
  REQUIRE(t.init(16));
  const uint64_t a = 0x100000;
  REQUIRE(t.add(region(a, 10, 7)));
  CHECK(view(t) == View{{a, {a + 10 * kPage, 7}}});

  // Middle: two pieces, both still the same call site.
  CHECK(t.unmap(a + 4 * kPage, a + 6 * kPage) == 2 * kPage);
  CHECK(view(t) == View{{a, {a + 4 * kPage, 7}}, {a + 6 * kPage, {a + 10 * kPage, 7}}});
  // Head of the upper piece, tail of the lower one.
  CHECK(t.unmap(a + 6 * kPage, a + 7 * kPage) == kPage);
  CHECK(t.unmap(a + 3 * kPage, a + 4 * kPage) == kPage);
  CHECK(view(t) == View{{a, {a + 3 * kPage, 7}}, {a + 7 * kPage, {a + 10 * kPage, 7}}});
  // A range spanning both pieces and the hole between.
  CHECK(t.unmap(a + 2 * kPage, a + 8 * kPage) == 2 * kPage);
  CHECK(view(t) == View{{a, {a + 2 * kPage, 7}}, {a + 8 * kPage, {a + 10 * kPage, 7}}});
  // Everything, and an unmap of nothing recorded.
  CHECK(t.unmap(a - kPage, a + 20 * kPage) == 4 * kPage);
  CHECK(view(t).empty());
  CHECK(t.unmap(a, a + kPage) == 0);
  uint64_t n = 1, bytes = 1;
  t.totals(&n, &bytes);
  CHECK(n == 0);
  CHECK(bytes == 0);
  CHECK(t.dropped() == 0);
  t.destroy();
}

TEST_CASE("region table: MAP_FIXED over recorded regions replaces the overlap",
          "[track][regions]") {
  RegionTable t;
  REQUIRE(t.init(16));
  const uint64_t a = 0x200000;
  REQUIRE(t.add(region(a, 4, 1)));
  REQUIRE(t.add(region(a + 4 * kPage, 4, 2)));
  // Pages 2..5: the tail of the first, the head of the second.
  REQUIRE(t.add(region(a + 2 * kPage, 4, 3)));
  CHECK(view(t) == View{{a, {a + 2 * kPage, 1}},
                        {a + 2 * kPage, {a + 6 * kPage, 3}},
                        {a + 6 * kPage, {a + 8 * kPage, 2}}});
  // Strictly inside the middle one: it splits around the new region.
  REQUIRE(t.add(region(a + 3 * kPage, 1, 4)));
  CHECK(view(t) == View{{a, {a + 2 * kPage, 1}},
                        {a + 2 * kPage, {a + 3 * kPage, 3}},
                        {a + 3 * kPage, {a + 4 * kPage, 4}},
                        {a + 4 * kPage, {a + 6 * kPage, 3}},
                        {a + 6 * kPage, {a + 8 * kPage, 2}}});
  Region found{};
  REQUIRE(t.find(a + 5 * kPage, &found));
  CHECK(found.frames[0] == 3);
  CHECK(found.start == a + 4 * kPage);
  CHECK_FALSE(t.find(a + 8 * kPage, &found));
  uint64_t n = 0, bytes = 0;
  t.totals(&n, &bytes);
  CHECK(n == 5);
  CHECK(bytes == 8 * kPage);
  t.destroy();
}

TEST_CASE("region table: full, a split loses its upper piece and says so", "[track][regions]") {
  RegionTable t;
  REQUIRE(t.init(2));
  REQUIRE(t.add(region(0x100000, 4, 1)));
  REQUIRE(t.add(region(0x200000, 4, 2)));
  CHECK_FALSE(t.add(region(0x300000, 4, 3)));
  CHECK(t.dropped() == 1);
  t.unmap(0x100000 + kPage, 0x100000 + 2 * kPage);
  CHECK(t.dropped() == 2);
  CHECK(view(t) == View{{0x100000, {0x100000 + kPage, 1}}, {0x200000, {0x200000 + 4 * kPage, 2}}});
  t.clear();
  CHECK(view(t).empty());
  t.destroy();
}

TEST_CASE("region table: four threads map and unmap concurrently", "[track][regions]") {
  // Each thread owns its own address band, maps 3-page regions, unmaps the
  // middle page of some and all of others; the final table is exactly the
  // union of what each thread left.
  RegionTable t;
  REQUIRE(t.init(4096));
  constexpr int kThreads = 4, kRounds = 300;
  std::vector<std::thread> threads;
  std::atomic<int> refused{0};  // Catch2's assertions are not thread-safe
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&t, &refused, k] {
      const uint64_t base = 0x10000000ull * (k + 1);
      for (int i = 0; i < kRounds; ++i) {
        const uint64_t a = base + static_cast<uint64_t>(i) * 4 * kPage;
        if (!t.add(region(a, 3, static_cast<uint64_t>(k)))) ++refused;
        if (i % 3 == 1) t.unmap(a + kPage, a + 2 * kPage);
        if (i % 3 == 2) t.unmap(a, a + 3 * kPage);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(refused == 0);
  View want;
  for (int k = 0; k < kThreads; ++k) {
    const uint64_t base = 0x10000000ull * (k + 1);
    for (int i = 0; i < kRounds; ++i) {
      const uint64_t a = base + static_cast<uint64_t>(i) * 4 * kPage;
      const uint64_t tag = static_cast<uint64_t>(k);
      if (i % 3 == 0) want[a] = Span{a + 3 * kPage, tag};
      if (i % 3 == 1) {
        want[a] = Span{a + kPage, tag};
        want[a + 2 * kPage] = Span{a + 3 * kPage, tag};
      }
    }
  }
  CHECK(view(t) == want);
  CHECK(t.dropped() == 0);
  t.destroy();
}
