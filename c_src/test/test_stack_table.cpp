// Catch2 tests for the tracker's stack table (track/stack_table):
// deduplication, stable ids, parked and concurrent writers (duplicates the
// readers merge), reclaimed and revived slots.
#include "catch.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "../track/stack_table.h"
#include "track_fixture.h"

using namespace mi::track;
using namespace mi::test;

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

TEST_CASE("stack table: a tail is stored after the frames, one stack, whatever its token",
          "[track][stacks]") {
  StackTable st;
  REQUIRE(st.init(1000, 8));
  const uintptr_t f[] = {1, 2, 3};
  const uint64_t ta[] = {0xE7C0000000010000ull, 7, 8};
  const uint64_t tb[] = {0xE7C0000000010000ull, 7, 9};
  const StackTable::Tail a{ta, 3, StackTable::hash_words(ta, 3), 0};
  const StackTable::Tail b{tb, 3, StackTable::hash_words(tb, 3), 0};
  const uint32_t ia = st.intern(f, 3, a);
  REQUIRE(ia != 0);
  uint64_t out[16];
  REQUIRE(st.get(ia, out, 16) == 6);
  CHECK(std::vector<uint64_t>(out, out + 6) == std::vector<uint64_t>{1, 2, 3, ta[0], 7, 8});
  // Another tail, or none: other stacks.
  const uint32_t ib = st.intern(f, 3, b);
  CHECK(ib != ia);
  CHECK(st.intern(f, 3) != ia);
  // The same words under any token (or none) are the same stack: a token
  // only spares the comparison.
  StackTable::Tail a1 = a, a2 = a;
  a1.token = 11;
  a2.token = 12;
  CHECK(st.intern(f, 3, a1) == ia);
  CHECK(st.intern(f, 3, a2) == ia);
  CHECK(st.intern(f, 3, a) == ia);
  CHECK(st.count() == 3);
  CHECK(st.hash_of(ia) != st.hash_of(ib));
  // A tail that does not fit is left out; frames are cut to fit beside one.
  const uint64_t long_tail[9] = {};
  CHECK(st.intern(f, 3, StackTable::Tail{long_tail, 9, 1, 0}) == st.intern(f, 3));
  const uintptr_t deep[] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
  const uint32_t id = st.intern(deep, 10, a);
  REQUIRE(st.get(id, out, 16) == 8);
  CHECK(std::vector<uint64_t>(out, out + 8) == std::vector<uint64_t>{9, 8, 7, 6, 5, ta[0], 7, 8});
  st.destroy();
}

TEST_CASE("stack table: a stored tail's token stands for its words", "[track][stacks]") {
  // White box: the token is what makes a tail cheap to compare. A caller
  // that broke Tail's contract (one token, two contents) would be answered
  // with the stack of the token's first content: the words are not read.
  StackTable st;
  REQUIRE(st.init(1000, 8));
  const uintptr_t f[] = {1, 2, 3};
  const uint64_t ta[] = {0xE7C0000000010000ull, 7, 8};
  const uint64_t tb[] = {0xE7C0000000010000ull, 7, 9};
  const uint64_t h = StackTable::hash_words(ta, 3);
  const uint32_t ia = st.intern(f, 3, StackTable::Tail{ta, 3, h, 5});
  CHECK(st.intern(f, 3, StackTable::Tail{tb, 3, h, 5}) == ia);
  // Another token: compared word by word.
  CHECK(st.intern(f, 3, StackTable::Tail{tb, 3, h, 6}) != ia);
  // The frames are always compared.
  const uintptr_t g[] = {1, 2, 4};
  CHECK(st.intern(g, 3, StackTable::Tail{ta, 3, h, 5}) != ia);
  st.destroy();
}

TEST_CASE("stack table: a writer parked past the spin limit makes a duplicate readers merge",
          "[track][stacks][concurrency]") {
  StackTable st;
  REQUIRE(st.init(1024, 8));
  const uintptr_t s[] = {0x11, 0x22, 0x33};
  Parking parking;
  st.set_park_hook(&Parking::hook, &parking);
  uint32_t parked_id = 0;
  std::thread writer([&] { parked_id = st.intern(s, 3); });
  parking.wait_parked();
  // The writer holds the slot s hashes to, mid-write. With no spinning
  // allowed, the second interner cannot wait for it: it stores s again.
  st.set_park_hook(nullptr, nullptr);
  st.set_spin_limit(0);
  const uint32_t second = st.intern(s, 3);
  parking.release();
  writer.join();
  REQUIRE(parked_id != 0);
  REQUIRE(second != 0);
  CHECK(second != parked_id);
  CHECK(st.count() == 2);
  CHECK(frames_of(st, second) == frames_of(st, parked_id));
  // Readers merge the two ids into one call site, the smaller id, whether
  // they hash the frames themselves or use the table's hashes.
  for (const bool table_hashes : {true, false}) {
    const auto canon = canonical_ids(st, {parked_id, second}, table_hashes);
    CHECK(canon.at(parked_id) == std::min(parked_id, second));
    CHECK(canon.at(second) == std::min(parked_id, second));
  }
  // Once published, the stack is found again: no third copy.
  CHECK(st.intern(s, 3) == std::min(parked_id, second));
  CHECK(st.count() == 2);
  st.destroy();
}

