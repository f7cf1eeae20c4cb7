// Catch2 tests for the reader side's grouping (sites/site_group, the
// Oldest collector's age bounds, sites/abi_read) over a fake tracker ABI:
// no interposer, no erl_nif.
#include "catch.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "../common/mi_sampling.h"
#include "../sites/abi_read.h"
#include "../sites/oldest.h"
#include "../sites/site_group.h"
#include "fake_tracker.h"

using mi::sites::Site;
using mi::test::FakeTracker;

namespace {

constexpr uint64_t kMs = 1000000;

mi_abi_entry entry(uint64_t address, uint64_t size, uint64_t ts, uint32_t stack,
                   uint32_t flags = 0) {
  return mi_abi_entry{address, size, ts, stack, flags, 0};
}

// A table of 64 stack slots, sampling every 4096 bytes on average.
mi_abi_status status_of(uint64_t stack_capacity = 64, uint64_t sample_bytes = 4096) {
  mi_abi_status st{};
  st.mode = MI_MODE_FULL;
  st.recording = 1;
  st.stack_capacity = stack_capacity;
  st.sample_bytes = sample_bytes;
  return st;
}

// Sites by stack id (the grouping's order is unspecified).
std::map<uint32_t, Site> by_stack(const std::vector<Site>& sites) {
  std::map<uint32_t, Site> m;
  for (const Site& s : sites) {
    INFO("stack " << s.stack);
    CHECK(m.count(s.stack) == 0);  // every site's id distinct
    m[s.stack] = s;
  }
  return m;
}

}  // namespace

TEST_CASE("site group: blocks grouped by stack id, counts, bytes and the oldest summed",
          "[sites]") {
  FakeTracker fake;
  fake.stacks = {{1, {0x10, 0x20}}, {2, {0x30}}};
  fake.entries = {entry(0x1000, 100, 50, 1), entry(0x2000, 200, 20, 1), entry(0x3000, 300, 30, 2),
                  entry(0x4000, 10, 5, 0)};
  const mi_preload_abi abi = fake.abi();
  std::vector<Site> sites = mi::sites::group_by_site(&abi, status_of());
  std::sort(sites.begin(), sites.end(), mi::sites::larger_site);
  REQUIRE(sites.size() == 3);
  // 300 bytes each: the smaller stack id first.
  CHECK(sites[0].stack == 1);
  CHECK(sites[0].count == 2);
  CHECK(sites[0].bytes == 300);
  CHECK(sites[0].oldest == 20);
  CHECK_FALSE(sites[0].estimated);
  CHECK(sites[1].stack == 2);
  CHECK(sites[1].count == 1);
  CHECK(sites[1].bytes == 300);
  CHECK(sites[1].oldest == 30);
  // The blocks recorded without a stack: site 0.
  CHECK(sites[2].stack == 0);
  CHECK(sites[2].bytes == 10);
  CHECK(sites[2].oldest == 5);
  CHECK(mi::sites::rounded(2.5) == 3);
  CHECK(mi::sites::rounded(2.49) == 2);
}

