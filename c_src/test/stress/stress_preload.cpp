// Runs under the real interposer:
//   LD_PRELOAD=priv/libmallocinfo_preload.so MALLOCINFO_TRACE_EXE=stress_preload
// and reads it back through the ABI, as the NIF does. Checks glibc-exact
// edge cases, C++ new/delete, a concurrency stress with a concurrent
// snapshot/reset thread (afterwards counters are exact and the table holds
// exactly the live blocks), stack reclamation under threads allocating from
// more call stacks than the stack table holds (every kept block's stack
// reads back as its own), and fork() from a multi-threaded process.
// Prints "N passed, N failed"; exit status 1 on any failure.
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "../preload_probe.h"

// The checks look freed addresses up in the table (never dereference
// them), which is exactly what this warning is about.
#pragma GCC diagnostic ignored "-Wuse-after-free"

namespace {

using probe::opaque;

const mi_preload_abi* g_abi = nullptr;

mi_abi_status status() {
  return probe::status(g_abi);
}

// Snapshot into a buffer reserved up front, so that reading the table does
// not itself allocate through the hooks.
struct Snap {
  std::vector<mi_abi_entry> v;
  uint64_t live_after = 0;  // status().live_entries right after the snapshot
  Snap() { v.reserve(1 << 20); }
  std::map<uint64_t, mi_abi_entry> take() {
    v.clear();
    g_abi->snapshot(
        [](void* ctx, const mi_abi_entry* e, size_t n) {
          auto* vec = static_cast<std::vector<mi_abi_entry>*>(ctx);
          for (size_t i = 0; i < n && vec->size() < vec->capacity(); ++i) vec->push_back(e[i]);
        },
        &v);
    live_after = status().live_entries;
    std::map<uint64_t, mi_abi_entry> m;
    for (const auto& e : v) m[e.address] = e;
    return m;
  }
};

bool live(const std::map<uint64_t, mi_abi_entry>& m, const void* p, uint64_t size) {
  auto it = m.find(reinterpret_cast<uintptr_t>(p));
  return it != m.end() && it->second.size == size;
}
bool absent(const std::map<uint64_t, mi_abi_entry>& m, const void* p) {
  return m.find(reinterpret_cast<uintptr_t>(p)) == m.end();
}

// Where results go that the compiler must not drop (with probe::opaque).
void* volatile g_sink;

void test_edge_cases(Snap& snap) {
  const mi_abi_status s0 = status();
  void* a = malloc(100);
  void* b = calloc(10, 30);
  void* c = opaque(realloc(opaque<void*>(nullptr), 40));  // realloc(NULL, n) is malloc
  void* d = nullptr;
  PROBE_CHECK(posix_memalign(&d, 64, 50) == 0);
  void* e = aligned_alloc(128, 256);
  void* f = memalign(32, 70);
  void* g = valloc(10);
  void* h = pvalloc(10);
  char* i = strdup("hello");
  char* j = strndup("hello world", 5);
  void* k = reallocarray(nullptr, 7, 9);
  errno = 0;
  // opaque() on the result too: GCC 16 folds a calloc whose result is only
  // compared to NULL into "not NULL" and drops the call.
  void* over = opaque(calloc(opaque(SIZE_MAX / 2), 4));  // overflow: NULL, ENOMEM, nothing recorded
  PROBE_CHECK(over == nullptr);
  PROBE_CHECK(errno == ENOMEM);
  errno = 0;
  PROBE_CHECK(reallocarray(a, opaque(SIZE_MAX / 2), 4) == nullptr);
  PROBE_CHECK(errno == ENOMEM);
  free(opaque<void*>(nullptr));

  auto m = snap.take();
  PROBE_CHECK(live(m, a, 100));
  PROBE_CHECK(live(m, b, 300));
  PROBE_CHECK(live(m, c, 40));
  PROBE_CHECK(live(m, d, 50));
  PROBE_CHECK(live(m, e, 256));
  PROBE_CHECK(live(m, f, 70));
  PROBE_CHECK(live(m, g, 10));
  PROBE_CHECK(live(m, h, 10));
  PROBE_CHECK(live(m, i, 6));
  PROBE_CHECK(live(m, j, 6));
  PROBE_CHECK(live(m, k, 63));

  const mi_abi_status s1 = status();
  PROBE_CHECK(s1.calls[MI_FN_CALLOC] - s0.calls[MI_FN_CALLOC] == 2);
  PROBE_CHECK(s1.calls[MI_FN_POSIX_MEMALIGN] - s0.calls[MI_FN_POSIX_MEMALIGN] == 1);
  PROBE_CHECK(s1.calls[MI_FN_ALIGNED_ALLOC] - s0.calls[MI_FN_ALIGNED_ALLOC] == 1);
  PROBE_CHECK(s1.calls[MI_FN_MEMALIGN] - s0.calls[MI_FN_MEMALIGN] == 1);
  PROBE_CHECK(s1.calls[MI_FN_VALLOC] - s0.calls[MI_FN_VALLOC] == 1);
  PROBE_CHECK(s1.calls[MI_FN_PVALLOC] - s0.calls[MI_FN_PVALLOC] == 1);
  PROBE_CHECK(s1.calls[MI_FN_STRDUP] - s0.calls[MI_FN_STRDUP] == 1);
  PROBE_CHECK(s1.calls[MI_FN_STRNDUP] - s0.calls[MI_FN_STRNDUP] == 1);
  PROBE_CHECK(s1.calls[MI_FN_REALLOCARRAY] - s0.calls[MI_FN_REALLOCARRAY] == 1);
  PROBE_CHECK(s1.calls[MI_FN_FREE] - s0.calls[MI_FN_FREE] == 1);  // free(NULL)

  // realloc growing: the old address leaves, the new one carries the size.
  void* a2 = realloc(a, 100000);
  m = snap.take();
  PROBE_CHECK(live(m, a2, 100000));
  if (a2 != a) PROBE_CHECK(absent(m, a));
  // realloc failure: NULL, the block is untouched and still recorded.
  errno = 0;
  void* fail = realloc(a2, opaque(SIZE_MAX - 4096));
  PROBE_CHECK(fail == nullptr);
  m = snap.take();
  PROBE_CHECK(live(m, a2, 100000));
  // realloc(p, 0) frees p (glibc) and returns NULL.
  PROBE_CHECK(realloc(b, 0) == nullptr);
  m = snap.take();
  PROBE_CHECK(absent(m, b));

  // C++ new/delete go through the hooks.
  char* arr = new char[12345];
  g_sink = arr;
  m = snap.take();
  PROBE_CHECK(live(m, arr, 12345));
  delete[] arr;
  m = snap.take();
  PROBE_CHECK(absent(m, arr));

  for (void* p : {a2, c, d, e, f, g, h, static_cast<void*>(i), static_cast<void*>(j), k}) free(p);
  m = snap.take();
  for (void* p : {a2, c, d, e, f, g, h, static_cast<void*>(i), static_cast<void*>(j), k})
    PROBE_CHECK(absent(m, p));
}

constexpr int kWorkers = 4;
constexpr int kOps = 100000;

// Workers keep their bookkeeping in fixed arrays, so that the only
// allocations they make are the ones they count.
constexpr size_t kMaxHeld = 512;

struct WorkerResult {
  std::pair<void*, size_t> held[kMaxHeld + 1];
  size_t nheld = 0;
  uint64_t calls[MI_FN_COUNT] = {};
};

// Mixed allocation traffic; keeps up to kMaxHeld blocks live.
void worker(int id, WorkerResult* r) {
  probe::Xorshift rnd(static_cast<uint64_t>(id + 1));
  auto& held = r->held;
  size_t& n = r->nheld;
  for (int op = 0; op < kOps; ++op) {
    const uint64_t v = rnd();
    if (n >= kMaxHeld || (n > 0 && v % 3 == 0)) {
      const size_t at = static_cast<size_t>(rnd() % n);
      if (v % 7 == 0) {
        const size_t ns = 1 + rnd() % 2000;
        held[at] = {realloc(held[at].first, ns), ns};
        ++r->calls[MI_FN_REALLOC];
      } else {
        free(held[at].first);
        ++r->calls[MI_FN_FREE];
        held[at] = held[--n];
      }
      continue;
    }
    size_t size = 1 + rnd() % 3000;
    void* p = nullptr;
    switch (v % 5) {
      case 0:
        p = malloc(size);
        ++r->calls[MI_FN_MALLOC];
        break;
      case 1:
        p = calloc(1, size);
        ++r->calls[MI_FN_CALLOC];
        break;
      case 2:
        p = memalign(64, size);
        ++r->calls[MI_FN_MEMALIGN];
        break;
      case 3:
        if (posix_memalign(&p, 32, size) != 0) p = nullptr;
        ++r->calls[MI_FN_POSIX_MEMALIGN];
        break;
      default:
        size = (size + 15) & ~size_t{15};
        p = aligned_alloc(16, size);
        ++r->calls[MI_FN_ALIGNED_ALLOC];
        break;
    }
    held[n++] = {p, size};
  }
}

void test_stress(Snap& snap) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> snapshots{0}, resets{0};
  // Phase 1: workers run while another thread snapshots and resets.
  std::thread chaos([&] {
    Snap local;
    while (!stop.load()) {
      local.take();
      ++snapshots;
      if (snapshots % 4 == 0) {
        g_abi->reset();
        ++resets;
      }
    }
  });
  // Rounds of workers until the chaos thread has reset (and so swept the
  // stack table) twice while they ran: on a loaded machine one round can be
  // over before it took a single snapshot.
  do {
    static WorkerResult res[kWorkers];
    std::vector<std::thread> ts;
    for (int w = 0; w < kWorkers; ++w) ts.emplace_back(worker, w, &res[w]);
    for (auto& t : ts) t.join();
    for (auto& r : res) {
      for (size_t k = 0; k < r.nheld; ++k) free(r.held[k].first);
      r = WorkerResult{};
    }
  } while (resets.load() < 2);
  stop = true;
  chaos.join();

