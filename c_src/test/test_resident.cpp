// Catch2 tests for glibc/resident.h: /proc/self/smaps parsing, the resident
// bytes of ranges from the kernel's figures, and how much mincore(2) work
// it takes (counted by a probe that stands in for mincore, never timed).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../glibc/resident.h"
#include "catch.h"

using namespace mi::mem;

namespace {

constexpr uint64_t kPage = 4096;

// Answers from a fixed set of resident pages and counts what it was asked.
struct FakeProbe {
  std::vector<uint64_t> resident_pages;  // page addresses
  uint64_t calls = 0, pages = 0;
};

uint64_t fake_probe(uint64_t start, uint64_t length, void* ctx) {
  auto* f = static_cast<FakeProbe*>(ctx);
  ++f->calls;
  f->pages += length / kPage;
  uint64_t n = 0;
  for (const uint64_t p : f->resident_pages)
    if (p >= start && p < start + length) n += kPage;
  return n;
}

struct CountingProbe {
  uint64_t pages = 0;
};

uint64_t counting_mincore(uint64_t start, uint64_t length, void* ctx) {
  static_cast<CountingProbe*>(ctx)->pages += length / static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return probe_mincore(start, length, nullptr);
}

}  // namespace

TEST_CASE("resident: smaps text is parsed into mappings and their Rss", "[resident]") {
  const std::string text =
      "00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon\n"
      "Size:                328 kB\n"
      "KernelPageSize:        4 kB\n"
      "Rss:                 300 kB\n"
      "Pss:                 150 kB\n"
      "VmFlags: rd ex mr mw me dw\n"
      "7f0000000000-7f2000000000 ---p 00000000 00:00 0 \n"
      "Size:          134217728 kB\n"
      "Rss:                   0 kB\n"
      "7fff00000000-7fff00004000 rw-p 00000000 00:00 0   /tmp/a path with spaces\n"
      "Rss:                  16 kB\n"
      "not a line\n"
      "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]\n";
  const std::vector<Vma> v = parse_smaps(text);
  REQUIRE(v.size() == 4);
  CHECK(v[0].start == 0x400000);
  CHECK(v[0].end == 0x452000);
  CHECK(v[0].rss == 300 * 1024);
  CHECK(v[1].end - v[1].start == (uint64_t{1} << 37));
  CHECK(v[1].rss == 0);
  CHECK(v[2].rss == 16 * 1024);
  CHECK(v[3].rss == 0);  // no Rss line
  CHECK(parse_smaps("").empty());
  CHECK(parse_smaps("zz-yy rw-p\nRss: 4 kB\n").empty());
}

TEST_CASE("resident: the kernel's figure where it is the range's, a probe where it is shared",
          "[resident]") {
  const uint64_t a = 0x10000000;
  // One mapping per range; a mapping shared by two ranges and a gap; a
  // fully resident shared mapping; a mapping with nothing resident.
  const std::vector<Vma> vmas = {
      {a, a + 16 * kPage, 5 * kPage},
      {a + 32 * kPage, a + 64 * kPage, 3 * kPage},
      {a + 64 * kPage, a + 72 * kPage, 8 * kPage},
      {a + 80 * kPage, a + 96 * kPage, 0},
  };
  FakeProbe f;
  f.resident_pages = {a + 33 * kPage, a + 40 * kPage, a + 50 * kPage};
  const std::vector<Range> ranges = {
      {a, 16 * kPage},               // the first mapping, whole: its Rss
      {a + 32 * kPage, 16 * kPage},  // half of the second: probed
      {a + 48 * kPage, 8 * kPage},   // a quarter of it: probed
      {a + 64 * kPage, 4 * kPage},   // half of a fully resident mapping
      {a + 80 * kPage, 16 * kPage},  // nothing resident: nothing probed
      {a + 200 * kPage, 4 * kPage},  // not mapped at all
  };
  const std::vector<uint64_t> r = resident_of(ranges, vmas, kPage, fake_probe, &f);
  CHECK(r == std::vector<uint64_t>{5 * kPage, 2 * kPage, 1 * kPage, 4 * kPage, 0, 0});
  CHECK(f.calls == 2);
  CHECK(f.pages == 24);
}

TEST_CASE("resident: a region over several mappings adds each of them", "[resident]") {
  const uint64_t a = 0x20000000;
  const std::vector<Vma> vmas = {{a, a + 4 * kPage, 4 * kPage},
                                 {a + 4 * kPage, a + 8 * kPage, 0},
                                 {a + 8 * kPage, a + 12 * kPage, kPage}};
  FakeProbe f;
  const std::vector<uint64_t> r = resident_of({{a, 12 * kPage}}, vmas, kPage, fake_probe, &f);
  CHECK(r == std::vector<uint64_t>{5 * kPage});
  CHECK(f.calls == 0);
}

TEST_CASE("resident: past the probe budget a shared mapping's Rss is shared out by length",
          "[resident]") {
  const uint64_t a = 0x30000000;
  const std::vector<Vma> vmas = {{a, a + 100 * kPage, 40 * kPage}};
  FakeProbe f;
  // Two ranges of 10 and 50 pages on it; a budget of 20 pages probes only
  // the smaller one.
  f.resident_pages = {a + kPage, a + 2 * kPage};
  const std::vector<uint64_t> r =
      resident_of({{a + 50 * kPage, 50 * kPage}, {a, 10 * kPage}}, vmas, kPage, fake_probe, &f, 20);
  CHECK(f.pages == 10);
  CHECK(r[1] == 2 * kPage);
  CHECK(r[0] == 20 * kPage);  // 40 pages * 50 / 100
}

// Issue 28, item 8: a huge reservation (here 32 TiB of PROT_NONE address
// space beside a small mapping the test touches) costs no probe work, and
// the figures are exact. The probe counts pages; mincore over the
// reservation, what mappings/1 did before, is 2^33 pages.
TEST_CASE("resident: a 32 TiB reservation costs no probe work", "[resident]") {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
#if defined(__SANITIZE_THREAD__)
  // TSan keeps most of the address space for its shadow: 1 TiB fits.
  const uint64_t reserve = uint64_t{1} << 40;
#else
  const uint64_t reserve = uint64_t{32} << 40;
#endif
  void* big = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  INFO("mmap of " << (reserve >> 40) << " TiB PROT_NONE: " << strerror(errno));
  REQUIRE(big != MAP_FAILED);  // PROT_NONE is not committed memory: overcommit does not refuse it
  void* small =
      mmap(nullptr, 64 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(small != MAP_FAILED);
  std::memset(static_cast<char*>(small) + 8 * page, 1, 10 * page);
  // Half of the small mapping is one range, the rest another: the kernel
  // sees one mapping, so its Rss has to be split by probing.
  const std::vector<Range> ranges = {{reinterpret_cast<uint64_t>(big), reserve},
                                     {reinterpret_cast<uint64_t>(small), 32 * page},
                                     {reinterpret_cast<uint64_t>(small) + 32 * page, 32 * page}};
  std::vector<Vma> vmas;
  REQUIRE(read_self_smaps(vmas));
  CountingProbe c;
  const std::vector<uint64_t> r = resident_of(ranges, vmas, page, counting_mincore, &c);
  CHECK(r == std::vector<uint64_t>{0, 10 * page, 0});
  CHECK(c.pages <= 64);
  munmap(small, 64 * page);
  munmap(big, reserve);
}
