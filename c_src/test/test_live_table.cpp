// Catch2 tests for the tracker's live table (track/live_table): insert,
// remove, walks, drops, concurrent writers, and how full it gets before it
// drops with glibc's heap layouts (through a Tracker on the fake unwinder).
#include "catch.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "../track/live_table.h"
#include "../track/tracker.h"
#include "track_fixture.h"

using namespace mi::track;
using namespace mi::test;

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

std::map<uint64_t, LiveEntry> live_of(const LiveTable& t) {
  std::map<uint64_t, LiveEntry> m;
  t.for_each([&](const LiveEntry& e) { m[e.address] = e; });
  return m;
}

}  // namespace

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

TEST_CASE("live table: walking a sparse table leaves its unwritten pages unread",
          "[track][table][memory]") {
  // A snapshot, olds() and clear() of a 32 MiB table holding 10 entries
  // used to read every slot, which made the whole table resident (on an
  // attached RabbitMQ the tracker's tables became the report's top verdict:
  // 72 MiB resident for 1.6 MiB live, all of it mallocinfo's own reading).
  LiveTable t;
  REQUIRE(t.init(1 << 20));
  for (uint64_t i = 1; i <= 10; ++i)
    REQUIRE(t.insert(i * 0x100000000ull, i, 0, static_cast<uint32_t>(i)));
  const size_t before = t.resident_bytes();
  // A walk reads the pools' chunks below their bump pointers (here the
  // 10 small chunks the entries went to, all in one page) and nothing else.
  const size_t groups = 4096;
  CHECK(live_of(t).size() == 10);
  CHECK(t.resident_bytes() <= before + groups);
  size_t stacks = 0;
  t.for_each_stack(0, t.capacity(), [&](uint32_t) { ++stacks; });
  CHECK(stacks == 10);
  CHECK(t.resident_bytes() <= before + groups);
  uint64_t bytes = 0;
  CHECK(t.clear(&bytes) == 10);
  CHECK(bytes == 55);
  CHECK(t.resident_bytes() <= before + groups);
  t.destroy();
}

TEST_CASE("live table: a 32-byte slot holds every address and size it takes, and refuses the rest",
          "[track][table]") {
  LiveTable t;
  REQUIRE(t.init(1 << 12));
  const uint64_t top = (uint64_t{1} << 48) - 32;  // the highest address it takes
  const uint64_t big = (uint64_t{1} << 40) - 1;   // the largest size
  struct Case {
    uint64_t address, size, ts;
    uint32_t stack;
    uint64_t pid;
  };
  const Case cases[] = {
      {0x1000, 0, 1, 1, 0},
      {0x1008, 1, 2, 0x7FFFFFFFu, (42ull << 4) | 3},  // 8-aligned, beside the next
      {0x1010, (uint64_t{1} << 21) - 1, 3, 0x80000003u, ~0ull},
      {0x1018, uint64_t{1} << 21, ~0ull, 5, 1},
      {0x7F0012345670, big, 4, 6, 2},
      {top, 123456789012, 5, 7, 3},
  };
  for (const Case& c : cases) REQUIRE(t.insert(c.address, c.size, c.ts, c.stack, c.pid));
  auto m = live_of(t);
  REQUIRE(m.size() == std::size(cases));
  for (const Case& c : cases) {
    INFO("address " << c.address);
    const LiveEntry& e = m.at(c.address);
    CHECK(e.size == c.size);
    CHECK(e.timestamp_ns == c.ts);
    CHECK(e.stack_id == c.stack);
    CHECK(e.pid == c.pid);
  }
  // What it cannot hold is refused, not mangled.
  CHECK_FALSE(t.insert(0x2004, 8, 0, 1));   // not a multiple of 8
  CHECK_FALSE(t.insert(top + 8, 8, 0, 1));  // beyond 2^48 - 24
  CHECK_FALSE(t.insert(uint64_t{1} << 48, 8, 0, 1));
  CHECK_FALSE(t.insert(0x3000, uint64_t{1} << 40, 0, 1));  // 1 TiB
  CHECK(live_of(t).size() == std::size(cases));
  // A pointer inside a block (not a multiple of 8) does not name it: the
  // key drops the low 3 bits, so remove() refuses such an address.
  for (const Case& c : cases) {
    for (uint64_t off = 1; off < 8; ++off) {
      INFO("address " << c.address << " + " << off);
      CHECK_FALSE(t.remove(c.address + off, nullptr));
    }
  }
  CHECK(live_of(t).size() == std::size(cases));
  for (const Case& c : cases) {
    LiveEntry e{};
    REQUIRE(t.remove(c.address, &e));
    CHECK(e.address == c.address);
    CHECK(e.size == c.size);
    CHECK(e.stack_id == c.stack);
  }
  CHECK(live_of(t).empty());
  t.destroy();
}

