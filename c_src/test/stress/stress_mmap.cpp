// Runs under the real interposer (LD_PRELOAD, MALLOCINFO_TRACE_EXE=
// stress_mmap, full mode): the region table must equal /proc/self/maps'
// view of this program's own mappings, byte for byte, after each step:
// map, partial unmap (middle, head, tail), mremap grow / shrink / move
// (MREMAP_MAYMOVE, MREMAP_FIXED), MAP_FIXED over recorded regions, a
// private file mapping, mremap over two regions the kernel merged (failing
// and moving), a trip through counters mode, and four threads mapping and
// unmapping at once.
// Also proves that glibc's own mmaps (a 64 MiB malloc block) are not
// regions. Exits 0 when every check held; prints each failure.
//
// The program's mappings are PROT_READ only: no allocator or loader makes
// an anonymous read-only private mapping, so the "r--p" anonymous lines of
// /proc/self/maps are exactly this program's (the kernel merges adjacent
// ones; comparisons are of byte coverage, not of line counts).
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "../preload_probe.h"

namespace {

const mi_preload_abi* g_abi = nullptr;
int g_failures = 0;
const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

void fail(const char* step, const char* what) {
  ++g_failures;
  fprintf(stderr, "stress_mmap: %s: %s\n", step, what);
}

// Coverage: start -> end, adjacent ranges merged.
using Cover = std::map<uint64_t, uint64_t>;

Cover merged(std::vector<std::pair<uint64_t, uint64_t>> v) {
  std::sort(v.begin(), v.end());
  Cover c;
  uint64_t s = 0, e = 0;
  bool open = false;
  for (const auto& [a, b] : v) {
    if (open && a <= e) {
      if (b > e) e = b;
      continue;
    }
    if (open) c[s] = e;
    s = a;
    e = b;
    open = true;
  }
  if (open) c[s] = e;
  return c;
}

// Anonymous read-only private mappings: this program's.
Cover maps_view() {
  std::vector<std::pair<uint64_t, uint64_t>> v;
  FILE* f = fopen("/proc/self/maps", "r");
  char line[512];
  while (f != nullptr && fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo, hi, off, inode;
    char perms[8], dev[16];
    int n = 0;
    if (sscanf(line, "%lx-%lx %7s %lx %15s %lu %n", &lo, &hi, perms, &off, dev, &inode, &n) < 6)
      continue;
    const char* rest = line + n;
    const bool anonymous = inode == 0 && (*rest == '\0' || *rest == '\n');
    if (anonymous && strcmp(perms, "r--p") == 0) v.emplace_back(lo, hi);
  }
  if (f != nullptr) fclose(f);
  return merged(v);
}

std::vector<mi_abi_region> regions() {
  mi_abi_region_status st{};
  g_abi->region_status(&st, sizeof st);
  std::vector<mi_abi_region> v(st.capacity);
  const uint64_t n = g_abi->regions(v.data(), v.size());
  v.resize(n < v.size() ? n : v.size());
  return v;
}

// The table's anonymous private non-shared regions whose first frame lies
// in this executable (the program's own calls; the C library's or the
// loader's, made before main, are not compared).
Cover table_view() {
  std::vector<std::pair<uint64_t, uint64_t>> v;
  for (const mi_abi_region& r : regions())
    if (r.flags == MI_REGION_ANONYMOUS || r.flags == (MI_REGION_ANONYMOUS | MI_REGION_REMAPPED))
      v.emplace_back(r.start, r.start + r.length);
  return merged(v);
}

std::string show(const Cover& c) {
  std::string s;
  char buf[64];
  for (const auto& [a, b] : c) {
    snprintf(buf, sizeof buf, " %lx-%lx", static_cast<unsigned long>(a),
             static_cast<unsigned long>(b));
    s += buf;
  }
  return s.empty() ? " (none)" : s;
}

// Every anonymous read-only region in the table must be a maps line, and
// the reverse, restricted to what this program mapped read-only.
void check(const char* step) {
  const Cover want = maps_view();
  Cover got;
  // Only the table's regions that are read-only anonymous in maps' terms:
  // intersect with the union of maps' anonymous read-only lines and of the
  // table (the table has no protection bits; others' regions are RW).
  for (const auto& [a, b] : table_view()) {
    bool ro = false;
    for (const auto& [c, d] : want)
      if (a < d && c < b) ro = true;
    if (ro) got[a] = b;
  }
  if (got != want) {
    std::string m = "table" + show(got) + " != maps" + show(want);
    fail(step, m.c_str());
  }
}

void* map_ro(size_t pages, void* at = nullptr, int extra = 0) {
  void* p = mmap(at, pages * kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | extra, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  return p;
}

char* at(void* p, size_t page) {
  return static_cast<char*>(p) + page * kPage;
}

bool frame_in_main(const mi_abi_region& r) {
  Dl_info info{};
  if (r.depth == 0 || dladdr(reinterpret_cast<void*>(r.frames[0]), &info) == 0) return false;
  return info.dli_fname != nullptr && strstr(info.dli_fname, "stress_mmap") != nullptr;
}

}  // namespace

int main() {
  g_abi = probe::find_abi();
  if (g_abi == nullptr) {
    fprintf(stderr, "stress_mmap: not under the interposer\n");
    return 2;
  }
  check("start");

  // Map, then unmap the middle, the head, the tail.
  void* a = map_ro(16);
  check("map 16 pages");
  {
    bool found = false;
    for (const mi_abi_region& r : regions())
      if (r.start == reinterpret_cast<uintptr_t>(a)) {
        found = true;
        if (r.length != 16 * kPage) fail("map", "wrong length");
        if (!frame_in_main(r)) fail("map", "first frame is not in stress_mmap");
      }
    if (!found) fail("map", "region not recorded");
  }
  munmap(at(a, 6), 4 * kPage);
  check("unmap the middle");
  munmap(a, kPage);
  check("unmap the head");
  munmap(at(a, 15), kPage);
  check("unmap the tail");

  // mremap: grow in place (or moving), shrink, move to a fixed place.
  void* b = map_ro(4);
  check("map b");
  void* b2 = mremap(b, 4 * kPage, 64 * kPage, MREMAP_MAYMOVE);
  if (b2 == MAP_FAILED) fail("mremap grow", strerror(errno));
  check("mremap grow");
  void* b3 = mremap(b2, 64 * kPage, 8 * kPage, 0);
  if (b3 != b2) fail("mremap shrink", "moved");
  check("mremap shrink");
  // A destination reserved first (so the kernel gives a known free place),
  // then MREMAP_FIXED over it: the reservation is replaced.
  void* dest = map_ro(32);
  check("map the destination");
  void* b4 = mremap(b3, 8 * kPage, 8 * kPage, MREMAP_MAYMOVE | MREMAP_FIXED, at(dest, 8));
  if (b4 != at(dest, 8)) fail("mremap fixed", strerror(errno));
  check("mremap MREMAP_FIXED into the middle of a region");
  // Shrinking the middle of a region: mremap on a part.
  void* c = map_ro(8);
  if (mremap(at(c, 2), 4 * kPage, 2 * kPage, 0) == MAP_FAILED) fail("mremap part", strerror(errno));
  check("mremap shrink a part");
  // A failing mremap (grow in place with the rest of its own mapping in
  // the way, no move allowed) leaves the table as it was.
  void* d = map_ro(8);
  if (mremap(d, 4 * kPage, 8 * kPage, 0) != MAP_FAILED) fail("mremap fail", "succeeded");
  check("mremap that fails");

  // MAP_FIXED over recorded regions (inside a mapping of our own, never
  // over someone else's): first one region, then across two.
  void* e = map_ro(16);
  map_ro(8, at(e, 8), MAP_FIXED);
  map_ro(6, at(e, 5), MAP_FIXED);
  check("MAP_FIXED over two regions");
  {
    int owners = 0;
    for (const mi_abi_region& r : regions()) {
      const uint64_t lo = reinterpret_cast<uintptr_t>(e);
      if (r.start >= lo && r.start < lo + 16 * kPage) ++owners;
    }
    if (owners != 3) fail("MAP_FIXED", "expected three regions (head, new, tail)");
  }

  // A private file mapping is recorded and flagged.
  char path[] = "/tmp/stress_mmap.XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(4 * kPage)) != 0) {
    fail("file", "cannot make a scratch file");
  } else {
    void* fm = mmap(nullptr, 4 * kPage, PROT_READ, MAP_PRIVATE, fd, 0);
    void* sm = mmap(nullptr, 4 * kPage, PROT_READ, MAP_SHARED, fd, 0);
    uint32_t fflags = 0, sflags = 0;
    for (const mi_abi_region& r : regions()) {
      if (r.start == reinterpret_cast<uintptr_t>(fm)) fflags = r.flags;
      if (r.start == reinterpret_cast<uintptr_t>(sm)) sflags = r.flags;
    }
    if (fflags != MI_REGION_PRIVATE_FILE) fail("file", "private file mapping not flagged so");
    if (sflags != MI_REGION_SHARED) fail("file", "shared file mapping not flagged so");
    munmap(fm, 4 * kPage);
    munmap(sm, 4 * kPage);
    close(fd);
    unlink(path);
  }