  // Phase 2: from a clean table, the same traffic without interference.
  // Counters must move by exactly the workers' calls, and the table must
  // hold exactly the blocks they still hold.
  g_abi->reset();
  const mi_abi_status s0 = status();
  static WorkerResult res[kWorkers];
  {
    std::vector<std::thread> ts;
    ts.reserve(kWorkers);
    for (int w = 0; w < kWorkers; ++w) ts.emplace_back(worker, w, &res[w]);
    for (auto& t : ts) t.join();
  }
  const mi_abi_status s1 = status();
  uint64_t expected[MI_FN_COUNT] = {};
  size_t held = 0;
  for (auto& r : res) {
    for (int f = 0; f < MI_FN_COUNT; ++f) expected[f] += r.calls[f];
    held += r.nheld;
  }
  for (int f : {MI_FN_MALLOC, MI_FN_REALLOC, MI_FN_FREE, MI_FN_MEMALIGN, MI_FN_POSIX_MEMALIGN,
                MI_FN_ALIGNED_ALLOC}) {
    // Starting and ending a thread makes glibc and libstdc++ call
    // malloc/calloc/free a few dozen times (thread state, TLS, atexit
    // lists): a small allowance for those three, none for the functions
    // only the workers call.
    if (f == MI_FN_MALLOC || f == MI_FN_FREE || f == MI_FN_CALLOC) {
      PROBE_CHECK(s1.calls[f] - s0.calls[f] >= expected[f]);
      PROBE_CHECK(s1.calls[f] - s0.calls[f] <= expected[f] + 32 * kWorkers);
    } else {
      PROBE_CHECK(s1.calls[f] - s0.calls[f] == expected[f]);
    }
  }
  PROBE_CHECK(s1.dropped == s0.dropped);
  auto m = snap.take();
  size_t found = 0;
  bool sizes_ok = true;
  for (auto& r : res)
    for (size_t k = 0; k < r.nheld; ++k) {
      auto it = m.find(reinterpret_cast<uintptr_t>(r.held[k].first));
      if (it != m.end()) {
        ++found;
        if (it->second.size != r.held[k].second) sizes_ok = false;
      }
    }
  PROBE_CHECK(found == held);
  PROBE_CHECK(sizes_ok);
  // Nothing else is live but what thread start-up allocated (a handful).
  PROBE_CHECK(m.size() >= held);
  PROBE_CHECK(m.size() <= held + 4 * kWorkers);
  PROBE_CHECK(snap.live_after == m.size());
  for (auto& r : res)
    for (size_t k = 0; k < r.nheld; ++k) free(r.held[k].first);
  m.clear();  // its nodes are live blocks too
  m = snap.take();
  PROBE_CHECK(m.size() <= 4 * kWorkers);
}