TEST_CASE("live table: a full pool drops, from the first drop on, until blocks go",
          "[track][table]") {
  LiveTable t;
  REQUIRE(t.init(64));
  CHECK(t.capacity() == 64);
  // Dense 16-byte blocks: 64 to a 1 KiB unit, so a few chains of big chunks.
  size_t ok = 0;
  uint64_t i = 1;
  for (; i <= 1000 && t.insert(i * 16, 1, 0, 0); ++i) ++ok;
  INFO("first drop after " << ok << " entries");
  CHECK(ok >= 64);  // at least what init() promised
  CHECK(ok < 1000);
  CHECK(live_of(t).size() == ok);
  // Its chain stays full: every later block of that unit is dropped too.
  size_t later = 0;
  for (uint64_t j = i; j < i + 40 && (j * 16) >> 10 == (i * 16) >> 10; ++j)
    later += t.insert(j * 16, 1, 0, 0) ? 1 : 0;
  CHECK(later == 0);
  CHECK(live_of(t).size() == ok);
  // A freed slot takes the next block of its own unit; chains emptied
  // entirely give their chunks back for any other unit to use.
  REQUIRE(t.remove(16, nullptr));
  CHECK(t.insert(8, 1, 0, 0));
  for (uint64_t j = 2; j < i; ++j) REQUIRE(t.remove(j * 16, nullptr));
  CHECK(t.remove(8, nullptr));
  CHECK(live_of(t).empty());
  size_t again = 0;
  for (uint64_t j = 0; j < 2000 && t.insert(0x7f0000000000ull + j * 4096, 1, 0, 0); ++j) ++again;
  INFO("one block a page after the pool emptied: " << again);
  CHECK(again >= 64);
  t.destroy();
}

