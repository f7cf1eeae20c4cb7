// Forked children of an attached process calling dlopen (issue 28, item 3).
// Runs WITHOUT LD_PRELOAD: like the NIF, it dlopen()s the real interposer
// (RTLD_LOCAL) and attaches, so this executable's dlopen slot leads to the
// interposer's dlopen hook.
//   build/stress_fork_dlopen [forks]
//
// While the main thread forks children one after another, other threads
// keep the dynamic loader's list lock busy the ways an attached node does:
//  - an attach thread attaches and detaches in a loop (each a walk of every
//    loaded object inside dl_iterate_phdr);
//  - a dlopen thread loads and unloads a small library (the hook's own
//    walk after each load);
//  - a phdr thread walks every object with dl_iterate_phdr and does some
//    work per object, as the symbolizer's rescan does.
// A fork() while one of them holds the lock leaves it held for good in the
// child. Each child dlopen()s a library that is loaded already (libc, with
// RTLD_NOLOAD: glibc's part of such a dlopen takes only the loader's main
// lock, which glibc resets in the child) and exits. A child that has not
// exited after 10 s is stuck: it is killed and the program ends with
// status 3, saying after how many forks. Exit 0 when every child exited
// by itself; 1 on a setup failure. x86_64 only (attach is).
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "../../common/mi_abi.h"

#if defined(__x86_64__)

namespace {

constexpr int kStallSeconds = 10;

std::atomic<bool> g_stop{false};
std::atomic<uint64_t> g_attaches{0}, g_dlopens{0}, g_walks{0};

std::string exe_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string s(buf);
  return s.substr(0, s.rfind('/'));
}

const mi_preload_abi* load_interposer() {
  const char* env = getenv("MI_PRELOAD_SO");
  const std::string path =
      env != nullptr ? env : exe_dir() + "/../../priv/libmallocinfo_preload.so";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    fprintf(stderr, "stress_fork_dlopen: %s\n", dlerror());
    return nullptr;
  }
  auto fn = reinterpret_cast<mi_preload_abi_fn>(dlsym(h, MI_ABI_SYMBOL));
  return fn != nullptr ? fn() : nullptr;
}

bool attach(const mi_preload_abi* abi) {
  mi_attach_config cfg{MI_MODE_FULL, 16, 1u << 16, 1u << 12, 512 * 1024};
  mi_attach_result r{};
  abi->attach(&cfg, sizeof cfg, &r, sizeof r);
  return r.rc == MI_ATTACH_OK;
}

void attach_thread(const mi_preload_abi* abi) {
  const timespec pause{0, 200 * 1000};
  while (!g_stop.load(std::memory_order_relaxed)) {
    if (attach(abi)) {
      nanosleep(&pause, nullptr);
      abi->detach();
    }
    g_attaches.fetch_add(1, std::memory_order_relaxed);
  }
}

void dlopen_thread(std::string path) {
  while (!g_stop.load(std::memory_order_relaxed)) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      fprintf(stderr, "stress_fork_dlopen: dlopen %s: %s\n", path.c_str(), dlerror());
      _exit(1);
    }
    dlclose(h);
    g_dlopens.fetch_add(1, std::memory_order_relaxed);
  }
}

// Some work per object while the loader's list lock is held.
int slow_callback(dl_phdr_info* info, size_t, void* data) {
  uint64_t h = *static_cast<uint64_t*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i)
    for (int k = 0; k < 200; ++k) h = h * 31 + info->dlpi_phdr[i].p_vaddr + k;
  *static_cast<uint64_t*>(data) = h;
  return 0;
}

void phdr_thread() {
  uint64_t h = 1;
  while (!g_stop.load(std::memory_order_relaxed)) {
    dl_iterate_phdr(slow_callback, &h);
    g_walks.fetch_add(1, std::memory_order_relaxed);
  }
  __asm__ volatile("" ::"r"(h));
}

// Waits for the child; false when it is still there after kStallSeconds
// (then it is killed and reaped).
bool reaped(pid_t pid, int* status) {
  const timespec tick{0, 1000 * 1000};
  for (long waited = 0; waited < kStallSeconds * 1000L; ++waited) {
    const pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (r < 0) return false;
    nanosleep(&tick, nullptr);
  }
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const long forks = argc > 1 ? atol(argv[1]) : 300;
  const mi_preload_abi* abi = load_interposer();
  if (abi == nullptr ||
      abi->struct_size < offsetof(mi_preload_abi, attach_status) + sizeof(void*)) {
    fprintf(stderr, "stress_fork_dlopen: no interposer with attach\n");
    return 1;
  }
  const std::string target = exe_dir() + "/stress_dlopen_target.so";
  std::thread threads[] = {std::thread(attach_thread, abi), std::thread(dlopen_thread, target),
                           std::thread(phdr_thread)};
  long hung = -1;
  long failed = 0;
  for (long i = 0; i < forks; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      perror("stress_fork_dlopen: fork");
      g_stop.store(true);
      for (auto& t : threads) t.join();
      return 1;
    }
    if (pid == 0) {
      // Through this executable's dlopen slot: the hook when attached.
      void* h = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
      _exit(h != nullptr ? 0 : 4);
    }
    int status = 0;
    if (!reaped(pid, &status)) {
      hung = i + 1;
      break;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  g_stop.store(true);
  for (auto& t : threads) t.join();
  abi->detach();
  if (hung > 0) {
    fprintf(stderr,
            "stress_fork_dlopen: FAILED: child %ld of %ld still in dlopen after %d s "
            "(deadlock), killed\n",
            hung, forks, kStallSeconds);
    return 3;
  }
  if (failed > 0) {
    fprintf(stderr, "stress_fork_dlopen: FAILED: %ld of %ld children did not exit 0\n", failed,
            forks);
    return 3;
  }
  printf(
      "stress_fork_dlopen: ok: %ld children, %llu attach/detach, %llu dlopen/dlclose, "
      "%llu dl_iterate_phdr walks meanwhile\n",
      forks, static_cast<unsigned long long>(g_attaches.load()),
      static_cast<unsigned long long>(g_dlopens.load()),
      static_cast<unsigned long long>(g_walks.load()));
  return 0;
}

#else

int main() {
  printf("stress_fork_dlopen: x86_64 only, nothing run\n");
  return 0;
}

#endif