// Many distinct call stacks: stack_path<0> and stack_path<1> call each other `level`
// times, bit k of `bits` choosing the callee at level k (as the CT suites'
// test NIFs do). noipa: no clones, no folding of the two into one; their
// asm differs too, so the two are never the same code.
template <int Which>
__attribute__((noipa)) void* stack_path(unsigned level, unsigned bits, size_t n) {
  void* p = level == 0   ? malloc(n)
            : (bits & 1) ? stack_path<0>(level - 1, bits >> 1, n)
                         : stack_path<1>(level - 1, bits >> 1, n);
  if constexpr (Which == 0)
    asm volatile("" : "+r"(p) : : "memory");
  else
    asm volatile("nop" : "+r"(p) : : "memory");
  return p;
}

// Three threads allocate from 65536 distinct call stacks each (three times
// the 64K stack table), keep every 128th block and free the others, while
// another thread keeps reclaiming stacks. Afterwards every kept block's
// stack reads back as its own: blocks from one path have the same frames,
// blocks from different paths different ones, and a block without a stack
// is one the table counted as dropped.
void test_reclaim_stress() {
  constexpr int kThreads = 3;
  constexpr unsigned kLevels = 18;
  constexpr unsigned kPaths = 1u << 16;  // per thread
  constexpr size_t kKept = 512;
  struct Kept {
    void* p;
    unsigned path;
  };
  static Kept kept[kThreads][kKept];
  g_abi->reset();
  const mi_abi_status s0 = status();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reclaims{0};
  std::thread chaos([&] {
    while (!stop.load()) {
      g_abi->reclaim();
      ++reclaims;
    }
  });
  std::vector<std::thread> ts;
  for (int w = 0; w < kThreads; ++w)
    ts.emplace_back([w] {
      for (unsigned i = 0; i < kPaths; ++i) {
        const unsigned path = static_cast<unsigned>(w) << 16 | i;
        void* p = stack_path<0>(kLevels, path, 24);
        // Every 128th block is kept; the others are freed at once.
        if ((i & 127) == 0)
          kept[w][i >> 7] = Kept{p, path};
        else
          free(p);
      }
    });
  for (auto& t : ts) t.join();
  stop = true;
  chaos.join();
  Snap snap;
  auto m = snap.take();
  std::map<unsigned, std::vector<uint64_t>> frames_of_path;
  std::set<std::vector<uint64_t>> seen;
  size_t checked = 0, mismatched = 0, unknown = 0;
  for (auto& row : kept)
    for (const Kept& k : row) {
      auto it = m.find(reinterpret_cast<uintptr_t>(k.p));
      if (it == m.end()) continue;
      uint64_t f[64];
      const uint32_t n = g_abi->stack(it->second.stack_id, f, 64);
      if (n == 0) {
        ++unknown;
        continue;
      }
      std::vector<uint64_t> frames(f, f + std::min<uint32_t>(n, 64));
      auto [pos, fresh] = frames_of_path.emplace(k.path, frames);
      if (!fresh && pos->second != frames) ++mismatched;
      if (fresh && !seen.insert(frames).second) ++mismatched;

      ++checked;
    }
  const mi_abi_status s1 = status();
  fprintf(stderr,
          "reclaim stress: %zu kept blocks checked, %lu reclaims, %lu stacks freed, %lu dropped\n",
          checked, static_cast<unsigned long>(reclaims.load()),
          static_cast<unsigned long>(s1.stacks_reclaimed - s0.stacks_reclaimed),
          static_cast<unsigned long>(s1.stacks_dropped - s0.stacks_dropped));
  PROBE_CHECK(checked + unknown == kThreads * kKept);
  PROBE_CHECK(mismatched == 0);
  // A thread descheduled inside a sweep chunk can hold the sweep up while
  // the others fill the table: their stacks are dropped and counted.
  PROBE_CHECK(unknown <= s1.stacks_dropped - s0.stacks_dropped);
  // At most a table's worth of stacks is stored at the end; the rest of
  // the three tables' worth was freed on the way.
  PROBE_CHECK(s1.stacks_reclaimed - s0.stacks_reclaimed + s1.stacks_dropped - s0.stacks_dropped +
                  s1.stacks >=
              kThreads * kPaths);
  m.clear();
  for (auto& row : kept)
    for (const Kept& k : row) free(k.p);
}

