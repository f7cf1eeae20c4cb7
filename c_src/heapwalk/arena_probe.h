// Finding glibc's arenas in memory without debug symbols, for the heap
// walker. The child (child.cpp) reads its frozen copy of the parent with
// rd*() and arena_at(): every address it reads was validated first, and a
// wrong guess faults into the child's handler. The parent's search
// (find_main_arena() below) reads the live process and checks what
// it cannot trust with process_vm_readv instead. Nothing here allocates.
#ifndef MALLOCINFO_HEAPWALK_ARENA_PROBE_H
#define MALLOCINFO_HEAPWALK_ARENA_PROBE_H

#include <cstdint>
#include <cstring>

#include "ptmalloc.h"

namespace mi::heapwalk::detail {

// Unchecked reads of this process's memory at `addr`.
inline uint64_t rd(uint64_t addr) {
  uint64_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
  return v;
}
inline uint32_t rd32(uint64_t addr) {
  uint32_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
  return v;
}
inline uint16_t rd16(uint64_t addr) {
  uint16_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
  return v;
}

// Whether `addr` holds something with the malloc_state signature of layout
// `l` (every bin pair empty or two 16-aligned chunk pointers outside the
// structure, top set). May fault if `addr` is not readable for
// l.arena_size bytes.
bool arena_at(const pt::Layout& l, uint64_t addr);

}  // namespace mi::heapwalk::detail

namespace mi::heapwalk {

// Where main_arena lives, found from this process without debug symbols:
// the 8-byte-aligned spot of libc's writable data whose 127 bin pairs (at
// layout `l`'s offsets: pt::layout_for(this glibc)) are each either empty
// (pointing at themselves) or a pair of chunk pointers. 0 when not found.
// Cached after the first success. Thread-safe. For the parent
// (heapwalk.cpp), before it forks.
uint64_t find_main_arena(const pt::Layout& l);

}  // namespace mi::heapwalk

#endif
