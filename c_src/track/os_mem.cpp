#include "os_mem.h"

#include <sys/mman.h>

namespace mi::track {

void* os_map(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void os_unmap(void* p, size_t bytes) {
  if (p != nullptr) ::munmap(p, bytes);
}

}  // namespace mi::track
