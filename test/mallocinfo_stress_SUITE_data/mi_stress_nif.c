/* Native threads that allocate in a storm, for mallocinfo_stress_SUITE.
 * Built by the suite.
 *
 *  - site threads allocate through chains of random depth made of 16 C
 *    functions (unwind info in .eh_frame) and, on x86_64, of copies of a
 *    trampoline mapped at run time (no unwind info, like BEAM's JIT code):
 *    65536 copies, so nearly every allocation comes from a return address
 *    the tracker has not seen yet and its stack capture takes the cold path;
 *  - phdr threads do the same from inside dl_iterate_phdr callbacks, that
 *    is, while holding the dynamic loader's lock;
 *  - one dlopen thread loads and unloads a small library and allocates from
 *    it (glibc allocates under the loader lock inside dlopen and dlclose).
 * Each thread keeps its last 256 blocks live, so the tracker's table holds
 * many distinct stacks for sites/olds to symbolize.
 *
 * Every thread counts its rounds; progress/0 reads the counters (a normal
 * scheduler: loads only), so the suite's watchdog can tell a stuck thread. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <erl_nif.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_THREADS 40
#define RING 256

struct chain {
  uint64_t rng;
  void* ring[RING];
  unsigned next;
};

struct worker {
  const char* kind;
  pthread_t tid;
  _Atomic uint64_t rounds;
  struct chain chain;
  char target[4096];
};

static struct worker workers[MAX_THREADS];
static int nworkers;
static atomic_bool stopping;

static uint64_t next_rand(struct chain* c) {
  c->rng ^= c->rng << 13;
  c->rng ^= c->rng >> 7;
  c->rng ^= c->rng << 17;
  return c->rng;
}

static void step(struct chain* c, long depth);

/* The leaf: one block replaces the oldest of the ring. */
static __attribute__((noinline)) void leaf_alloc(struct chain* c) {
  void* p = malloc(16 + next_rand(c) % 500);
  __asm__ volatile("" : : "g"(p) : "memory");
  free(c->ring[c->next % RING]);
  c->ring[c->next++ % RING] = p;
}

/* Sixteen distinct C frames; the asm after the call keeps it from being a
 * tail call, so each is a real frame with its own return address. */
#define HOP(i)                                                                  \
  static __attribute__((noinline)) void hop_##i(struct chain* c, long depth) { \
    step(c, depth);                                                             \
    __asm__ volatile("" : : : "memory");                                        \
  }
HOP(0) HOP(1) HOP(2) HOP(3) HOP(4) HOP(5) HOP(6) HOP(7)
HOP(8) HOP(9) HOP(10) HOP(11) HOP(12) HOP(13) HOP(14) HOP(15)
static void (*const hops[16])(struct chain*, long) = {
    hop_0, hop_1, hop_2,  hop_3,  hop_4,  hop_5,  hop_6,  hop_7,
    hop_8, hop_9, hop_10, hop_11, hop_12, hop_13, hop_14, hop_15};

#if defined(__x86_64__)
#define CODE_BYTES (1u << 20)
#define TRAMP_STRIDE 16u
#define TRAMPS (CODE_BYTES / TRAMP_STRIDE)
typedef void (*tramp_fn)(struct chain*, long, void (*)(struct chain*, long));
static const unsigned char* code;

/* push %rbp; mov %rsp,%rbp; call *%rdx; pop %rbp; ret: calls
 * next(chain, depth) from a frame-pointer frame without unwind info. */
