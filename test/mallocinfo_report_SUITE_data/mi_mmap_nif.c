/* A NIF that maps memory directly with mmap, behind every allocator's back,
 * and touches it, so the report must count it as unaccounted. Built by
 * mallocinfo_report_SUITE (the negative control of the accounting). */
#include <erl_nif.h>
#include <string.h>
#include <sys/mman.h>

static void* mapped;
static size_t mapped_bytes;

/* The named function that maps: with the tracker, mappings/1 and the
 * report name it (mallocinfo_report_SUITE:mapped_by_nif_is_attributed). */
__attribute__((noinline, visibility("default"))) void* mi_map_private_region(size_t bytes) {
  void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  __asm__ volatile("" ::: "memory"); /* keeps the call from becoming a tail call */
  return p;
}

/* map(Bytes) -> {ok, Address} | {error, already_mapped | enomem} */
static ERL_NIF_TERM map(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  ErlNifUInt64 bytes;
  (void)argc;
  if (!enif_get_uint64(env, argv[0], &bytes) || bytes == 0 || bytes > (1ull << 34))
    return enif_make_badarg(env);
  if (mapped != NULL)
    return enif_make_tuple2(env, enif_make_atom(env, "error"), enif_make_atom(env, "already_mapped"));
  void* p = mi_map_private_region(bytes);
  if (p == MAP_FAILED)
    return enif_make_tuple2(env, enif_make_atom(env, "error"), enif_make_atom(env, "enomem"));
  memset(p, 0x5a, bytes); /* resident, every page */
  mapped = p;
  mapped_bytes = bytes;
  return enif_make_tuple2(env, enif_make_atom(env, "ok"), enif_make_uint64(env, (ErlNifUInt64)p));
}

static ERL_NIF_TERM unmap(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  if (mapped != NULL) munmap(mapped, mapped_bytes);
  mapped = NULL;
  return enif_make_atom(env, "ok");
}

/* An address-space reservation (PROT_NONE, nothing committed), as
 * sanitizers, wasm engines and GC heaps make: mappings/1 must not take
 * longer for it however large it is (issue 28). */
static void* reserved;
static size_t reserved_bytes;

__attribute__((noinline, visibility("default"))) void* mi_reserve_region(size_t bytes) {
  void* p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  __asm__ volatile("" ::: "memory");
  return p;
}

/* reserve(Bytes) -> {ok, Address} | {error, already_mapped | enomem} */
static ERL_NIF_TERM reserve(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  ErlNifUInt64 bytes;
  (void)argc;
  if (!enif_get_uint64(env, argv[0], &bytes) || bytes == 0 || bytes > (1ull << 46))
    return enif_make_badarg(env);
  if (reserved != NULL)
    return enif_make_tuple2(env, enif_make_atom(env, "error"), enif_make_atom(env, "already_mapped"));
  void* p = mi_reserve_region(bytes);
  if (p == MAP_FAILED)
    return enif_make_tuple2(env, enif_make_atom(env, "error"), enif_make_atom(env, "enomem"));
  reserved = p;
  reserved_bytes = bytes;
  return enif_make_tuple2(env, enif_make_atom(env, "ok"), enif_make_uint64(env, (ErlNifUInt64)p));
}

static ERL_NIF_TERM unreserve(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  (void)argc;
  (void)argv;
  if (reserved != NULL) munmap(reserved, reserved_bytes);
  reserved = NULL;
  return enif_make_atom(env, "ok");
}

static ErlNifFunc funcs[] = {
    {"map", 1, map, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"unmap", 0, unmap, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"reserve", 1, reserve, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"unreserve", 0, unreserve, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(mi_mmap_nif, funcs, NULL, NULL, NULL, NULL)