TEST_CASE("stack table: with a generous spin limit every thread gets the parked writer's id",
          "[track][stacks][concurrency]") {
  StackTable st;
  REQUIRE(st.init(1024, 8));
  st.set_spin_limit(UINT32_MAX);
  const uintptr_t s[] = {0x44, 0x55, 0x66, 0x77};
  Parking parking;
  st.set_park_hook(&Parking::hook, &parking);
  uint32_t parked_id = 0;
  std::thread writer([&] { parked_id = st.intern(s, 4); });
  parking.wait_parked();
  st.set_park_hook(nullptr, nullptr);
  constexpr int kThreads = 4;
  std::vector<uint32_t> ids(kThreads, 0);
  std::vector<std::thread> others;
  for (int t = 0; t < kThreads; ++t) others.emplace_back([&, t] { ids[t] = st.intern(s, 4); });
  // Whether they arrive while the writer is parked (and wait for it) or
  // after it published, every thread must find the writer's copy.
  parking.release();
  writer.join();
  for (auto& t : others) t.join();
  REQUIRE(parked_id != 0);
  for (uint32_t id : ids) CHECK(id == parked_id);
  CHECK(st.count() == 1);
  st.destroy();
}

TEST_CASE("stack table: concurrent interning of the same stacks", "[track][stacks][concurrency]") {
  // Two threads intern the same 2000 stacks in the same order. Without
  // spinning, each stack may be stored twice: up to 4000 copies, so the
  // table has room for four times that (at 98% full, as 4096 slots would
  // be, a probe window can be all taken and a stack dropped: a fresh-clone
  // TSan run saw it).
  for (const uint32_t limit : {UINT32_MAX, 0u}) {
    StackTable st;
    REQUIRE(st.init(16384, 4));
    st.set_spin_limit(limit);
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
    INFO("spin limit " << limit);
    std::vector<uint32_t> all(ids[0]);
    all.insert(all.end(), ids[1].begin(), ids[1].end());
    const auto canon = canonical_ids(st, all);
    std::set<uint32_t> sites;
    size_t same = 0, same_site = 0;
    for (size_t i = 0; i < 2000; ++i) {
      REQUIRE(ids[0][i] != 0);
      REQUIRE(ids[1][i] != 0);
      REQUIRE(frames_of(st, ids[1][i]) == std::vector<uint64_t>{i + 1, (i + 1) * 7, (i + 1) * 13});
      if (ids[0][i] == ids[1][i]) ++same;
      if (canon.at(ids[0][i]) == canon.at(ids[1][i])) ++same_site;
      sites.insert(canon.at(ids[0][i]));
    }
    // Waiting out every writer, the threads agree on every id. Without
    // waiting they may not, but readers still see exactly one call site per
    // stack, and every stored copy is one of them.
    if (limit == UINT32_MAX) {
      CHECK(same == 2000);
      CHECK(st.count() == 2000);
    }
    CHECK(same_site == 2000);
    CHECK(sites.size() == 2000);
    CHECK(st.count() == 2000 + (2000 - same));
    st.destroy();
  }
}

namespace {
// One whole sweep of a 64-slot table holding `ids` that marks every id
// but ids[skip]: it frees that stack, and only that one.
void sweep_freeing(StackTable& st, const std::vector<uint32_t>& ids, size_t skip) {
  const uint32_t e = st.begin_sweep();
  for (size_t i = 0; i < ids.size(); ++i)
    if (i != skip) REQUIRE(st.mark(ids[i], e));
  CHECK(st.condemn(0, 64, e) == 1);
  CHECK(st.finish(0, 64, e) == 1);
  st.end_sweep(1);
}
}  // namespace

