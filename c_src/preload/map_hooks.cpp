// The interposed mmap family (issue 14): mmap, mmap64, munmap, mremap.
// Each hook forwards to the next definition and, while the tracker
// records, keeps the region table (track/region_table.h) equal to the
// process's mappings made through these symbols. Nothing here touches the
// malloc hooks' path: a process not recording pays one load, one compare
// and a tail call per mapping call, as malloc does.
//
// Order, as for free: a range is cut out of the table BEFORE the real
// munmap (once unmapped, the kernel may hand the addresses to another
// thread's mmap, whose region a late cut would delete); mremap marks the
// old range's pieces as moving before the real call and relocates or
// restores them after it (track/region_table.h). A new region is recorded
// after the real call returns its address.
//
// New regions are recorded in the modes that keep live entries (full,
// sample); what is recorded is kept true in every mode that reaches these
// hooks: in counters mode too, munmap, mremap and MAP_FIXED edit the
// table, so a switch to counters and back leaves no region that is no
// longer mapped. (In off mode the hooks pass through; a switch to or from
// off forgets every region.)
//
// glibc's own mappings (malloc's large blocks and arena heaps, thread
// stacks, the loader's) call the system directly, not through these
// symbols: they never reach the table and are not counted twice.
//
// The hooks never call mmap themselves (the table is mapped at start-up
// with raw system calls, track/os_mem.h), never allocate through malloc,
// never wait for a lock but the table's spinlock, and leave errno as the
// real call set it. Before start-up is done (no next mmap resolved yet)
// they make the raw system call.
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "../track/region_table.h"
#include "map_runtime.h"
#include "runtime.h"

#define MI_EXPORT extern "C" __attribute__((visibility("default")))

