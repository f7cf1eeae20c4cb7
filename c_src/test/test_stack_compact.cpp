// Catch2 tests for the stack table's compaction (StackTable::compact()):
// stacks stored high in a record pool move down with their ids and churn
// rows, the pages above go back to the kernel, and readers and interning
// threads never see a moved stack's words mixed with another's.
#include "catch.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "../track/churn.h"
#include "../track/record_map.h"
#include "../track/stack_table.h"
#include "track_fixture.h"

using namespace mi::track;
using namespace mi::test;

namespace {

constexpr unsigned kDepth = 44;

// Stack i of a test: kDepth words of its own.
void words_of(uintptr_t i, uintptr_t* f) {
  for (unsigned j = 0; j < kDepth; ++j) f[j] = i << 16 | j;
}
// Stores stack i; its id (never 0).
uint32_t store_stack(StackTable& st, uintptr_t i) {
  uintptr_t f[kDepth];
  words_of(i, f);
  const uint32_t id = st.intern(f, kDepth);
  REQUIRE(id != 0);
  return id;
}
std::vector<uint64_t> expected(uintptr_t i) {
  uintptr_t f[kDepth];
  words_of(i, f);
  return std::vector<uint64_t>(f, f + kDepth);
}

// A whole sweep that keeps the stacks of `keep` (marked) and frees the rest.
size_t sweep_keeping(StackTable& st, const std::vector<uint32_t>& keep) {
  const uint32_t e = st.begin_sweep();
  for (const uint32_t id : keep) REQUIRE(st.mark(id, e));
  st.condemn(0, st.capacity(), e);
  const size_t freed = st.finish(0, st.capacity(), e);
  st.end_sweep(freed);
  return freed;
}

// A compaction step by step over every chunk, as the sweep's phases run
// it (tracker_sweep.cpp), with the targets of its start.
struct Compaction {
  explicit Compaction(StackTable& table) : st(table) { st.compact_begin(target); }
  uint32_t move(StackTable::RowOwner* owner) {
    uint32_t n = 0;
    for (uint32_t k = 0; k < st.compact_chunks(); ++k) n += st.compact_move(k, target, owner);
    return n;
  }
  template <class Held>
  uint32_t settle(StackTable::RowOwner* owner, Held&& held) {
    uint32_t n = 0;
    for (uint32_t k = 0; k < st.compact_chunks(); ++k) n += st.compact_settle(k, owner, held);
    return n;
  }
  size_t release(StackTable::RowOwner* owner) {
    size_t n = 0;
    uint32_t kept = 0;
    for (uint32_t k = 0; k < st.compact_chunks(); ++k)
      n += st.compact_release(k, target, owner, &kept);
    st.compact_end(target, kept);
    return n;
  }
  StackTable& st;
  uint32_t target[StackTable::kClasses];
};

bool none(uint32_t) {
  return false;
}

// A whole compaction with no hook pinning anything. Returns how many
// stacks moved.
uint32_t compact_all(StackTable& st, StackTable::RowOwner* owner) {
  Compaction c(st);
  const uint32_t moved = c.move(owner);
  c.settle(owner, none);
  c.release(owner);
  return moved;
}

// The churn table's rows, as the tracker's sweep passes them (tracker_sweep.cpp).
class Rows final : public StackTable::RowOwner {
 public:
  explicit Rows(ChurnTable& churn) : churn_(churn) {}
  void moved(uint32_t id, uint32_t from, uint32_t to) override {
    ++moves;
    churn_.move_row(id, from, to);
  }
  void settle(uint32_t id, uint32_t from, uint32_t to) override {
    ++settles;
    churn_.settle_row(id, from, to);
  }
  bool released(uint32_t first, uint32_t n) override {
    if (keep) return false;
    released_rows += n;
    churn_.release_rows(first, n);
    return true;
  }
  bool keep = false;  // keep every row (as for a pinned hook)
  uint32_t moves = 0, settles = 0;
  uint64_t released_rows = 0;