TEST_CASE("stack table: a reclaimed id reads as unknown, never as its slot's next stack",
          "[track][stacks]") {
  StackTable st;
  REQUIRE(st.init(64, 4));  // one probe window: every stack can use every slot
  std::vector<uint32_t> ids;
  for (uintptr_t i = 1; i <= 64; ++i) {
    const uintptr_t f[] = {i, i + 1000};
    ids.push_back(st.intern(f, 2));
    REQUIRE(ids.back() != 0);
  }
  const uintptr_t extra[] = {7777, 8888};
  CHECK(st.intern(extra, 2) == 0);  // full
  CHECK(st.dropped() == 1);
  // A sweep that marks every stack but the fifth frees the fifth only.
  sweep_freeing(st, ids, 4);
  CHECK(st.count() == 63);
  CHECK(st.reclaimed() == 1);
  CHECK(frames_of(st, ids[4]).empty());
  CHECK_FALSE(st.hold(ids[4], st.epoch()));
  // The new stack can only go to the freed slot: same slot, new generation.
  const uint32_t reused = st.intern(extra, 2);
  REQUIRE(reused != 0);
  CHECK((reused & 63) == (ids[4] & 63));
  CHECK(reused != ids[4]);
  CHECK(frames_of(st, reused) == std::vector<uint64_t>{7777, 8888});
  CHECK(frames_of(st, ids[4]).empty());  // still unknown, not 7777/8888
  CHECK(frames_of(st, ids[5]) == std::vector<uint64_t>{6, 1006});
  st.destroy();
}

TEST_CASE(
    "stack table: reuse() answers for the id's own stack while it is stored, as intern() would",
    "[track][stacks]") {
  StackTable st;
  REQUIRE(st.init(64, 4));
  const uintptr_t a[] = {11, 12}, b[] = {21, 22};
  const uint32_t ia = st.intern(a, 2), ib = st.intern(b, 2);
  REQUIRE(ia != 0);
  REQUIRE(ib != 0);
  const uint64_t ha = st.hash_of(ia), hb = st.hash_of(ib);
  REQUIRE(ha != hb);
  CHECK(st.reuse(ia, ha));
  CHECK_FALSE(st.reuse(ia, hb));  // a hash of another stack: not this id's
  CHECK_FALSE(st.reuse(0, ha));
  // A sweep that marks nothing condemns both; reuse() keeps a, as intern()
  // of a's frames would (stamped with the sweep's epoch: revived).
  const uint32_t e = st.begin_sweep();
  CHECK(st.condemn(0, 64, e) == 2);
  CHECK(st.reuse(ia, ha));
  CHECK(st.finish(0, 64, e) == 1);
  st.end_sweep(1);
  CHECK(frames_of(st, ia) == std::vector<uint64_t>{11, 12});
  // b was freed: its id and hash answer no more, and a stack stored in
  // its slot later is not b.
  CHECK_FALSE(st.reuse(ib, hb));
  CHECK(frames_of(st, ib).empty());
  CHECK(st.intern(a, 2) == ia);
  st.destroy();
}

TEST_CASE("stack table: a condemned stack interned again is revived, not duplicated",
          "[track][stacks]") {
  StackTable st;
  REQUIRE(st.init(1024, 4));
  const uintptr_t f[] = {5, 6, 7};
  const uint32_t id = st.intern(f, 3);
  const uint32_t e = st.begin_sweep();
  CHECK(st.condemn(0, 1024, e) == 1);
  CHECK(frames_of(st, id) == std::vector<uint64_t>{5, 6, 7});  // FREEING still reads
  CHECK(st.intern(f, 3) == id);  // revived and stamped with this epoch
  CHECK(st.finish(0, 1024, e) == 0);
  st.end_sweep(0);
  CHECK(st.count() == 1);
  CHECK(frames_of(st, id) == std::vector<uint64_t>{5, 6, 7});
  st.destroy();
}

namespace {
// One whole sweep that marks nothing: every stack not interned or held
// since it began is freed. Returns how many were.
size_t sweep_all(StackTable& st) {
  const uint32_t e = st.begin_sweep();
  st.condemn(0, st.capacity(), e);
  const size_t freed = st.finish(0, st.capacity(), e);
  st.end_sweep(freed);
  return freed;
}
}  // namespace