static int map_trampolines(void) {
  static const unsigned char tramp[] = {0x55, 0x48, 0x89, 0xe5, 0xff, 0xd2, 0x5d, 0xc3};
  unsigned char* mem =
      mmap(NULL, CODE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 0;
  memset(mem, 0xcc, CODE_BYTES);
  for (unsigned i = 0; i < TRAMPS; ++i) memcpy(mem + i * TRAMP_STRIDE, tramp, sizeof tramp);
  if (mprotect(mem, CODE_BYTES, PROT_READ | PROT_EXEC) != 0) return 0;
  code = mem;
  return 1;
}
#endif

static __attribute__((noinline)) void step(struct chain* c, long depth) {
  if (depth <= 0) {
    leaf_alloc(c);
    return;
  }
  const uint64_t r = next_rand(c);
#if defined(__x86_64__)
  if (code != NULL && (r & 1) != 0) {
    ((tramp_fn)(code + (r >> 8) % TRAMPS * TRAMP_STRIDE))(c, depth - 1, step);
    return;
  }
#endif
  hops[(r >> 4) % 16](c, depth - 1);
  __asm__ volatile("" : : : "memory");
}

static void* site_thread(void* arg) {
  struct worker* w = arg;
  while (!atomic_load_explicit(&stopping, memory_order_relaxed)) {
    step(&w->chain, 1 + (long)(next_rand(&w->chain) % 24));
    atomic_fetch_add_explicit(&w->rounds, 1, memory_order_relaxed);
  }
  return NULL;
}

static int phdr_callback(struct dl_phdr_info* info, size_t size, void* data) {
  struct chain* c = data;
  (void)info;
  (void)size;
  step(c, 1 + (long)(next_rand(c) % 6));
  return 0;
}

static void* phdr_thread(void* arg) {
  struct worker* w = arg;
  while (!atomic_load_explicit(&stopping, memory_order_relaxed)) {
    dl_iterate_phdr(phdr_callback, &w->chain);
    atomic_fetch_add_explicit(&w->rounds, 1, memory_order_relaxed);
  }
  return NULL;
}

static void* dlopen_thread(void* arg) {
  struct worker* w = arg;
  while (!atomic_load_explicit(&stopping, memory_order_relaxed)) {
    void* h = dlopen(w->target, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) break; /* the count stops: the suite sees it */
    void* (*fn)(size_t) = (void* (*)(size_t))dlsym(h, "mi_stress_target_alloc");
    if (fn != NULL) free(fn(64));
    dlclose(h);
    atomic_fetch_add_explicit(&w->rounds, 1, memory_order_relaxed);
  }
  return NULL;
}

static ERL_NIF_TERM counts(ErlNifEnv* env) {
  ERL_NIF_TERM list = enif_make_list(env, 0);
  for (int i = nworkers - 1; i >= 0; --i)
    list = enif_make_list_cell(
        env,
        enif_make_tuple2(env, enif_make_atom(env, workers[i].kind),
                         enif_make_uint64(env, atomic_load(&workers[i].rounds))),
        list);
  return list;
}

static int add_worker(const char* kind, void* (*fn)(void*), const char* target) {
  struct worker* w = &workers[nworkers];
  memset(w, 0, sizeof *w);
  w->kind = kind;
  w->chain.rng = 0x9E3779B97F4A7C15ull * (uint64_t)(nworkers + 1);
  if (target != NULL) strcpy(w->target, target);
  if (pthread_create(&w->tid, NULL, fn, w) != 0) return 0;
  ++nworkers;
  return 1;
}

static ERL_NIF_TERM start(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned sites, phdr;
  ErlNifBinary path;
  char target[4096];
  (void)argc;
  if (!enif_get_uint(env, argv[0], &sites) || !enif_get_uint(env, argv[1], &phdr) ||
      sites + phdr + 1 > MAX_THREADS || !enif_inspect_iolist_as_binary(env, argv[2], &path) ||
      path.size >= sizeof target)
    return enif_make_badarg(env);
  if (nworkers != 0)
    return enif_make_tuple2(env, enif_make_atom(env, "error"),
                            enif_make_atom(env, "already_started"));
  memcpy(target, path.data, path.size);
  target[path.size] = '\0';
#if defined(__x86_64__)
  if (code == NULL && !map_trampolines())
    return enif_make_tuple2(env, enif_make_atom(env, "error"), enif_make_atom(env, "mmap"));
#endif
  atomic_store(&stopping, 0);
  int ok = 1;
  for (unsigned i = 0; ok && i < sites; ++i) ok = add_worker("site", site_thread, NULL);
  for (unsigned i = 0; ok && i < phdr; ++i) ok = add_worker("phdr", phdr_thread, NULL);
  if (ok) ok = add_worker("dlopen", dlopen_thread, target);
  if (!ok) return enif_make_tuple2(env, enif_make_atom(env, "error"), enif_make_atom(env, "thread"));
  return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM progress(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  return counts(env);
}

static ERL_NIF_TERM stop(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  atomic_store(&stopping, 1);
  for (int i = 0; i < nworkers; ++i) pthread_join(workers[i].tid, NULL);
  const ERL_NIF_TERM result = counts(env);
  for (int i = 0; i < nworkers; ++i)
    for (unsigned k = 0; k < RING; ++k) free(workers[i].chain.ring[k]);
  nworkers = 0;
  return result;
}

/* progress/0 reads atomics only; start and stop create and join threads
 * (stop waits for every thread's current round): dirty. */
static ErlNifFunc funcs[] = {
    {"start", 3, start, ERL_NIF_DIRTY_JOB_IO_BOUND},
    {"progress", 0, progress, 0},
    {"stop", 0, stop, ERL_NIF_DIRTY_JOB_IO_BOUND},
};

ERL_NIF_INIT(mi_stress_nif, funcs, NULL, NULL, NULL, NULL)