TEST_CASE("site group: ids with the same frames are one site, unknown ones the no-stack site",
          "[sites][stacks]") {
  for (const bool hashes : {true, false}) {
    for (const bool with_no_stack_block : {true, false}) {
      INFO("stack hashes " << hashes << ", a block without a stack " << with_no_stack_block);
      FakeTracker fake;
      fake.hashes = hashes;
      // 7 and 9: one stack stored twice (racing threads); 8 another; 20
      // and 21 differ but share the fake's weak hash; 99 freed since.
      fake.stacks = {{7, {0x1000, 0x2000, 0x3000}},
                     {8, {0x4000, 0x5000}},
                     {9, {0x1000, 0x2000, 0x3000}},
                     {20, {1, 4}},
                     {21, {2, 3}}};
      fake.entries = {entry(0x100, 100, 70, 7), entry(0x200, 200, 90, 9), entry(0x300, 300, 80, 8),
                      entry(0x400, 40, 60, 99), entry(0x500, 5, 50, 20),  entry(0x600, 6, 40, 21)};
      if (with_no_stack_block) fake.entries.push_back(entry(0x700, 1, 100, 0));
      const mi_preload_abi abi = fake.abi();
      const auto sites = by_stack(mi::sites::group_by_site(&abi, status_of()));
      CHECK(sites.size() == 5);
      REQUIRE(sites.count(7) == 1);
      CHECK(sites.count(9) == 0);
      CHECK(sites.at(7).count == 2);
      CHECK(sites.at(7).bytes == 300);
      CHECK(sites.at(7).oldest == 70);
      CHECK(sites.at(8).bytes == 300);
      CHECK(sites.at(20).bytes == 5);
      CHECK(sites.at(21).bytes == 6);
      REQUIRE(sites.count(0) == 1);
      CHECK(sites.at(0).count == (with_no_stack_block ? 2 : 1));
      CHECK(sites.at(0).bytes == (with_no_stack_block ? 41 : 40));
      CHECK(sites.at(0).oldest == 60);
    }
  }
}

TEST_CASE("site group: sampled entries weigh 1/p blocks of size/p bytes", "[sites][sampler]") {
  FakeTracker fake;
  fake.status.mode = MI_MODE_SAMPLE;
  fake.stacks = {{1, {0x10}}, {2, {0x20}}, {3, {0x20}}};
  fake.entries = {entry(0x100, 1000, 1, 1, MI_ENTRY_SAMPLED), entry(0x200, 500, 2, 1),
                  entry(0x300, 64, 3, 2), entry(0x400, 2000, 4, 3, MI_ENTRY_SAMPLED)};
  const mi_preload_abi abi = fake.abi();
  const auto sites = by_stack(mi::sites::group_by_site(&abi, status_of(64, 1000)));
  REQUIRE(sites.size() == 2);
  const mi::sampling::Weight w1000 = mi::sampling::weight(1000, 1000);
  const mi::sampling::Weight w2000 = mi::sampling::weight(2000, 1000);
  CHECK(w1000.count == Approx(1 / (1 - std::exp(-1.0))));
  // One sampled block and one recorded in full.
  CHECK(sites.at(1).count == Approx(w1000.count + 1));
  CHECK(sites.at(1).bytes == Approx(w1000.bytes + 500));
  CHECK(sites.at(1).estimated);
  // Stack 3 merges into 2: the merged site is an estimate too.
  CHECK(sites.at(2).count == Approx(1 + w2000.count));
  CHECK(sites.at(2).bytes == Approx(64 + w2000.bytes));
  CHECK(sites.at(2).estimated);
}

TEST_CASE("site group: since_ns keeps blocks allocated from then on; olds sees every block",
          "[sites]") {
  FakeTracker fake;
  fake.batch = 1;  // one entry per sink call
  fake.stacks = {{1, {0x10}}, {2, {0x20}}};
  fake.entries = {entry(0x100, 10, 10 * kMs, 1), entry(0x200, 20, 20 * kMs, 1),
                  entry(0x300, 30, 30 * kMs, 2), entry(0x400, 40, 19 * kMs, 2)};
  const mi_preload_abi abi = fake.abi();
  mi::sites::Oldest olds = mi::sites::Oldest::by_age(10, 40 * kMs, 0, UINT64_MAX, 0);
  const auto sites = by_stack(mi::sites::group_by_site(&abi, status_of(), 20 * kMs, &olds));
  REQUIRE(sites.size() == 2);
  CHECK(sites.at(1).count == 1);
  CHECK(sites.at(1).bytes == 20);
  CHECK(sites.at(1).oldest == 20 * kMs);
  CHECK(sites.at(2).bytes == 30);
  const std::vector<mi_abi_entry> old = olds.take();
  REQUIRE(old.size() == 4);
  CHECK(old[0].address == 0x100);
  CHECK(old[1].address == 0x400);
  CHECK(old[3].address == 0x300);
  // since_ns 0: every block.
  const auto all = by_stack(mi::sites::group_by_site(&abi, status_of()));
  CHECK(all.at(1).bytes == 30);
  CHECK(all.at(2).bytes == 70);
}

