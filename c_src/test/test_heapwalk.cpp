// The heap walker against this test process's own glibc heap: the dump
// must be a valid v1 file, its chunks must be where the test put them, and
// its totals must equal mallinfo2() of the same snapshot.
#include <gnu/libc-version.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include "catch.h"

#include "../heapwalk/dump_format.h"
#include "../heapwalk/heapwalk.h"
#include "../heapwalk/ptmalloc.h"
#include "fake_tracker.h"
#include "scratch_targets.h"

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
  // Fill the 112-byte tcache bin (7 entries up to glibc 2.42, 16 from
  // 2.43), then one more goes to a fastbin (a bin from 2.43, which has
  // none); a large block freed between live ones lands in a bin. Earlier
  // tests may have left chunks of this size cached: take them out first,
  // more than a tcache's worth, since a malloc served from a small bin
  // moves that bin's other chunks into the tcache (seen on glibc 2.43
  // after the context tests: 2-3 stashed entries left behind a drain of
  // one tcache's worth).
  const mi::heapwalk::pt::Layout* layout = mi::heapwalk::pt::layout_for(::gnu_get_libc_version());
  REQUIRE(layout != nullptr);
  const int fill = static_cast<int>(layout->tcache_fill);
  const bool fastbins = layout->n_fastbins != 0;
  std::vector<void*> drained;
  for (int i = 0; i < 8 * fill; ++i) drained.push_back(std::malloc(100));
  std::vector<void*> small;
  for (int i = 0; i < fill + 2; ++i) small.push_back(std::malloc(100));
  void* live = std::malloc(100);
  void* big = std::malloc(5000);
  const uint64_t big_addr = reinterpret_cast<uint64_t>(big);
  // The fence must be the chunk right after big (else big, freed, may merge
  // into top): blocks of its size cached by earlier cases come first, and
  // 2.43 caches 16 per bin.
  std::vector<void*> fences;
  for (int i = 0; i < 64 && (fences.empty() || fences.back() != static_cast<char*>(big) + 5008);
       ++i)
    fences.push_back(std::malloc(100));
  void* fence = fences.back();
  for (int i = 0; i <= fill; ++i) std::free(small[static_cast<size_t>(i)]);
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
  // Freed, so cached: in the tcache or a fastbin (a bin from 2.43), never
  // in_use. (The dump's own few allocations before the fork may take or
  // return an entry of this size, so the split is not exact.)
  int tcache = 0, fastn = 0, freen = 0;
  for (int i = 0; i <= fill; ++i) {
    const int k = at(small[static_cast<size_t>(i)]).second;
    tcache += k == hd::kTcache;
    fastn += k == hd::kFast;
    freen += k == hd::kFree;
  }
  CHECK(tcache + fastn + freen == fill + 1);
  CHECK(tcache >= fill - 1);
  CHECK((fastbins ? fastn : freen) >= 1);
  CHECK((fastbins ? freen : fastn) == 0);
  ::unlink(path.c_str());
  std::free(small[static_cast<size_t>(fill + 1)]);
  std::free(live);
  for (void* f : fences) std::free(f);
  for (void* q : drained) std::free(q);
}

TEST_CASE("a dump never leaves a partial file behind", "[glibc][heapwalk]") {
  hw::DumpResult r;
  SECTION("the directory does not exist") {
    const hw::DumpStatus st =
        hw::dump("/nonexistent-dir/x.heapdump", hw::DumpOptions{}, nullptr, r);
    CHECK(st.failure == hw::Failure::os_error);
    CHECK(st.err == ENOENT);
  }
  const std::string dir = temp_path("dir");
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  const std::string target = dir + "/target";
  auto leftovers = [&] {
    std::vector<std::string> names;
    const std::string cmd = "ls -A " + dir;
    FILE* p = ::popen(cmd.c_str(), "r");
    char line[256];
    while (p != nullptr && std::fgets(line, sizeof line, p) != nullptr) names.emplace_back(line);
    if (p != nullptr) ::pclose(p);
    return names;
  };
  SECTION("the rename fails after the whole file was written") {
    REQUIRE(::mkdir(target.c_str(), 0700) == 0);
    REQUIRE(::mknod((target + "/x").c_str(), S_IFREG | 0600, 0) == 0);
    const hw::DumpStatus st = hw::dump(target, hw::DumpOptions{}, nullptr, r);
    CHECK(st.failure == hw::Failure::os_error);
    CHECK((st.err == EISDIR || st.err == ENOTEMPTY || st.err == EEXIST));
    CHECK(leftovers().size() == 1);  // target/ only
    ::unlink((target + "/x").c_str());
    ::rmdir(target.c_str());
  }
  SECTION("the child is killed at the deadline") {
    std::vector<void*> many;
    for (int i = 0; i < 400000; ++i) many.push_back(std::malloc(32));
    hw::DumpOptions o;
    o.timeout_ms = 1;
    const hw::DumpStatus st = hw::dump(target, o, nullptr, r);
    CHECK(st.failure == hw::Failure::timeout);
    CHECK(leftovers().empty());
    for (void* q : many) std::free(q);
  }
  SECTION("a site labeler that throws") {
    // No tracker, so no sites: the labeler is never called and the dump
    // succeeds; with a throwing labeler and sites, the guard cleans up
    // (exercised through the CT suite's tracker runs).
    const hw::DumpStatus st = hw::dump(
        target, hw::DumpOptions{},
        [](const std::vector<uint64_t>&) -> std::string { throw std::runtime_error("x"); }, r);
    CHECK(st.failure == hw::Failure::none);
    ::unlink(target.c_str());
  }
  ::rmdir(dir.c_str());
}

