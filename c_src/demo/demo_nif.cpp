// The demo workload behind `make run` and mallocinfo_report_SUITE
// (module mallocinfo_demo_nif, _build/demo/mallocinfo_demo_nif.so, built
// by `make demo`, never shipped): the three
// classic native problems, reproduced on purpose so the report has
// something real to find.
//
//   cache_insert  a leak from one named call site (demo_cache_insert);
//   fragment      several threads, so several glibc arenas, each filling
//                 its arena with small blocks and freeing most of them in
//                 an interleaved pattern: the free memory stays pinned
//                 between the survivors;
//   enif_keep     blocks from enif_alloc, which land in ERTS carriers and
//                 are tagged with this module as their origin.
//
// Its own link unit: the demo's state belongs to this shared object alone
// and nothing of it is linked into mallocinfo_nif.so. Every NIF here is
// noexcept and uses nothing that throws (pthreads, fixed arrays, malloc):
// failures come back as {error, enomem | eagain}, never as an abort of the
// node. Built with -fno-exceptions to keep it that way.
#include <erl_nif.h>
#include <sys/mman.h>

#include <pthread.h>

#include <cstdint>
#include <cstdlib>

namespace {

// A kept block starts with the pointer to the next one: the lists cost no
// allocation of their own, so every byte the tracker sees at the demo's
// call sites is a byte the demo means to hold.
struct Node {
  Node* next;
};

struct List {
  Node* head = nullptr;
  uint64_t blocks = 0;
  uint64_t bytes = 0;

  void push(void* p, size_t size) {
    auto* n = static_cast<Node*>(p);
    n->next = head;
    head = n;
    ++blocks;
    bytes += size;
  }
};

pthread_mutex_t lists_mutex = PTHREAD_MUTEX_INITIALIZER;
List cache;      // demo_cache_insert: never freed until release/0
List fragments;  // the survivors of fragment/4
List enif;       // enif_alloc blocks

// The atoms the demo returns, made once at load (and again, idempotently,
// at upgrade); read-only afterwards.
struct {
  ERL_NIF_TERM ok, error, enomem, eagain;
} atoms;

void make_atoms(ErlNifEnv* env) {
  atoms.ok = enif_make_atom(env, "ok");
  atoms.error = enif_make_atom(env, "error");
  atoms.enomem = enif_make_atom(env, "enomem");
  atoms.eagain = enif_make_atom(env, "eagain");
}

ERL_NIF_TERM error_tuple(ErlNifEnv* env, ERL_NIF_TERM reason) {
  return enif_make_tuple2(env, atoms.error, reason);
}

bool get_size(ErlNifEnv* env, ERL_NIF_TERM t, uint64_t min, uint64_t max, uint64_t* out) {
  ErlNifUInt64 v;
  if (!enif_get_uint64(env, t, &v) || v < min || v > max) return false;
  *out = v;
  return true;
}

}  // namespace

