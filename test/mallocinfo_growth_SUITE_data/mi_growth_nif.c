/* A NIF for mallocinfo_growth_SUITE: a leak, a cache that fills and
 * drains, one culprit reached through two call paths, and a strdup, each
 * from a function with a known name, so growth, diffs and roll-ups can be
 * checked exactly. */
#include <erl_nif.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEPT (1024 * 1024)
static void* kept[MAX_KEPT];
static unsigned nkept;
static void* cache[MAX_KEPT];
static unsigned ncache;

/* noinline and an empty asm after each call: real frames with symbols,
 * no tail calls, no merged call sites. */
__attribute__((noinline)) void* mi_growth_leak_here(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

__attribute__((noinline)) void* mi_growth_cache_here(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

__attribute__((noinline)) void* mi_growth_culprit(size_t n) {
  void* p = calloc(1, n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

__attribute__((noinline)) void* mi_growth_via_a(size_t n) {
  void* p = mi_growth_culprit(n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

__attribute__((noinline)) void* mi_growth_via_b(size_t n) {
  void* p = mi_growth_culprit(n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

/* strdup of a string of n-1 characters: n bytes, allocated inside libc. */
__attribute__((noinline)) void* mi_growth_dup_here(size_t n) {
  char buf[256];
  memset(buf, 'x', n - 1);
  buf[n - 1] = '\0';
  void* p = strdup(buf);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

static int two_uints(ErlNifEnv* env, const ERL_NIF_TERM argv[], unsigned* count, unsigned* size) {
  return enif_get_uint(env, argv[0], count) && enif_get_uint(env, argv[1], size) && *size > 0 &&
         *count <= MAX_KEPT - nkept;
}

/* leak(Count, Size), via(Which, Count, Size), dup(Count, Size): kept until release/0. */
static ERL_NIF_TERM leak(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned count, size;
  (void)argc;
  if (!two_uints(env, argv, &count, &size)) return enif_make_badarg(env);
  for (unsigned i = 0; i < count; ++i) kept[nkept++] = mi_growth_leak_here(size);
  return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM via(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned which, count, size;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &which) || !two_uints(env, argv + 1, &count, &size))
    return enif_make_badarg(env);
  for (unsigned i = 0; i < count; ++i)
    kept[nkept++] = which == 0 ? mi_growth_via_a(size) : mi_growth_via_b(size);
  return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM dup_n(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned count, size;
  (void)argc;
  if (!two_uints(env, argv, &count, &size) || size > 256) return enif_make_badarg(env);
  for (unsigned i = 0; i < count; ++i) kept[nkept++] = mi_growth_dup_here(size);
  return enif_make_atom(env, "ok");
}

/* cache_fill(Count, Size) adds blocks to the cache; cache_drain() frees them all. */
static ERL_NIF_TERM cache_fill(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned count, size;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &count) || !enif_get_uint(env, argv[1], &size) ||
      count > MAX_KEPT - ncache)
    return enif_make_badarg(env);
  for (unsigned i = 0; i < count; ++i) cache[ncache++] = mi_growth_cache_here(size);
  return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM cache_drain(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  while (ncache > 0) free(cache[--ncache]);
  return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM release(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  while (nkept > 0) free(kept[--nkept]);
  while (ncache > 0) free(cache[--ncache]);
  return enif_make_atom(env, "ok");
}

static ErlNifFunc funcs[] = {{"leak", 2, leak, 0},          {"via", 3, via, 0},
                             {"dup", 2, dup_n, 0},            {"cache_fill", 2, cache_fill, 0},
                             {"cache_drain", 0, cache_drain, 0}, {"release", 0, release, 0}};

ERL_NIF_INIT(mi_growth_nif, funcs, NULL, NULL, NULL, NULL)
