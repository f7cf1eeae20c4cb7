/* A NIF whose allocating functions have names that are not text (issue
 * 28): GNU __asm__ labels give a symbol any bytes. One is the issue's
 * invalid UTF-8, one carries terminal escapes (colour, window title, BEL,
 * clear screen), and one maps memory directly, so its name reaches the
 * report's mapped sites too. mallocinfo_report_SUITE:odd_names loads the
 * library from a path that is not text either. */
#include <erl_nif.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define ODD __attribute__((noinline, visibility("default")))

ODD void* bad_utf8_alloc(size_t n) __asm__("bad\377\376utf8");
ODD void* ansi_alloc(size_t n) __asm__("\"ansi\033[31mRED\033]0;pwned-title\007\033[2Jend\"");
ODD void* odd_map(size_t n) __asm__("\"map\033[5m\233blink\"");

void* bad_utf8_alloc(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" ::: "memory"); /* not a tail call: this frame stays */
  return p;
}

void* ansi_alloc(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" ::: "memory");
  return p;
}

void* odd_map(size_t n) {
  void* p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  __asm__ volatile("" ::: "memory");
  return p;
}

/* Called through pointers: gas takes a quoted label as a definition, not
 * in "call label@PLT". */
static void* (*volatile const alloc_bad)(size_t) = bad_utf8_alloc;
static void* (*volatile const alloc_ansi)(size_t) = ansi_alloc;
static void* (*volatile const map_odd)(size_t) = odd_map;

#define MAX_BLOCKS 4096
static void* held[MAX_BLOCKS];
static int nheld;

/* hold(Blocks, Bytes): Blocks blocks of Bytes from each of the two
 * allocating functions, touched, kept until the node ends; then one
 * mapping of Blocks * Bytes from odd_map. */
static ERL_NIF_TERM hold(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  unsigned blocks;
  unsigned long bytes;
  (void)argc;
  if (!enif_get_uint(env, argv[0], &blocks) || !enif_get_ulong(env, argv[1], &bytes) ||
      nheld + 2 * (int)blocks > MAX_BLOCKS || bytes == 0 || bytes > (64ul << 20))
    return enif_make_badarg(env);
  for (unsigned i = 0; i < blocks; ++i) {
    void* a = alloc_bad(bytes);
    void* b = alloc_ansi(bytes);
    if (a == NULL || b == NULL) return enif_make_atom(env, "enomem");
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    held[nheld++] = a;
    held[nheld++] = b;
  }
  void* m = map_odd((size_t)blocks * bytes);
  if (m == MAP_FAILED) return enif_make_atom(env, "enomem");
  memset(m, 3, (size_t)blocks * bytes);
  return enif_make_atom(env, "ok");
}

static ErlNifFunc funcs[] = {
    {"hold", 2, hold, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_names_nif, funcs, NULL, NULL, NULL, NULL)
