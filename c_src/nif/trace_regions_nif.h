// NIF body for the tracker's mapped regions (mallocinfo_trace:mappings/1,2).
// Thread-safe; allocates (std::bad_alloc: {error, enomem} through
// guarded<>); reads /proc/self/smaps and symbolizes: dirty I/O (nif/nif.cpp).
#ifndef MALLOCINFO_NIF_TRACE_REGIONS_NIF_H
#define MALLOCINFO_NIF_TRACE_REGIONS_NIF_H

#include <erl_nif.h>

namespace mi::nif {

// regions(Demangle): {ok, [#{start, length, flags, resident, age_ms, stack}]}
// every live region the interposer recorded from the mmap family, resident
// bytes from smaps and mincore(2) (glibc/resident.h); {error, enotsup} from
// an interposer without the region block; {error, not_preloaded |
// not_recording} without a recording one.
ERL_NIF_TERM trace_regions(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
