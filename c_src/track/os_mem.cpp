#include "os_mem.h"

#include <sys/mman.h>
#include <unistd.h>

namespace mi::track {

void* os_map(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void os_unmap(void* p, size_t bytes) {
  if (p != nullptr) ::munmap(p, bytes);
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
