/* A NIF that leaks from one native function, called from Erlang code the
 * tests name: mallocinfo_context_SUITE checks that each block carries the
 * process and the Erlang functions that drove it. leak/2 runs on a normal
 * scheduler (a few hundred blocks: well under a millisecond), leak_dirty/2
 * on a dirty CPU scheduler. */
#include "mi_test_nif.h"

MI_HELD(kept, 64 * 1024);

/* The allocation site the tests look for. */
MI_SITE(mi_ctx_leak_here)

MI_NIF_FILL(leak, kept, mi_ctx_leak_here)
MI_NIF_FILL(leak_dirty, kept, mi_ctx_leak_here)
MI_NIF_RELEASE(release, kept)

/* leak_thread(Count, Size): the same leak from a thread of the NIF's own,
 * named "mictx_pool_7" (a pool's thread, numbered as pools number them);
 * joined before it returns. */
struct job {
  unsigned count, size;
  int ok;
};

static void* pool_thread(void* arg) {
  struct job* j = arg;
  j->ok = mi_held_fill(&kept, j->count, j->size, mi_ctx_leak_here);
  return NULL;
}

static ERL_NIF_TERM leak_thread(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned a[2];
  ErlNifTid tid;
  (void)argc;
  if (!mi_get_uints(env, argv, 2, a)) return enif_make_badarg(env);
  struct job j = {a[0], a[1], 0};
  if (enif_thread_create("mictx_pool_7", &tid, pool_thread, &j, NULL) != 0)
    return enif_make_atom(env, "thread_failed");
  enif_thread_join(tid, NULL);
  return j.ok ? enif_make_atom(env, "ok") : enif_make_badarg(env);
}

static ErlNifFunc funcs[] = {
    {"leak", 2, leak, 0},
    {"leak_dirty", 2, leak_dirty, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"leak_thread", 2, leak_thread, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_ctx_nif, funcs, NULL, NULL, NULL, NULL)
