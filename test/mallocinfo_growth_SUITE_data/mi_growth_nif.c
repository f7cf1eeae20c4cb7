/* A NIF for mallocinfo_growth_SUITE: a leak, a cache that fills and
 * drains, one culprit reached through two call paths, and a strdup, each
 * from a function with a known name, so growth, diffs and roll-ups can be
 * checked exactly. */
#include <string.h>

#include "mi_test_nif.h"

MI_HELD(kept, 1024 * 1024);
MI_HELD(cache, 1024 * 1024);

MI_SITE(mi_growth_leak_here)
MI_SITE(mi_growth_cache_here)

/* noinline and an empty asm after each call: real frames with symbols,
 * no tail calls, no merged call sites. */
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

/* leak(Count, Size), via(Which, Count, Size), dup(Count, Size): kept until
 * release/0; cache_fill(Count, Size) adds blocks to the cache,
 * cache_drain() frees them all. */
MI_NIF_FILL(leak, kept, mi_growth_leak_here)

static ERL_NIF_TERM via(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned which;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &which)) return enif_make_badarg(env);
  return mi_nif_fill(env, argv + 1, &kept, which == 0 ? mi_growth_via_a : mi_growth_via_b);
}

static ERL_NIF_TERM dup_n(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned size;
  (void)argc;
  /* The string and its terminator fit mi_growth_dup_here's buffer. */
  if (!enif_get_uint(env, argv[1], &size) || size == 0 || size > 256)
    return enif_make_badarg(env);
  return mi_nif_fill(env, argv, &kept, mi_growth_dup_here);
}

MI_NIF_FILL(cache_fill, cache, mi_growth_cache_here)

MI_NIF_RELEASE(cache_drain, cache)

static ERL_NIF_TERM release(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  mi_held_free_all(&kept);
  return mi_nif_release(env, &cache);
}

static ErlNifFunc funcs[] = {{"leak", 2, leak, 0},          {"via", 3, via, 0},
                             {"dup", 2, dup_n, 0},            {"cache_fill", 2, cache_fill, 0},
                             {"cache_drain", 0, cache_drain, 0}, {"release", 0, release, 0}};

ERL_NIF_INIT(mi_growth_nif, funcs, NULL, NULL, NULL, NULL)