 private:
  ChurnTable& churn_;
};

void init_churn(ChurnTable& ch, const StackTable& st) {
  size_t rows[StackTable::kClasses];
  for (unsigned c = 0; c < StackTable::kClasses; ++c) rows[c] = st.segment_rows(c);
  REQUIRE(ch.init(rows, StackTable::kClasses));
}

// Stores stacks 0 .. n - 1 (records 0 .. n - 1 of the largest size, on an
// empty table) and counts an allocation of 100 + i bytes for stack i, as a
// hook would. Returns their ids.
std::vector<uint32_t> store_counted(StackTable& st, ChurnTable& ch, size_t n) {
  std::vector<uint32_t> ids;
  for (uintptr_t i = 0; i < n; ++i) {
    ids.push_back(store_stack(st, i));
    ch.on_alloc(ids.back(), st.row(ids.back()), kCountOne, 100 + i, false);
  }
  return ids;
}

// A 65,536-slot table and its churn rows with 8,000 stacks stored and
// counted (store_counted()).
struct Stored {
  Stored() {
    REQUIRE(st.init(65536, kDepth));
    init_churn(ch, st);
    ids = store_counted(st, ch, 8000);
  }
  ~Stored() {
    ch.destroy();
    st.destroy();
  }
  StackTable st;
  ChurnTable ch;
  Rows rows{ch};
  std::vector<uint32_t> ids;
};

struct Counts {
  uint64_t allocated = 0, freed = 0;
};
// Every churn row's counts by stack id (several rows of one id summed).
std::map<uint32_t, Counts> counts_by_id(const ChurnTable& ch) {
  std::map<uint32_t, Counts> m;
  ch.for_each([&](const mi_abi_churn& r) {
    m[r.stack_id].allocated += r.allocated_bytes;
    m[r.stack_id].freed += r.freed_bytes;
  });
  return m;
}

}  // namespace

TEST_CASE("record map: lowest first, given back, claimed by the word", "[track][stacks]") {
  std::vector<std::atomic<uint64_t>> words(RecordMap::words_for(130));
  RecordMap m;
  m.init(words.data(), 130);
  for (uint32_t i = 0; i < 130; ++i) REQUIRE(m.take() == i);
  CHECK(m.take() == RecordMap::kNone);
  CHECK(m.count() == 130);
  CHECK(m.high() == 130);
  m.give(70);
  m.give(5);
  CHECK(m.take() == 5);  // the lowest free, whatever the order given back
  CHECK(m.take() == 70);
  // A word's free records claimed at once, none handed out meanwhile.
  for (uint32_t i = 64; i < 128; ++i) m.give(i);
  m.give(3);
  const uint64_t claimed = m.claim_free(1);
  CHECK(claimed == ~uint64_t{0});
  CHECK(m.take() == 3);
  CHECK(m.take() == RecordMap::kNone);
  m.unclaim(1, claimed);
  CHECK(m.take() == 64);
  CHECK(m.count() == 130 - 63);
}

TEST_CASE_METHOD(
    Stored, "stack table: compaction moves the stacks stored high down and gives their pages back",
    "[track][stacks][memory]") {
  // 8,000 stacks of 44 frames (368-byte records), then a sweep that keeps
  // every eighth: 1,000 stacks spread over 2.9 MiB of records. Compaction
  // moves the 848 stored above its target (1,000 and an eighth more, in
  // words of the map: 1,216) down, gives back the records they moved from
  // (but one a hook pins), and every page above the target.
  std::vector<uint32_t> kept;
  for (size_t i = 0; i < ids.size(); i += 8) kept.push_back(ids[i]);
  CHECK(sweep_keeping(st, kept) == 7000);
  const PageCounter pages = PageCounter::pagemap();
  REQUIRE(pages.reads_pagemap());
  const size_t before = st.resident_record_bytes(pages);
  const size_t churn_before = ch.resident_bytes(pages);
  CHECK(before >= 8000 * st.record_bytes(kDepth));

  Compaction first(st);
  CHECK(first.target[3] == 1216);
  CHECK(first.move(&rows) == 848);  // kept stacks 152 .. 999 lived at records 1216 .. 7992
  CHECK(rows.moves == 848);
  CHECK(st.retired_count() == 848);
  uint64_t scratch[1100];
  CHECK(st.records_consistent(scratch, 1100));
  // Ids, frames and churn rows moved with the stacks.
  for (uintptr_t i = 0; i < 8000; i += 8) {
    const uint32_t id = ids[i];
    REQUIRE(frames_of(st, id) == expected(i));
    REQUIRE(st.row(id) <= 1216 + st.segment_rows(0) + st.segment_rows(1) + st.segment_rows(2));
    // Counted as the hook would: on the row row() answers now.
    ch.on_free(id, st.row(id), kCountOne, 100 + i, 1000, false);
  }
  // The counts moved with the rows: each kept stack's allocation (counted
  // before the move) and free (after it) are on one row.
  std::set<uint32_t> kept_ids(kept.begin(), kept.end());
  size_t kept_rows = 0;
  ch.for_each([&](const mi_abi_churn& r) {
    if (kept_ids.count(r.stack_id) == 0) return;
    ++kept_rows;
    CHECK(r.allocated_bytes == r.freed_bytes);
  });
  CHECK(kept_rows == 1000);
  // A hook still pinning a moved stack, which read its old row just before
  // the move, counts there: that record stays retired through this
  // settle, and the next settles its count into the new row.
  const uint32_t late = ids[7992];
  const uint32_t old_row = 7992 + 1 + st.segment_rows(0) + st.segment_rows(1) + st.segment_rows(2);
  REQUIRE(st.row(late) != old_row);
  ch.on_alloc(late, old_row, kCountOne, 5, false);
  CHECK(first.settle(&rows, [&](uint32_t id) { return id == late; }) == 847);
  CHECK(st.retired_count() == 1);
  CHECK(first.release(&rows) > 0);
  CHECK(st.records_consistent(scratch, 1100));
  Compaction second(st);
  CHECK(second.move(&rows) == 0);
  CHECK(second.settle(&rows, none) == 1);
  second.release(&rows);
  CHECK(st.records_consistent(scratch, 1100));
  // The pool's high-water mark came down to the free top: the next
  // compaction looks no further.
  CHECK(st.records_used() <= 1216);
  const size_t after = st.resident_record_bytes(pages);
  INFO("records resident " << before << " -> " << after << " B, churn " << churn_before << " -> "
                           << ch.resident_bytes(pages) << " B");
  CHECK(after <= 1216 * st.record_bytes(kDepth) + 2 * 4096);
  CHECK(after >= 1000 * st.record_bytes(kDepth));
  CHECK(ch.resident_bytes(pages) <= 1216 * ChurnTable::kRowBytes + 2 * 4096 + 4096);
  for (uintptr_t i = 0; i < 8000; i += 8) REQUIRE(frames_of(st, ids[i]) == expected(i));

  // Every count is where it was made: the kept sites' own rows (the stale
  // one included), the freed sites' folded into the unknown row when their
  // rows were given back. Nothing lost.
  const auto counts = counts_by_id(ch);
  uint64_t total = 0, unknown_expected = 0;
  for (uintptr_t i = 0; i < 8000; ++i) {
    total += 100 + i;
    if (i % 8 != 0) continue;
    const auto it = counts.find(ids[i]);
    REQUIRE(it != counts.end());
    CHECK(it->second.allocated == 100 + i + (ids[i] == late ? 5 : 0));
    CHECK(it->second.freed == 100 + i);
  }
  uint64_t listed = 0;
  for (const auto& [id, c] : counts) listed += c.allocated;
  CHECK(listed == total + 5);
  for (uintptr_t i = 0; i < 8000; ++i)
    if (i % 8 != 0) unknown_expected += 100 + i;
  // The freed stacks' rows above the target went to the unknown row; the
  // ones below it still count for their old ids until a new stack claims
  // the row (churn.h), so the unknown row holds at most their total.
  REQUIRE(counts.count(0) == 1);
  CHECK(counts.at(0).allocated <= unknown_expected);
  CHECK(counts.at(0).allocated > 0);
}

