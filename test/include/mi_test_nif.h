/* What the Common Test suites' helper NIFs have in common: blocks held
 * until released, allocation sites with names the tests look for, the
 * many-stacks recursion, and the NIF bodies that leak and release.
 *
 * C, header only (every function static inline), for the NIFs under
 * test/ *_SUITE_data/; mi_ct:build_nif/2,3,4 passes -I for this directory
 * (the Elixir suite passes it to the NIF it builds inside its Mix project).
 *
 * Why macros define the sites rather than one shared function: the tests
 * assert the exact symbol at the top of a stack, so every NIF needs its own
 * non-inlined, exported function with its own name. */
#ifndef MI_TEST_NIF_H
#define MI_TEST_NIF_H

#include <erl_nif.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

/* An allocation site: returns a block of n bytes from malloc (NULL when
 * malloc fails). Must be safe on any thread. */
typedef void* (*mi_site_fn)(size_t n);

/* MI_SITE(name) defines `void* name(size_t n)`: malloc(n) from a frame of
 * its own. noinline, and default visibility (exported even where a build
 * hides the rest), make it a real frame with a symbol in .dynsym; the
 * empty asm after the call keeps the call a call (no tail call into
 * malloc). Thread-safe; allocates n bytes. */
#define MI_SITE(name)                                                     \
  __attribute__((noinline, visibility("default"))) void* name(size_t n) { \
    void* p = malloc(n);                                                  \
    __asm__ volatile("" : : "g"(p) : "memory");                           \
    return p;                                                             \
  }

/* MI_PATH_PAIR(a, b) defines `void* a(unsigned level, unsigned path,
 * size_t n)` and its twin `b`: they call each other (or themselves)
 * `level` times, taking the call that bit k of `path` selects at level k,
 * then malloc(n). So every path below 2^level reaches malloc through its
 * own sequence of return addresses: one distinct call stack per path
 * value. Thread-safe; allocates n bytes; recursion depth is `level`. */
#define MI_PATH_PAIR(a, b) \
  MI_PATH_DECL_(b);        \
  MI_PATH_DECL_(a) {       \
    MI_PATH_STEP_(a, b);   \
  }                        \
  MI_PATH_DECL_(b) {       \
    MI_PATH_STEP_(a, b);   \
  }

#define MI_PATH_DECL_(f) \
  __attribute__((noinline, visibility("default"))) void* f(unsigned level, unsigned path, size_t n)

/* One level of the pair: the same body in both, each a function of its
 * own (the symbols differ, so the call sites do). */
#define MI_PATH_STEP_(a, b)                   \
  void* p;                                    \
  if (level == 0)                             \
    p = malloc(n);                            \
  else if (path & 1)                          \
    p = a(level - 1, path >> 1, n);           \
  else                                        \
    p = b(level - 1, path >> 1, n);           \
  __asm__ volatile("" : : "g"(p) : "memory"); \
  return p

/* Blocks a NIF keeps until release: a fixed array (no allocation of its
 * own, so the tracker sees only the test's blocks) and a lock, for NIFs
 * that fill it from several threads. */
struct mi_held {
  pthread_mutex_t lock;
  unsigned n;   /* blocks[0 .. n-1] are held */
  unsigned cap; /* the array's length */
  void** blocks;
};

/* MI_HELD(name, capacity) defines a static, empty `struct mi_held name`
 * over a static array of `capacity` pointers. */
#define MI_HELD(name, capacity)         \
  static void* name##_blocks[capacity]; \
  static struct mi_held name = {PTHREAD_MUTEX_INITIALIZER, 0, (capacity), name##_blocks}

/* 1 when `count` more blocks fit. Caller holds h->lock, or no other thread
 * touches h. No allocation. */
static inline int mi_held_room(const struct mi_held* h, unsigned long long count) {
  return count <= (unsigned long long)(h->cap - h->n);
}

/* Holds `count` blocks of `size` bytes, each from site(size), under
 * h->lock. Returns 0, holding nothing new, when they would not fit.
 * Thread-safe against the other mi_held_ calls on h. */
static inline int mi_held_fill(struct mi_held* h, unsigned count, size_t size, mi_site_fn site) {
  pthread_mutex_lock(&h->lock);
  const int ok = mi_held_room(h, count);
  for (unsigned i = 0; ok && i < count; ++i) h->blocks[h->n++] = site(size);
  pthread_mutex_unlock(&h->lock);
  return ok;
}

/* Frees every block held, under h->lock; h is empty after. Thread-safe
 * against the other mi_held_ calls on h. */
static inline void mi_held_free_all(struct mi_held* h) {
  pthread_mutex_lock(&h->lock);
  for (unsigned i = 0; i < h->n; ++i) free(h->blocks[i]);
  h->n = 0;
  pthread_mutex_unlock(&h->lock);
}

/* Decodes argv[0 .. n-1] as unsigned ints into out[0 .. n-1]. Returns 0
 * when one is not. No allocation. */
static inline int mi_get_uints(ErlNifEnv* env, const ERL_NIF_TERM argv[], unsigned n,
                               unsigned out[]) {
  for (unsigned i = 0; i < n; ++i)
    if (!enif_get_uint(env, argv[i], &out[i])) return 0;
  return 1;
}

/* The body of a NIF leak(Count, Size) (argv[0], argv[1]): mi_held_fill of
 * h from `site`; `ok`, or badarg when an argument is not an unsigned int
 * or the blocks would not fit. */
static inline ERL_NIF_TERM mi_nif_fill(ErlNifEnv* env, const ERL_NIF_TERM argv[], struct mi_held* h,
                                       mi_site_fn site) {
  unsigned a[2];
  if (!mi_get_uints(env, argv, 2, a) || !mi_held_fill(h, a[0], a[1], site))
    return enif_make_badarg(env);
  return enif_make_atom(env, "ok");
}

/* The body of a NIF release(): frees what h holds; `ok`. */
static inline ERL_NIF_TERM mi_nif_release(ErlNifEnv* env, struct mi_held* h) {
  mi_held_free_all(h);
  return enif_make_atom(env, "ok");
}

/* MI_NIF_FILL(fn, h, site) defines the NIF function `fn` of a
 * leak(Count, Size): mi_nif_fill of the struct mi_held `h` from `site`.
 * MI_NIF_RELEASE(fn, h) defines the NIF function `fn` of a release():
 * mi_nif_release of `h`. Both static, for the NIF's function table. */
#define MI_NIF_FILL(fn, h, site)                                                 \
  static ERL_NIF_TERM fn(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) { \
    (void)argc;                                                                  \
    return mi_nif_fill(env, argv, &(h), site);                                   \
  }

#define MI_NIF_RELEASE(fn, h)                                                    \
  static ERL_NIF_TERM fn(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) { \
    (void)argc;                                                                  \
    (void)argv;                                                                  \
    return mi_nif_release(env, &(h));                                            \
  }

#endif
