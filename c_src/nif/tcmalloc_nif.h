// NIF bodies of mallocinfo_tcmalloc: gperftools statistics and heap
// profiler through the active tcmalloc (found by alloc_nif.h's detect()).
//
// Contracts shared by every function below: thread-safe; may allocate and
// may wait on the dynamic loader's lock (dirty schedulers only, chosen in
// nif.cpp); when the active allocator is not this one, {error,
// {wrong_allocator, glibc | jemalloc | tcmalloc | mimalloc | unknown}};
// allocator errno values come back as {error, PosixName}.
#ifndef MALLOCINFO_NIF_TCMALLOC_NIF_H
#define MALLOCINFO_NIF_TCMALLOC_NIF_H

#include <erl_nif.h>

namespace mi::nif {

// {ok, Text}: MallocExtension_GetStats, whole (the buffer grows until the
// text fits, up to 64 MiB).
ERL_NIF_TERM tcmalloc_stats(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// argv[0]: the file prefix (binary, no NUL) HeapProfilerStart keeps for the
// dumps tcmalloc writes by itself (HEAP_PROFILE_*_INTERVAL). ok | {error,
// already_running | profiler_not_loaded}.
ERL_NIF_TERM tcmalloc_profile_start(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// {ok, Profile}: GetHeapProfile, the returned string freed with tcmalloc's
// own free. {error, not_running | profiler_not_loaded}.
ERL_NIF_TERM tcmalloc_profile_dump(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// ok | {error, not_running | profiler_not_loaded}.
ERL_NIF_TERM tcmalloc_profile_stop(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// true | false | {error, profiler_not_loaded}.
ERL_NIF_TERM tcmalloc_profile_running(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