TEST_CASE_METHOD(Stored, "stack table: churn rows a compaction kept go back at a later one",
                 "[track][stacks][memory]") {
  // A compaction whose row owner keeps the rows above the target (a hook
  // pinned one of their stacks) gives back the records' pages only, and
  // keeps the pool's high-water mark above the rows, so the next
  // compaction finds them and gives them back.
  sweep_keeping(st, std::vector<uint32_t>(ids.begin(), ids.begin() + 1000));
  const PageCounter pages = PageCounter::pagemap();
  REQUIRE(pages.reads_pagemap());
  rows.keep = true;
  CHECK(compact_all(st, &rows) == 0);  // the 1,000 kept are the lowest records
  INFO("churn resident " << ch.resident_bytes(pages) << " B");
  CHECK(ch.resident_bytes(pages) >= 8000 * ChurnTable::kRowBytes);
  CHECK(st.resident_record_bytes(pages) <= 1216 * st.record_bytes(kDepth) + 2 * 4096);
  rows.keep = false;
  compact_all(st, &rows);
  CHECK(ch.resident_bytes(pages) <= 1216 * ChurnTable::kRowBytes + 2 * 4096);
}

TEST_CASE("stack table: new stacks fill the holes low in a pool before its top",
          "[track][stacks]") {
  // After a sweep frees most stacks, the next stacks take the lowest free
  // records (a free list handed them out in the order freed, all over the
  // pool): the pool's high-water mark does not move.
  StackTable st;
  REQUIRE(st.init(4096, kDepth));
  std::vector<uint32_t> kept;
  for (uintptr_t i = 0; i < 1000; ++i) {
    const uint32_t id = store_stack(st, i);
    if (i % 10 == 0) kept.push_back(id);
  }
  sweep_keeping(st, kept);
  const size_t high = st.records_used();
  for (uintptr_t i = 1000; i < 1900; ++i) {
    uintptr_t f[kDepth];
    words_of(i, f);
    REQUIRE(st.intern(f, kDepth) != 0);
  }
  CHECK(st.records_used() == high);
  uint64_t scratch[64];
  CHECK(st.records_consistent(scratch, 64));
  st.destroy();
}

