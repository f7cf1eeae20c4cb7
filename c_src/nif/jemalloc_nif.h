// NIF bodies of mallocinfo_jemalloc: statistics and the heap profiler
// through the active jemalloc's mallctl (found by alloc_nif.h's detect()).
//
// Contracts shared by every function below: thread-safe; may allocate and
// may wait on the dynamic loader's lock (dirty schedulers only, chosen in
// nif.cpp); when the active allocator is not this one, {error,
// {wrong_allocator, glibc | jemalloc | tcmalloc | mimalloc | unknown}};
// allocator errno values come back as {error, PosixName}.
#ifndef MALLOCINFO_NIF_JEMALLOC_NIF_H
#define MALLOCINFO_NIF_JEMALLOC_NIF_H

#include <erl_nif.h>

namespace mi::nif {

// {ok, Json}: malloc_stats_print(..., "J").
ERL_NIF_TERM jemalloc_stats(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// {ok, #{allocated, active, resident, mapped, retained, metadata}} read after
// advancing "epoch"; {error, stats_disabled} for a jemalloc built without
// statistics.
ERL_NIF_TERM jemalloc_summary(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// #{prof, active, thread_active_init, lg_sample}; {error,
// profiling_unsupported} for a jemalloc built without --enable-prof.
ERL_NIF_TERM jemalloc_profile_status(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// argv[0]: true | false (anything else: badarg). ok; {error,
// profiling_disabled} when the process started without MALLOC_CONF prof:true.
ERL_NIF_TERM jemalloc_profile_active(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// argv[0]: the directory (binary, no NUL) under which a private mkdtemp
// directory is made for the dump. {ok, Profile}; the directory and the file
// are gone when it returns, whatever the outcome. {error, profiling_disabled}
// as above; {error, efault} when jemalloc could not write the dump.
ERL_NIF_TERM jemalloc_profile_dump(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
