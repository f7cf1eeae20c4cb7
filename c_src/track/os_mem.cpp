#include "os_mem.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace mi::track {

// Raw system calls, not mmap(3): the interposer exports mmap and munmap
// itself (preload/map_hooks.cpp), and its own tables are neither the
// process's mappings to record nor worth a trip through a hook.
void* os_map(size_t bytes) {
  const long p = ::syscall(SYS_mmap, nullptr, bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == -1) return nullptr;  // the wrapper sets errno
  // The tables are sparse by design (a slot here, a chunk there): with
  // transparent huge pages on `always', one write would make 2 MiB of a
  // table resident. Best effort: a kernel without THP refuses it.
  ::syscall(SYS_madvise, p, bytes, MADV_NOHUGEPAGE);
  return reinterpret_cast<void*>(p);
}

void os_unmap(void* p, size_t bytes) {
  if (p != nullptr) ::syscall(SYS_munmap, p, bytes);
}

void os_release(void* p, size_t bytes) {
  if (p != nullptr && bytes != 0) ::madvise(p, bytes, MADV_DONTNEED);
}

size_t os_page_size() {
  // Cached in an atomic, not a function-local static: no guard lock
  // inside a hook.
  static std::atomic<size_t> cached{0};
  size_t page = cached.load(std::memory_order_relaxed);
  if (page == 0) {
    page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    cached.store(page, std::memory_order_relaxed);
  }
  return page;
}

size_t os_release_within(const void* begin, const void* end) {
  // The kernel's page, not 4 KiB: on a kernel of 16 or 64 KiB pages,
  // madvise() rounds the length up to whole pages, so a range cut at 4 KiB
  // would zero the records beside it.
  const uintptr_t page = os_page_size();
  const uintptr_t a = (reinterpret_cast<uintptr_t>(begin) + page - 1) & ~(page - 1);
  const uintptr_t b = reinterpret_cast<uintptr_t>(end) & ~(page - 1);
  if (b <= a) return 0;
  os_release(reinterpret_cast<void*>(a), b - a);
  return b - a;
}

size_t os_resident(const void* p, size_t bytes) {
  if (p == nullptr) return 0;
  const size_t page = os_page_size();
  unsigned char vec[4096];  // one byte per page: 16 MiB of mapping a call
  size_t resident = 0;
  const char* at = static_cast<const char*>(p);
  size_t left = (bytes + page - 1) / page;
  while (left > 0) {
    const size_t n = left < sizeof vec ? left : sizeof vec;
    if (::mincore(const_cast<char*>(at), n * page, vec) != 0) return resident;
    for (size_t i = 0; i < n; ++i) resident += (vec[i] & 1) != 0 ? page : 0;
    at += n * page;
    left -= n;
  }
  return resident;
}

PageCounter PageCounter::pagemap() {
  PageCounter pc;
  // Raw system calls, like the mappings above: nothing here goes through
  // another library's interposed wrappers.
  const long fd = ::syscall(SYS_openat, AT_FDCWD, "/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  pc.fd_ = fd < 0 ? -1 : static_cast<int>(fd);
  return pc;
}

PageCounter::~PageCounter() {
  if (fd_ >= 0) ::syscall(SYS_close, fd_);
}

size_t PageCounter::count(const void* p, size_t bytes) const {
  if (p == nullptr) return 0;
  if (fd_ < 0) return os_resident(p, bytes);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  uint64_t entries[512];  // one word per page: 2 MiB of mapping a read
  size_t at = reinterpret_cast<uintptr_t>(p) / page;
  size_t left = (bytes + page - 1) / page;
  size_t resident = 0;
  while (left > 0) {
    const size_t n = left < 512 ? left : 512;
    const long got = ::syscall(SYS_pread64, fd_, entries, n * sizeof(uint64_t),
                               static_cast<off_t>(at * sizeof(uint64_t)));
    const size_t k = got > 0 ? static_cast<size_t>(got) / sizeof(uint64_t) : 0;
    if (k == 0) {
      // pagemap stopped answering: mincore's count for the rest.
      return resident + os_resident(reinterpret_cast<const void*>(at * page), left * page);
    }
    constexpr uint64_t kPresent = uint64_t{1} << 63, kExclusive = uint64_t{1} << 56;
    for (size_t i = 0; i < k; ++i)
      resident += (entries[i] & (kPresent | kExclusive)) == (kPresent | kExclusive) ? page : 0;
    at += k;
    left -= k;
  }
  return resident;
}

}  // namespace mi::track
