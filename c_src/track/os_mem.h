// Memory for the tracker, straight from the kernel. Never from malloc: the
// tracker runs inside malloc.
#ifndef MALLOCINFO_TRACK_OS_MEM_H
#define MALLOCINFO_TRACK_OS_MEM_H

#include <cstddef>

namespace mi::track {

// Zero-filled, page-aligned, lazily backed (MAP_NORESERVE): untouched pages
// cost no resident memory. nullptr on failure. Thread-safe.
void* os_map(size_t bytes);
void os_unmap(void* p, size_t bytes);

}  // namespace mi::track

#endif
