// Catch2 tests for churn (issue 26): the per-site counters the tracker
// keeps (track/churn), fed through the Tracker's hooks on a fake unwinder
// and clock, and their grouping by call site on the reader side
// (sites/churn_group).
#include "catch.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "../sites/churn_group.h"
#include "../track/churn.h"
#include "../track/tracker.h"
#include "track_fixture.h"

using namespace mi::track;
using namespace mi::test;

namespace {

// Churn rows by the first frame of their stack (0: no stack).
std::map<uint64_t, mi_abi_churn> churn_by_frame(Tracker& t) {
  std::map<uint64_t, mi_abi_churn> out;
  t.for_each_churn([&](const mi_abi_churn& r) {
    uint64_t frames[8];
    const unsigned n = r.stack_id != 0 ? t.stack(r.stack_id, frames, 8) : 0;
    const uint64_t key = n != 0 ? frames[0] : 0;
    REQUIRE(out.count(key) == 0);
    out[key] = r;
  });
  return out;
}

uint64_t sum(const uint64_t* v, unsigned n) {
  uint64_t s = 0;
  for (unsigned i = 0; i < n; ++i) s += v[i];
  return s;
}

}  // namespace

TEST_CASE("churn: lifetime buckets are log2 of whole ms", "[track][churn]") {
  CHECK(lifetime_bucket(0) == 0);
  CHECK(lifetime_bucket(999'999) == 0);
  CHECK(lifetime_bucket(1'000'000) == 1);  // [1, 2) ms
  CHECK(lifetime_bucket(1'999'999) == 1);
  CHECK(lifetime_bucket(2'000'000) == 2);  // [2, 4) ms
  CHECK(lifetime_bucket(5'000'000) == 3);  // [4, 8) ms
  CHECK(lifetime_bucket((uint64_t{1} << 21) * 1'000'000) == 22);
  CHECK(lifetime_bucket((uint64_t{1} << 22) * 1'000'000) == kLifetimeBuckets - 1);
  CHECK(lifetime_bucket(UINT64_MAX) == kLifetimeBuckets - 1);
}

TEST_CASE("churn: full mode counts every site exactly", "[track][churn]") {
  Tracker t;
  init_small(t);
  // Site A: 1000 pairs of 64 bytes, each freed before the next allocation.
  t_fake_stack = {0xA000, 0x1};
  for (int i = 0; i < 1000; ++i) {
    t.on_alloc(MI_FN_MALLOC, addr(0x10000 + 16 * (i % 7)), 64);
    t.on_free(MI_FN_FREE, addr(0x10000 + 16 * (i % 7)));
  }
  // Site B: 10 blocks live 5 ms together, freed in allocation order: only
  // the last one is still its thread's last allocation when freed.
  t_fake_stack = {0xB000, 0x1};
  for (int i = 0; i < 10; ++i) t.on_alloc(MI_FN_MALLOC, addr(0x20000 + 32 * i), 100);
  g_fake_now += 5'000'000;
  for (int i = 0; i < 10; ++i) t.on_free(MI_FN_FREE, addr(0x20000 + 32 * i));
  // Site C: still live.
  t_fake_stack = {0xC000, 0x1};
  t.on_alloc(MI_FN_MALLOC, addr(0x30000), 7);

  auto rows = churn_by_frame(t);
  REQUIRE(rows.size() == 3);
  const mi_abi_churn& a = rows.at(0xA000);
  CHECK(a.allocated_count == 1000);
  CHECK(a.allocated_bytes == 64000);
  CHECK(a.freed_count == 1000);
  CHECK(a.freed_bytes == 64000);
  CHECK(a.temporary_count == 1000);
  CHECK(a.lifetimes[0] == 1000);
  CHECK(a.flags == 0);
  const mi_abi_churn& b = rows.at(0xB000);
  CHECK(b.allocated_count == 10);
  CHECK(b.allocated_bytes == 1000);
  CHECK(b.freed_count == 10);
  CHECK(b.freed_bytes == 1000);
  CHECK(b.temporary_count == 1);
  CHECK(b.lifetimes[3] == 10);  // 5 ms: [4, 8)
  CHECK(sum(b.lifetimes, MI_LIFETIME_BUCKETS) == 10);
  const mi_abi_churn& c = rows.at(0xC000);
  CHECK(c.allocated_count == 1);
  CHECK(c.allocated_bytes == 7);
  CHECK(c.freed_count == 0);
  // A free of a block the table never held counts nowhere.
  t.on_free(MI_FN_FREE, addr(0x99990));
  CHECK(churn_by_frame(t).at(0xC000).freed_count == 0);

  // reset() forgets the churn too (and does not count the live block freed).
  t.reset();
  CHECK(churn_by_frame(t).empty());
  t_fake_stack = {0xA000, 0x1};
  t.on_alloc(MI_FN_MALLOC, addr(0x10000), 64);
  rows = churn_by_frame(t);
  REQUIRE(rows.size() == 1);
  CHECK(rows.at(0xA000).allocated_count == 1);
  t.destroy();
}

// Four segments of 16 rows: rows 0 to 64.
const size_t kSixteens[] = {16, 16, 16, 16};

TEST_CASE("churn table: the rows of every segment are listed, and only those written",
          "[track][churn]") {
  ChurnTable ct;
  const size_t thousands[] = {1000, 1000, 1000, 1000};
  REQUIRE(ct.init(thousands, 4));
  // The first two rows of each segment (one per record class), and row 0
  // (no stack).
  std::map<uint32_t, uint64_t> want{{0, 7}};
  uint32_t id = 1;
  for (uint32_t g = 0; g < 4; ++g) {
    for (const uint32_t at : {0u, 1u}) {
      const uint32_t row = 1 + g * 1000 + at;
      ct.on_alloc(id, row, kCountOne, row, false);
      want[id++] = row;
    }
  }
  ct.on_alloc(0, 0, kCountOne, 7, false);
  std::map<uint32_t, uint64_t> got;
  CHECK(ct.for_each([&](const mi_abi_churn& r) { got[r.stack_id] = r.allocated_bytes; }) == 9);
  CHECK(got == want);
  // Resident after the listing: the pages of the rows written (row 0's
  // with the first segment's, and one for each other segment), not the
  // rest of the segments (a listing reads each up to its last claim, not
  // everything below the highest row).
  CHECK(ct.resident_bytes() <= 5 * 4096);
  ct.clear();
  CHECK(ct.for_each([](const mi_abi_churn&) {}) == 0);
  ct.destroy();
}

TEST_CASE("churn table: segments of different sizes each keep their own rows", "[track][churn]") {
  // Segments of 3, 10, 1 and 20 rows: rows 1-3, 4-13, 14 and 15-34. A
  // row claimed at each segment's end and start is listed with its own
  // counts; a row past the last is the unknown row's.
  ChurnTable ct;
  const size_t sizes[] = {3, 10, 1, 20};
  REQUIRE(ct.init(sizes, 4));
  const uint32_t rows[] = {1, 3, 4, 13, 14, 15, 34};
  for (uint32_t k = 0; k < 7; ++k) ct.on_alloc(100 + k, rows[k], kCountOne, rows[k], false);
  ct.on_alloc(200, 35, kCountOne, 1000, false);
  std::map<uint32_t, uint64_t> got;
  CHECK(ct.for_each([&](const mi_abi_churn& r) { got[r.stack_id] = r.allocated_bytes; }) == 8);
  for (uint32_t k = 0; k < 7; ++k) CHECK(got[100 + k] == rows[k]);
  CHECK(got[0] == 1000);
  ct.destroy();
}

namespace {

// Every row ct lists, by stack id.
std::map<uint32_t, mi_abi_churn> rows_of(const ChurnTable& ct) {
  std::map<uint32_t, mi_abi_churn> m;
  ct.for_each([&](const mi_abi_churn& r) { m[r.stack_id] = r; });
  return m;
}

}  // namespace

TEST_CASE("churn: a row's 32-bit counts carry, and read exactly past 2^31", "[track][churn]") {
  // 2^31 in fixed point is 2 Mi blocks. Adds of 1,000 and of 3,000,000
  // blocks (the second beyond what a row takes in one add) cross it many
  // times; every count reads exactly what was added.
  ChurnTable ct;
  REQUIRE(ct.init(kSixteens, 4));
  uint64_t blocks = 0;
  for (int i = 0; i < 20000; ++i) {
    ct.on_alloc(7, 3, 1000 * kCountOne, 64, false);
    ct.on_free(7, 3, 1000 * kCountOne, 64, 0, true);
    blocks += 1000;
  }
  for (int i = 0; i < 5; ++i) {
    ct.on_alloc(7, 3, 3'000'000 * kCountOne, 64, false);
    ct.on_free(7, 3, 3'000'000 * kCountOne, 64, 5'000'000, false);  // 5 ms: bucket 3
  }
  const auto rows = rows_of(ct);
  REQUIRE(rows.count(7) == 1);
  const mi_abi_churn& r = rows.at(7);
  CHECK(r.allocated_count == blocks + 15'000'000);
  CHECK(r.freed_count == blocks + 15'000'000);
  CHECK(r.temporary_count == blocks);
  CHECK(r.lifetimes[0] == blocks);
  CHECK(r.lifetimes[3] == 15'000'000);
  CHECK(r.allocated_bytes == 64 * 20005);
  ct.destroy();
}

TEST_CASE(
    "churn: threads crossing a carry together lose no count, and readers never see one "
    "go back",
    "[track][churn][concurrency]") {
  // Four threads add to one row, a carry every 2,048 adds of 1,024 blocks
  // (hundreds, racing the others' adds), or every 32 adds of 65,536 (an
  // 8-byte block's sampled weight: enough adds land during one carry to
  // wrap the 32-bit count). A reader meanwhile: a count read mid-carry
  // would be 2 Mi blocks low, below one read before.
  for (const uint64_t blocks : {uint64_t{1024}, uint64_t{65536}}) {
    INFO(blocks << " blocks an add");
    ChurnTable ct;
    REQUIRE(ct.init(kSixteens, 4));
    const int adds = blocks == 1024 ? 200000 : 100000;
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> back{0}, reads{0};
    std::thread reader([&] {
      uint64_t last = 0;
      while (!stop.load()) {
        ct.for_each([&](const mi_abi_churn& r) {
          if (r.stack_id != 9) return;
          if (r.allocated_count < last) ++back;
          last = r.allocated_count;
          ++reads;
        });
      }
    });
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&] {
        for (int i = 0; i < adds; ++i) {
          ct.on_alloc(9, 5, blocks * kCountOne, 1, false);
          ct.on_free(9, 5, blocks * kCountOne, 1, 0, false);
        }
      });
    for (auto& t : ts) t.join();
    stop = true;
    reader.join();
    INFO(reads.load() << " reads");
    CHECK(back.load() == 0);
    const mi_abi_churn r = rows_of(ct).at(9);
    CHECK(r.allocated_count == uint64_t{4} * adds * blocks);
    CHECK(r.lifetimes[0] == uint64_t{4} * adds * blocks);
    ct.destroy();
  }
}