namespace mi::preload {
namespace {

constinit MapNext g_map_next{};
constinit mi::track::RegionTable g_regions;
constinit bool g_regions_ok = false;
// Fixed: a few hundred regions are live on a busy node (carriers of 1-8
// MiB, a NIF's few arenas); 8192 frames-and-all entries reserve 4.3 MiB
// of address space, touched only as regions are recorded.
constexpr size_t kRegionCapacity = 8192;

struct Counters {
  std::atomic<uint64_t> mmap{0}, munmap{0}, mremap{0}, bytes_mapped{0}, bytes_unmapped{0};
  // Mappings made while the thread was quiet (mallocinfo's own work).
  std::atomic<uint64_t> self_mmaps{0}, self_bytes_mapped{0};
};
constinit Counters g_counts;

struct Guard {
  Guard() { t_in_hook = true; }
  ~Guard() { t_in_hook = false; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
};

// Restores the errno the real call left, whatever the bookkeeping did.
struct KeepErrno {
  int saved;
  KeepErrno() : saved(errno) {}
  ~KeepErrno() { errno = saved; }
  void take() { saved = errno; }
};

inline bool pass_through() {
  return g_gate.load(std::memory_order_acquire) == kGatePass;
}

inline bool ready() {
  return g_state.load(std::memory_order_acquire) == kReady;
}

// Counting: start-up done, a tracking mode on (full, counters or sample:
// the gates above kGateInit), and not inside another hook.
inline bool tracking() {
  return !t_in_hook && g_gate.load(std::memory_order_relaxed) >= kGateFull;
}

// Recording regions: counting, and a mode that keeps live entries.
inline bool recording() {
  return g_regions_ok && g_tracker.mode() >= MI_MODE_SAMPLE;
}

// Keeping the recorded regions true: counting, in any mode.
inline bool keeping() {
  return g_regions_ok;
}

size_t page_size() {
  static size_t cached = 0;  // a plain word: racing writers store the same value
  if (cached == 0) cached = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return cached;
}

inline uint64_t page_round(uint64_t n) {
  const uint64_t ps = page_size();
  return (n + ps - 1) & ~(ps - 1);
}

void* raw_mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  const long r = ::syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  return r == -1 ? MAP_FAILED : reinterpret_cast<void*>(r);
}

uint32_t region_flags(int prot, int flags) {
  uint32_t f = 0;
  if ((flags & MAP_ANONYMOUS) != 0) f |= MI_REGION_ANONYMOUS;
  // MAP_SHARED_VALIDATE is MAP_SHARED | MAP_PRIVATE.
  if ((flags & MAP_SHARED) != 0)
    f |= MI_REGION_SHARED;
  else if ((flags & MAP_ANONYMOUS) == 0)
    f |= MI_REGION_PRIVATE_FILE;
  if (prot == PROT_NONE) f |= MI_REGION_NO_ACCESS;
  return f;
}

// After a successful mmap of len bytes at p (counting already checked).
// mallocinfo's own mappings (a quiet thread's) are counted apart and never
// recorded; their munmap finds nothing to cut.
void note_mapped(void* p, size_t len, int prot, int flags) {
  if (quiet()) [[unlikely]] {
    g_counts.self_mmaps.fetch_add(1, std::memory_order_relaxed);
    g_counts.self_bytes_mapped.fetch_add(page_round(len), std::memory_order_relaxed);
    return;
  }
  g_counts.mmap.fetch_add(1, std::memory_order_relaxed);
  g_counts.bytes_mapped.fetch_add(page_round(len), std::memory_order_relaxed);
  if (!recording()) {
    // MAP_FIXED replaced whatever was mapped there.
    if (keeping() && (flags & MAP_FIXED) != 0) {
      const uint64_t start = reinterpret_cast<uintptr_t>(p);
      g_regions.unmap(start, start + page_round(len));
    }
    return;
  }
  mi::track::Region r{};
  r.start = reinterpret_cast<uintptr_t>(p);
  r.length = page_round(len);
  r.flags = region_flags(prot, flags);
  r.timestamp_ns = g_tracker.now_ns();
  r.depth = g_tracker.capture_frames(r.frames, mi::track::kRegionFrames);
  g_regions.add(r);
}

using MmapFn = void* (*)(void*, size_t, int, int, int, off_t);

void* do_mmap(MmapFn next, void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (!ready() || next == nullptr) [[unlikely]]
    return raw_mmap(addr, len, prot, flags, fd, off);
  if (!tracking()) return next(addr, len, prot, flags, fd, off);
  Guard g;
  void* p = next(addr, len, prot, flags, fd, off);
  if (p == MAP_FAILED) {
    g_counts.mmap.fetch_add(1, std::memory_order_relaxed);
    return p;
  }
  KeepErrno keep;
  note_mapped(p, len, prot, flags);
  return p;
}

[[gnu::noinline]] void* slow_mmap(void* addr, size_t len, int prot, int flags, int fd,
                                  off_t off) noexcept {
  return do_mmap(g_map_next.mmap, addr, len, prot, flags, fd, off);
}

[[gnu::noinline]] void* slow_mmap64(void* addr, size_t len, int prot, int flags, int fd,
                                    off_t off) noexcept {
  return do_mmap(g_map_next.mmap64, addr, len, prot, flags, fd, off);
}

[[gnu::noinline]] int slow_munmap(void* addr, size_t len) noexcept {
  if (!ready() || g_map_next.munmap == nullptr) [[unlikely]] {
    const long r = ::syscall(SYS_munmap, addr, len);
    return r == -1 ? -1 : 0;
  }
  if (!tracking()) return g_map_next.munmap(addr, len);
  Guard g;
  const uint64_t start = reinterpret_cast<uintptr_t>(addr);
  // The kernel refuses an unaligned start or a zero length (EINVAL)
  // without unmapping anything: nothing to cut then.
  const bool valid = len != 0 && (start & (page_size() - 1)) == 0;
  const uint64_t end = start + page_round(len);
  // Cut first (see the top); a refused call puts nothing back: only an
  // invalid range is refused, which the check above filters.
  if (valid && keeping()) g_regions.unmap(start, end);
  const int rc = g_map_next.munmap(addr, len);
  KeepErrno keep;
  g_counts.munmap.fetch_add(1, std::memory_order_relaxed);
  if (rc == 0) g_counts.bytes_unmapped.fetch_add(end - start, std::memory_order_relaxed);
  return rc;
}

[[gnu::noinline]] void* slow_mremap(void* old, size_t old_len, size_t new_len, int flags,
                                    void* new_addr) noexcept {
  if (!ready() || g_map_next.mremap == nullptr) [[unlikely]] {
    const long r = ::syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
    return r == -1 ? MAP_FAILED : reinterpret_cast<void*>(r);
  }
  if (!tracking()) return g_map_next.mremap(old, old_len, new_len, flags, new_addr);
  Guard g;
  const bool keep = keeping();
  const uint64_t start = reinterpret_cast<uintptr_t>(old);
  const uint64_t old_end = start + page_round(old_len);
  // old_len 0 duplicates a shared mapping; MREMAP_DONTUNMAP leaves the old
  // range mapped (empty). Either way the old regions stay.
  const bool keep_old = old_len == 0 || (flags & MREMAP_DONTUNMAP) != 0;
  // The old range may hold several recorded regions (the kernel merges
  // adjacent mappings into one): each moves, or stays, as itself.
  const uint32_t ticket = keep && !keep_old ? g_regions.begin_move(start, old_end) : 0;
  void* r = g_map_next.mremap(old, old_len, new_len, flags, new_addr);
  KeepErrno keep_errno;
  g_counts.mremap.fetch_add(1, std::memory_order_relaxed);
  if (!keep) return r;
  if (r == MAP_FAILED) {
    if (ticket != 0) g_regions.cancel_move(ticket);
    return r;
  }
  // Where it landed, whatever was recorded is gone (MREMAP_FIXED); what
  // was recorded in the old range keeps who mapped it and when.
  const uint64_t to = reinterpret_cast<uintptr_t>(r);
  const uint64_t new_length = page_round(new_len);
  if (keep_old)
    g_regions.copy_range(start, old_len == 0 ? start + new_length : old_end, to, new_length);
  else
    g_regions.finish_move(ticket, start, old_end - start, to, new_length);
  return r;
}

}  // namespace

void map_resolve_next() {
  auto resolve = []<class F>(F*& slot, const char* name) {
    slot = reinterpret_cast<F*>(::dlsym(RTLD_NEXT, name));
  };
  resolve(g_map_next.mmap, "mmap");
  resolve(g_map_next.mmap64, "mmap64");
  resolve(g_map_next.munmap, "munmap");
  resolve(g_map_next.mremap, "mremap");
}

bool map_init() {
  if (g_regions_ok) return true;
  g_regions_ok = g_regions.init(kRegionCapacity);
  return g_regions_ok;
}

void map_set_next(const MapNext& next) {
  if (next.mmap != nullptr) g_map_next.mmap = next.mmap;
  if (next.mmap64 != nullptr) g_map_next.mmap64 = next.mmap64;
  if (next.munmap != nullptr) g_map_next.munmap = next.munmap;
  if (next.mremap != nullptr) g_map_next.mremap = next.mremap;
}

void map_forget_all() {
  if (g_regions_ok) g_regions.clear();
}

void map_status(mi_abi_region_status* out) {
  mi_abi_region_status s{};
  constexpr auto rl = std::memory_order_relaxed;
  if (g_regions_ok) {
    s.capacity = g_regions.capacity();
    s.table_bytes = g_regions.bytes_reserved();
    g_regions.totals(&s.regions, &s.bytes);
    s.dropped = g_regions.dropped();
  }
  s.calls_mmap = g_counts.mmap.load(rl);
  s.calls_munmap = g_counts.munmap.load(rl);
  s.calls_mremap = g_counts.mremap.load(rl);
  s.bytes_mapped = g_counts.bytes_mapped.load(rl);
  s.bytes_unmapped = g_counts.bytes_unmapped.load(rl);
  s.self_mmaps = g_counts.self_mmaps.load(rl);
  s.self_bytes_mapped = g_counts.self_bytes_mapped.load(rl);
  *out = s;
}

uint64_t map_copy(mi_abi_region* out, uint64_t max) {
  if (!g_regions_ok) return 0;
  return g_regions.copy(out, static_cast<size_t>(max));
}

}  // namespace mi::preload

