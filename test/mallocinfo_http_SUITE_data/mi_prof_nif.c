/* Allocations with known names and stacks for mallocinfo_http_SUITE:
 *   alloc(Count, Size)        Count blocks from mi_prof_alloc_here, kept;
 *   mark(Depth, Count, Size)  the same, Depth recursive frames of
 *                             mi_prof_mark deeper, so every Depth is a
 *                             stack of its own in a profile;
 *   release()                 frees every kept block. */
#include "mi_test_nif.h"

MI_HELD(kept, 1024 * 1024);

/* The allocation site the profiles must name. */
MI_SITE(mi_prof_alloc_here)

/* The empty asm after the call keeps it from becoming a loop or a tail
 * call: each level is a real frame with the same return address. */
__attribute__((noinline)) int mi_prof_mark(unsigned depth, unsigned count, size_t size) {
  if (depth == 0) return mi_held_fill(&kept, count, size, mi_prof_alloc_here);
  int ok = mi_prof_mark(depth - 1, count, size);
  __asm__ volatile("" : : "g"(ok) : "memory");
  return ok;
}

MI_NIF_FILL(alloc, kept, mi_prof_alloc_here)

static ERL_NIF_TERM mark(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned a[3];
  (void)argc;
  if (!mi_get_uints(env, argv, 3, a) || a[0] > 100 || !mi_prof_mark(a[0], a[1], a[2]))
    return enif_make_badarg(env);
  return enif_make_atom(env, "ok");
}

MI_NIF_RELEASE(release, kept)

static ErlNifFunc funcs[] = {
    {"alloc", 2, alloc, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"mark", 3, mark, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_prof_nif, funcs, NULL, NULL, NULL, NULL)