TEST_CASE("churn: what a row carried moves and folds with it", "[track][churn]") {
  // A row with carried counts moved by compaction (all of it to the new
  // row), then given back (all of it to the unknown row); 3,000 rows that
  // each carry keep their own counts (every row has a spill entry).
  ChurnTable ct;
  const size_t sizes[] = {4000, 16, 16, 16};
  REQUIRE(ct.init(sizes, 4));
  constexpr uint64_t kBig = 5'000'000;  // blocks: past 2^31 in one add
  ct.on_alloc(11, 2, kBig * kCountOne, 10, false);
  ct.on_alloc(11, 2, 7 * kCountOne, 10, false);
  ct.move_row(11, 2, 1);
  auto rows = rows_of(ct);
  REQUIRE(rows.count(11) == 1);
  CHECK(rows.at(11).allocated_count == kBig + 7);
  CHECK(rows.count(0) == 0);
  ct.settle_row(11, 2, 1);
  ct.on_alloc(11, 1, kCountOne, 10, false);
  CHECK(rows_of(ct).at(11).allocated_count == kBig + 8);
  ct.release_rows(1, 1);
  rows = rows_of(ct);
  CHECK(rows.count(11) == 0);
  CHECK(rows.at(0).allocated_count == kBig + 8);
  for (uint32_t row = 10; row < 3010; ++row) {
    ct.on_alloc(1000 + row, row, kBig * kCountOne, 1, false);
    ct.on_alloc(1000 + row, row, 3 * kCountOne, 1, false);
    for (int k = 0; k < 3; ++k) ct.on_free(1000 + row, row, kBig * kCountOne / 3, 1, 0, false);
  }
  rows = rows_of(ct);
  CHECK(rows.at(0).allocated_count == kBig + 8);
  size_t exact = 0;
  for (uint32_t row = 10; row < 3010; ++row) {
    const mi_abi_churn& r = rows.at(1000 + row);
    if (r.allocated_count == kBig + 3 && r.freed_count == kBig && r.lifetimes[0] == kBig) ++exact;
  }
  CHECK(exact == 3000);
  ct.clear();
  CHECK(rows_of(ct).empty());
  ct.destroy();
}

