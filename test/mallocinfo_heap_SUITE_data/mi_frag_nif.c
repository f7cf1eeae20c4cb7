/* Test NIF for the heap map: fragments the glibc heap on purpose, from a
 * named function and from several threads (so several arenas hold
 * fragments), and churns allocations in background threads. */
#include <stdint.h>
#include <string.h>

#include "mi_test_nif.h"

MI_HELD(kept, 1 << 22);

/* The call site the heap map must name. */
__attribute__((noinline)) void* mi_frag_alloc(size_t size) {
  void* p = malloc(size);
  if (p != NULL) memset(p, 0xab, size);
  __asm__ volatile("" ::: "memory");
  return p;
}

struct job {
  size_t n, size, keep_every;
};

/* Allocates n blocks and frees all but every keep_every-th and the last:
 * the freed holes sit between live blocks (the last one keeps them from
 * merging into top), so only whole free pages inside them can be trimmed. */
static void* fragment_job(void* arg) {
  const struct job* j = arg;
  void** mine = malloc(j->n * sizeof(void*));
  if (mine == NULL) return NULL;
  for (size_t i = 0; i < j->n; ++i) mine[i] = mi_frag_alloc(j->size);
  pthread_mutex_lock(&kept.lock);
  for (size_t i = 0; i < j->n; ++i) {
    if ((i % j->keep_every == 0 || i + 1 == j->n) && mi_held_room(&kept, 1))
      kept.blocks[kept.n++] = mine[i];
    else
      free(mine[i]);
  }
  pthread_mutex_unlock(&kept.lock);
  free(mine);
  return NULL;
}

static ERL_NIF_TERM fragment(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned threads;
  unsigned long n, size, keep;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &threads) || threads < 1 || threads > 64 ||
      !enif_get_ulong(env, argv[1], &n) || !enif_get_ulong(env, argv[2], &size) ||
      !enif_get_ulong(env, argv[3], &keep) || keep < 1)
    return enif_make_badarg(env);
  struct job j = {n, size, keep};
  pthread_t t[64];
  for (unsigned i = 0; i < threads; ++i) pthread_create(&t[i], NULL, fragment_job, &j);
  for (unsigned i = 0; i < threads; ++i) pthread_join(t[i], NULL);
  return enif_make_atom(env, "ok");
}

MI_NIF_RELEASE(release, kept)

/* Background churn: threads that allocate and free without pause. */
static volatile int churning;
static pthread_t churners[16];
static unsigned n_churners;

static void* churn_job(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void* v[2048] = {0};
  while (__atomic_load_n(&churning, __ATOMIC_RELAXED)) {
    seed = seed * 1103515245u + 12345u;
    const size_t i = (seed >> 8) % 2048;
    free(v[i]);
    v[i] = malloc(16 + (seed >> 16) % 4000);
  }
  for (size_t i = 0; i < 2048; ++i) free(v[i]);
  return NULL;
}

static ERL_NIF_TERM churn_start(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned n;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &n) || n < 1 || n > 16 || n_churners != 0)
    return enif_make_badarg(env);
  churning = 1;
  for (unsigned i = 0; i < n; ++i)
    pthread_create(&churners[i], NULL, churn_job, (void*)(uintptr_t)(i + 1));
  n_churners = n;
  return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM churn_stop(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  __atomic_store_n(&churning, 0, __ATOMIC_RELAXED);
  for (unsigned i = 0; i < n_churners; ++i) pthread_join(churners[i], NULL);
  n_churners = 0;
  return enif_make_atom(env, "ok");
}

static ErlNifFunc funcs[] = {
    {"fragment", 4, fragment, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"churn_start", 1, churn_start, 0},
    {"churn_stop", 0, churn_stop, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_frag_nif, funcs, NULL, NULL, NULL, NULL)