TEST_CASE("a dump replaces only a regular file or a missing name", "[glibc][heapwalk][file]") {
  mi::test::ScratchTargets scratch;
  const auto before = scratch.entries();
  hw::DumpResult r;
  for (const auto& t : scratch.targets()) {
    INFO(t.kind);
    const auto print = mi::test::ScratchTargets::fingerprint(t.path);
    const hw::DumpStatus st = hw::dump(t.path, hw::DumpOptions{}, nullptr, r);
    CHECK(st.failure == hw::Failure::os_error);
    CHECK(st.err == t.expected_errno);
    CHECK(mi::test::ScratchTargets::fingerprint(t.path) == print);
  }
  CHECK(scratch.entries() == before);

  const std::string fresh = scratch.dir() + "/fresh.heapdump";
  REQUIRE(hw::dump(fresh, hw::DumpOptions{}, nullptr, r).failure == hw::Failure::none);
  CHECK(parse(fresh).ok);
  const auto first = mi::test::ScratchTargets::fingerprint(fresh);
  REQUIRE(hw::dump(fresh, hw::DumpOptions{}, nullptr, r).failure == hw::Failure::none);
  const Parsed again = parse(fresh);
  INFO(again.error);
  CHECK(again.ok);
  CHECK(mi::test::ScratchTargets::fingerprint(fresh).ino != first.ino);
}

// Fills a thread arena's current 64 MiB heap until exactly `left` bytes of
// top remain, then allocates what does not fit, so that sysmalloc opens a
// second heap and retires the first one's top into fenceposts. Reads the
// arena's top (ptmalloc.h layout, validated by the walker's own tests) so
// that blocks served from the arena's bins do not fool it.
// Runs on its own thread: reports instead of REQUIRE-ing.
bool fill_first_heap(uint64_t left, std::vector<void*>& keep) {
  namespace pt = mi::heapwalk::pt;
  const pt::Layout* layout = pt::layout_for(::gnu_get_libc_version());
  if (layout == nullptr) return false;
  void* first = std::malloc(100);
  keep.push_back(first);
  const uint64_t arena =
      *reinterpret_cast<uint64_t*>(reinterpret_cast<uint64_t>(first) & ~(pt::kHeapMax - 1));
  // volatile: the compiler assumes malloc() writes no memory it can see.
  auto top = [&] { return *reinterpret_cast<volatile uint64_t*>(arena + layout->arena_top); };
  const uint64_t heap = top() & ~(pt::kHeapMax - 1);
  const uint64_t end = heap + pt::kHeapMax;
  for (int i = 0; i < 100000 && (top() & ~(pt::kHeapMax - 1)) == heap && end - top() != left; ++i) {
    const uint64_t remaining = end - top();
    // A chunk of exactly `chunk` bytes: request2size(chunk - 16) == chunk.
    const uint64_t chunk = remaining >= 120000 + left ? 100000 : remaining - left;
    keep.push_back(std::malloc(static_cast<size_t>(chunk - 16)));
  }
  if (end - top() != left) return false;
  // Blocks that cannot come from that top; the first ones may still come
  // from the arena's bins, but a new heap must open eventually.
  for (int i = 0; i < 1000000 && (top() & ~(pt::kHeapMax - 1)) == heap; ++i)
    keep.push_back(std::malloc(static_cast<size_t>(left) + 1000));
  return (top() & ~(pt::kHeapMax - 1)) != heap;
}

