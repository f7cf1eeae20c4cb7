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

// Issue 28, item 6: mremap over several recorded regions (the kernel merges
// adjacent mappings, so one mremap can span two): each piece moves as
// itself, or stays as it was when the call fails.
TEST_CASE("region table: a failed move leaves every piece as it was", "[track][regions]") {
  RegionTable t;
  REQUIRE(t.init(16));
  const uint64_t a = 0x400000;
  REQUIRE(t.add(region(a, 4, 1)));
  REQUIRE(t.add(region(a + 4 * kPage, 4, 2)));
  REQUIRE(t.add(region(a + 8 * kPage, 4, 3)));
  const View before = view(t);
  // Pages 2..9: the tail of the first, all of the second, the head of the
  // third.
  const uint32_t ticket = t.begin_move(a + 2 * kPage, a + 10 * kPage);
  CHECK(ticket != 0);
  // Hidden while moving, as if cut.
  CHECK(view(t) == View{{a, {a + 2 * kPage, 1}}, {a + 10 * kPage, {a + 12 * kPage, 3}}});
  Region found{};
  CHECK_FALSE(t.find(a + 5 * kPage, &found));
  uint64_t n = 0, bytes = 0;
  t.totals(&n, &bytes);
  CHECK(n == 2);
  CHECK(bytes == 4 * kPage);
  t.cancel_move(ticket);
  // The same coverage and owners (split where the move began: the pieces
  // stay pieces).
  View merged;
  for (const auto& [s, span] : view(t)) {
    if (!merged.empty() && merged.rbegin()->second.end == s &&
        merged.rbegin()->second.tag == span.tag)
      merged.rbegin()->second.end = span.end;
    else
      merged[s] = span;
  }
  CHECK(merged == before);
  CHECK(t.dropped() == 0);
  t.destroy();
}

TEST_CASE("region table: a move relocates every piece with its own stack", "[track][regions]") {
  RegionTable t;
  REQUIRE(t.init(16));
  const uint64_t a = 0x400000, b = 0x800000;
  REQUIRE(t.add(region(a, 4, 1)));
  REQUIRE(t.add(region(a + 4 * kPage, 4, 2)));
  REQUIRE(t.add(region(b + 2 * kPage, 2, 9)));  // replaced where the move lands
  // Grow 8 pages to 12, moving to b: the last piece takes the growth.
  const uint32_t ticket = t.begin_move(a, a + 8 * kPage);
  t.finish_move(ticket, a, 8 * kPage, b, 12 * kPage);
  CHECK(view(t) == View{{b, {b + 4 * kPage, 1}}, {b + 4 * kPage, {b + 12 * kPage, 2}}});
  std::vector<Region> all(t.capacity());
  const size_t n = t.copy(all.data(), all.size());
  REQUIRE(n == 2);
  for (size_t i = 0; i < n; ++i) CHECK(all[i].flags == (MI_REGION_ANONYMOUS | MI_REGION_REMAPPED));
  // Shrink in place to 6 pages: the second piece keeps 2.
  const uint32_t t2 = t.begin_move(b, b + 12 * kPage);
  t.finish_move(t2, b, 12 * kPage, b, 6 * kPage);
  CHECK(view(t) == View{{b, {b + 4 * kPage, 1}}, {b + 4 * kPage, {b + 6 * kPage, 2}}});
  // Shrink to 3 pages: the second piece is gone, the first cut.
  const uint32_t t3 = t.begin_move(b, b + 6 * kPage);
  t.finish_move(t3, b, 6 * kPage, b, 3 * kPage);
  CHECK(view(t) == View{{b, {b + 3 * kPage, 1}}});
  // A move of nothing recorded only clears where it lands.
  REQUIRE(t.add(region(a, 2, 5)));
  const uint32_t t4 = t.begin_move(0x100000, 0x100000 + 2 * kPage);
  t.finish_move(t4, 0x100000, 2 * kPage, a, 2 * kPage);
  CHECK(view(t) == View{{b, {b + 3 * kPage, 1}}});
  CHECK(t.dropped() == 0);
  t.destroy();
}

TEST_CASE("region table: a region mapped where a moving piece was is neither cut nor moved",
          "[track][regions]") {
  // The kernel moved the range; another thread maps at the old address
  // before the mover's finish_move.
  RegionTable t;
  REQUIRE(t.init(16));
  const uint64_t a = 0x400000, b = 0x800000;
  REQUIRE(t.add(region(a, 4, 1)));
  const uint32_t ticket = t.begin_move(a, a + 4 * kPage);
  REQUIRE(t.add(region(a, 2, 7)));
  t.unmap(a + 2 * kPage, a + 3 * kPage);  // and an unmap there: nothing recorded
  t.finish_move(ticket, a, 4 * kPage, b, 4 * kPage);
  CHECK(view(t) == View{{a, {a + 2 * kPage, 7}}, {b, {b + 4 * kPage, 1}}});
  t.destroy();
}

TEST_CASE("region table: copy_range duplicates each piece where the copy lands",
          "[track][regions]") {
  RegionTable t;
  REQUIRE(t.init(16));
  const uint64_t a = 0x400000, b = 0x800000;
  REQUIRE(t.add(region(a, 2, 1)));
  REQUIRE(t.add(region(a + 2 * kPage, 2, 2)));
  t.copy_range(a, a + 4 * kPage, b, 3 * kPage);
  CHECK(view(t) == View{{a, {a + 2 * kPage, 1}},
                        {a + 2 * kPage, {a + 4 * kPage, 2}},
                        {b, {b + 2 * kPage, 1}},
                        {b + 2 * kPage, {b + 3 * kPage, 2}}});
  t.destroy();
}
