#include "os_mem.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace mi::track {

// Raw system calls, not mmap(3): the interposer exports mmap and munmap
// itself (preload/map_hooks.cpp), and its own tables are neither the
// process's mappings to record nor worth a trip through a hook.
void* os_map(size_t bytes) {
  const long p = ::syscall(SYS_mmap, nullptr, bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == -1 ? nullptr : reinterpret_cast<void*>(p);  // the wrapper sets errno
}

void os_unmap(void* p, size_t bytes) {
  if (p != nullptr) ::syscall(SYS_munmap, p, bytes);
}

void os_release(void* p, size_t bytes) {
  if (p != nullptr && bytes != 0) ::madvise(p, bytes, MADV_DONTNEED);
}

size_t os_resident(const void* p, size_t bytes) {
  if (p == nullptr) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
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

}  // namespace mi::track
