// The symbolizer's NIFs: symbolize/2 for raw addresses and the
// process-wide symbolizer's counters. Contracts in symbolize_nif.h.
#include "symbolize_nif.h"

#include <vector>

#include "atoms.h"
#include "stack_terms.h"
#include "term.h"

namespace mi::nif {

// symbolizer_stats(): the process-wide symbolizer's counters, so tests can
// check how much work a query did (not how long it took).
ERL_NIF_TERM trace_symbolizer_stats(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const mi::symbolize::SymbolizerStats s = symbolizer().stats();
  return MapBuilder()
      .put(atoms.lookups, make_u64(env, s.lookups))
      .put(atoms.cache_hits, make_u64(env, s.cache_hits))
      .put(atoms.objects_loaded, make_u64(env, s.objects_loaded))
      .put(atoms.rescans, make_u64(env, s.rescans))
      .put(atoms.maps_reads, make_u64(env, s.maps_reads))
      .put(atoms.cached_addresses, make_u64(env, s.cached_addresses))
      .build(env);
}

// symbolize([Address], Demangle) -> [Frame]: for callers holding raw
// addresses (tests, reports).
ERL_NIF_TERM trace_symbolize(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const std::vector<uint64_t> addresses = get_u64_list(env, argv[0]);
  const bool demangle = enif_is_identical(argv[1], atoms.true_);
  // One batch: one read of /proc/self/maps at most, however many misses.
  std::vector<ERL_NIF_TERM> out;
  out.reserve(addresses.size());
  for (const auto& f : symbolizer().resolve_all(addresses, demangle, false))
    out.push_back(frame_term(env, f));
  return enif_make_list_from_array(env, out.data(), static_cast<unsigned>(out.size()));
}

}  // namespace mi::nif
