// NIF bodies for allocator detection (mallocinfo:allocator/0) and the
// jemalloc and gperftools tcmalloc APIs (modules mallocinfo_jemalloc and
// mallocinfo_tcmalloc).
//
// The NIF links neither allocator. Every call finds, at call time, the
// shared object that serves the process's malloc (looking through
// mallocinfo's own interposer, which forwards to the next one), and takes
// each allocator function from that object's own symbols with dlsym: a
// jemalloc or tcmalloc that was dlopen()ed late, or that a library carries
// privately, is never mistaken for the active allocator, and nothing is
// cached that a later dlopen could make wrong.
//
// Contracts shared by every function below:
//  - thread-safe; may be called concurrently from any number of schedulers;
//  - may allocate (through whatever allocator is active) and may wait on the
//    dynamic loader's lock: call them on dirty schedulers only;
//  - when the active allocator is not the module's, they return
//    {error, {wrong_allocator, glibc | jemalloc | tcmalloc | mimalloc | unknown}};
//  - allocator errno values come back as {error, PosixName}.
// The scheduler for each is chosen in nif.cpp, beside the function table.
#ifndef MALLOCINFO_NIF_ALLOC_NIF_H
#define MALLOCINFO_NIF_ALLOC_NIF_H

#include <erl_nif.h>

namespace mi::nif {

// glibc | jemalloc | tcmalloc | mimalloc | unknown.
ERL_NIF_TERM allocator(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

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
