/* A NIF that leaks on purpose, from a function with a known name, so the
 * tracker's answers can be checked exactly. Built by mallocinfo_trace_SUITE. */
#include <sys/mman.h>

#include "mi_test_nif.h"

MI_HELD(kept, 2 * 1024 * 1024);

/* The allocation site the tests look for. */
MI_SITE(mi_test_leak_here)

/* Many distinct call stacks from two functions (see MI_PATH_PAIR). */
#define PATH_LEVELS 20
MI_PATH_PAIR(mi_test_path_a, mi_test_path_b)

MI_NIF_FILL(leak, kept, mi_test_leak_here)

/* paths(First, Count, PerPath, Size): PerPath blocks of Size bytes from each
 * of the Count distinct stacks First .. First+Count-1 (below 2^20). With
 * PerPath = 0 each path allocates one block and frees it at once: a stream
 * of distinct stacks none of which stays referenced. */
static ERL_NIF_TERM paths(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned a[4];
  (void)argc;
  if (!mi_get_uints(env, argv, 4, a)) return enif_make_badarg(env);
  const unsigned first = a[0], count = a[1], per = a[2], size = a[3];
  if (count > (1u << PATH_LEVELS) || first > (1u << PATH_LEVELS) - count ||
      !mi_held_room(&kept, (unsigned long long)count * per))
    return enif_make_badarg(env);
  for (unsigned i = 0; i < count; ++i) {
    if (per == 0) {
      free(mi_test_path_a(PATH_LEVELS, first + i, size));
      continue;
    }
    for (unsigned k = 0; k < per; ++k)
      kept.blocks[kept.n++] = mi_test_path_a(PATH_LEVELS, first + i, size);
  }
  return enif_make_atom(env, "ok");
}

/* paths_jit(First, Count, PerPath, Size): as paths/4, but on a normal
 * scheduler, so each stack runs into the JIT's frames above the NIF (at
 * most 1000 blocks: well under a millisecond). */
static ERL_NIF_TERM paths_jit(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned count, per;
  if (!enif_get_uint(env, argv[1], &count) || !enif_get_uint(env, argv[2], &per) ||
      (unsigned long long)count * per > 1000)
    return enif_make_badarg(env);
  return paths(env, argc, argv);
}

/* race_paths(Threads, Count, PerPath, Size): Threads threads released
 * together each allocate PerPath blocks from each of paths 0 .. Count-1, in
 * the same order, so they meet on every new stack at once. */
struct race {
  pthread_mutex_t lock;
  pthread_cond_t go;
  int started;
  unsigned count, per, size;
  unsigned base;
};

static void* race_thread(void* arg) {
  struct race* r = arg;
  pthread_mutex_lock(&r->lock);
  unsigned base = r->base;
  r->base += r->count * r->per;
  r->started++;
  pthread_cond_broadcast(&r->go);
  while (r->started >= 0) pthread_cond_wait(&r->go, &r->lock);
  pthread_mutex_unlock(&r->lock);
  for (unsigned i = 0; i < r->count; ++i)
    for (unsigned k = 0; k < r->per; ++k)
      kept.blocks[base++] = mi_test_path_a(PATH_LEVELS, i, r->size);
  return NULL;
}

static ERL_NIF_TERM race_paths(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned a[4];
  pthread_t tids[16];
  struct race r = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0};
  (void)argc;
  if (!mi_get_uints(env, argv, 4, a)) return enif_make_badarg(env);
  const unsigned threads = a[0], count = a[1], per = a[2], size = a[3];
  if (threads == 0 || threads > 16 || count > (1u << PATH_LEVELS) ||
      !mi_held_room(&kept, (unsigned long long)threads * count * per))
    return enif_make_badarg(env);
  r.count = count;
  r.per = per;
  r.size = size;
  r.base = kept.n;
  for (unsigned t = 0; t < threads; ++t) pthread_create(&tids[t], NULL, race_thread, &r);
  pthread_mutex_lock(&r.lock);
  while (r.started < (int)threads) pthread_cond_wait(&r.go, &r.lock);
  r.started = -1;
  pthread_cond_broadcast(&r.go);
  pthread_mutex_unlock(&r.lock);
  for (unsigned t = 0; t < threads; ++t) pthread_join(tids[t], NULL);
  kept.n = r.base;
  return enif_make_atom(env, "ok");
}

/* regions(N): maps N one-page regions that cannot merge (alternating
 * protections), as a big node's many thread stacks and carriers make
 * /proc/self/maps long. Never unmapped (c_src/bench/sites.sh). */
static ERL_NIF_TERM regions(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned n;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &n) || n > 1000000) return enif_make_badarg(env);
  for (unsigned i = 0; i < n; ++i) {
    const int prot = (i & 1) ? PROT_READ : PROT_READ | PROT_WRITE;
    if (mmap(NULL, 4096, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
      return enif_make_badarg(env);
  }
  return enif_make_atom(env, "ok");
}

MI_NIF_RELEASE(release, kept)

static ErlNifFunc funcs[] = {
    {"leak", 2, leak, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"paths", 4, paths, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"paths_jit", 4, paths_jit, 0},
    {"race_paths", 4, race_paths, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"regions", 1, regions, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_leaky_nif, funcs, NULL, NULL, NULL, NULL)