TEST_CASE("old heaps end in fenceposts, whatever top was left", "[glibc][heapwalk]") {
  for (uint64_t left : {48ull, 80ull, 176ull, 4096ull}) {
    std::vector<void*> keep;
    keep.reserve(1100000);  // no vector growth inside the filling thread's arena
    bool filled = false;
    std::thread([&] { filled = fill_first_heap(left, keep); }).join();
    INFO("left " << left);
    REQUIRE(filled);
    hw::DumpResult r;
    const hw::DumpStatus st = hw::dump("", hw::DumpOptions{}, nullptr, r);
    INFO("left " << left << ": " << st.detail);
    REQUIRE(st.failure == hw::Failure::none);
    uint64_t meta = 0, segments = 0;
    for (const auto& a : r.arenas) {
      meta += a.by_kind[hd::kMeta];
      segments += a.segments;
    }
    CHECK(segments > r.arenas.size());  // some arena has two heaps
    CHECK(meta >= 32);
    CHECK(total(r, &hw::ArenaSummary::system_bytes) == r.mallinfo.arena);
    CHECK(total_kind(r, hd::kFree) + total_kind(r, hd::kFast) + total_kind(r, hd::kTop) ==
          r.mallinfo.fordblks);
    for (void* q : keep) std::free(q);
  }
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

TEST_CASE("heap map sites: one site per call stack, whatever its ids", "[glibc][heapwalk]") {
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(std::malloc(100 + 100 * i));
  // Ids 7 and 9 are two copies of one stack (as racing threads store
  // them), 8 another stack, 99 a stack freed since the snapshot.
  mi::test::FakeTracker fake;
  fake.hashes = false;
  fake.stacks = {
      {7, {0x1000, 0x2000, 0x3000}}, {8, {0x4000, 0x5000}}, {9, {0x1000, 0x2000, 0x3000}}};
  const uint32_t ids[] = {7, 9, 8, 99};
  for (int i = 0; i < 4; ++i)
    fake.entries.push_back(mi_abi_entry{reinterpret_cast<uint64_t>(blocks[i]),
                                        static_cast<uint64_t>(100 + 100 * i), 0, ids[i], 0, 0});
  const mi_preload_abi abi = fake.abi();
  hw::DumpOptions o;
  o.tracker = &abi;
  hw::DumpResult r;
  const hw::DumpStatus st = hw::dump("", o, nullptr, r);
  INFO(st.detail);
  REQUIRE(st.failure == hw::Failure::none);
  REQUIRE(r.tracker);
  std::map<std::vector<uint64_t>, std::pair<uint64_t, uint64_t>> sites;
  for (const hw::Site& s : r.sites) sites[s.frames] = {s.live_blocks, s.live_bytes};
  // Ids 7 and 9 are one site (100 + 200 bytes); 8 another; 99 none.
  CHECK(sites.size() == 2);
  CHECK(sites[{0x1000, 0x2000, 0x3000}] == std::make_pair(uint64_t{2}, uint64_t{300}));
  CHECK(sites[{0x4000, 0x5000}] == std::make_pair(uint64_t{1}, uint64_t{300}));
  for (void* b : blocks) std::free(b);
}

TEST_CASE("the walker knows glibc 2.35 to 2.43 and refuses any other release", "[heapwalk]") {
  namespace pt = mi::heapwalk::pt;
  for (const char* v : {"2.35", "2.36", "2.40", "2.41"})
    CHECK(pt::layout_for(v) == &pt::kLayout235);
  CHECK(pt::layout_for("2.42") == &pt::kLayout242);
  CHECK(pt::layout_for("2.43") == &pt::kLayout243);
  CHECK(pt::layout_for("2.43.9000") == &pt::kLayout243);  // a development snapshot of 2.43
  for (const char* v : {"2.34", "2.44", "2.50", "3.0", "1.43", "2", "", "2.x", "glibc"}) {
    INFO(v);
    CHECK(pt::layout_for(v) == nullptr);
  }
  CHECK(pt::layout_for(nullptr) == nullptr);
  // This test binary's own glibc is one of them (the matrix runs it on
  // each), and the dump refuses a release it does not know by name.
  CHECK(pt::layout_for(::gnu_get_libc_version()) != nullptr);
}

TEST_CASE("a tcache bin takes the chunk sizes glibc files into it", "[heapwalk]") {
  namespace pt = mi::heapwalk::pt;
  for (const pt::Layout* l : {&pt::kLayout235, &pt::kLayout242, &pt::kLayout243}) {
    INFO(l->releases);
    CHECK(pt::fits_tcache_bin(*l, 0, 32));
    CHECK_FALSE(pt::fits_tcache_bin(*l, 0, 48));
    CHECK(pt::fits_tcache_bin(*l, 63, 1040));
    CHECK_FALSE(pt::fits_tcache_bin(*l, 63, 1056));
    CHECK_FALSE(pt::fits_tcache_bin(*l, l->tcache_bins, 1056));
  }
  // 2.42's large bins (large_csize2tidx): one per power of two, from the
  // first size above the small bins up to 4 MiB.
  const pt::Layout& l = pt::kLayout242;
  CHECK(pt::fits_tcache_bin(l, 64, 1056));
  CHECK(pt::fits_tcache_bin(l, 64, 2032));
  CHECK_FALSE(pt::fits_tcache_bin(l, 64, 2048));
  CHECK_FALSE(pt::fits_tcache_bin(l, 64, 1040));
  CHECK(pt::fits_tcache_bin(l, 65, 2048));
  CHECK(pt::fits_tcache_bin(l, 75, (4u << 20) - 16));
  CHECK_FALSE(pt::fits_tcache_bin(l, 75, 4u << 20));
  CHECK_FALSE(pt::fits_tcache_bin(pt::kLayout235, 64, 1056));
}
