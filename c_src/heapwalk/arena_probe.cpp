#include "arena_probe.h"

#include <elf.h>
#include <link.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "ptmalloc.h"

namespace mi::heapwalk {

using detail::arena_at;

const pt::Layout* pt::layout_for(const char* version) {
  unsigned major = 0, minor = 0;
  if (version == nullptr || std::sscanf(version, "%u.%u", &major, &minor) != 2 || major != 2)
    return nullptr;
  // 2.35 added heap_info.pagesize; 2.42 changed the tcache, 2.43 dropped
  // the fastbins (ptmalloc.h). A later release may move anything: refused
  // until its sources were read.
  if (minor >= 35 && minor <= 41) return &kLayout235;
  if (minor == 42) return &kLayout242;
  if (minor == 43) return &kLayout243;
  return nullptr;
}

bool pt::fits_tcache_bin(const Layout& l, size_t bin, uint64_t size) {
  if (bin < l.tcache_small_bins) return size == bin_chunk_size(bin);
  if (bin >= l.tcache_bins || size < bin_chunk_size(l.tcache_small_bins)) return false;
  return (size >> (10 + (bin - l.tcache_small_bins))) == 1;
}

namespace detail {

namespace {

// The malloc_state signature: every bin pair is either empty (both links
// point at the pair's own bin header) or two 16-aligned chunk pointers
// outside the structure; top is set. `w` is a copy of the candidate.
bool looks_like_arena(const pt::Layout& l, uint64_t addr, const uint64_t* w) {
  const uint64_t top = w[l.arena_top / 8];
  if (top == 0 || (top & (pt::kAlign - 1)) != 0) return false;
  const uint64_t next = w[l.arena_next / 8];
  if (next == 0 || (next & 7) != 0) return false;
  unsigned empty = 0;
  for (size_t k = 0; k < pt::kNBinPairs; ++k) {
    const uint64_t fd = w[l.arena_bins / 8 + 2 * k];
    const uint64_t bk = w[l.arena_bins / 8 + 2 * k + 1];
    const uint64_t self = addr + l.arena_bins + 16 * k - 16;
    if (fd == self || bk == self) {
      if (fd != bk) return false;
      ++empty;
      continue;
    }
    if (fd == 0 || bk == 0 || (fd & 15) != 0 || (bk & 15) != 0) return false;
    if ((fd >= addr && fd < addr + l.arena_size) || (bk >= addr && bk < addr + l.arena_size))
      return false;
  }
  return empty > 0;
}

}  // namespace

bool arena_at(const pt::Layout& l, uint64_t addr) {
  uint64_t w[pt::kMaxArenaSize / 8];
  std::memcpy(w, reinterpret_cast<const void*>(addr), l.arena_size);
  return looks_like_arena(l, addr, w);
}

}  // namespace detail

namespace {

struct LibcData {
  uint64_t lo = 0, hi = 0;
};

// A dl_iterate_phdr callback: runs under the loader's lock, so it only
// writes the caller's POD (an allocation here would reach malloc's hooks
// with that lock held).
int find_libc_data(dl_phdr_info* info, size_t, void* ctx) {
  const char* name = info->dlpi_name;
  if (name == nullptr || std::strstr(name, "/libc.so.6") == nullptr) return 0;
  auto* out = static_cast<LibcData*>(ctx);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_W) == 0) continue;
    out->lo = info->dlpi_addr + ph.p_vaddr;
    out->hi = out->lo + ph.p_memsz;
  }
  return 1;
}

// A read of this process's memory that fails instead of faulting: the
// parent checks candidates whose pointers it cannot trust yet.
bool safe_read(uint64_t addr, uint64_t* out) {
  iovec local{out, sizeof *out};
  iovec remote{reinterpret_cast<void*>(addr), sizeof *out};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) ==
         static_cast<ssize_t>(sizeof *out);
}

// Beyond the bin signature: 0 when the arena list does not come back to
// the candidate through heap_info-backed arenas; 1 when it does; 2 when, in
// addition, a contiguous sbrk heap ends with top exactly at the current
// break (a foreign sbrk() breaks only that). A copy of the signature
// shifted by one bin pair (possible with large fastbins) fails both.
int plausible_main_arena(const pt::Layout& l, uint64_t a) {
  uint64_t next = 0;
  if (!safe_read(a + l.arena_next, &next)) return 0;
  for (int steps = 0; next != a; ++steps) {
    const uint64_t heap = next - pt::kHeapInfoBytes;
    uint64_t ar = 0;
    if (steps > 4096 || (heap & (pt::kHeapMax - 1)) != 0 || !safe_read(heap, &ar) || ar != next ||
        !safe_read(next + l.arena_next, &next))
      return 0;
  }
  uint64_t system = 0, top = 0, top_hdr = 0, flags = 0;
  if (!safe_read(a + l.arena_system_mem, &system) || !safe_read(a + l.arena_top, &top) ||
      !safe_read(a, &flags))
    return 0;
  if (system == 0 || ((flags >> 32) & pt::kNonContiguousBit) != 0) return 2;
  if (!safe_read(top + 8, &top_hdr)) return 1;
  return top + (top_hdr & ~pt::kFlagBits) == reinterpret_cast<uint64_t>(::sbrk(0)) ? 2 : 1;
}

}  // namespace

uint64_t find_main_arena(const pt::Layout& l) {
  // One glibc per process, so one layout: the cache holds for every call.
  static std::atomic<uint64_t> cached{0};
  uint64_t found = cached.load(std::memory_order_acquire);
  if (found != 0) return found;
  LibcData d;
  ::dl_iterate_phdr(find_libc_data, &d);
  if (d.lo == 0) return 0;
  // Other threads may be changing bins and the break while this reads: a
  // transient mismatch is retried; the child re-validates on its frozen
  // copy anyway. One spot must stand out: the only one whose list closes,
  // or else the only one that also ends at the break.
  for (int attempt = 0; attempt < 5 && found == 0; ++attempt) {
    int count[3] = {0, 0, 0};
    uint64_t match[3] = {0, 0, 0};
    for (uint64_t a = (d.lo + 7) & ~7ull; a + l.arena_size <= d.hi; a += 8) {
      if (!arena_at(l, a)) continue;
      const int score = plausible_main_arena(l, a);
      for (int k = 1; k <= score; ++k) {
        ++count[k];
        match[k] = a;
      }
    }
    if (count[1] == 1)
      found = match[1];
    else if (count[2] == 1)
      found = match[2];
  }
  if (found != 0) cached.store(found, std::memory_order_release);
  return found;
}

}  // namespace mi::heapwalk
