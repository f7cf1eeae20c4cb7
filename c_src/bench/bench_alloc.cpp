// Allocation-tracker benchmark workload (run by bench/run.sh).
//
// T threads each own a 1024-slot ring. One iteration replaces a random slot:
// free the block in it, then allocate a fresh 16..255-byte block through a
// chain of D distinct noinline functions, so a tracker that unwinds sees D
// real frames above malloc. The ring is pre-filled untimed; all threads start
// together at a barrier; each times its own loop with CLOCK_MONOTONIC.
// With -s K the allocations come from K call sites in turn (stacks that
// differ outside the chain), so no two in a row share a stack.
//
// Output: one key=value line, e.g.
//   threads=2 depth=12 iters=4000000 ns_per_pair=41.2 per_thread=40.9,41.5
//     malloc_from=libc.so.6
// ns_per_pair is the mean over threads of (thread's loop time / iters).
// With -m N the program measures memory instead: each thread allocates its
// share of N live 64-byte blocks through the D-deep chain, holds them, and
// the line reports rss_kib (VmRSS with all blocks live) and rss_base_kib
// (VmRSS before the first block), so run.sh can compare the resident set of
// the same live population with and without a tracker.
//
// malloc_from names the object that defines the malloc this process calls,
// so run.sh can tell a preload that was silently ignored by ld.so. When the
// mallocinfo interposer is loaded, its status (read through the one ABI
// symbol, after the loop, with the rings still live) is appended as mi_*.

#include <dirent.h>
#include <dlfcn.h>
#include <time.h>

#include <array>
#include <barrier>
#include <cerrno>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "../common/mi_abi.h"