using namespace mi::preload;

// Exported fast paths.
MI_EXPORT void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) noexcept {
  if (pass_through() && g_map_next.mmap != nullptr) [[likely]]
    return g_map_next.mmap(addr, len, prot, flags, fd, off);
  return slow_mmap(addr, len, prot, flags, fd, off);
}

MI_EXPORT void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) noexcept {
  if (pass_through() && g_map_next.mmap64 != nullptr) [[likely]]
    return g_map_next.mmap64(addr, len, prot, flags, fd, off);
  return slow_mmap64(addr, len, prot, flags, fd, off);
}

MI_EXPORT int munmap(void* addr, size_t len) noexcept {
  if (pass_through() && g_map_next.munmap != nullptr) [[likely]]
    return g_map_next.munmap(addr, len);
  return slow_munmap(addr, len);
}

MI_EXPORT void* mremap(void* old, size_t old_len, size_t new_len, int flags, ...) noexcept {
  void* new_addr = nullptr;
  if ((flags & MREMAP_FIXED) != 0) {
    va_list ap;
    va_start(ap, flags);
    new_addr = va_arg(ap, void*);
    va_end(ap);
  }
  if (pass_through() && g_map_next.mremap != nullptr) [[likely]]
    return g_map_next.mremap(old, old_len, new_len, flags, new_addr);
  return slow_mremap(old, old_len, new_len, flags, new_addr);
}
