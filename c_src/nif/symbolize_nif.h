// NIF bodies for the process-wide symbolizer (stack_terms.h), which needs
// no interposer. Thread-safe; they allocate (std::bad_alloc: {error,
// enomem} through guarded<>); both may wait on the symbolizer's lock or
// read ELF files: dirty I/O (nif/nif.cpp).
#ifndef MALLOCINFO_NIF_SYMBOLIZE_NIF_H
#define MALLOCINFO_NIF_SYMBOLIZE_NIF_H

#include <erl_nif.h>

namespace mi::nif {

// symbolize([Address], Demangle) -> [#{address, object, symbol, offset}],
// one per address, in order; a non-list or a non-integer address: badarg.
ERL_NIF_TERM trace_symbolize(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// #{lookups, cache_hits, objects_loaded, rescans, maps_reads, cached_addresses}
ERL_NIF_TERM trace_symbolizer_stats(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