TEST_CASE("live table: what stays resident follows the live blocks, not the heap's spread",
          "[track][table][memory]") {
  // The page-local layout gave every touched heap page 8 KiB of table:
  // 10,000 blocks one a page cost 80 MiB; here a unit with one block takes a
  // small chunk (128 bytes) and a directory word.
  constexpr size_t kLive = 10000;
  struct Layout {
    const char* name;
    uint64_t stride;
    size_t max_bytes_per_block;
  };
  const Layout layouts[] = {
      {"dense, 80-byte stride", 80, 60},
      {"one block a 4 KiB page", 4096, 160},
      {"one block every 64 KiB", 65536, 160},
  };
  for (const Layout& l : layouts) {
    INFO(l.name);
    LiveTable t;
    REQUIRE(t.init(size_t{1} << 21));
    const size_t empty = t.resident_bytes();
    for (size_t i = 0; i < kLive; ++i)
      REQUIRE(t.insert(0x7f0000000000ull + i * l.stride, 64, 0, 1));
    const size_t full = t.resident_bytes() - empty;
    // The directory's pages count too: runs of 8 units (64 bytes of
    // directory) hashed over its 256 KiB, so a page for each run at most.
    const size_t dir =
        std::min<size_t>((kLive * l.stride / 8192 + 1) * 4096, (size_t{1} << 21) / 64 * 8);
    INFO("resident " << full << " bytes, directory allowance " << dir);
    CHECK(full <= kLive * l.max_bytes_per_block + dir);
    // Emptied and filled elsewhere: the chunks are reused, nothing grows.
    for (size_t i = 0; i < kLive; ++i) REQUIRE(t.remove(0x7f0000000000ull + i * l.stride, nullptr));
    for (size_t i = 0; i < kLive; ++i)
      REQUIRE(t.insert(0x7e0000000000ull + i * l.stride, 64, 0, 1));
    CHECK(t.resident_bytes() - empty <= full + dir);
    CHECK(live_of(t).size() == kLive);
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

TEST_CASE("live table: writers sharing chains that empty and refill, with a full pool",
          "[track][table][concurrency]") {
  // Eight writers (more than cores, so they are preempted inside each other's
  // windows) own interleaved addresses in the same 8 KiB (8 units, so
  // every chain is shared), insert and remove at random, and free
  // addresses they never recorded; chains go to 0 and are freed while
  // others pin them again, and the pool is small enough to run out. A
  // reader walks meanwhile. Every answer must match what each writer knows
  // it holds, and the walk must see only whole entries.
  constexpr unsigned kWriters = 8;
  constexpr uint64_t kBase = 0x7f1234560000ull;
  constexpr uint64_t kPerWriter = 64;  // 16-byte blocks: 512 in 8 KiB
  LiveTable t;
  REQUIRE(t.init(64));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> torn{0}, wrong{0}, drops{0}, walks{0};
  std::vector<std::vector<uint8_t>> held(kWriters, std::vector<uint8_t>(kPerWriter, 0));
  auto address = [](unsigned w, uint64_t i) { return kBase + (i * kWriters + w) * 16; };
  auto size_of = [](uint64_t a) { return (a - kBase) / 16 + 1; };
  auto writer = [&](unsigned w) {
    XorShift rng{w * 0x9E3779B97F4A7C15ull + 7};
    std::vector<uint8_t>& mine = held[w];
    for (int op = 0; op < 200000; ++op) {
      const uint64_t i = rng.next() % kPerWriter;
      const uint64_t a = address(w, i);
      if (mine[i] == 0) {
        if ((rng.next() & 3) == 0) {
          if (t.remove(a, nullptr)) ++wrong;  // never recorded: must not be found
        } else if (t.insert(a, size_of(a), size_of(a) * 3, static_cast<uint32_t>(a & 0xffff))) {
          mine[i] = 1;
        } else {
          ++drops;
        }
      } else {
        LiveEntry e{};
        if (!t.remove(a, &e) || e.address != a || e.size != size_of(a)) ++wrong;
        mine[i] = 0;
      }
    }
  };
  std::thread reader([&] {
    while (!stop.load()) {
      t.for_each([&](const LiveEntry& e) {
        const uint64_t s = size_of(e.address);
        if (e.size != s || e.timestamp_ns != s * 3 || e.stack_id != (e.address & 0xffff)) ++torn;
      });
      ++walks;
    }
  });
  std::vector<std::thread> ws;
  for (unsigned w = 0; w < kWriters; ++w) ws.emplace_back(writer, w);
  for (auto& th : ws) th.join();
  stop = true;
  reader.join();
  INFO("drops " << drops.load() << ", walks " << walks.load());
  CHECK(torn.load() == 0);
  CHECK(wrong.load() == 0);
  CHECK(drops.load() > 0);  // the pool did run out
  // What the table holds is exactly what the writers hold.
  std::map<uint64_t, LiveEntry> want;
  for (unsigned w = 0; w < kWriters; ++w)
    for (uint64_t i = 0; i < kPerWriter; ++i)
      if (held[w][i] != 0) want[address(w, i)] = LiveEntry{};
  const auto got = live_of(t);
  CHECK(got.size() == want.size());
  for (const auto& [a, e] : got) CHECK(want.count(a) == 1);
  // Emptied, every chunk is back: the pool takes as many as at the start.
  for (const auto& [a, e] : got) REQUIRE(t.remove(a, nullptr));
  size_t again = 0;
  for (uint64_t j = 0; j < 10000 && t.insert(0x100000 + j * 16, 1, 0, 0); ++j) ++again;
  LiveTable fresh;
  REQUIRE(fresh.init(64));
  size_t first = 0;
  for (uint64_t j = 0; j < 10000 && fresh.insert(0x100000 + j * 16, 1, 0, 0); ++j) ++first;
  CHECK(again == first);
  fresh.destroy();
  t.destroy();
}

TEST_CASE("live table: chains that keep their chunks after a burst leave room for the capacity",
          "[track][table]") {
  // A chain keeps every chunk it grew to while any of its blocks is live:
  // a burst of small blocks that is mostly freed (one in 32 or 256 kept,
  // fragmentation) holds its chunks, and blocks allocated afterwards
  // elsewhere need others. The pools hold twice the capacity for this; a
  // review found the first drop at 40% of capacity when they held 17/16.
  constexpr size_t kCap = size_t{1} << 16;
  for (const uint64_t keep_one_in : {32u, 256u}) {
    for (const uint64_t stride : {48u, 12288u}) {
      LiveTable t;
      REQUIRE(t.init(kCap));
      constexpr uint64_t kBurst = 0x7e0000000000ull;
      size_t live = 0;
      for (uint64_t i = 0; i < kCap * 9 / 10; ++i) REQUIRE(t.insert(kBurst + i * 16, 16, 0, 1));
      for (uint64_t i = 0; i < kCap * 9 / 10; ++i) {
        if (i % keep_one_in != 0)
          REQUIRE(t.remove(kBurst + i * 16, nullptr));
        else
          ++live;
      }
      size_t later = 0;
      while (later < 4 * kCap && t.insert(0x7d0000000000ull + later * stride, 40, 0, 1)) ++later;
      INFO("keep one in " << keep_one_in << ", then blocks " << stride
                          << " bytes apart: first drop at " << live + later << " live");
      CHECK(live + later >= kCap);
      t.destroy();
    }
  }
}

// --- How full the live table gets before it drops ---------------------------
//
// Each 1 KiB unit of heap owns a chain of chunks (units share chains when
// the directory wraps), and a chain's last chunk is partly empty. How full
// the table can get before the pools run out therefore depends on how
// blocks sit in pages. The layouts below are glibc's: chunks of request + 8 bytes rounded up to 16
// (at least 32), packed one after another from the top of the heap, user
// pointers 16 bytes into each chunk; optionally a share of live blocks
// freed at random as the heap grows (holes, and tombstones in the table).
// Every block goes through the Tracker (fake unwinder and clock), as a
// malloc hook would record it, until the first one is dropped.

namespace {

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

TEST_CASE("live table: with glibc's layouts the first drop comes above 1.8 times the capacity",
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
      // doc/tracking.md ("MALLOCINFO_TABLE_SIZE"): the pools hold twice the
      // capacity in big chunks (so that chains that keep their chunks after
      // a burst do not drop early), and little of it is lost to partly
      // filled chunks before the first drop.
      CHECK(load >= 1.80);
      // Nor beyond what the pools hold: 2 + 1/16 (the small chunks).
      CHECK(load <= 2.07);
      lowest = std::min(lowest, load);
    }
  }
  // Blocks freed as the heap grows leave chains with holes that other
  // units cannot use: that is where drops begin.
  INFO("lowest load at a first drop: " << lowest * 100 << "%");
  CHECK(lowest < 1.90);
}

namespace {

// Fills units (1 KiB each) from `base` with 64 blocks of 16 bytes: a small
// chunk and four big ones a unit, taken in order.
void fill_units(LiveTable& t, uint64_t base, uint64_t first, uint64_t n, uint32_t stack) {
  for (uint64_t u = first; u < first + n; ++u)
    for (uint64_t j = 0; j < 64; ++j) REQUIRE(t.insert(base + u * 1024 + j * 16, 16, u, stack));
}
void empty_units(LiveTable& t, uint64_t base, uint64_t first, uint64_t n) {
  for (uint64_t u = first; u < first + n; ++u)
    for (uint64_t j = 0; j < 64; ++j) REQUIRE(t.remove(base + u * 1024 + j * 16, nullptr));
}
size_t trim_all(LiveTable& t) {
  const size_t chunks = t.trim_begin();
  size_t released = 0;
  for (size_t k = 0; k < chunks; ++k) released += t.trim(k);
  t.trim_end(released);
  return released;
}

}  // namespace

TEST_CASE("live table: a trim gives back the pages only free chunks cover, and keeps every entry",
          "[track][table][memory]") {
  // 1,000 units of 64 blocks: 4,000 big chunks (500 pages of slots). Every
  // tenth unit stays: its big chunks share a page with one emptied unit's,
  // so 100 pages stay and 400 only free chunks cover, less a few: runs of
  // units that hash to one directory word share a chain, which keeps its
  // chunks while any entry is live (measured: 17 pages).
  constexpr uint64_t kBase = 0x7f0000000000ull;
  LiveTable t;
  REQUIRE(t.init(size_t{1} << 16));
  fill_units(t, kBase, 0, 1000, 1);
  const size_t full = t.resident_bytes();
  for (uint64_t u = 0; u < 1000; ++u)
    if (u % 10 != 0) empty_units(t, kBase, u, 1);
  CHECK(t.wants_trim());
  const size_t released = trim_all(t);
  const size_t after = t.resident_bytes();
  INFO("resident " << full << " then " << after << ", released " << released);
  CHECK(released >= 360 * 4096);
  CHECK(full - after >= 360 * 4096);
  CHECK_FALSE(t.wants_trim());
  // Every kept entry is whole; nothing else is there.
  const auto live = live_of(t);
  CHECK(live.size() == 100 * 64);
  for (uint64_t u = 0; u < 1000; u += 10)
    for (uint64_t j = 0; j < 64; ++j) {
      const auto it = live.find(kBase + u * 1024 + j * 16);
      REQUIRE(it != live.end());
      CHECK(it->second.size == 16);
      CHECK(it->second.timestamp_ns == u);
      CHECK(it->second.stack_id == 1);
    }
  // Nothing dirtied since: the next trim looks at no word and gives back
  // nothing; the table then waits for more dirty words.
  CHECK(trim_all(t) == 0);
  // The released chunks are taken again and written like new ones.
  fill_units(t, kBase + (1 << 24), 0, 900, 2);
  CHECK(live_of(t).size() == 1000 * 64);
  empty_units(t, kBase + (1 << 24), 0, 900);
  for (uint64_t u = 0; u < 1000; u += 10) empty_units(t, kBase, u, 1);
  CHECK(live_of(t).empty());
  CHECK(trim_all(t) >= 490 * 4096);
  t.destroy();
}

TEST_CASE("live table: a trim of a small table keeps to its pools", "[track][table][memory]") {
  // 1,024 entries: 16 small chunks and 128 big ones, less than a bitmap
  // word for the small pool. Bits past a pool's end name no chunk: a trim
  // that released them would zero the big pool's first chunks, here the
  // ones still in use.
  constexpr uint64_t kBase = 0x7f0000000000ull;
  LiveTable t;
  REQUIRE(t.init(1024));
  fill_units(t, kBase, 0, 24, 1);
  empty_units(t, kBase, 4, 20);
  trim_all(t);
  const auto live = live_of(t);
  CHECK(live.size() == 4 * 64);
  for (uint64_t u = 0; u < 4; ++u)
    for (uint64_t j = 0; j < 64; ++j) {
      const auto it = live.find(kBase + u * 1024 + j * 16);
      REQUIRE(it != live.end());
      CHECK(it->second.timestamp_ns == u);
    }
  t.destroy();
}

TEST_CASE("live table: the lowest free chunks are taken first", "[track][table]") {
  // 100 units filled in order, all but the last emptied: a new unit's
  // chunks are the pools' first ones again (a free list would hand out
  // the last freed, high up), so its entries sit at the lowest positions:
  // small chunk 0 (positions 0-3) and big chunks 0-3 (the 60 positions
  // from the big pool's first; the small pool has 1,024 chunks here).
  constexpr uint64_t kBase = 0x7f0000000000ull;
  constexpr size_t kSmallPositions = 1024 * 4;
  LiveTable t;
  REQUIRE(t.init(size_t{1} << 16));
  fill_units(t, kBase, 0, 100, 1);
  empty_units(t, kBase, 0, 99);
  fill_units(t, kBase, 500, 1, 2);
  size_t low = 0;
  t.for_each_stack(0, kSmallPositions + 64, [&](uint32_t id) { low += id == 2 ? 1 : 0; });
  CHECK(low == 64);
  t.destroy();
}

TEST_CASE("live table: trims racing writers lose and tear no entry",
          "[track][table][concurrency]") {
  // Writers fill and empty whole units at random (chains freed and taken
  // again all the time, over many words of the pools) while a trimmer
  // trims without pause and a reader checks every entry it walks. A trim
  // that gave back a page a writer had just taken would zero entries
  // under it: they would read torn or be missing at the end.
  constexpr unsigned kWriters = 3;
  constexpr uint64_t kUnits = 96;  // per writer
  LiveTable t;
  REQUIRE(t.init(size_t{1} << 15));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> torn{0}, wrong{0}, trims{0}, released{0};
  std::vector<std::vector<uint8_t>> held(kWriters, std::vector<uint8_t>(kUnits, 0));
  auto unit_base = [](unsigned w, uint64_t u) {
    return 0x7f0000000000ull + (uint64_t{w} << 32) + u * 1024;
  };
  auto check = [](const LiveEntry& e) {
    return e.size == (e.address & 0xFF0) + 16 && e.timestamp_ns == e.address * 3 &&
           e.stack_id == static_cast<uint32_t>(e.address >> 10 & 0xFFFF);
  };
  auto writer = [&](unsigned w) {
    XorShift rng{w * 0x9E3779B97F4A7C15ull + 11};
    for (int op = 0; op < 3000; ++op) {
      const uint64_t u = rng.below(kUnits);
      const uint64_t b = unit_base(w, u);
      for (uint64_t j = 0; j < 64; ++j) {
        const uint64_t a = b + j * 16;
        if (held[w][u] == 0) {
          if (!t.insert(a, (a & 0xFF0) + 16, a * 3, static_cast<uint32_t>(a >> 10 & 0xFFFF)))
            ++wrong;
        } else {
          LiveEntry e{};
          if (!t.remove(a, &e) || e.address != a || !check(e)) ++wrong;
        }
      }
      held[w][u] ^= 1;
    }
  };
  std::thread trimmer([&] {
    while (!stop.load()) {
      released += trim_all(t);
      ++trims;
    }
  });
  std::thread reader([&] {
    while (!stop.load())
      t.for_each([&](const LiveEntry& e) {
        if (!check(e)) ++torn;
      });
  });
  std::vector<std::thread> ws;
  for (unsigned w = 0; w < kWriters; ++w) ws.emplace_back(writer, w);
  for (auto& th : ws) th.join();
  stop = true;
  trimmer.join();
  reader.join();
  INFO("trims " << trims.load() << ", released " << released.load());
  CHECK(trims.load() > 10);
  CHECK(released.load() > 0);
  CHECK(torn.load() == 0);
  CHECK(wrong.load() == 0);
  const auto live = live_of(t);
  size_t want = 0;
  for (unsigned w = 0; w < kWriters; ++w)
    for (uint64_t u = 0; u < kUnits; ++u)
      if (held[w][u] != 0) {
        want += 64;
        for (uint64_t j = 0; j < 64; ++j) {
          const auto it = live.find(unit_base(w, u) + j * 16);
          REQUIRE(it != live.end());
          CHECK(check(it->second));
        }
      }
  CHECK(live.size() == want);
  t.destroy();
}
