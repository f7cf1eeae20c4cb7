/* A NIF that leaks on purpose, from a function with a known name, so the
 * tracker's answers can be checked exactly. Built by mallocinfo_trace_SUITE. */
#include <erl_nif.h>
#include <stdlib.h>

#define MAX_KEPT (2 * 1024 * 1024)
static void* kept[MAX_KEPT];
static unsigned nkept;

/* The allocation site the tests look for. Exported and not inlined, so it
 * is a real frame with a symbol in .dynsym. */
__attribute__((noinline)) void* mi_test_leak_here(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

static ERL_NIF_TERM leak(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned count, size;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &count) || !enif_get_uint(env, argv[1], &size) ||
      count > MAX_KEPT - nkept)
    return enif_make_badarg(env);
  for (unsigned i = 0; i < count; ++i) kept[nkept++] = mi_test_leak_here(size);
  return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM release(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  for (unsigned i = 0; i < nkept; ++i) free(kept[i]);
  nkept = 0;
  return enif_make_atom(env, "ok");
}

static ErlNifFunc funcs[] = {
    {"leak", 2, leak, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_leaky_nif, funcs, NULL, NULL, NULL, NULL)