TEST_CASE("churn: sampled counts keep their fractions", "[track][churn]") {
  ChurnTable ct;
  REQUIRE(ct.init(kSixteens, 4));
  // Ten sampled blocks of 1.4 blocks each: 14, where whole weights gave 10.
  for (int i = 0; i < 10; ++i) ct.on_alloc(7, 3, kCountOne * 14 / 10, 1400, true);
  mi_abi_churn row{};
  ct.for_each([&](const mi_abi_churn& r) { row = r; });
  CHECK(row.stack_id == 7);
  CHECK(row.allocated_count == 14);
  CHECK(row.allocated_bytes == 14000);
  CHECK(row.flags == MI_CHURN_SAMPLED);
  ct.destroy();
}

TEST_CASE("churn: a block freed by another thread, or after another allocation, is not temporary",
          "[track][churn]") {
  Tracker t;
  init_small(t);
  t_fake_stack = {0xA000};
  t.on_alloc(MI_FN_MALLOC, addr(0x10000), 10);
  std::thread([&] { t.on_free(MI_FN_FREE, addr(0x10000)); }).join();
  t.on_alloc(MI_FN_MALLOC, addr(0x20000), 10);
  t.on_alloc(MI_FN_MALLOC, addr(0x30000), 10);
  t.on_free(MI_FN_FREE, addr(0x20000));  // 0x30000 came after it
  t.on_free(MI_FN_FREE, addr(0x30000));  // the last allocation: temporary
  const mi_abi_churn r = churn_by_frame(t).at(0xA000);
  CHECK(r.allocated_count == 3);
  CHECK(r.freed_count == 3);
  CHECK(r.temporary_count == 1);
  t.destroy();
}

