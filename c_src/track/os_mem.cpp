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

}  // namespace mi::track