TEST_CASE("stack table: the record pool holds the stacks stored at once, not every slot used",
          "[track][stacks]") {
  StackTable st;
  REQUIRE(st.init(4096, 6));
  // Depth 6: records of 3, 4, 6 and 8 words (a token, the hash and the
  // stack).
  CHECK(st.record_bytes(1) == 3 * sizeof(uint64_t));
  CHECK(st.record_bytes(3) == 6 * sizeof(uint64_t));
  CHECK(st.record_bytes(6) == 8 * sizeof(uint64_t));
  std::vector<uint32_t> old_ids;
  for (uintptr_t round = 0; round < 10; ++round) {
    std::vector<uint32_t> ids;
    for (uintptr_t i = 1; i <= 200; ++i) {
      const uintptr_t f[] = {round * 1000 + i, i, round};
      ids.push_back(st.intern(f, 3));
      REQUIRE(ids.back() != 0);
    }
    for (uintptr_t i = 1; i <= 200; ++i)
      REQUIRE(frames_of(st, ids[i - 1]) == std::vector<uint64_t>{round * 1000 + i, i, round});
    // The previous round's ids gave their records to this round's stacks:
    // they read as unknown, never as the stacks now in their records.
    for (const uint32_t id : old_ids) REQUIRE(frames_of(st, id).empty());
    CHECK(sweep_all(st) == 200);
    old_ids = ids;
  }
  // 2000 stacks over the slots their hashes chose, 200 records.
  CHECK(st.reclaimed() == 2000);
  CHECK(st.records_used() == 200);
  st.destroy();
}

TEST_CASE("stack table: records moving between slots under concurrent sweeps never mix stacks",
          "[track][stacks][concurrency]") {
  // Two threads intern ever new stacks and read them back, each as it is
  // stored and again 64 stacks later, while a third sweeps without
  // marking, so records are freed and taken again under them. A read
  // answers the id's own words or nothing.
  StackTable st;
  REQUIRE(st.init(1024, 8));
  std::atomic<bool> stop{false}, sweeping{false};
  std::atomic<uint64_t> reads{0}, unknown{0}, bad{0};
  auto words = [](uintptr_t w, uintptr_t i, uintptr_t* f) {
    const uintptr_t v[] = {w, i, i * 3, i ^ 0x5555, w * 7 + i};
    std::copy(v, v + 5, f);
  };
  auto check = [&](uint32_t id, uintptr_t w, uintptr_t i) {
    uintptr_t f[5];
    words(w, i, f);
    uint64_t out[8];
    const unsigned n = st.get(id, out, 8);
    reads.fetch_add(1, std::memory_order_relaxed);
    if (n == 0)
      unknown.fetch_add(1, std::memory_order_relaxed);
    else if (n != 5 || !std::equal(f, f + 5, out))
      bad.fetch_add(1, std::memory_order_relaxed);
  };
  auto work = [&](uintptr_t w) {
    while (!sweeping.load()) std::this_thread::yield();
    std::pair<uint32_t, uintptr_t> ring[64] = {};
    for (uintptr_t i = 1, stored = 0; stored < 20000; ++i) {
      uintptr_t f[5];
      words(w, i, f);
      const uint32_t id = st.intern(f, 5);
      if (id == 0) {  // dropped: the table is full of stacks no sweep has seen yet
        std::this_thread::yield();
        continue;
      }
      check(id, w, i);
      auto& old = ring[stored++ % 64];
      if (old.first != 0) check(old.first, w, old.second);
      old = {id, i};
    }
  };
  std::thread sweeper([&] {
    sweeping.store(true);
    while (!stop.load(std::memory_order_relaxed)) sweep_all(st);
  });
  std::thread t1(work, 1), t2(work, 2);
  t1.join();
  t2.join();
  stop.store(true);
  sweeper.join();
  INFO("reads " << reads.load() << ", unknown " << unknown.load());
  CHECK(bad.load() == 0);
  CHECK(reads.load() > 0);
  CHECK(st.reclaimed() > 0);
  // Every record is in a slot or free again: never more than the table's
  // slots (and the window a fork may lose).
  CHECK(st.records_used() <= st.capacity() + StackTable::kWindow);
  st.destroy();
}