// The call sites the report must name. extern "C", exported and never
// inlined, so each is a real frame with a plain symbol in .dynsym.
extern "C" __attribute__((noinline, visibility("default"))) void* demo_cache_insert(size_t size) {
  void* p = std::malloc(size);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

extern "C" __attribute__((noinline, visibility("default"))) void* demo_scratch_alloc(size_t size) {
  void* p = std::malloc(size);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}

namespace {

constexpr uint64_t kMaxBlocks = 16ull << 20;
constexpr uint64_t kMaxSize = 1ull << 20;

// Count blocks of Size bytes from `alloc`, kept on `list`: {error, enomem}
// at the first that fails (those made so far stay on the list).
ERL_NIF_TERM keep_blocks(ErlNifEnv* env, const ERL_NIF_TERM argv[], void* (*alloc)(size_t),
                         List& list) {
  uint64_t count, size;
  if (!get_size(env, argv[0], 0, kMaxBlocks, &count) ||
      !get_size(env, argv[1], sizeof(Node), kMaxSize, &size))
    return enif_make_badarg(env);
  bool ok = true;
  pthread_mutex_lock(&lists_mutex);
  for (uint64_t i = 0; ok && i < count; ++i) {
    void* p = alloc(size);
    if (p == nullptr)
      ok = false;
    else
      list.push(p, size);
  }
  pthread_mutex_unlock(&lists_mutex);
  return ok ? atoms.ok : error_tuple(env, atoms.enomem);
}

// cache_insert(Count, Size) -> ok | {error, enomem}
ERL_NIF_TERM cache_insert(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) noexcept {
  return keep_blocks(env, argv, demo_cache_insert, cache);
}

constexpr uint64_t kMaxThreads = 64;

struct ThreadJob {
  // Inputs.
  uint64_t blocks = 0, size = 0, keep_every = 1;
  // Outputs.
  List kept;
  uint64_t freed_bytes = 0;
  bool failed = false;
};

// The start gate: threads wait on it so that they all allocate at the same
// time. A plain flag and condition variable rather than a barrier, so a
// thread that failed to start cannot leave the others waiting.
pthread_mutex_t gate_mutex = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
bool gate_open = false;

// One fragmenting thread: `blocks` allocations in a row (contiguous in
// this thread's arena), then every block but each `keep_every`-th freed.
// With blocks smaller than a page / keep_every, each page keeps a live
// block: the freed bytes coalesce into free chunks glibc cannot give back.
void* fragment_thread(void* arg) {
  auto& job = *static_cast<ThreadJob*>(arg);
  // The pointer array comes from mmap, not malloc: a large malloc'd array
  // would be an mmapped chunk whose free moves glibc's dynamic mmap
  // threshold and changes how everything after it is placed.
  const size_t array_bytes = job.blocks * sizeof(void*);
  void* mem =
      mmap(nullptr, array_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  pthread_mutex_lock(&gate_mutex);
  while (!gate_open) pthread_cond_wait(&gate_cond, &gate_mutex);
  pthread_mutex_unlock(&gate_mutex);
  if (mem == MAP_FAILED) {
    job.failed = true;
    return nullptr;
  }
  auto** ptrs = static_cast<void**>(mem);
  // All threads allocate at the same time: glibc gives a thread that finds
  // its arena busy another one, so several arenas fill.
  for (uint64_t i = 0; i < job.blocks; ++i) {
    ptrs[i] = demo_scratch_alloc(job.size);
    if (ptrs[i] == nullptr) job.failed = true;
  }
  for (uint64_t i = 0; i < job.blocks; ++i) {
    if (ptrs[i] == nullptr) continue;
    if (i % job.keep_every == 0) {
      job.kept.push(ptrs[i], job.size);
    } else {
      std::free(ptrs[i]);
      job.freed_bytes += job.size;
    }
  }
  munmap(mem, array_bytes);
  return nullptr;
}

// fragment(Threads, Blocks, Size, KeepEvery)
//   -> {ok, KeptBytes, FreedBytes} | {error, enomem | eagain}
ERL_NIF_TERM fragment(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) noexcept {
  uint64_t threads, blocks, size, keep_every;
  if (!get_size(env, argv[0], 1, kMaxThreads, &threads) ||
      !get_size(env, argv[1], 1, kMaxBlocks, &blocks) ||
      !get_size(env, argv[2], sizeof(Node), kMaxSize, &size) ||
      !get_size(env, argv[3], 1, kMaxBlocks, &keep_every))
    return enif_make_badarg(env);
  // One fragment/4 at a time: the gate is shared.
  static pthread_mutex_t one_at_a_time = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&one_at_a_time);
  ThreadJob jobs[kMaxThreads];
  pthread_t ids[kMaxThreads];
  uint64_t started = 0;
  gate_open = false;
  for (; started < threads; ++started) {
    jobs[started].blocks = blocks;
    jobs[started].size = size;
    jobs[started].keep_every = keep_every;
    if (pthread_create(&ids[started], nullptr, fragment_thread, &jobs[started]) != 0) break;
  }
  pthread_mutex_lock(&gate_mutex);
  gate_open = true;
  pthread_cond_broadcast(&gate_cond);
  pthread_mutex_unlock(&gate_mutex);
  for (uint64_t t = 0; t < started; ++t) pthread_join(ids[t], nullptr);
  pthread_mutex_unlock(&one_at_a_time);

  uint64_t kept = 0, freed = 0;
  bool failed = false;
  pthread_mutex_lock(&lists_mutex);
  for (uint64_t t = 0; t < started; ++t) {
    List& k = jobs[t].kept;
    while (k.head != nullptr) {
      Node* n = k.head;
      k.head = n->next;
      fragments.push(n, size);
    }
    kept += k.bytes;
    freed += jobs[t].freed_bytes;
    failed = failed || jobs[t].failed;
  }
  pthread_mutex_unlock(&lists_mutex);
  if (started < threads) return error_tuple(env, atoms.eagain);
  if (failed) return error_tuple(env, atoms.enomem);
  return enif_make_tuple3(env, atoms.ok, enif_make_uint64(env, kept), enif_make_uint64(env, freed));
}

// enif_keep(Count, Size) -> ok | {error, enomem}
ERL_NIF_TERM enif_keep(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) noexcept {
  return keep_blocks(env, argv, enif_alloc, enif);
}

void free_list(List& l, void (*release)(void*)) {
  while (l.head != nullptr) {
    Node* n = l.head;
    l.head = n->next;
    release(n);
  }
  l = List{};
}

// release() -> ok: frees everything the demo holds.
ERL_NIF_TERM release(ErlNifEnv*, int, const ERL_NIF_TERM[]) noexcept {
  pthread_mutex_lock(&lists_mutex);
  free_list(cache, std::free);
  free_list(fragments, std::free);
  free_list(enif, enif_free);
  pthread_mutex_unlock(&lists_mutex);
  return atoms.ok;
}

// held() -> {CacheBlocks, CacheBytes, FragmentBlocks, FragmentBytes, EnifBlocks, EnifBytes}
ERL_NIF_TERM held(ErlNifEnv* env, int, const ERL_NIF_TERM[]) noexcept {
  pthread_mutex_lock(&lists_mutex);
  const uint64_t v[6] = {cache.blocks,    cache.bytes, fragments.blocks,
                         fragments.bytes, enif.blocks, enif.bytes};
  pthread_mutex_unlock(&lists_mutex);
  ERL_NIF_TERM t[6];
  for (int i = 0; i < 6; ++i) t[i] = enif_make_uint64(env, v[i]);
  return enif_make_tuple_from_array(env, t, 6);
}

// Scheduler choice: everything here runs on a dirty CPU scheduler.
// cache_insert, fragment, enif_keep and release allocate or free up to
// millions of blocks (fragment also starts threads and joins them); held/0
// only reads six counters, but under the mutex the others hold while they
// work, so it could wait for them.
ErlNifFunc funcs[] = {
    {"cache_insert", 2, cache_insert, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"fragment", 4, fragment, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"enif_keep", 2, enif_keep, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"release", 0, release, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"held", 0, held, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

int load(ErlNifEnv* env, void**, ERL_NIF_TERM) {
  make_atoms(env);
  return 0;
}

// Upgrade keeps the lists (they are process-global, not per instance).
int upgrade(ErlNifEnv* env, void**, void**, ERL_NIF_TERM) {
  make_atoms(env);
  return 0;
}

}  // namespace

ERL_NIF_INIT(mallocinfo_demo_nif, funcs, load, nullptr, upgrade, nullptr)