TEST_CASE("churn: realloc counts the old block freed, a failed one nothing", "[track][churn]") {
  Tracker t;
  init_small(t);
  t_fake_stack = {0xA000};
  t.on_alloc(MI_FN_MALLOC, addr(0x10000), 10);
  LiveEntry old{};
  REQUIRE(t.take(addr(0x10000), &old));
  t.restore(old);  // the realloc failed
  CHECK(churn_by_frame(t).at(0xA000).freed_count == 0);
  REQUIRE(t.take(addr(0x10000), &old));
  t.freed(MI_FN_REALLOC, &old, 0);  // it moved
  t_fake_stack = {0xB000};
  t.on_alloc(MI_FN_REALLOC, addr(0x20000), 20);
  auto rows = churn_by_frame(t);
  CHECK(rows.at(0xA000).freed_count == 1);
  CHECK(rows.at(0xA000).freed_bytes == 10);
  CHECK(rows.at(0xA000).temporary_count == 1);  // nothing allocated between
  CHECK(rows.at(0xB000).allocated_bytes == 20);
  t.destroy();
}

TEST_CASE("churn: sample mode's figures are unbiased estimates", "[track][churn]") {
  Tracker t;
  Config c;
  c.table_capacity = 1 << 12;
  c.stack_capacity = 1024;
  c.mode = MI_MODE_SAMPLE;
  c.sample_bytes = 4096;
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  // 64 MiB in 64-byte blocks, each freed before the next allocation
  // (expected ~16K samples: 5% is about six standard deviations).
  t_fake_stack = {0xA000};
  const uint64_t n = (uint64_t{64} << 20) / 64;
  for (uint64_t i = 0; i < n; ++i) {
    void* p = addr(0x100000 + 4096 * (i % 8));
    t.on_alloc(MI_FN_MALLOC, p, 64);
    t.on_free(MI_FN_FREE, p);
  }
  const mi_abi_churn r = churn_by_frame(t).at(0xA000);
  CHECK(r.flags == MI_CHURN_SAMPLED);
  CHECK(std::fabs(static_cast<double>(r.allocated_bytes) / (n * 64) - 1) < 0.05);
  CHECK(std::fabs(static_cast<double>(r.allocated_count) / n - 1) < 0.05);
  CHECK(r.freed_bytes == r.allocated_bytes);  // every sampled block was freed
  CHECK(r.temporary_count == r.freed_count);  // and each before the next allocation
  CHECK(r.lifetimes[0] == r.freed_count);
  t.destroy();
}

