// Lock-order stress for the interposer's stack capture (issue 15, item 1).
// Runs under the real interposer:
//   LD_PRELOAD=priv/libmallocinfo_preload.so MALLOCINFO_TRACE_EXE=stress_loader_lock
//   build/stress_loader_lock [seconds]
//
// Threads of four kinds run together:
//  - site threads allocate through chains of code mapped at run time (no
//    unwind info, like BEAM's JIT), picked at random among 65536 copies, so
//    nearly every allocation comes from a return address the tracker has not
//    seen: its stack capture takes the cold path;
//  - phdr threads allocate the same way from inside dl_iterate_phdr
//    callbacks, i.e. while holding the dynamic loader's lock;
//  - a dlopen thread loads and unloads a small library (malloc under the
//    loader lock, inside glibc) and allocates from it;
//  - a reset thread makes the tracker forget its cached unwind rules.
// A capture that waits for a lock its allocating thread's caller may hold
// (the loader lock, libunwind's global lock) deadlocks here: a thread in a
// callback waits in the hook for libunwind's lock while another holds that
// lock and waits for the loader lock inside libunwind.
//
// A watchdog thread (no malloc: atomics and write(2) only) checks once a
// second that every worker made progress; a worker stuck for 10 s ends the
// process with status 3 and says which. Exit 0 after [seconds] (default 10)
// with every worker alive; 1 on a setup failure. x86_64 only (the mapped
// code is x86_64); elsewhere it says so and exits 0.
#include <dlfcn.h>
#include <link.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "../preload_probe.h"

#if defined(__x86_64__)

namespace {

constexpr size_t kCodeBytes = size_t{1} << 20;
constexpr size_t kTrampStride = 16;
constexpr size_t kTramps = kCodeBytes / kTrampStride;
constexpr int kStallSeconds = 10;

std::atomic<bool> g_go{false};
std::atomic<bool> g_stop{false};

// Every worker waits here until all are created: a running dlopen thread
// takes the loader's TLS lock again and again, and pthread_create needs it
// (_dl_allocate_tls_init), so on a busy machine creating the threads after
// it could take longer than the watchdog allows (seen: 20 s on one CPU).
void wait_for_go() {
  while (!g_go.load(std::memory_order_acquire)) sched_yield();
}

struct Worker {
  const char* kind;
  std::atomic<uint64_t> progress{0};
};

struct Chain {
  uint64_t rng;
  const uint8_t* code;
  void* keep;  // defeats dead-store elimination of the block
};

inline uint64_t next_rand(Chain* c) {
  c->rng ^= c->rng << 13;
  c->rng ^= c->rng >> 7;
  c->rng ^= c->rng << 17;
  return c->rng;
}

using Next = void (*)(Chain*, long);
using Tramp = void (*)(Chain*, long, Next);

// Each trampoline: push %rbp; mov %rsp,%rbp; call *%rdx; pop %rbp; ret.
// It calls next(chain, depth) with its own arguments: a frame-pointer frame
// without unwind info at a distinct return address per copy.
const uint8_t* map_trampolines() {
  static const uint8_t kTramp[] = {0x55, 0x48, 0x89, 0xe5, 0xff, 0xd2, 0x5d, 0xc3};
  void* mem = mmap(nullptr, kCodeBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  auto* code = static_cast<uint8_t*>(mem);
  memset(code, 0xcc, kCodeBytes);
  for (size_t i = 0; i < kTramps; ++i) memcpy(code + i * kTrampStride, kTramp, sizeof kTramp);
  if (mprotect(mem, kCodeBytes, PROT_READ | PROT_EXEC) != 0) return nullptr;
  return code;
}

// depth levels of random trampolines, then one malloc/free.
__attribute__((noinline)) void chain_step(Chain* c, long depth) {
  if (depth <= 0) {
    void* p = malloc(16 + next_rand(c) % 240);
    __asm__ volatile("" ::"r"(p) : "memory");
    c->keep = p;
    free(p);
    return;
  }
  const size_t i = next_rand(c) % kTramps;
  reinterpret_cast<Tramp>(const_cast<uint8_t*>(c->code) + i * kTrampStride)(c, depth - 1,
                                                                            chain_step);
}

void site_thread(Worker* w, const uint8_t* code, uint64_t seed) {
  Chain c{seed, code, nullptr};
  wait_for_go();
  while (!g_stop.load(std::memory_order_relaxed)) {
    chain_step(&c, 1 + static_cast<long>(next_rand(&c) % 16));
    w->progress.fetch_add(1, std::memory_order_relaxed);
  }
}

int phdr_callback(dl_phdr_info*, size_t, void* data) {
  auto* c = static_cast<Chain*>(data);
  chain_step(c, 1 + static_cast<long>(next_rand(c) % 4));
  return 0;
}

void phdr_thread(Worker* w, const uint8_t* code, uint64_t seed) {
  Chain c{seed, code, nullptr};
  wait_for_go();
  while (!g_stop.load(std::memory_order_relaxed)) {
    dl_iterate_phdr(phdr_callback, &c);
    w->progress.fetch_add(1, std::memory_order_relaxed);
  }
}

void dlopen_thread(Worker* w, std::string path) {
  wait_for_go();
  while (!g_stop.load(std::memory_order_relaxed)) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      fprintf(stderr, "stress_loader_lock: dlopen %s: %s\n", path.c_str(), dlerror());
      _exit(1);
    }
    auto fn = reinterpret_cast<void* (*)(size_t)>(dlsym(h, "stress_target_alloc"));
    if (fn != nullptr) free(fn(64));
    dlclose(h);
    w->progress.fetch_add(1, std::memory_order_relaxed);
  }
}

