// Test-only probes of the dynamic loader, for checks that code never waits
// for the loader lock, and never allocates while holding it. The Catch2
// binary interposes dl_iterate_phdr (to count walks and mark its callbacks)
// and the malloc family (to count allocations made inside those callbacks).
// Sanitizer builds interpose both themselves, so there the probes are off:
// available() is false and every count stays 0.
//
// Thread-safe: counts are per thread (initial-exec TLS), since the thread
// started. Never allocates.
#ifndef MALLOCINFO_TEST_LOADER_PROBE_H
#define MALLOCINFO_TEST_LOADER_PROBE_H

#include <cstdint>

namespace loader_probe {

struct Counts {
  uint64_t walks;                     // dl_iterate_phdr calls
  uint64_t callbacks;                 // callback invocations inside them
  uint64_t allocations_in_callbacks;  // malloc-family calls inside callbacks
};

bool available();
Counts thread_counts();

}  // namespace loader_probe

#endif