namespace {

constexpr size_t kRingSlots = 1024;  // power of two: slot = random & mask
constexpr size_t kMinSize = 16;
constexpr size_t kMaxSize = 255;
constexpr int kMaxDepth = 64;
constexpr int kMaxThreads = 256;

// The call chain. level<K> calls level<K-1>; level<0> calls malloc. Each is a
// separate function (distinct return addresses, as in real code). The empty
// asm after each call consumes the result and clobbers memory, so the call is
// neither a tail call nor foldable: every level keeps its frame.
template <int K>
__attribute__((noinline)) void* level(size_t size) {
  void* p;
  if constexpr (K == 0) {
    p = malloc(size);
  } else {
    p = level<K - 1>(size);
  }
  asm volatile("" : "+r"(p) : : "memory");
  return p;
}

using AllocFn = void* (*)(size_t);

// kChain[d] allocates d calls deep (d >= 1): entry level<d-1> ... level<0>.
template <size_t... I>
constexpr auto make_chain(std::index_sequence<I...>) {
  return std::array<AllocFn, sizeof...(I)>{{&level<static_cast<int>(I)>...}};
}
constexpr auto kChain = make_chain(std::make_index_sequence<kMaxDepth>{});

// -s K: K call sites, taken in turn, so that no two consecutive
// allocations of a thread share a stack. Site s calls the chain from a
// call of its own: the stacks differ in the frame outside the chain (a
// tracker comparing stacks from the innermost frame finds the difference
// last).
constexpr int kMaxSites = 4;
template <int S>
__attribute__((noinline)) void* site(AllocFn chain, size_t size) {
  void* p = chain(size);
  asm volatile("" : "+r"(p) : : "memory");
  return p;
}
using SiteFn = void* (*)(AllocFn, size_t);
constexpr std::array<SiteFn, kMaxSites> kSites{{&site<0>, &site<1>, &site<2>, &site<3>}};

uint64_t xorshift64(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

const char* malloc_provider();
void mallocinfo_status(char* buf, size_t len);

struct Params {
  int threads = 1;
  int depth = 12;
  uint64_t iters = 2000000;
  uint64_t hold = 0;  // -m: live blocks to hold (memory mode); 0: timing mode
  int sites = 1;      // -s: call sites taken in turn (1: the chain alone)
};

// VmRSS of this process in KiB, from /proc/self/status (read with read(2):
// no stdio buffer is allocated between the two samples).
uint64_t rss_kib() {
  char buf[4096];
  FILE* f = fopen("/proc/self/status", "re");
  if (f == nullptr) return 0;
  uint64_t kib = 0;
  while (fgets(buf, sizeof buf, f) != nullptr) {
    if (sscanf(buf, "VmRSS: %" SCNu64, &kib) == 1) break;
  }
  fclose(f);
  return kib;
}

// Memory mode: each of p.threads threads holds its share of p.hold blocks.
int hold_blocks(const Params& p) {
  const AllocFn alloc = kChain[p.depth - 1];
  std::vector<void*> blocks(p.hold);
  const uint64_t base = rss_kib();
  std::barrier<> sync(p.threads + 1);
  std::vector<std::thread> threads;
  for (int id = 0; id < p.threads; id++) {
    threads.emplace_back([&, id] {
      const uint64_t lo = p.hold * static_cast<uint64_t>(id) / static_cast<uint64_t>(p.threads);
      const uint64_t hi = p.hold * static_cast<uint64_t>(id + 1) / static_cast<uint64_t>(p.threads);
      for (uint64_t i = lo; i < hi; i++) {
        void* b = alloc(64);
        memset(b, 1, 64);
        blocks[i] = b;
      }
      sync.arrive_and_wait();  // all held
      sync.arrive_and_wait();  // measured
    });
  }
  sync.arrive_and_wait();
  const uint64_t held = rss_kib();
  char mi[512];
  mallocinfo_status(mi, sizeof mi);
  sync.arrive_and_wait();
  for (auto& t : threads) t.join();
  for (void* b : blocks) free(b);
  printf("threads=%d depth=%d hold=%" PRIu64 " rss_base_kib=%" PRIu64 " rss_kib=%" PRIu64
         " malloc_from=%s%s\n",
         p.threads, p.depth, p.hold, base, held, malloc_provider(), mi);
  return 0;
}

// Phases of the shared barrier (threads + main): start, loop done, status read.
void worker(const Params& p, int id, std::barrier<>& sync, double* ns_out) {
  const AllocFn alloc = kChain[p.depth - 1];
  uint64_t rng = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(id + 1);
  void* ring[kRingSlots];
  for (auto& slot : ring) {
    slot = alloc(kMinSize + xorshift64(rng) % (kMaxSize - kMinSize + 1));
  }

  sync.arrive_and_wait();
  const uint64_t t0 = now_ns();
  for (uint64_t i = 0; i < p.iters; i++) {
    const uint64_t r = xorshift64(rng);
    void*& slot = ring[r & (kRingSlots - 1)];
    free(slot);
    const size_t size = kMinSize + (r >> 10) % (kMaxSize - kMinSize + 1);
    void* block = p.sites == 1 ? alloc(size) : kSites[i % p.sites](alloc, size);
    *static_cast<unsigned char*>(block) = static_cast<unsigned char>(r);  // touch it
    slot = block;
  }
  const uint64_t t1 = now_ns();
  *ns_out = static_cast<double>(t1 - t0) / static_cast<double>(p.iters);

  sync.arrive_and_wait();
  sync.arrive_and_wait();
  for (void* slot : ring) free(slot);
}

// Basename of the object defining the malloc that calls resolve to.
const char* malloc_provider() {
  void* sym = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info info;
  if (sym == nullptr || dladdr(sym, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  const char* slash = strrchr(info.dli_fname, '/');
  return slash ? slash + 1 : info.dli_fname;
}

// The interposer dlopen()ed and attached by -a (nullptr without -a).
void* g_attached_so = nullptr;

// -a SO: attach the tracker at run time as mallocinfo_trace:attach() does
// (dlopen RTLD_LOCAL, then the ABI's attach), in full mode, before the
// threads start. Prints attach_us=<time attach() took>.
bool attach_tracker(const char* so, double* attach_us) {
  g_attached_so = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (g_attached_so == nullptr) return false;
  auto fn = reinterpret_cast<mi_preload_abi_fn>(dlsym(g_attached_so, MI_ABI_SYMBOL));
  const mi_preload_abi* abi = fn != nullptr ? fn() : nullptr;
  if (abi == nullptr || abi->struct_size < offsetof(mi_preload_abi, attach_status) + sizeof(void*))
    return false;
  mi_attach_config cfg{MI_MODE_FULL, 32, size_t{1} << 21, size_t{1} << 16, 512 * 1024};
  mi_attach_result r{};
  timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  abi->attach(&cfg, sizeof cfg, &r, sizeof r);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *attach_us = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
  return r.rc == MI_ATTACH_OK;
}

// -o DIR: dlopen() every *.so in DIR first (attach_us with many loaded
// objects). Returns how many loaded.
int load_objects(const char* dir) {
  DIR* d = opendir(dir);
  if (d == nullptr) return 0;
  int n = 0;
  while (dirent* e = readdir(d)) {
    const size_t len = strlen(e->d_name);
    if (len < 4 || strcmp(e->d_name + len - 3, ".so") != 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (dlopen(path, RTLD_NOW | RTLD_LOCAL) != nullptr) ++n;
  }
  closedir(d);
  return n;
}

// " mi_..." fields from the mallocinfo interposer's status, or "" if absent.
void mallocinfo_status(char* buf, size_t len) {
  buf[0] = '\0';
  auto abi_fn = reinterpret_cast<mi_preload_abi_fn>(
      dlsym(g_attached_so != nullptr ? g_attached_so : RTLD_DEFAULT, MI_ABI_SYMBOL));
  if (abi_fn == nullptr) return;
  const mi_preload_abi* abi = abi_fn();
  if (abi == nullptr || abi->abi_version != MI_ABI_VERSION ||
      abi->struct_size < offsetof(mi_preload_abi, status) + sizeof(abi->status) ||
      abi->status == nullptr) {
    snprintf(buf, len, " mi_abi=unknown");
    return;
  }
  mi_abi_status st;
  memset(&st, 0, sizeof st);
  abi->status(&st, sizeof st);
  static const char* const kModes[] = {"off", "counters", "sample", "full"};
  snprintf(buf, len,
           " mi_mode=%s mi_recording=%" PRIu32 " mi_unwinder=%s mi_stack_depth=%" PRIu32
           " mi_live=%" PRIu64 " mi_stacks=%" PRIu64 " mi_dropped=%" PRIu64
           " mi_stacks_dropped=%" PRIu64 " mi_malloc_calls=%" PRIu64,
           st.mode < 4 ? kModes[st.mode] : "unknown", st.recording,
           st.unwinder == 0 ? "libunwind" : "cached", st.stack_depth, st.live_entries, st.stacks,
           st.dropped, st.stacks_dropped, st.calls[MI_FN_MALLOC]);
}

bool parse_num(const char* s, uint64_t lo, uint64_t hi, uint64_t* out) {
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

[[noreturn]] void usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s [-t threads (1..%d)] [-d depth (1..%d)] [-n iterations per thread]\n"
          "          [-a libmallocinfo_preload.so (attach at run time instead of preloading)]\n"
          "          [-o dir (dlopen every *.so in dir first)]\n"
          "          [-s call sites taken in turn (1..%d)]\n"
          "       [-m live blocks to hold: memory mode]\n"
          "One line: threads= depth= iters= ns_per_pair= (mean over threads) ...\n",
          argv0, kMaxThreads, kMaxDepth, kMaxSites);
  exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Params p;
  const char* attach_so = nullptr;
  int objects = -1;
  for (int i = 1; i < argc; i++) {
    const char* flag = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : nullptr;
    uint64_t v = 0;
    if (strcmp(flag, "-t") == 0 && parse_num(val, 1, kMaxThreads, &v)) {
      p.threads = static_cast<int>(v);
    } else if (strcmp(flag, "-d") == 0 && parse_num(val, 1, kMaxDepth, &v)) {
      p.depth = static_cast<int>(v);
    } else if (strcmp(flag, "-n") == 0 && parse_num(val, 1, UINT64_MAX, &v)) {
      p.iters = v;
    } else if (strcmp(flag, "-a") == 0 && val != nullptr) {
      attach_so = val;
    } else if (strcmp(flag, "-o") == 0 && val != nullptr) {
      objects = load_objects(val);
    } else if (strcmp(flag, "-s") == 0 && parse_num(val, 1, kMaxSites, &v)) {
      p.sites = static_cast<int>(v);
    } else if (strcmp(flag, "-m") == 0 && parse_num(val, 1, uint64_t{1} << 32, &v)) {
      p.hold = v;
    } else {
      usage(argv[0]);
    }
    i++;
  }

  double attach_us = 0;
  if (attach_so != nullptr && !attach_tracker(attach_so, &attach_us)) {
    fprintf(stderr, "bench_alloc: attach through %s failed\n", attach_so);
    return 1;
  }
  if (p.hold != 0) return hold_blocks(p);

  std::vector<double> ns(p.threads, 0.0);
  std::barrier<> sync(p.threads + 1);
  std::vector<std::thread> threads;
  threads.reserve(p.threads);
  for (int id = 0; id < p.threads; id++) {
    threads.emplace_back(worker, std::cref(p), id, std::ref(sync), &ns[id]);
  }
  sync.arrive_and_wait();  // start
  sync.arrive_and_wait();  // loops done, rings still live
  char mi[512];
  mallocinfo_status(mi, sizeof mi);
  sync.arrive_and_wait();  // let the workers free their rings
  for (auto& t : threads) t.join();

  double sum = 0;
  char per_thread[kMaxThreads * 16] = "";
  size_t used = 0;
  for (int id = 0; id < p.threads; id++) {
    sum += ns[id];
    used += snprintf(per_thread + used, sizeof per_thread - used, "%s%.1f", id ? "," : "", ns[id]);
  }
  printf("threads=%d depth=%d iters=%" PRIu64 " ns_per_pair=%.1f per_thread=%s malloc_from=%s%s",
         p.threads, p.depth, p.iters, sum / p.threads, per_thread, malloc_provider(), mi);
  if (attach_so != nullptr) printf(" attach_us=%.0f", attach_us);
  if (objects >= 0) printf(" objects_loaded=%d", objects);
  printf("\n");
  return 0;
}
