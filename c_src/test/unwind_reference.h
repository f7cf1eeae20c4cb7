// The reference the tracker's unwinder is compared with in test_unwind.cpp:
// libunwind's unw_step loop. Test code only: libunwind takes a global lock
// (and, through dl_iterate_phdr, the dynamic loader's), so the interposer
// never calls it (see track/unwind.h).
#ifndef MALLOCINFO_TEST_UNWIND_REFERENCE_H
#define MALLOCINFO_TEST_UNWIND_REFERENCE_H

#include <cstddef>
#include <cstdint>

namespace unwind_reference {

// Return addresses of the calling thread's stack, innermost first, starting
// with the return address into the function that called it: libunwind's
// unw_step loop under UNW_CACHE_GLOBAL. Thread-safe (libunwind locks);
// may allocate (libunwind's caches) and takes locks: never from a hook.
size_t capture_libunwind(uintptr_t* out, size_t max);

}  // namespace unwind_reference

#endif
