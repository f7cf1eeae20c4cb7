/* A NIF that leaks on purpose from a function with a known name, and churns
 * malloc/free on threads of its own. Built twice by mallocinfo_attach_SUITE
 * (MI_MODULE, MI_LEAK_FN): one copy loaded before attach(), one after. */
#include <stdatomic.h>

#include "mi_test_nif.h"

MI_HELD(kept, 1024 * 1024);

/* The allocation site the tests look for. */
MI_SITE(MI_LEAK_FN)

MI_NIF_FILL(leak, kept, MI_LEAK_FN)

MI_NIF_RELEASE(release, kept)

/* Churn: threads allocating and freeing (malloc, calloc, realloc, free)
 * until stopped; each counts its operations. */
#define MAX_THREADS 16
static pthread_t threads[MAX_THREADS];
static unsigned nthreads;
static atomic_int stop;
static atomic_ulong ops;

static void* churn(void* arg) {
  (void)arg;
  void* ring[64] = {0};
  unsigned long i = 0;
  while (!atomic_load(&stop)) {
    const unsigned k = (unsigned)(i % 64);
    free(ring[k]);
    switch (i % 3) {
      case 0:
        ring[k] = malloc(16 + i % 512);
        break;
      case 1:
        ring[k] = calloc(4, 8 + i % 64);
        break;
      default:
        ring[k] = realloc(malloc(32), 64 + i % 256);
        break;
    }
    ++i;
  }
  for (unsigned k = 0; k < 64; ++k) free(ring[k]);
  atomic_fetch_add(&ops, i);
  return NULL;
}

static ERL_NIF_TERM churn_start(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned n;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &n) || n > MAX_THREADS || nthreads != 0)
    return enif_make_badarg(env);
  atomic_store(&stop, 0);
  atomic_store(&ops, 0);
  for (unsigned i = 0; i < n; ++i)
    if (pthread_create(&threads[nthreads], NULL, churn, NULL) == 0) ++nthreads;
  return enif_make_uint(env, nthreads);
}

static ERL_NIF_TERM churn_stop(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  atomic_store(&stop, 1);
  for (unsigned i = 0; i < nthreads; ++i) pthread_join(threads[i], NULL);
  nthreads = 0;
  return enif_make_uint64(env, atomic_load(&ops));
}

static ErlNifFunc funcs[] = {
    {"leak", 2, leak, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"churn_start", 1, churn_start, 0},
    {"churn_stop", 0, churn_stop, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

/* ERL_NIF_INIT stringifies its first argument: expand MI_MODULE first. */
#define MI_NIF_INIT(m) ERL_NIF_INIT(m, funcs, NULL, NULL, NULL, NULL)
MI_NIF_INIT(MI_MODULE)