TEST_CASE("churn: sample mode, a block with bytes allocated after it is not temporary",
          "[track][churn]") {
  Tracker t;
  Config c;
  c.table_capacity = 1 << 12;
  c.stack_capacity = 1024;
  c.mode = MI_MODE_SAMPLE;
  c.sample_bytes = 1;  // every block is a sample point
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  // This thread's countdown may hold what an earlier test's sampler drew
  // (a mean of 4 KiB): a 1 GiB block runs it out, and the next draws are
  // of this tracker's 1-byte mean. Another site, left live.
  t_fake_stack = {0xF000};
  t.on_alloc(MI_FN_MALLOC, addr(0x40000000), size_t{1} << 30);
  t_fake_stack = {0xA000};
  t.on_alloc(MI_FN_MALLOC, addr(0x100000), 4096);
  t.on_free(MI_FN_FREE, addr(0x100000));  // temporary
  t.on_alloc(MI_FN_MALLOC, addr(0x200000), 4096);
  // An allocation the sampler passed over (the hooks' fast path only runs
  // the countdown): the thread's byte position moved, so the block is no
  // longer its last allocation.
  (void)Tracker::sample_due(16);
  t.on_free(MI_FN_FREE, addr(0x200000));
  // Sampled blocks stand for 1/p blocks: p(4096) = 1 - e^-4096 = 1 here.
  const mi_abi_churn r = churn_by_frame(t).at(0xA000);
  CHECK(r.freed_count == 2);
  CHECK(r.temporary_count == 1);
  t.destroy();
}

TEST_CASE("churn table: a reused row folds the old stack's counts into the unknown row",
          "[track][churn]") {
  ChurnTable ct;
  REQUIRE(ct.init(kSixteens, 4));
  // Two stacks that had the same record in turn: the same row.
  const uint32_t old_id = (1u << 6) | 5, new_id = (2u << 6) | 9, row = 12;
  ct.on_alloc(old_id, row, 3 * kCountOne, 300, false);
  ct.on_free(old_id, row, kCountOne, 100, 0, true);
  ct.on_alloc(0, 0, kCountOne, 1, false);
  ct.on_alloc(new_id, row, kCountOne, 10, false);
  std::map<uint32_t, mi_abi_churn> rows;
  ct.for_each([&](const mi_abi_churn& r) { rows[r.stack_id] = r; });
  REQUIRE(rows.size() == 2);
  CHECK(rows.at(new_id).allocated_count == 1);
  CHECK(rows.at(new_id).allocated_bytes == 10);
  CHECK(rows.at(new_id).freed_count == 0);
  CHECK(rows.at(0).allocated_count == 4);
  CHECK(rows.at(0).allocated_bytes == 301);
  CHECK(rows.at(0).freed_count == 1);
  CHECK(rows.at(0).temporary_count == 1);
  // A free for the old id now (it cannot happen: its stack was reclaimed
  // because no live block used it) would go to the unknown row.
  ct.on_free(old_id, row, kCountOne, 100, 0, false);
  // Rows out of range, and any row for id 0, are the unknown row's.
  ct.on_alloc(new_id, 65, kCountOne, 5, false);  // rows 0 to 64
  ct.on_alloc(0, row, kCountOne, 5, false);
  rows.clear();
  ct.for_each([&](const mi_abi_churn& r) { rows[r.stack_id] = r; });
  CHECK(rows.at(0).freed_count == 2);
  CHECK(rows.at(0).allocated_count == 6);
  CHECK(rows.at(0).allocated_bytes == 311);
  CHECK(rows.at(new_id).freed_count == 0);
  CHECK(rows.at(new_id).allocated_count == 1);
  ct.clear();
  uint64_t n = ct.for_each([](const mi_abi_churn&) {});
  CHECK(n == 0);
  ct.destroy();
}

