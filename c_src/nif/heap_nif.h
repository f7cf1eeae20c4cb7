// NIF body for the heap map (module mallocinfo_heap): a chunk-level dump of
// every glibc arena, walked in a forked child (see heapwalk/heapwalk.h).
#ifndef MALLOCINFO_NIF_HEAP_NIF_H
#define MALLOCINFO_NIF_HEAP_NIF_H

#include <erl_nif.h>

namespace mi::nif {

// heap_dump(Path :: binary(), MaxSites :: integer(), TimeoutMs :: integer(),
//           WantXml :: boolean()) -> {ok, Map} | {error, Reason}.
// Path <<>> walks and summarises without writing a file. Blocks for the
// whole walk: dirty scheduler only.
ERL_NIF_TERM heap_dump(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