TEST_CASE("stack table: resident records follow the stacks stored at once", "[track][stacks]") {
  // 20,000 distinct stacks through a 65,536-slot table in rounds of 2,000,
  // each round's swept away before the next: the slots touched are spread
  // over the whole table, the records are 2,000. (With the frames kept in
  // their slots, as before the record pool, about 17,000 slots used of
  // 65,536 left nearly every page of the frames resident: this run grew
  // the RSS by 23.2 MiB then, 2.2 MiB now.)
  StackTable st;
  REQUIRE(st.init(65536, 44));
  const size_t rec = st.record_bytes(44);
  for (uintptr_t round = 0; round < 10; ++round) {
    for (uintptr_t i = 1; i <= 2000; ++i) {
      uintptr_t f[44];
      for (uintptr_t j = 0; j < 44; ++j) f[j] = round << 32 | i << 8 | j;
      REQUIRE(st.intern(f, 44) != 0);
    }
    CHECK(sweep_all(st) == 2000);
  }
  CHECK(st.records_used() == 2000);
  const size_t records = st.resident_record_bytes();
  INFO("records resident " << records << " B, slots written "
                           << st.resident_slot_bytes(PageCounter::pagemap()) << " B");
  CHECK(records >= 2000 * rec);
  CHECK(records <= 2000 * rec + 4096);
  // The slots: 16 bytes and a tag each, all in the first level (a quarter
  // of the table, 272 KiB): a window there always had room, and a swept
  // table reuses its freed slots first. One level of 65,536 kept 1 MiB. (The
  // pages written: the sweeps read every slot, which mincore counts.)
  const PageCounter pages = PageCounter::pagemap();
  REQUIRE(pages.reads_pagemap());
  CHECK(st.resident_slot_bytes(pages) <= 65536 / 4 * 17);
  st.destroy();
}

// The probe position of stack `id` (stored, so its hash is known): how
// many slots its probe visits before its own; SIZE_MAX when its slot is
// not in its probe.
size_t probe_position(const StackTable& st, uint32_t id) {
  const size_t slot = id & (st.capacity() - 1);
  const uint64_t hash = st.hash_of(id);
  for (unsigned l = 0; l < st.levels(); ++l)
    for (size_t i = 0; i < StackTable::kWindow; ++i)
      if (st.probe_slot_of(hash, l, i) == slot) return l * StackTable::kWindow + i;
  return SIZE_MAX;
}

// The id of a READY slot's stack, on a table never swept (generation 1);
// 0 when the slot holds none.
uint32_t first_gen_id(const StackTable& st, size_t slot) {
  const uint32_t id = uint32_t{1} << st.slot_bits() | static_cast<uint32_t>(slot);
  return st.ready(id) ? id : 0;
}

TEST_CASE("stack table: stacks go to a later level only when their windows before are full",
          "[track][stacks]") {
  // 1,024 slots: levels of 256, 256 and 512. 900 stacks fill the first
  // level's windows, so some go on to the later ones; each is found
  // again with its id, wherever it went.
  StackTable st;
  REQUIRE(st.init(1024, 4));
  REQUIRE(st.levels() == 3);
  std::vector<uint32_t> ids;
  size_t later = 0;
  for (uintptr_t i = 1; i <= 900; ++i) {
    const uintptr_t f[] = {i, i * 3, i * 5};
    const uint32_t id = st.intern(f, 3);
    REQUIRE(id != 0);
    ids.push_back(id);
    if ((id & 1023) >= 512) ++later;
    // Nothing was freed: every slot the new stack's probe visited before
    // its own held a stack when it was stored (it takes the first free
    // slot it passes).
    const size_t at = probe_position(st, id);
    REQUIRE(at != SIZE_MAX);
    const uint64_t hash = st.hash_of(id);
    for (size_t p = 0; p < at; ++p) {
      const size_t slot = st.probe_slot_of(hash, static_cast<unsigned>(p / StackTable::kWindow),
                                           p % StackTable::kWindow);
      REQUIRE(first_gen_id(st, slot) != 0);
    }
  }
  CHECK(st.dropped() == 0);
  INFO(later << " of 900 stacks in the last level");
  CHECK(later > 0);
  // Each found again through the tags alone: no probe of the headers.
  CHECK(st.header_probes() == 900);
  for (uintptr_t i = 1; i <= 900; ++i) {
    const uintptr_t f[] = {i, i * 3, i * 5};
    REQUIRE(st.intern(f, 3) == ids[i - 1]);
    REQUIRE(frames_of(st, ids[i - 1]) == std::vector<uint64_t>{i, i * 3, i * 5});
  }
  CHECK(st.header_probes() == 900);
  CHECK(st.count() == 900);
  // Swept, the table stores new stacks in the first level again: each
  // window there is all FREE or EMPTY now, and a new stack takes the first
  // reusable slot of its probe. Their tags replace the old stacks': they
  // are found again through the tags too.
  CHECK(sweep_all(st) == 900);
  std::vector<uint32_t> reused;
  for (uintptr_t i = 1; i <= 200; ++i) {
    const uintptr_t f[] = {i << 20, i, 77};
    const uint32_t id = st.intern(f, 3);
    REQUIRE(id != 0);
    CHECK((id & 1023) < 256);
    reused.push_back(id);
  }
  const uint64_t probes = st.header_probes();
  for (uintptr_t i = 1; i <= 200; ++i) {
    const uintptr_t f[] = {i << 20, i, 77};
    REQUIRE(st.intern(f, 3) == reused[i - 1]);
  }
  CHECK(st.header_probes() == probes);
  // A stack of the first batch is new again: not a stale id of its old
  // slot.
  const uintptr_t first[] = {1, 3, 5};
  const uint32_t again = st.intern(first, 3);
  CHECK(again != ids[0]);
  CHECK((again & 1023) < 256);
  st.destroy();
}