namespace {
// `threads` threads that each allocate and free `pairs` 48-byte blocks
// from the hot site (0xA000), counting in *started (if given) once they
// are 1,000 pairs in.
std::vector<std::thread> hot_pairs(Tracker& t, int threads, int pairs, std::atomic<int>* started) {
  std::vector<std::thread> out;
  for (int w = 0; w < threads; ++w)
    out.emplace_back([&t, w, pairs, started] {
      t_fake_stack = {0xA000};
      for (int i = 0; i < pairs; ++i) {
        void* p = addr(0x1000000 * (w + 1) + 16 * (i % 64));
        t.on_alloc(MI_FN_MALLOC, p, 48);
        t.on_free(MI_FN_FREE, p);
        if (i == 1000 && started != nullptr) started->fetch_add(1);
      }
    });
  return out;
}
}  // namespace

TEST_CASE("churn: counts stay exact with many threads on one site", "[track][churn]") {
  Tracker t;
  init_small(t, 1 << 14);
  constexpr int kThreads = 4, kPairs = 20000;
  for (auto& th : hot_pairs(t, kThreads, kPairs, nullptr)) th.join();
  // One call site, possibly two ids (threads meeting on a new stack):
  // summed over every row with the site's frames.
  uint64_t allocated = 0, bytes = 0, freed = 0, temporary = 0;
  t.for_each_churn([&](const mi_abi_churn& r) {
    allocated += r.allocated_count;
    bytes += r.allocated_bytes;
    freed += r.freed_count;
    temporary += r.temporary_count;
  });
  CHECK(allocated == kThreads * kPairs);
  CHECK(bytes == uint64_t{48} * kThreads * kPairs);
  CHECK(freed == kThreads * kPairs);
  CHECK(temporary == kThreads * kPairs);
  t.destroy();
}

TEST_CASE("churn_group: ids with the same frames are one site, unknown ones are stack 0",
          "[sites][churn]") {
  StackTable st;
  REQUIRE(st.init(64, 8));
  const uintptr_t frames[] = {0x1, 0x2};
  const uint32_t a = st.intern(frames, 2);
  REQUIRE(a != 0);
  std::vector<mi_abi_churn> rows(3);
  rows[0].stack_id = a;
  rows[0].allocated_count = 2;
  rows[0].allocated_bytes = 20;
  rows[1].stack_id = a + 1000;  // never stored: unknown
  rows[1].allocated_count = 5;
  rows[1].flags = MI_CHURN_SAMPLED;
  rows[2].stack_id = 0;
  rows[2].allocated_count = 1;
  rows[2].lifetimes[2] = 1;
  rows[2].freed_count = 1;
  const auto sites = mi::sites::group_churn(rows, fetch_from, hash_from, &st);
  REQUIRE(sites.size() == 2);
  std::map<uint32_t, mi::sites::ChurnSite> by;
  for (const auto& s : sites) by[s.stack] = s;
  CHECK(by.at(a).allocated_count == 2);
  CHECK(by.at(a).allocated_bytes == 20);
  CHECK_FALSE(by.at(a).estimated);
  CHECK(by.at(0).allocated_count == 6);
  CHECK(by.at(0).freed_count == 1);
  CHECK(by.at(0).lifetimes[2] == 1);
  CHECK(by.at(0).estimated);

  // Joined with the live sites: alloc from churn, inuse from the table.
  std::vector<mi::sites::Site> live = {{a, 1, 10, 0, false}};
  const auto joined = mi::sites::join_sites(live, sites, fetch_from, hash_from, &st);
  REQUIRE(joined.size() == 2);
  for (const auto& j : joined) {
    if (j.stack == a) {
      CHECK(j.inuse_count == 1);
      CHECK(j.alloc_count == 2);
      CHECK(j.alloc_bytes == 20);
    } else {
      CHECK(j.stack == 0);
      CHECK(j.inuse_count == 0);
      CHECK(j.alloc_count == 6);
    }
  }
  st.destroy();
}

