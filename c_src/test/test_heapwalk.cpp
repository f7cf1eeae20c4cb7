// The heap walker against this test process's own glibc heap: the dump
// must be a valid v1 file, its chunks must be where the test put them, and
// its totals must equal mallinfo2() of the same snapshot.
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "../heapwalk/dump_format.h"
#include "../heapwalk/heapwalk.h"

namespace hw = mi::heapwalk;
namespace hd = mi::heapdump;

namespace {

// A strict reader of the format, independent of the writer's code.
struct Parsed {
  uint32_t version = 0, page_size = 0, flags = 0;
  std::string glibc;
  std::map<uint64_t, std::pair<uint64_t, int>> chunks;  // address -> (size, kind)
  std::vector<uint64_t> system;                         // per arena
  std::vector<uint64_t> free_kind_count;                // per arena: chunks of kind free
  std::vector<uint64_t> fast_count;
  uint64_t n_chunks = 0, n_segments = 0, end_chunks = 0, end_segments = 0;
  uint32_t end_arenas = 0;
  bool ok = false;
  std::string error;
};

template <class T>
T take(const std::string& s, size_t& at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof v);
  at += sizeof v;
  return v;
}

Parsed parse(const std::string& path) {
  Parsed p;
  std::ifstream in(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (s.size() < 8 || std::memcmp(s.data(), hd::kMagic, 8) != 0) {
    p.error = "magic";
    return p;
  }
  size_t at = 8;
  uint64_t next = 0, seg_end = 0;
  int arena = -1;
  bool seen_end = false;
  while (at < s.size()) {
    if (seen_end || at + 8 > s.size()) {
      p.error = "trailing";
      return p;
    }
    const uint32_t tag = take<uint32_t>(s, at);
    const uint32_t len = take<uint32_t>(s, at);
    if (at + len > s.size()) {
      p.error = "truncated";
      return p;
    }
    const size_t body = at;
    switch (tag) {
      case hd::kHeaderRec:
        p.version = take<uint32_t>(s, at);
        p.page_size = take<uint32_t>(s, at);
        take<uint32_t>(s, at);
        p.flags = take<uint32_t>(s, at);
        at += 24;
        p.glibc.assign(s.data() + at, body + len - at);
        break;
      case hd::kArenaRec:
        arena = static_cast<int>(take<uint32_t>(s, at));
        take<uint32_t>(s, at);
        take<uint64_t>(s, at);
        p.system.push_back(take<uint64_t>(s, at));
        p.free_kind_count.push_back(0);
        p.fast_count.push_back(0);
        break;
      case hd::kSegmentRec: {
        take<uint32_t>(s, at);
        take<uint32_t>(s, at);
        const uint64_t base = take<uint64_t>(s, at);
        const uint64_t size = take<uint64_t>(s, at);
        next = take<uint64_t>(s, at);
        seg_end = base + size;
        ++p.n_segments;
        break;
      }
      case hd::kChunksRec:
        for (uint32_t i = 0; i < len / 8; ++i) {
          const uint64_t w = take<uint64_t>(s, at);
          const uint64_t size = w & hd::kSizeMask;
          const int kind = static_cast<int>(w & 0xf);
          p.chunks[next] = {size, kind};
          if (kind == hd::kFree) ++p.free_kind_count[arena];
          if (kind == hd::kFast) ++p.fast_count[arena];
          next += size;
          ++p.n_chunks;
          if (next > seg_end) {
            p.error = "overrun";
            return p;
          }
        }
        break;
      case hd::kPagesRec:
        if (next != seg_end) {
          p.error = "segment not covered";
          return p;
        }
        break;
      case hd::kMmapRec:
      case hd::kSiteRec:
        break;
      case hd::kEndRec:
        p.end_chunks = take<uint64_t>(s, at);
        p.end_segments = take<uint64_t>(s, at);
        p.end_arenas = take<uint32_t>(s, at);
        seen_end = true;
        break;
      default:
        p.error = "tag";
        return p;
    }
    at = body + len;
  }
  p.ok = seen_end;
  if (!seen_end) p.error = "no END";
  return p;
}

std::string temp_path(const char* name) {
  return std::string("/tmp/mi_heapwalk_") + std::to_string(::getpid()) + "_" + name;
}

uint64_t total(const hw::DumpResult& r, uint64_t hw::ArenaSummary::*f) {
  uint64_t t = 0;
  for (const auto& a : r.arenas) t += a.*f;
  return t;
}

uint64_t total_kind(const hw::DumpResult& r, int kind) {
  uint64_t t = 0;
  for (const auto& a : r.arenas) t += a.by_kind[kind];
  return t;
}

}  // namespace