TEST_CASE("stack table: the tags find a stack whose window wraps round its level's end",
          "[track][stacks]") {
  // Tables filled to 90%, so that windows run long: among their stacks,
  // for each level and each offset of a window's start in a tag word,
  // one whose window wraps round its level's end before reaching the
  // stack. Each is found again through the tags alone.
  std::set<std::pair<unsigned, size_t>> seen;  // (level, start % 8) of a wrapped find
  for (uintptr_t seed = 1; seed <= 200 && seen.size() < 3 * 8; ++seed) {
    StackTable st;
    REQUIRE(st.init(1024, 4));
    std::vector<std::pair<uint32_t, std::vector<uintptr_t>>> stored;
    for (uintptr_t i = 1; i <= 920; ++i) {
      std::vector<uintptr_t> f = {seed << 40 | i, i * 11, seed};
      const uint32_t id = st.intern(f.data(), 3);
      if (id != 0) stored.emplace_back(id, f);
    }
    const uint64_t probes = st.header_probes();
    for (const auto& [id, f] : stored) {
      const size_t at = probe_position(st, id);
      REQUIRE(at != SIZE_MAX);
      const unsigned l = static_cast<unsigned>(at / StackTable::kWindow);
      const uint64_t hash = st.hash_of(id);
      const size_t start = st.probe_slot_of(hash, l, 0);
      // Wrapped: the stack's slot is below its window's start.
      if ((id & 1023) >= start) continue;
      REQUIRE(st.intern(f.data(), 3) == id);
      seen.emplace(l, start % 8);
    }
    CHECK(st.header_probes() == probes);
    st.destroy();
  }
  CHECK(seen.size() == 3 * 8);
}

TEST_CASE("stack table: what a sweep only reads is not counted as resident",
          "[track][stacks][memory]") {
  // 100 stacks in 65,536 16-byte slots (256 pages), then a sweep, which
  // reads every slot: the pages it only read map the kernel's zero page.
  // status()'s figure (PageCounter on pagemap) counts the pages written, at
  // most one a stack; mincore counts every page read too (a review found
  // 1.5 MiB reported for 100 stacks).
  StackTable st;
  REQUIRE(st.init(65536, 44));
  for (uintptr_t i = 1; i <= 100; ++i) {
    const uintptr_t f[] = {i, i * 7, i * 13};
    REQUIRE(st.intern(f, 3) != 0);
  }
  const uint32_t e = st.begin_sweep();
  st.condemn(0, st.capacity(), e);
  st.end_sweep(st.finish(0, st.capacity(), e));
  const PageCounter pages = PageCounter::pagemap();
  REQUIRE(pages.reads_pagemap());  // a Linux /proc, as the tracker's hosts have
  const size_t own = st.resident_slot_bytes(pages);
  INFO("pagemap " << own << " B, mincore " << st.resident_slot_bytes() << " B");
  CHECK(own > 0);
  CHECK(own <= 100 * 4096);
  CHECK(st.resident_slot_bytes() >= own);
  // Pages written after are counted: 300 more stacks take the 100 records
  // the sweep freed and 200 new ones of 96 bytes, at least four pages
  // past the first 100's.
  const size_t records = st.resident_record_bytes(pages);
  for (uintptr_t i = 101; i <= 400; ++i) {
    const uintptr_t f[] = {i, i * 7, i * 13};
    REQUIRE(st.intern(f, 3) != 0);
  }
  CHECK(st.resident_record_bytes(pages) >= records + 4 * 4096);
  st.destroy();
}