TEST_CASE("join_sites: live sites split by process keep their split, churn is counted once",
          "[sites][churn]") {
  StackTable st;
  REQUIRE(st.init(64, 8));
  const uintptr_t fa[] = {0x1, 0x2}, fb[] = {0x3};
  const uint32_t a = st.intern(fa, 2), b = st.intern(fb, 1);
  REQUIRE(a != 0);
  REQUIRE(b != 0);
  std::vector<mi_abi_churn> rows(2);
  rows[0].stack_id = a;  // 100 blocks allocated, 3 of them live in two processes
  rows[0].allocated_count = 100;
  rows[0].allocated_bytes = 1000;
  rows[1].stack_id = b;  // 2 allocated, both live in one process
  rows[1].allocated_count = 2;
  rows[1].allocated_bytes = 40;
  const auto churned = mi::sites::group_churn(rows, fetch_from, hash_from, &st);
  const uint64_t p1 = 0x1003, p2 = 0x2003;
  std::vector<mi::sites::Site> live = {
      {a, 2, 20, 0, false, p1}, {a, 1, 10, 0, false, p2}, {b, 2, 40, 0, false, p1}};
  const auto joined = mi::sites::join_sites(live, churned, fetch_from, hash_from, &st);
  std::map<std::pair<uint32_t, uint64_t>, mi::sites::ProfileSite> by;
  for (const auto& j : joined) by[{j.stack, j.pid}] = j;
  // b's every allocation is p1's live blocks: no row of pid 0 is left.
  REQUIRE(by.size() == 4);
  CHECK(by.at({a, p1}).inuse_bytes == 20);
  CHECK(by.at({a, p1}).alloc_bytes == 20);
  CHECK(by.at({a, p2}).alloc_count == 1);
  CHECK(by.at({a, 0}).inuse_count == 0);
  CHECK(by.at({a, 0}).alloc_count == 97);
  CHECK(by.at({a, 0}).alloc_bytes == 970);
  CHECK(by.at({b, p1}).alloc_bytes == 40);
  // Per stack, the figures add up to churn's and the table's.
  double alloc_a = 0, inuse_a = 0;
  for (const auto& j : joined)
    if (j.stack == a) alloc_a += j.alloc_bytes, inuse_a += j.inuse_bytes;
  CHECK(alloc_a == 1000);
  CHECK(inuse_a == 30);
  st.destroy();
}

TEST_CASE("churn: the table is resident only where sites wrote", "[track][churn]") {
  Tracker t;
  Config c;
  c.table_capacity = 1 << 12;
  c.stack_capacity = 1 << 16;  // the default: 16 MiB reserved for churn
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  CHECK(t.churn_resident_bytes() == 0);
  for (uintptr_t site = 1; site <= 3; ++site) {
    t_fake_stack = {0x1000 * site};
    t.on_alloc(MI_FN_MALLOC, addr(0x10000 * site), 16);
    t.on_free(MI_FN_FREE, addr(0x10000 * site));
  }
  CHECK(churn_by_frame(t).size() == 3);
  // Four slots (the unknown row's too) on one page, and the index's pages
  // for three stack-table slots; a read (for_each) maps nothing more.
  CHECK(t.churn_resident_bytes() <= 4 * 4096);
  t.reset();
  CHECK(t.churn_resident_bytes() == 0);
  t.destroy();
}

TEST_CASE("churn: sites spread over the stack table cost a slot each, not a page each",
          "[track][churn]") {
  Tracker t;
  Config c;
  c.table_capacity = 1 << 12;
  c.stack_capacity = 1 << 16;
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  // 2000 call sites: their stacks hash all over the 64 Ki stack slots.
  for (uintptr_t site = 1; site <= 2000; ++site) {
    t_fake_stack = {0x1000 * site, 0x777000};
    t.on_alloc(MI_FN_MALLOC, addr(0x10000), 16);
    t.on_free(MI_FN_FREE, addr(0x10000));
  }
  const auto by = churn_by_frame(t);
  CHECK(by.size() == 2000);
  // 2001 rows of 128 bytes (250 KiB) and at most the whole index (4
  // bytes a stack slot: 256 KiB); slots indexed by stack slot would touch
  // about 1,600 of their 4,096 pages (6.4 MiB).
  const size_t resident = t.churn_resident_bytes();
  INFO("churn resident " << resident);
  CHECK(resident <= (2001 * ChurnTable::kRowBytes + 4095) / 4096 * 4096 + 256 * 1024);
  t.destroy();
}

