// Memory for the tracker, straight from the kernel. Never from malloc: the
// tracker runs inside malloc.
#ifndef MALLOCINFO_TRACK_OS_MEM_H
#define MALLOCINFO_TRACK_OS_MEM_H

#include <cstddef>

namespace mi::track {

// `bytes` rounded up to whole 4 KiB pages: tables that place one array
// after another (or give their pages back by range) start each on a page.
constexpr size_t os_page_up(size_t bytes) {
  return (bytes + 4095) & ~size_t{4095};
}

// Zero-filled, page-aligned, lazily backed (MAP_NORESERVE): untouched pages
// cost no resident memory. nullptr on failure. Thread-safe.
void* os_map(size_t bytes);
void os_unmap(void* p, size_t bytes);
// Gives the pages of [p, p + bytes) back to the kernel (MADV_DONTNEED):
// they read as zero afterwards and cost no resident memory until written.
// p page-aligned. No other thread may write there meanwhile (a write racing
// the call may be lost). Thread-safe otherwise.
void os_release(void* p, size_t bytes);
// Resident bytes of the page-aligned mapping [p, p + bytes) (mincore).
// Never allocates. Thread-safe.
size_t os_resident(const void* p, size_t bytes);

}  // namespace mi::track

#endif
