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

static ErlNifFunc funcs[] = {
    {"leak", 2, leak, 0},
    {"leak_dirty", 2, leak_dirty, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_ctx_nif, funcs, NULL, NULL, NULL, NULL)
