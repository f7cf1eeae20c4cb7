/* Allocations with known names and stacks for mallocinfo_http_SUITE:
 *   alloc(Count, Size)        Count blocks from mi_prof_alloc_here, kept;
 *   mark(Depth, Count, Size)  the same, Depth recursive frames of
 *                             mi_prof_mark deeper, so every Depth is a
 *                             stack of its own in a profile;
 *   release()                 frees every kept block. */
#include <erl_nif.h>
#include <pthread.h>
#include <stdlib.h>

#define MAX_KEPT (1024 * 1024)
static void* kept[MAX_KEPT];
static unsigned nkept;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* The allocation site the profiles must name: exported, not inlined. */
__attribute__((noinline)) void* mi_prof_alloc_here(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

static int keep(unsigned count, size_t size) {
  pthread_mutex_lock(&lock);
  int ok = count <= MAX_KEPT - nkept;
  for (unsigned i = 0; ok && i < count; ++i) kept[nkept++] = mi_prof_alloc_here(size);
  pthread_mutex_unlock(&lock);
  return ok;
}

/* The empty asm after the call keeps it from becoming a loop or a tail
 * call: each level is a real frame with the same return address. */
__attribute__((noinline)) int mi_prof_mark(unsigned depth, unsigned count, size_t size) {
  if (depth == 0) return keep(count, size);
  int ok = mi_prof_mark(depth - 1, count, size);
  __asm__ volatile("" : : "g"(ok) : "memory");
  return ok;
}

static ERL_NIF_TERM alloc(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned count, size;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &count) || !enif_get_uint(env, argv[1], &size) ||
      !keep(count, size))
    return enif_make_badarg(env);
  return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM mark(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned depth, count, size;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &depth) || depth > 100 ||
      !enif_get_uint(env, argv[1], &count) || !enif_get_uint(env, argv[2], &size) ||
      !mi_prof_mark(depth, count, size))
    return enif_make_badarg(env);
  return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM release(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  pthread_mutex_lock(&lock);
  for (unsigned i = 0; i < nkept; ++i) free(kept[i]);
  nkept = 0;
  pthread_mutex_unlock(&lock);
  return enif_make_atom(env, "ok");
}

static ErlNifFunc funcs[] = {
    {"alloc", 2, alloc, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"mark", 3, mark, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_prof_nif, funcs, NULL, NULL, NULL, NULL)
