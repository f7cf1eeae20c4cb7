/* A NIF that leaks on purpose from a function with a known name, for
 * mallocinfo_elixir_SUITE: MiElixirApp.Leak.leak(Count, Size) keeps Count
 * blocks of Size bytes, release() frees them. Built by the suite into the
 * application's priv/ before `mix release`, with -I for test/include. */
#include "mi_test_nif.h"

MI_HELD(kept, 1024 * 1024);

/* The allocation site the test looks for. */
MI_SITE(mi_elixir_leak_here)

MI_NIF_FILL(leak, kept, mi_elixir_leak_here)

MI_NIF_RELEASE(release, kept)

/* Dirty: a leak of a million blocks takes longer than a millisecond. */
static ErlNifFunc funcs[] = {
    {"leak", 2, leak, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(Elixir.MiElixirApp.Leak, funcs, NULL, NULL, NULL, NULL)