void reset_thread(Worker* w, const mi_preload_abi* abi) {
  const timespec pause{0, 5 * 1000 * 1000};
  wait_for_go();
  while (!g_stop.load(std::memory_order_relaxed)) {
    if (abi != nullptr) abi->reset();
    nanosleep(&pause, nullptr);
    w->progress.fetch_add(1, std::memory_order_relaxed);
  }
}

void say(const char* a, const char* b = "", const char* c = "") {
  for (const char* s : {a, b, c}) {
    const ssize_t n = write(2, s, strlen(s));
    (void)n;
  }
}

// No malloc here (it runs while workers may be stuck inside malloc's hooks
// or the loader): its arrays are sized before any worker starts.
struct Watch {
  std::vector<Worker>* workers;
  std::vector<uint64_t> last;
  std::vector<int> still;
  int seconds;
};

void watchdog(Watch* w) {
  for (int t = 0; t < w->seconds; ++t) {
    sleep(1);
    for (size_t i = 0; i < w->workers->size(); ++i) {
      const uint64_t now = (*w->workers)[i].progress.load();
      w->still[i] = now == w->last[i] ? w->still[i] + 1 : 0;
      w->last[i] = now;
      if (w->still[i] >= kStallSeconds) {
        // Before the gate opened every worker waits: the creation hung.
        if (!g_go.load(std::memory_order_acquire))
          say("stress_loader_lock: FAILED: creating the worker threads took 10 s (deadlock)\n");
        else
          say("stress_loader_lock: FAILED: a ", (*w->workers)[i].kind,
              " thread made no progress for 10 s (deadlock)\n");
        _exit(3);
      }
    }
  }
}

std::string sibling(const char* name) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return name;
  self[n] = '\0';
  std::string dir(self);
  return dir.substr(0, dir.rfind('/') + 1) + name;
}

}  // namespace

int main(int argc, char** argv) {
  const int seconds = argc > 1 ? atoi(argv[1]) : 10;
  const uint8_t* code = map_trampolines();
  if (code == nullptr) {
    fprintf(stderr, "stress_loader_lock: cannot map code\n");
    return 1;
  }
  const mi_preload_abi* abi = probe::find_abi();
  if (abi == nullptr) fprintf(stderr, "stress_loader_lock: not preloaded, nothing to stress\n");
  const std::string target = sibling("stress_dlopen_target.so");

  // Enough workers to matter, few enough not to starve each other on 2 cores.
  const int kSites = 3, kPhdr = 3;
  std::vector<Worker> workers(kSites + kPhdr + 2);
  std::vector<std::thread> threads;
  threads.reserve(workers.size());
  Watch watch{&workers, std::vector<uint64_t>(workers.size(), 0),
              std::vector<int>(workers.size(), 0), seconds};
  // Started first, counting at once: a creation that hangs keeps the gate
  // shut, and the watchdog says so.
  std::thread dog(watchdog, &watch);
  size_t w = 0;
  for (int i = 0; i < kSites; ++i, ++w) {
    workers[w].kind = "site";
    threads.emplace_back(site_thread, &workers[w], code, 0x9E3779B97F4A7C15ull * (w + 1));
  }
  for (int i = 0; i < kPhdr; ++i, ++w) {
    workers[w].kind = "dl_iterate_phdr";
    threads.emplace_back(phdr_thread, &workers[w], code, 0xD1B54A32D192ED03ull * (w + 1));
  }
  workers[w].kind = "dlopen";
  threads.emplace_back(dlopen_thread, &workers[w], target);
  ++w;
  workers[w].kind = "reset";
  threads.emplace_back(reset_thread, &workers[w], abi);
  g_go.store(true, std::memory_order_release);
  dog.join();
  g_stop.store(true);
  for (auto& t : threads) t.join();
  uint64_t total[4] = {0, 0, 0, 0};
  for (size_t i = 0; i < workers.size(); ++i)
    total[i < kSites                ? 0
          : i < kSites + kPhdr      ? 1
          : i == workers.size() - 2 ? 2
                                    : 3] += workers[i].progress.load();
  mi_abi_status st{};
  if (abi != nullptr) abi->status(&st, sizeof st);
  printf(
      "stress_loader_lock: ok: %d s, %llu allocation chains, %llu dl_iterate_phdr walks, "
      "%llu dlopen/dlclose, %llu resets, %llu stacks\n",
      seconds, static_cast<unsigned long long>(total[0]), static_cast<unsigned long long>(total[1]),
      static_cast<unsigned long long>(total[2]), static_cast<unsigned long long>(total[3]),
      static_cast<unsigned long long>(st.stacks));
  return 0;
}

#else

int main() {
  printf("stress_loader_lock: x86_64 only, nothing run\n");
  return 0;
}

#endif
