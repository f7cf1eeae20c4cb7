/* A NIF that leaks on purpose from a function with a known name, for
 * mallocinfo_elixir_SUITE: MiElixirApp.Leak.leak(Count, Size) keeps Count
 * blocks of Size bytes, release() frees them. Built by the suite into the
 * application's priv/ before `mix release`. */
#include <erl_nif.h>
#include <stdlib.h>

#define MAX_KEPT (1024 * 1024)
static void* kept[MAX_KEPT];
static unsigned nkept;

/* The allocation site the test looks for: exported and not inlined, so it
 * is a frame of its own with a symbol in .dynsym. */
__attribute__((noinline)) void* mi_elixir_leak_here(size_t n) {
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
  for (unsigned i = 0; i < count; ++i) kept[nkept++] = mi_elixir_leak_here(size);
  return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM release(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  for (unsigned i = 0; i < nkept; ++i) free(kept[i]);
  nkept = 0;
  return enif_make_atom(env, "ok");
}

/* Dirty: a leak of a million blocks takes longer than a millisecond. */
static ErlNifFunc funcs[] = {
    {"leak", 2, leak, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(Elixir.MiElixirApp.Leak, funcs, NULL, NULL, NULL, NULL)