TEST_CASE("site group: reused slots and tables too large to index flat group the same", "[sites]") {
  FakeTracker fake;
  // With 8 slots, 1, 9 and 17 share slot 1 (three generations): 1 and 17
  // are one stack, 9 another.
  fake.stacks = {{1, {0xa, 0xb}}, {9, {0xc}}, {17, {0xa, 0xb}}, {2, {0xd}}};
  fake.entries = {entry(0x100, 1, 1, 1),   entry(0x200, 2, 2, 9),  entry(0x300, 4, 3, 17),
                  entry(0x400, 8, 4, 2),   entry(0x500, 16, 5, 9), entry(0x600, 32, 6, 1),
                  entry(0x700, 64, 7, 17), entry(0x800, 128, 8, 0)};
  const mi_preload_abi abi = fake.abi();
  using Row = std::tuple<uint32_t, double, double, uint64_t>;
  auto rows = [&](uint64_t capacity) {
    std::vector<Row> out;
    for (const auto& [id, s] : by_stack(mi::sites::group_by_site(&abi, status_of(capacity))))
      out.emplace_back(id, s.count, s.bytes, s.oldest);
    return out;
  };
  const std::vector<Row> want = {Row{0, 1, 128, 8}, Row{1, 4, 101, 1}, Row{2, 1, 8, 4},
                                 Row{9, 2, 18, 2}};
  // Flat index (8 slots), none (0, 6: not a power of two), too large for one.
  for (const uint64_t capacity : {uint64_t{8}, uint64_t{0}, uint64_t{6}, uint64_t{1} << 21}) {
    INFO("stack capacity " << capacity);
    CHECK(rows(capacity) == want);
  }
}

TEST_CASE("oldest: ages in whole ms, both bounds inclusive, no overflow", "[sites]") {
  const uint64_t now = 10000 * kMs + kMs / 2;
  // Ages 1, 2, 5 and 6 ms (age_ms rounds down), and one block stamped
  // after now (0 ms old).
  const mi_abi_entry e[] = {entry(0x1, 8, now - 1 * kMs, 1), entry(0x2, 8, now - 2 * kMs, 1),
                            entry(0x5, 8, now - 5 * kMs - kMs / 4, 1),
                            entry(0x6, 8, now - 6 * kMs, 1), entry(0x0, 8, now + kMs, 1)};
  CHECK(mi::sites::age_ms(now, now - 5 * kMs - kMs / 4) == 5);
  CHECK(mi::sites::age_ms(now, now + kMs) == 0);
  auto kept = [&](mi::sites::Oldest o) {
    for (const mi_abi_entry& x : e) o.offer(x);
    std::vector<uint64_t> out;
    for (const mi_abi_entry& x : o.take()) out.push_back(x.address);
    return out;
  };
  CHECK(kept(mi::sites::Oldest::by_age(10, now, 2, 5, 0)) == std::vector<uint64_t>{0x5, 0x2});
  CHECK(kept(mi::sites::Oldest::by_age(10, now, 0, 1, 0)) == std::vector<uint64_t>{0x1, 0x0});
  CHECK(kept(mi::sites::Oldest::by_age(2, now, 0, UINT64_MAX, 0)) ==
        std::vector<uint64_t>{0x6, 0x5});
  CHECK(kept(mi::sites::Oldest::by_age(10, now, UINT64_MAX, UINT64_MAX, 0)).empty());
  CHECK(kept(mi::sites::Oldest::by_age(10, now, 0, UINT64_MAX, 9)).empty());
  CHECK(kept(mi::sites::Oldest::by_age(0, now, 0, UINT64_MAX, 0)).empty());
}