TEST_CASE("stack table: a stack takes a larger record when its own size is spent",
          "[track][stacks]") {
  // 2048 slots at depth 6 (records of 3, 4, 6 and 8 words): 2,112
  // records of the largest size, 544 of each other (a quarter, rounded up
  // to a page of churn rows). 1,000 three-word stacks (5 words with the
  // token and the hash: the third size) fill its 544, then take 456 of
  // the largest; swept and stored again, each
  // record goes back to its own size's pool and is taken from there.
  StackTable st;
  REQUIRE(st.init(2048, 6));
  CHECK(st.segment_rows(0) == 544);
  CHECK(st.segment_rows(2) == 544);
  CHECK(st.segment_rows(3) == 2112);
  uint64_t scratch[64];
  for (uintptr_t round = 0; round < 2; ++round) {
    std::vector<uint32_t> ids;
    for (uintptr_t i = 1; i <= 1000; ++i) {
      const uintptr_t f[] = {round << 32 | i, i, round};
      ids.push_back(st.intern(f, 3));
      REQUIRE(ids.back() != 0);
    }
    for (uintptr_t i = 1; i <= 1000; ++i)
      CHECK(frames_of(st, ids[i - 1]) == std::vector<uint64_t>{round << 32 | i, i, round});
    CHECK(st.records_used() == 1000);
    CHECK(st.records_consistent(scratch, 64));
    // Rows: one per stack, the first 544 the third segment's (after row 0
    // and two segments of 544), the rest at the start of the largest's.
    std::vector<uint32_t> rows;
    for (const uint32_t id : ids) rows.push_back(st.row(id));
    std::sort(rows.begin(), rows.end());
    CHECK(std::adjacent_find(rows.begin(), rows.end()) == rows.end());
    CHECK(rows[0] == 1 + 2 * 544);
    CHECK(rows[543] == 3 * 544);
    CHECK(rows[544] == 1 + 3 * 544);  // the largest size's first row
    CHECK(rows[999] == 3 * 544 + 456);
    if (round == 0) CHECK(sweep_all(st) == 1000);
    CHECK(st.records_consistent(scratch, 64));
  }
  st.destroy();
}

TEST_CASE("stack table: a stack takes the smallest record that holds it", "[track][stacks]") {
  // Depth 44: records of 12, 23, 35 and 46 words (a token, the hash and
  // the stack). 3,000 shallow stacks (5
  // words) and 1,000 deep ones (40), interleaved, then swept and stored
  // again: each class's pool keeps its own stacks, packed.
  StackTable st;
  REQUIRE(st.init(65536, 44));
  CHECK(st.record_bytes(5) == 12 * sizeof(uint64_t));
  CHECK(st.record_bytes(10) == 12 * sizeof(uint64_t));
  CHECK(st.record_bytes(11) == 23 * sizeof(uint64_t));
  CHECK(st.record_bytes(40) == 46 * sizeof(uint64_t));
  auto fill = [](uintptr_t round, uintptr_t i, unsigned n, uintptr_t* f) {
    for (unsigned j = 0; j < n; ++j) f[j] = round << 40 | i << 8 | j;
  };
  std::vector<std::pair<uint32_t, unsigned>> ids;
  for (uintptr_t round = 0; round < 3; ++round) {
    ids.clear();
    for (uintptr_t i = 1; i <= 4000; ++i) {
      const unsigned n = i % 4 == 0 ? 40 : 5;
      uintptr_t f[40];
      fill(round, i, n, f);
      ids.emplace_back(st.intern(f, n), n);
      REQUIRE(ids.back().first != 0);
    }
    for (uintptr_t i = 1; i <= 4000; ++i) {
      uintptr_t f[40];
      const unsigned n = ids[i - 1].second;
      fill(round, i, n, f);
      REQUIRE(frames_of(st, ids[i - 1].first) == std::vector<uint64_t>(f, f + n));
    }
    if (round < 2) CHECK(sweep_all(st) == 4000);
  }
  CHECK(st.records_used() == 4000);
  std::vector<uint64_t> scratch(4000 / 64 + 1);
  CHECK(st.records_consistent(scratch.data(), scratch.size()));
  // 3,000 records of 96 bytes and 1,000 of 368, not 4,000 of 368 (1.40
  // MiB): 0.63 MiB, with a page at the end of each pool.
  const size_t records = st.resident_record_bytes();
  INFO("records resident " << records << " B");
  CHECK(records >= 3000 * 96 + 1000 * 368);
  CHECK(records <= 3000 * 96 + 1000 * 368 + 2 * 4096);
  // Rows: one per record, dense in each class's segment.
  size_t base[5] = {1};
  for (unsigned c = 0; c < 4; ++c) base[c + 1] = base[c] + st.segment_rows(c);
  std::vector<bool> seen(base[4]);
  for (const auto& [id, n] : ids) {
    const uint32_t row = st.row(id);
    REQUIRE(row > 0);
    REQUIRE(row < seen.size());
    CHECK(!seen[row]);
    seen[row] = true;
    const unsigned c = n == 5 ? 0 : 3;
    CHECK(row >= base[c]);
    CHECK(row - base[c] < (n == 5 ? 3000u : 1000u));
  }
  st.destroy();
}

