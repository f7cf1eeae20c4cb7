// The mapping side of the interposer (issue 14): the next mmap family and
// the one region table, owned by map_hooks.cpp. The malloc family's state
// is runtime.h's; the two meet only at start-up, mode changes and attach.
#ifndef MALLOCINFO_PRELOAD_MAP_RUNTIME_H
#define MALLOCINFO_PRELOAD_MAP_RUNTIME_H

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "../common/mi_abi.h"

namespace mi::preload {

// The mmap family after us, as dlsym(RTLD_NEXT) (or attach) found it.
struct MapNext {
  void* (*mmap)(void*, size_t, int, int, int, off_t);
  void* (*mmap64)(void*, size_t, int, int, int, off_t);
  int (*munmap)(void*, size_t);
  void* (*mremap)(void*, size_t, size_t, int, ...);
};

// Start-up (ensure_init, with t_in_hook set): resolves the next mmap
// family with dlsym(RTLD_NEXT). Not for hooks otherwise (dlsym).
void map_resolve_next();
// After the tracker's tables are mapped (start-up or first attach): maps
// the region table. False when it cannot be mapped: mappings are then
// counted, never recorded. Not thread-safe; called once.
bool map_init();
// attach(): the values the patched mmap slots held become the next mmap
// family (entries left null keep what start-up resolved).
void map_set_next(const MapNext& next);
// Forgets every recorded region: the tracker switched to off (munmaps are
// no longer seen) or was attached again. Thread-safe; not for hooks.
void map_forget_all();

// ABI readers (abi.cpp). Thread-safe; not for hooks.
void map_status(mi_abi_region_status* out);
uint64_t map_copy(mi_abi_region* out, uint64_t max);

}  // namespace mi::preload

#endif
