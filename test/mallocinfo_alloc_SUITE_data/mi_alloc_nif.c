/* Allocations from a function with a known name, so that allocator
 * profiles (jemalloc, tcmalloc) and the tracker can be checked for it; and a
 * late dlopen(RTLD_GLOBAL), to check allocator detection after one. Built
 * by mallocinfo_alloc_SUITE. */
#include <dlfcn.h>
#include <erl_nif.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HELD (1024 * 1024)
static void* held[MAX_HELD];
static unsigned nheld;
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;

/* The allocation site the tests look for. Exported and not inlined, so it
 * is a real frame with a symbol in .dynsym. The memory is touched so that
 * it is resident, as a real cache's would be. */
__attribute__((noinline)) void* mi_alloc_test_site(size_t n) {
  void* p = malloc(n);
  if (p != NULL) memset(p, 0x5a, n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

/* hold(Count, Size): keeps Count blocks of Size bytes until release/0. */
static ERL_NIF_TERM hold(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned count, size, i;
  ERL_NIF_TERM result = enif_make_atom(env, "ok");
  (void)argc;
  if (!enif_get_uint(env, argv[0], &count) || !enif_get_uint(env, argv[1], &size))
    return enif_make_badarg(env);
  pthread_mutex_lock(&held_lock);
  if (count > MAX_HELD - nheld)
    result = enif_make_badarg(env);
  else
    for (i = 0; i < count; ++i) held[nheld++] = mi_alloc_test_site(size);
  pthread_mutex_unlock(&held_lock);
  return result;
}

static ERL_NIF_TERM release(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned i;
  (void)argc;
  (void)argv;
  pthread_mutex_lock(&held_lock);
  for (i = 0; i < nheld; ++i) free(held[i]);
  nheld = 0;
  pthread_mutex_unlock(&held_lock);
  return enif_make_atom(env, "ok");
}

/* alloc(Size) -> Address; free(Address): one block, for concurrent callers. */
static ERL_NIF_TERM alloc(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned size;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &size)) return enif_make_badarg(env);
  return enif_make_uint64(env, (uintptr_t)mi_alloc_test_site(size));
}

static ERL_NIF_TERM free_block(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  ErlNifUInt64 addr;
  (void)argc;
  if (!enif_get_uint64(env, argv[0], &addr)) return enif_make_badarg(env);
  free((void*)(uintptr_t)addr);
  return enif_make_atom(env, "ok");
}

/* dlopen_global(Path): loads a shared object into the global scope, late. */
static ERL_NIF_TERM dlopen_global(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  char path[4096];
  (void)argc;
  if (enif_get_string(env, argv[0], path, sizeof path, ERL_NIF_LATIN1) <= 0)
    return enif_make_badarg(env);
  return dlopen(path, RTLD_NOW | RTLD_GLOBAL) != NULL ? enif_make_atom(env, "ok")
                                                      : enif_make_atom(env, "error");
}

static ErlNifFunc funcs[] = {
    {"hold", 2, hold, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"alloc", 1, alloc, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"free", 1, free_block, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"dlopen_global", 1, dlopen_global, ERL_NIF_DIRTY_JOB_IO_BOUND},
};

ERL_NIF_INIT(mi_alloc_nif, funcs, NULL, NULL, NULL, NULL)