void test_fork() {
  // fork() while other threads allocate: the child must be able to
  // allocate, record and exit normally (no lock held across fork).
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int w = 0; w < 3; ++w)
    ts.emplace_back([&stop] {
      while (!stop.load()) {
        void* p = malloc(64);
        g_sink = p;
        free(p);
      }
    });
  int ok_children = 0;
  for (int n = 0; n < 20; ++n) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<void*> v;
      for (int i = 0; i < 1000; ++i) v.push_back(malloc(32 + i));
      mi_abi_status s{};
      g_abi->status(&s, sizeof s);
      for (void* p : v) free(p);
      _exit(s.live_entries >= 1000 ? 0 : 3);
    }
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0)
      ++ok_children;
  }
  stop = true;
  for (auto& t : ts) t.join();
  PROBE_CHECK(ok_children == 20);
}

}  // namespace

// mallocinfo's own work (the NIF wraps every call in quiet(1)/quiet(0)):
// whatever a quiet thread allocates, reallocates or maps is counted in
// self_* and never recorded; its frees of its own blocks count nothing; a
// block of the node's it frees still leaves the table. Quiet nests; the
// thread records again once it is left.
void test_quiet(Snap& snap) {
  void* node = malloc(opaque<size_t>(4321));  // the node's, freed quietly below
  const mi_abi_status s0 = status();
  g_abi->quiet(1);
  g_abi->quiet(1);  // nests
  void* a = malloc(opaque<size_t>(1000));
  void* b = calloc(3, opaque<size_t>(100));
  void* c = realloc(opaque<void*>(nullptr), 200);
  c = realloc(c, 20000);
  char* d = strdup("quiet");
  void* e = nullptr;
  PROBE_CHECK(posix_memalign(&e, 64, 640) == 0);
  void* m = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  g_abi->quiet(0);
  void* still = malloc(opaque<size_t>(55));  // one level left: still quiet
  g_abi->quiet(0);
  void* other = malloc(opaque<size_t>(777));  // recorded: no longer quiet
  memset(other, 0, 777);
  const mi_abi_status s1 = status();
  const auto live_now = snap.take();
  PROBE_CHECK(absent(live_now, a) && absent(live_now, b) && absent(live_now, c) &&
              absent(live_now, d) && absent(live_now, e) && absent(live_now, still));
  PROBE_CHECK(live(live_now, other, 777));
  PROBE_CHECK(s1.live_entries - s0.live_entries == 1);
  // malloc, calloc, realloc x2, strdup's malloc, posix_memalign, malloc
  PROBE_CHECK(s1.self_calls - s0.self_calls == 7);
  PROBE_CHECK(s1.self_bytes - s0.self_bytes == 1000 + 300 + 200 + 20000 + 6 + 640 + 55);
  PROBE_CHECK(s1.calls[MI_FN_MALLOC] - s0.calls[MI_FN_MALLOC] == 1);  // `other' only
  PROBE_CHECK(s1.calls[MI_FN_STRDUP] == s0.calls[MI_FN_STRDUP]);
  mi_abi_region_status r{};
  g_abi->region_status(&r, sizeof r);
  PROBE_CHECK(r.self_mmaps >= 1 && r.self_bytes_mapped >= (1u << 20));
  std::vector<mi_abi_region> regions(r.capacity);
  const uint64_t nr = g_abi->regions(regions.data(), regions.size());
  for (uint64_t i = 0; i < nr && i < regions.size(); ++i)
    PROBE_CHECK(regions[i].start != reinterpret_cast<uintptr_t>(m));
  // Frees, still quiet: nothing of its own counts; the node's block does.
  g_abi->quiet(1);
  free(a);
  free(b);
  free(c);
  free(d);
  free(e);
  free(still);
  munmap(m, 1 << 20);
  free(node);
  g_abi->quiet(0);
  const mi_abi_status s2 = status();
  PROBE_CHECK(s2.bytes_freed - s1.bytes_freed == 4321);
  PROBE_CHECK(s2.frees_untracked == s1.frees_untracked);
  PROBE_CHECK(s2.calls[MI_FN_FREE] - s1.calls[MI_FN_FREE] == 1);
  PROBE_CHECK(absent(snap.take(), node));
  free(other);
}

int main() {
  g_abi = probe::find_abi();  // struct_size checked there
  if (g_abi == nullptr) {
    fprintf(stderr, "stress_preload: run me with LD_PRELOAD=libmallocinfo_preload.so\n");
    return 2;
  }
  PROBE_CHECK(g_abi->abi_version == MI_ABI_VERSION);
  const mi_abi_status s = status();
  PROBE_CHECK(s.recording == 1);
  PROBE_CHECK(s.mode == MI_MODE_FULL);
  if (s.recording != 1) {
    fprintf(stderr, "stress_preload: not recording (MALLOCINFO_TRACE_EXE?)\n");
    return 2;
  }
  Snap snap;
  test_edge_cases(snap);
  test_quiet(snap);
  test_stress(snap);
  test_reclaim_stress();
  test_fork();
  return probe::finish("stress_preload");
}