TEST_CASE(
    "stack table: a slot claimed while its sweep is between the free and the give back "
    "keeps its new record",
    "[track][stacks]") {
  // A full one-window table: the only slot a new stack can take is the one
  // the sweep frees. finish() is held after the free (its test hook), a
  // new stack takes that slot, then finish() goes on. It must give back
  // the old stack's record, not the new stack's (a review found finish()
  // reading the slot's record after the free, so it gave back the one the
  // new stack had just put there: two stacks would then share a record).
  StackTable st;
  REQUIRE(st.init(64, 4));
  std::vector<uint32_t> ids;
  for (uintptr_t i = 1; i <= 64; ++i) {
    const uintptr_t f[] = {i, i + 100};
    ids.push_back(st.intern(f, 2));
    REQUIRE(ids.back() != 0);
  }
  struct Ctx {
    StackTable* st;
    uint32_t id = 0;
  } ctx{&st};
  st.set_finish_hook(
      [](void* p) {
        auto* c = static_cast<Ctx*>(p);
        if (c->id != 0) return;
        const uintptr_t f[] = {9001, 9002};
        c->id = c->st->intern(f, 2);
      },
      &ctx);
  sweep_freeing(st, ids, 4);
  st.set_finish_hook(nullptr, nullptr);
  REQUIRE(ctx.id != 0);
  CHECK((ctx.id & 63) == (ids[4] & 63));  // the freed slot, taken mid-finish
  uint64_t scratch[4];
  CHECK(st.records_consistent(scratch, 4));
  // The old stack's record is the free one: the next stack stored gets it
  // and the new stack keeps its words.
  const uint32_t e2 = st.begin_sweep();
  for (size_t i = 0; i < ids.size(); ++i)
    if (i != 4 && i != 5) REQUIRE(st.mark(ids[i], e2));
  REQUIRE(st.mark(ctx.id, e2));
  CHECK(st.condemn(0, 64, e2) == 1);
  CHECK(st.finish(0, 64, e2) == 1);
  st.end_sweep(1);
  const uintptr_t g[] = {7001, 7002};
  REQUIRE(st.intern(g, 2) != 0);
  CHECK(frames_of(st, ctx.id) == std::vector<uint64_t>{9001, 9002});
  CHECK(st.records_consistent(scratch, 4));
  st.destroy();
}

namespace {
// Interns the stacks {v, tag} for v in [lo, hi], each of them stored.
void intern_range(StackTable& st, uintptr_t lo, uintptr_t hi, uintptr_t tag) {
  for (uintptr_t v = lo; v <= hi; ++v) {
    const uintptr_t f[] = {v, tag};
    REQUIRE(st.intern(f, 2) != 0);
  }
}
}  // namespace

TEST_CASE("stack table: sweeps are wanted at 4096 stacks, then after half the survivors again",
          "[track][stacks]") {
  // What the record pool keeps is the most stacks stored at once, so the
  // sweep points decide it: a node that goes through many start-up stacks
  // and keeps a few thousand gives records back early and often.
  StackTable st;
  REQUIRE(st.init(65536, 4));
  intern_range(st, 1, 4095, 7);
  CHECK_FALSE(st.wants_sweep());
  intern_range(st, 4096, 4096, 7);
  CHECK(st.wants_sweep());  // not at a quarter (16,384): at 4096
  // A sweep that keeps 8,000 stacks (interned again during it, so stamped
  // with its epoch) wants the next one 4,000 stacks later.
  intern_range(st, 4097, 8000, 7);
  const uint32_t e = st.begin_sweep();
  intern_range(st, 1, 8000, 7);
  st.condemn(0, st.capacity(), e);
  st.end_sweep(st.finish(0, st.capacity(), e));
  CHECK(st.count() == 8000);
  intern_range(st, 8001, 11999, 7);
  CHECK_FALSE(st.wants_sweep());
  intern_range(st, 12000, 12000, 7);
  CHECK(st.wants_sweep());
  // Survivors of a full table: the step is at most an eighth of it.
  StackTable big;
  REQUIRE(big.init(1024, 4));
  intern_range(big, 1, 600, 9);
  const uint32_t e2 = big.begin_sweep();
  intern_range(big, 1, 600, 9);
  big.condemn(0, big.capacity(), e2);
  big.end_sweep(big.finish(0, big.capacity(), e2));
  intern_range(big, 601, 727, 9);
  CHECK_FALSE(big.wants_sweep());
  intern_range(big, 5000, 5000, 9);
  CHECK(big.wants_sweep());  // 600 + 1024 / 8
  st.destroy();
  big.destroy();
}
