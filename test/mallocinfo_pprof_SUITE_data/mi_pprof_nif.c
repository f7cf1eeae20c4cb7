/* Allocations with known names for mallocinfo_pprof_SUITE:
 *   leak(Count, Size)    Count blocks from mi_pprof_leak_here, kept;
 *   window(Count, Size)  the same from mi_pprof_window_here (the delta
 *                        profile test allocates with it inside the window);
 *   spread(N, Size)      N blocks, each from its own call stack (N <= 2^16):
 *                        mi_pprof_fork_a/b call each other by the bits of
 *                        the block's number, 16 levels deep;
 *   release()            frees every kept block. */
#include <erl_nif.h>
#include <pthread.h>
#include <stdlib.h>

#define MAX_KEPT (1024 * 1024)
#define LEVELS 16
static void* kept[MAX_KEPT];
static unsigned nkept;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Exported and not inlined: real frames with symbols in .dynsym. The
 * empty asm keeps each call a call (no tail call, no merging). */
__attribute__((noinline)) void* mi_pprof_leak_here(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

__attribute__((noinline)) void* mi_pprof_window_here(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

__attribute__((noinline)) void* mi_pprof_fork_b(unsigned level, unsigned path, size_t n);

__attribute__((noinline)) void* mi_pprof_fork_a(unsigned level, unsigned path, size_t n) {
  void* p;
  if (level == 0)
    p = malloc(n);
  else if (path & 1)
    p = mi_pprof_fork_a(level - 1, path >> 1, n);
  else
    p = mi_pprof_fork_b(level - 1, path >> 1, n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

__attribute__((noinline)) void* mi_pprof_fork_b(unsigned level, unsigned path, size_t n) {
  void* p;
  if (level == 0)
    p = malloc(n);
  else if (path & 1)
    p = mi_pprof_fork_a(level - 1, path >> 1, n);
  else
    p = mi_pprof_fork_b(level - 1, path >> 1, n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

enum which { LEAK, WINDOW, SPREAD };

static ERL_NIF_TERM keep(ErlNifEnv* env, const ERL_NIF_TERM argv[], enum which w) {
  unsigned count, size;
  if (!enif_get_uint(env, argv[0], &count) || !enif_get_uint(env, argv[1], &size) ||
      (w == SPREAD && count > (1u << LEVELS)))
    return enif_make_badarg(env);
  pthread_mutex_lock(&lock);
  int ok = count <= MAX_KEPT - nkept;
  for (unsigned i = 0; ok && i < count; ++i)
    kept[nkept++] = w == LEAK     ? mi_pprof_leak_here(size)
                    : w == WINDOW ? mi_pprof_window_here(size)
                                  : mi_pprof_fork_a(LEVELS, i, size);
  pthread_mutex_unlock(&lock);
  return ok ? enif_make_atom(env, "ok") : enif_make_badarg(env);
}

static ERL_NIF_TERM leak(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  return keep(env, argv, LEAK);
}

static ERL_NIF_TERM window(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  return keep(env, argv, WINDOW);
}

static ERL_NIF_TERM spread(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  return keep(env, argv, SPREAD);
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
    {"leak", 2, leak, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"window", 2, window, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"spread", 2, spread, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_pprof_nif, funcs, NULL, NULL, NULL, NULL)