namespace {
// A sweeping tracker with 900 call sites' stacks stored (records 0-899,
// their blocks allocated and freed), then the hot site's (0xA000, record
// 900) with `hot` blocks of 48 bytes live at 0x9000000, 0x9000100, ...:
// the first keeps its stack stored through every sweep (a reclaimed
// stack's churn rows can no longer be named). The next sweep frees the
// 900 and its compaction moves the hot stack's record to the bottom.
void init_hot_site(Tracker& t, int hot) {
  Config c;
  c.table_capacity = 1 << 14;
  c.stack_capacity = 4096;
  REQUIRE(t.init(c, fake_unwind, fake_clock));
  REQUIRE(t.hooks_sweep());  // membarrier and MADV_WIPEONFORK are available
  for (uintptr_t site = 1; site <= 900; ++site) {
    t_fake_stack = {0x1000 * site, 0x777000};
    t.on_alloc(MI_FN_MALLOC, addr(0x100000 + 64 * site), 16);
  }
  t_fake_stack = {0xA000};
  for (int i = 0; i < hot; ++i) t.on_alloc(MI_FN_MALLOC, addr(0x9000000 + 0x100 * i), 48);
  for (uintptr_t site = 1; site <= 900; ++site) t.on_free(MI_FN_FREE, addr(0x100000 + 64 * site));
}
}  // namespace

TEST_CASE("churn: a busy site's counts stay exact while compaction moves its record",
          "[track][churn][reclaim]") {
  // 900 sites with a live block each, then a hot site: its stack's record
  // is the pool's 901st. The 900 blocks are freed, and two threads
  // allocate and free from the hot site while reclaim() sweeps: the first
  // compaction moves the hot stack's record (and its churn row) down to
  // the bottom of the pool under them, the next settles what was counted
  // on the old row meanwhile. The site's counts, over every row with its
  // frames, are exact.
  Tracker t;
  init_hot_site(t, 1);
  constexpr int kThreads = 2, kPairs = 200000;
  std::atomic<int> started{0};
  std::vector<std::thread> threads = hot_pairs(t, kThreads, kPairs, &started);
  while (started.load() < kThreads) std::this_thread::yield();
  for (int i = 0; i < 3; ++i) t.reclaim();
  for (auto& th : threads) th.join();
  t.reclaim();  // settles the last moves
  CHECK(t.stacks_moved() >= 1);
  uint64_t allocated = 0, bytes = 0, freed = 0, all = 0;
  t.for_each_churn([&](const mi_abi_churn& r) {
    all += r.allocated_count;
    uint64_t frames[4];
    if (r.stack_id == 0 || t.stack(r.stack_id, frames, 4) == 0 || frames[0] != 0xA000) return;
    allocated += r.allocated_count;
    bytes += r.allocated_bytes;
    freed += r.freed_count;
  });
  CHECK(allocated == kThreads * kPairs + 1);
  CHECK(bytes == 48 * (uint64_t{kThreads} * kPairs + 1));
  CHECK(freed == kThreads * kPairs);
  CHECK(all == kThreads * kPairs + 901);
  t.destroy();
}

TEST_CASE("churn: a free counting on a stack's old row while it moves keeps its count",
          "[track][churn][reclaim][concurrency]") {
  // A thread frees a block of a hot site and is held after it read the
  // site's churn row (its stack pinned), while a sweep frees 900 other
  // stacks and its compaction moves the hot stack's record (and row) from
  // 900 down to 0. The pin keeps the old row through that compaction; the
  // free then counts there, and the next compaction carries the count to
  // the new row. (Without the pin the old row would be given up at once,
  // and the free counted with the unknown stacks.)
  Tracker t;
  init_hot_site(t, 2);  // 0x9000100 is freed by the held thread
  struct Held : Parking {
    static void hook(TestPoint p, void* ctx) {
      if (p == TestPoint::kCounting) Parking::hook(ctx);
    }
  } held;
  t.set_test_hook(&Held::hook, &held);
  std::thread freer([&] { t.on_free(MI_FN_FREE, addr(0x9000100)); });
  held.wait_parked();
  const uint64_t moved = t.stacks_moved();
  CHECK(t.reclaim() == 900);
  CHECK(t.stacks_moved() == moved + 1);
  held.release();
  freer.join();
  t.set_test_hook(nullptr, nullptr);
  t.reclaim();  // settles the old row into the new one
  uint64_t hot_allocated = 0, hot_freed = 0, freed = 0;
  t.for_each_churn([&](const mi_abi_churn& r) {
    freed += r.freed_count;
    uint64_t frames[4];
    if (r.stack_id != 0 && t.stack(r.stack_id, frames, 4) != 0 && frames[0] == 0xA000) {
      hot_allocated += r.allocated_count;
      hot_freed += r.freed_count;
    }
  });
  CHECK(hot_allocated == 2);
  CHECK(hot_freed == 1);
  CHECK(freed == 901);  // the 900 other sites' (freed stacks: the unknown row's, or their ids')
  t.destroy();
}