TEST_CASE("the dump agrees with mallinfo2 of the same snapshot", "[glibc][heapwalk]") {
  // A second arena, with live and freed blocks, from another thread.
  std::vector<void*> keep;
  std::thread([&] {
    for (int i = 0; i < 2000; ++i) keep.push_back(std::malloc(static_cast<size_t>(24 + i % 500)));
    for (size_t i = 0; i < keep.size(); i += 2) {
      std::free(keep[i]);
      keep[i] = nullptr;
    }
  }).join();

  hw::DumpResult r;
  const std::string path = temp_path("agree");
  const hw::DumpStatus st = hw::dump(path, hw::DumpOptions{}, nullptr, r);
  INFO(st.detail);
  REQUIRE(st.failure == hw::Failure::none);
  REQUIRE(r.arenas.size() >= 2);

  const auto& m = r.mallinfo;
  CHECK(total(r, &hw::ArenaSummary::system_bytes) == m.arena);
  CHECK(total_kind(r, hd::kFree) + total_kind(r, hd::kFast) + total_kind(r, hd::kTop) ==
        m.fordblks);
  CHECK(total_kind(r, hd::kFast) == m.fsmblks);
  CHECK(m.arena - m.fordblks == m.uordblks);

  const Parsed p = parse(path);
  INFO(p.error);
  REQUIRE(p.ok);
  CHECK(p.version == hd::kVersion);
  CHECK(p.page_size == static_cast<uint32_t>(::sysconf(_SC_PAGESIZE)));
  CHECK(p.end_chunks == p.n_chunks);
  CHECK(p.end_chunks == r.chunks);
  CHECK(p.end_segments == p.n_segments);
  CHECK(p.end_arenas == r.arenas.size());
  uint64_t free_chunks = 0, fast = 0;
  for (size_t i = 0; i < p.system.size(); ++i) {
    CHECK(p.system[i] == r.arenas[i].system_bytes);
    free_chunks += p.free_kind_count[i];
    fast += p.fast_count[i];
  }
  // ordblks counts each arena's top as one free block.
  CHECK(free_chunks + r.arenas.size() == m.ordblks);
  CHECK(fast == m.smblks);
  struct stat sb {};
  REQUIRE(::stat(path.c_str(), &sb) == 0);
  CHECK(static_cast<uint64_t>(sb.st_size) == r.file_bytes);
  ::unlink(path.c_str());
  for (void* q : keep) std::free(q);
}

TEST_CASE("chunks are where the allocator put them, with the right kind", "[glibc][heapwalk]") {
  // Fill the 112-byte tcache bin (7 entries), then one more goes to a
  // fastbin; a large block freed between live ones lands in a bin.
  std::vector<void*> small;
  for (int i = 0; i < 9; ++i) small.push_back(std::malloc(100));
  void* live = std::malloc(100);
  void* big = std::malloc(5000);
  const uint64_t big_addr = reinterpret_cast<uint64_t>(big);
  void* fence = std::malloc(100);
  for (int i = 0; i < 8; ++i) std::free(small[static_cast<size_t>(i)]);
  std::free(big);

  hw::DumpResult r;
  const std::string path = temp_path("kinds");
  REQUIRE(hw::dump(path, hw::DumpOptions{}, nullptr, r).failure == hw::Failure::none);
  const Parsed p = parse(path);
  REQUIRE(p.ok);
  auto at_addr = [&](uint64_t user) {
    const auto it = p.chunks.find(user - 16);
    return it == p.chunks.end() ? std::make_pair(uint64_t{0}, -1) : it->second;
  };
  auto at = [&](void* user) { return at_addr(reinterpret_cast<uint64_t>(user)); };
  CHECK(at(live) == std::make_pair(uint64_t{112}, int{hd::kInUse}));
  CHECK(at(fence).second == hd::kInUse);
  CHECK(at_addr(big_addr).second == hd::kFree);
  CHECK(at_addr(big_addr).first >= 5008);
  int tcache = 0, fastn = 0;
  for (int i = 0; i < 8; ++i) {
    const int k = at(small[static_cast<size_t>(i)]).second;
    tcache += k == hd::kTcache;
    fastn += k == hd::kFast;
  }
  CHECK(tcache == 7);
  CHECK(fastn == 1);
  ::unlink(path.c_str());
  std::free(small[8]);
  std::free(live);
  std::free(fence);
}

TEST_CASE("a dump never leaves a partial file behind", "[glibc][heapwalk]") {
  hw::DumpResult r;
  const hw::DumpStatus st = hw::dump("/nonexistent-dir/x.heapdump", hw::DumpOptions{}, nullptr, r);
  CHECK(st.failure == hw::Failure::os_error);
  CHECK(st.err == ENOENT);
}

TEST_CASE("dumps stay consistent while other threads allocate", "[glibc][heapwalk]") {
  std::atomic<bool> stop{false};
  auto churn = [&](unsigned seed) {
    std::vector<void*> v(4096, nullptr);
    while (!stop.load(std::memory_order_relaxed)) {
      seed = seed * 1103515245u + 12345u;
      const size_t i = (seed >> 8) % v.size();
      std::free(v[i]);
      v[i] = std::malloc(16 + (seed >> 20) % 3000);
    }
    for (void* q : v) std::free(q);
  };
  std::thread a(churn, 1u), b(churn, 2u);
  for (int i = 0; i < 20; ++i) {
    hw::DumpResult r;
    const hw::DumpStatus st = hw::dump("", hw::DumpOptions{}, nullptr, r);
    INFO(st.detail);
    REQUIRE(st.failure == hw::Failure::none);
    CHECK(total(r, &hw::ArenaSummary::system_bytes) == r.mallinfo.arena);
    CHECK(total_kind(r, hd::kFree) + total_kind(r, hd::kFast) + total_kind(r, hd::kTop) ==
          r.mallinfo.fordblks);
  }
  stop = true;
  a.join();
  b.join();
}