  // glibc maps a 64 MiB block itself, without the mmap symbol: no region.
  {
    mi_abi_region_status before{};
    g_abi->region_status(&before, sizeof before);
    void* big = malloc(64 << 20);
    mi_abi_region_status after{};
    g_abi->region_status(&after, sizeof after);
    for (const mi_abi_region& r : regions())
      if (reinterpret_cast<uintptr_t>(big) >= r.start &&
          reinterpret_cast<uintptr_t>(big) < r.start + r.length)
        fail("64 MiB malloc", "its block is a region");
    if (after.calls_mmap != before.calls_mmap) fail("64 MiB malloc", "an mmap call was counted");
    // And it is a mapping of its own (so the check above meant something).
    bool mapped = false;
    FILE* m = fopen("/proc/self/maps", "r");
    char line[512];
    while (m != nullptr && fgets(line, sizeof line, m) != nullptr) {
      unsigned long lo, hi;
      if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && reinterpret_cast<uintptr_t>(big) >= lo &&
          reinterpret_cast<uintptr_t>(big) < hi && hi - lo >= (64ul << 20))
        mapped = true;
    }
    if (m != nullptr) fclose(m);
    if (!mapped) fail("64 MiB malloc", "not an mmapped block");
    free(big);
  }

  // Issue 28, item 6: the kernel merges adjacent mappings, so one mremap
  // can span two recorded regions. A failed one leaves both as they were;
  // a successful one moves each with its own stack.
  {
    void* g = map_ro(12);
    map_ro(4, at(g, 4), MAP_FIXED);  // a second region inside one mapping
    const uint64_t lo = reinterpret_cast<uintptr_t>(g);
    auto owners = [&](uint64_t from, uint64_t pages) {
      std::map<uint64_t, uint64_t> m;  // start -> timestamp
      for (const mi_abi_region& r : regions())
        if (r.start >= from && r.start < from + pages * kPage) m[r.start] = r.timestamp_ns;
      return m;
    };
    const auto before = owners(lo, 12);
    if (before.size() != 3) fail("two regions, one mapping", "expected three regions");
    // Growing pages 0..7 in place cannot work: pages 8..11 are in the way.
    if (mremap(g, 8 * kPage, 16 * kPage, 0) != MAP_FAILED)
      fail("mremap over two regions that fails", "succeeded");
    check("mremap over two regions that fails");
    if (owners(lo, 12) != before) fail("mremap over two regions that fails", "owners changed");
    void* dest2 = map_ro(24);
    void* moved = mremap(g, 8 * kPage, 8 * kPage, MREMAP_MAYMOVE | MREMAP_FIXED, at(dest2, 8));
    if (moved != at(dest2, 8)) fail("mremap over two regions", strerror(errno));
    check("mremap over two regions");
    const auto after = owners(reinterpret_cast<uintptr_t>(moved), 8);
    auto it = before.begin();
    const uint64_t first = it->second, second = (++it)->second;
    if (after.size() != 2 || after.begin()->second != first || after.rbegin()->second != second)
      fail("mremap over two regions", "the regions did not move each with its own stack");
  }

  // Issue 28, item 4: full -> counters -> full (the HTTP endpoint's
  // ?active=false then ?active=true). What is unmapped or moved in counters
  // mode leaves the table; a MAP_FIXED over a region replaces it.
  {
    void* h = map_ro(16);
    void* moving = map_ro(4);
    void* fixed = map_ro(4);
    check("before counters mode");
    if (g_abi->set_mode(MI_MODE_COUNTERS) != 0) fail("counters mode", "set_mode refused");
    munmap(at(h, 4), 4 * kPage);
    munmap(at(h, 12), 4 * kPage);
    void* moved = mremap(moving, 4 * kPage, 8 * kPage, MREMAP_MAYMOVE);
    if (moved == MAP_FAILED) fail("counters mode", strerror(errno));
    // Read-write: not one of the mappings check() compares, so the table
    // must simply have nothing there any more.
    if (mmap(fixed, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
             0) != fixed)
      fail("counters mode", "MAP_FIXED failed");
    if (g_abi->set_mode(MI_MODE_FULL) != 0) fail("full mode again", "set_mode refused");
    check("full -> counters -> full");
    for (const mi_abi_region& r : regions())
      if (r.start < reinterpret_cast<uintptr_t>(fixed) + 4 * kPage &&
          reinterpret_cast<uintptr_t>(fixed) < r.start + r.length)
        fail("full -> counters -> full", "a region MAP_FIXED replaced in counters mode is left");
    munmap(fixed, 4 * kPage);
  }

  // Four threads mapping, cutting and unmapping at once.
  {
    std::vector<std::thread> ts;
    std::atomic<int> bad{0};
    for (int k = 0; k < 4; ++k) {
      ts.emplace_back([&bad] {
        std::vector<void*> kept;
        for (int i = 0; i < 400; ++i) {
          void* p = mmap(nullptr, 3 * kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          if (p == MAP_FAILED) {
            ++bad;
            continue;
          }
          if (i % 3 == 0) munmap(at(p, 1), kPage);
          if (i % 3 == 1) munmap(p, 3 * kPage);
          if (i % 3 == 2) {
            void* q = mremap(p, 3 * kPage, 5 * kPage, MREMAP_MAYMOVE);
            if (q == MAP_FAILED) ++bad;
          }
        }
      });
    }
    for (auto& t : ts) t.join();
    if (bad != 0) fail("threads", "a call failed");
    check("four threads");
  }
  mi_abi_region_status st{};
  g_abi->region_status(&st, sizeof st);
  if (st.dropped != 0) fail("status", "regions dropped");
  printf("stress_mmap: %s (%lu regions, %lu bytes, %lu mmap calls)\n",
         g_failures == 0 ? "ok" : "FAILED", static_cast<unsigned long>(st.regions),
         static_cast<unsigned long>(st.bytes), static_cast<unsigned long>(st.calls_mmap));
  return g_failures == 0 ? 0 : 1;
}