TEST_CASE("stack table: compaction moves the stacks of every level", "[track][stacks]") {
  // 1,024 slots (levels of 256, 256 and 512) and 900 stacks: the ones
  // stored last, in the highest records, went past the first level. A
  // sweep keeps those past it; compaction finds each moved stack's slot
  // in its probe's later windows and moves it down.
  StackTable st;
  REQUIRE(st.init(1024, kDepth));
  REQUIRE(st.levels() == 3);
  std::vector<uint32_t> kept;
  std::vector<uintptr_t> kept_i;
  for (uintptr_t i = 0; i < 900; ++i) {
    const uint32_t id = store_stack(st, i);
    if ((id & 1023) >= 256) {
      kept.push_back(id);
      kept_i.push_back(i);
    }
  }
  sweep_keeping(st, kept);
  uint32_t target[StackTable::kClasses];
  st.compact_begin(target);
  const unsigned c = StackTable::kClasses - 1;  // 44 words: the largest records
  size_t above = 0;                             // kept stacks stored above the target
  for (const uintptr_t i : kept_i)
    if (i >= target[c]) ++above;
  REQUIRE(above > 0);
  CHECK(compact_all(st, nullptr) == above);
  for (size_t k = 0; k < kept.size(); ++k) REQUIRE(frames_of(st, kept[k]) == expected(kept_i[k]));
  uint64_t scratch[64];
  CHECK(st.records_consistent(scratch, 64));
  st.compact_begin(target);
  CHECK_FALSE(st.compact_wanted(target));
  st.destroy();
}

TEST_CASE("stack table: stacks moving under readers and interning threads never mix",
          "[track][stacks][concurrency]") {
  // A sweeper thread, 30 rounds: it stores 2,000 new stacks and publishes
  // the last 500 (the highest records), sweeps keeping those and the
  // previous round's, and compacts, so the 500 move down while two other
  // threads intern the published stacks again and read them back, and
  // freed and retired records are taken by the next round's stacks. A read
  // answers the id's own words or nothing; an intern of a stack still
  // stored answers its id (a move must not make a second copy).
  constexpr size_t kKeep = 500, kRound = 2000, kRounds = 30;
  StackTable st;
  REQUIRE(st.init(8192, kDepth));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> published[kKeep];  // id << 32 | stack number
  for (auto& p : published) p.store(0);
  std::atomic<uint64_t> reads{0}, bad{0}, twice{0};
  auto work = [&](size_t from) {
    for (size_t k = from; !stop.load(std::memory_order_relaxed); k += 7) {
      const uint64_t v = published[k % kKeep].load(std::memory_order_acquire);
      if (v == 0) continue;
      const auto id = static_cast<uint32_t>(v >> 32);
      uintptr_t f[kDepth];
      words_of(static_cast<uint32_t>(v), f);
      const uint32_t again = st.intern(f, kDepth);
      uint64_t out[kDepth];
      const unsigned n = st.get(id, out, kDepth);
      reads.fetch_add(1, std::memory_order_relaxed);
      if (n != 0 && (n != kDepth || !std::equal(f, f + kDepth, out)))
        bad.fetch_add(1, std::memory_order_relaxed);
      // Still stored after the intern, yet the intern answered another id;
      // only while the stack is published still, so no sweep meanwhile
      // condemned it (a condemned stack interned again may be stored
      // twice: that is the sweep's, not a move's).
      if (n != 0 && again != id && published[k % kKeep].load(std::memory_order_acquire) == v)
        twice.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::thread t1(work, 0), t2(work, 3);
  uint32_t moved = 0;
  std::vector<uint32_t> prev;
  for (uintptr_t round = 0; round < kRounds; ++round) {
    std::vector<uint32_t> keep = prev, cur;
    for (uintptr_t k = 0; k < kRound; ++k) {
      const uintptr_t i = round * kRound + k + 1;
      uintptr_t f[kDepth];
      words_of(i, f);
      const uint32_t id = st.intern(f, kDepth);
      REQUIRE(id != 0);
      if (k >= kRound - kKeep) {
        published[k - (kRound - kKeep)].store(uint64_t{id} << 32 | i, std::memory_order_release);
        cur.push_back(id);
      }
    }
    keep.insert(keep.end(), cur.begin(), cur.end());
    sweep_keeping(st, keep);
    moved += compact_all(st, nullptr);
    prev = cur;
  }
  stop.store(true);
  t1.join();
  t2.join();
  INFO("reads " << reads.load() << ", moved " << moved);
  CHECK(bad.load() == 0);
  CHECK(twice.load() == 0);
  CHECK(moved >= kRounds * 100);
  CHECK(reads.load() > 0);
  uint64_t scratch[256];
  CHECK(st.records_consistent(scratch, 256));
  st.destroy();
}
