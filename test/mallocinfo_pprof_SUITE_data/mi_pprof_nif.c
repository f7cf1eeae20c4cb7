/* Allocations with known names for mallocinfo_pprof_SUITE:
 *   leak(Count, Size)    Count blocks from mi_pprof_leak_here, kept;
 *   window(Count, Size)  the same from mi_pprof_window_here (the delta
 *                        profile test allocates with it inside the window);
 *   spread(N, Size)      N blocks, each from its own call stack (N <= 2^16):
 *                        mi_pprof_fork_a/b call each other by the bits of
 *                        the block's number, 16 levels deep;
 *   churn(Total, Size)   Total bytes in blocks of Size from mi_pprof_churn_here,
 *                        each freed before the next is allocated (one live
 *                        at a time);
 *   release()            frees every kept block. */
#include "mi_test_nif.h"

#define LEVELS 16
MI_HELD(kept, 1024 * 1024);

MI_SITE(mi_pprof_leak_here)
MI_SITE(mi_pprof_window_here)
MI_SITE(mi_pprof_churn_here)
MI_PATH_PAIR(mi_pprof_fork_a, mi_pprof_fork_b)

MI_NIF_FILL(leak, kept, mi_pprof_leak_here)

MI_NIF_FILL(window, kept, mi_pprof_window_here)

static ERL_NIF_TERM spread(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned a[2];
  (void)argc;
  if (!mi_get_uints(env, argv, 2, a) || a[0] > (1u << LEVELS)) return enif_make_badarg(env);
  pthread_mutex_lock(&kept.lock);
  const int ok = mi_held_room(&kept, a[0]);
  for (unsigned i = 0; ok && i < a[0]; ++i)
    kept.blocks[kept.n++] = mi_pprof_fork_a(LEVELS, i, a[1]);
  pthread_mutex_unlock(&kept.lock);
  return ok ? enif_make_atom(env, "ok") : enif_make_badarg(env);
}

static ERL_NIF_TERM churn(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  ErlNifUInt64 total, size;
  (void)argc;
  if (!enif_get_uint64(env, argv[0], &total) || !enif_get_uint64(env, argv[1], &size) ||
      size == 0 || total % size != 0)
    return enif_make_badarg(env);
  for (ErlNifUInt64 done = 0; done < total; done += size) {
    void* p = mi_pprof_churn_here(size);
    if (p == NULL) return enif_make_badarg(env);
    free(p);
  }
  return enif_make_atom(env, "ok");
}

MI_NIF_RELEASE(release, kept)

static ErlNifFunc funcs[] = {
    {"leak", 2, leak, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"window", 2, window, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"spread", 2, spread, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"churn", 2, churn, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_pprof_nif, funcs, NULL, NULL, NULL, NULL)