TEST_CASE("abi read: frames capped at the deepest stack, none for id 0", "[sites]") {
  FakeTracker fake;
  std::vector<uint64_t> deep(mi::sites::kMaxFrames + 10);
  for (size_t i = 0; i < deep.size(); ++i) deep[i] = 0x1000 + i;
  fake.stacks = {{0, {0x1}}, {5, deep}};
  const mi_preload_abi abi = fake.abi();
  uint64_t pcs[mi::sites::kMaxFrames];
  CHECK(mi::sites::stack_frames(&abi, 0, pcs) == 0);
  CHECK(mi::sites::stack_frames(&abi, 6, pcs) == 0);
  REQUIRE(mi::sites::stack_frames(&abi, 5, pcs) == mi::sites::kMaxFrames);
  CHECK(pcs[mi::sites::kMaxFrames - 1] == deep[mi::sites::kMaxFrames - 1]);
  CHECK(mi::sites::abi_stack_hasher(&abi) != nullptr);
  fake.hashes = false;
  const mi_preload_abi old = fake.abi();
  CHECK(mi::sites::abi_stack_hasher(&old) == nullptr);
}

TEST_CASE("abi read: a consumer's exception crosses no C frame and is rethrown once", "[sites]") {
  FakeTracker fake;
  fake.batch = 1;
  fake.entries = {entry(0x1, 1, 1, 0), entry(0x2, 1, 1, 0), entry(0x3, 1, 1, 0)};
  const mi_preload_abi abi = fake.abi();
  int calls = 0;
  CHECK_THROWS_AS(mi::sites::stream_snapshot(&abi,
                                             [&](const mi_abi_entry*, size_t) {
                                               if (++calls == 2) throw std::runtime_error("full");
                                             }),
                  std::runtime_error);
  // The batch after the throw was skipped.
  CHECK(calls == 2);
}

TEST_CASE("site group: split by process, merged stacks too; the parts add up to the sites",
          "[sites]") {
  FakeTracker fake;
  // 7 and 9: one stack stored twice; 8 another; 99 freed since.
  fake.stacks = {{7, {0x1000, 0x2000}}, {8, {0x3000}}, {9, {0x1000, 0x2000}}};
  constexpr uint64_t kA = (10ull << 4) | 3, kB = (11ull << 4) | 3;
  auto with_pid = [](mi_abi_entry e, uint64_t pid) {
    e.pid = pid;
    return e;
  };
  fake.entries = {with_pid(entry(0x100, 100, 70, 7), kA),
                  with_pid(entry(0x200, 200, 60, 9), kA),
                  with_pid(entry(0x300, 300, 50, 7), kB),
                  with_pid(entry(0x400, 40, 40, 8), kB),
                  entry(0x500, 5, 30, 8),
                  with_pid(entry(0x600, 6, 20, 99), kA)};
  const mi_preload_abi abi = fake.abi();
  std::vector<Site> parts = mi::sites::group_by_site_and_process(&abi, status_of());
  std::map<std::pair<uint32_t, uint64_t>, Site> by;
  for (const Site& p : parts) {
    CHECK(by.count({p.stack, p.pid}) == 0);
    by[{p.stack, p.pid}] = p;
  }
  REQUIRE(by.size() == 5);
  CHECK(by[{7, kA}].count == 2);
  CHECK(by[{7, kA}].bytes == 300);
  CHECK(by[{7, kA}].oldest == 60);
  CHECK(by[{7, kB}].bytes == 300);
  CHECK(by[{8, kB}].bytes == 40);
  CHECK(by[{8, 0}].bytes == 5);   // no process
  CHECK(by[{0, kA}].bytes == 6);  // an unknown stack
  // The same figures as group_by_site, stack by stack.
  std::map<uint32_t, double> sums;
  for (const Site& p : parts) sums[p.stack] += p.bytes;
  for (const auto& [id, site] : by_stack(mi::sites::group_by_site(&abi, status_of())))
    CHECK(sums[id] == site.bytes);
  // group_by_site leaves pid 0.
  for (const Site& s : mi::sites::group_by_site(&abi, status_of())) CHECK(s.pid == 0);
}
