// Runs under the real interposer in full or counters mode:
//   LD_PRELOAD=priv/libmallocinfo_preload.so MALLOCINFO_TRACE_EXE=drift_preload
//   MALLOCINFO_TRACE=counters build/drift_preload
// Threads make a random mix of malloc, calloc, realloc (grow, shrink, move,
// to 0, from NULL), reallocarray, posix_memalign, aligned_alloc and free;
// then, with the blocks they hold still live, bytes_allocated - bytes_freed
// must have moved by exactly the bytes of those blocks (requested in full
// mode, usable, malloc_usable_size, in counters mode), and by exactly 0
// once they are freed. In sample
// mode (MALLOCINFO_TRACE=sample) it checks what sample mode promises
// instead: allocated - freed equals the estimate of the live sampled
// blocks, and returns to where it was once they are freed.
// In full mode it then checks that reset() gives the live table's pages
// back: VmRSS drops once 200,000 freed-but-recorded-then-removed entries'
// pages are released.
// Prints "drift_preload: N passed, N failed"; exit status 1 on any failure.
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <barrier>
#include <thread>
#include <vector>

#include "../preload_probe.h"

namespace {

using probe::opaque;

const mi_preload_abi* g_abi = nullptr;

mi_abi_status status() {
  return probe::status(g_abi);
}

int64_t net(const mi_abi_status& s) {
  return static_cast<int64_t>(s.bytes_allocated - s.bytes_freed);
}

constexpr int kThreads = 4;
constexpr int kOps = 60000;
constexpr size_t kMaxHeld = 400;

struct Held {
  void* p[kMaxHeld];
  size_t req[kMaxHeld];  // requested bytes of p[i] (what full mode counts)
  size_t n = 0;
  void drop(size_t at) {
    --n;
    p[at] = p[n];
    req[at] = req[n];
  }
};

// Sizes that cross glibc's bins, tcache and the mmap threshold.
size_t pick_size(uint64_t v) {
  switch (v % 8) {
    case 0:
      return 0;
    case 1:
      return 1 + v % 24;
    case 2:
      return 200000 + v % 100000;  // mmapped
    default:
      return 1 + v % 3000;
  }
}

void worker(int id, Held* h) {
  probe::Xorshift rnd(static_cast<uint64_t>(id + 7));
  for (int op = 0; op < kOps; ++op) {
    const uint64_t v = rnd();
    if (h->n >= kMaxHeld || (h->n > 0 && v % 3 == 0)) {
      const size_t at = static_cast<size_t>(rnd() % h->n);
      void*& slot = h->p[at];
      size_t& req = h->req[at];
      switch (v % 6) {
        case 0: {  // realloc(p, 0): glibc frees p, returns NULL
          void* r = realloc(slot, opaque<size_t>(0));
          if (r == nullptr) {
            h->drop(at);
          } else {
            slot = r;
            req = 0;
          }
          break;
        }
        case 1:  // grow (often a move)
        case 2: {
          const size_t n = pick_size(rnd()) + 4096;
          void* r = realloc(slot, n);
          if (r != nullptr) {
            slot = r;
            req = n;
          }
          break;
        }
        case 3: {  // shrink (in place)
          const size_t n = malloc_usable_size(slot) / 2 + 1;
          void* r = realloc(slot, n);
          if (r != nullptr) {
            slot = r;
            req = n;
          }
          break;
        }
        case 4: {
          const size_t k = 1 + rnd() % 700;
          void* r = reallocarray(slot, 3, k);
          if (r != nullptr) {
            slot = r;
            req = 3 * k;
          }
          break;
        }
        default:
          free(slot);
          h->drop(at);
          break;
      }
      continue;
    }
    size_t size = pick_size(rnd());
    void* p = nullptr;
    switch (v % 6) {
      case 0:
        p = malloc(size);
        break;
      case 1:
        p = calloc(1 + v % 5, size);
        size *= 1 + v % 5;
        break;
      case 2:
        p = realloc(opaque<void*>(nullptr), size);
        break;
      case 3:
        if (posix_memalign(&p, 64, size) != 0) p = nullptr;
        break;
      case 4:
        size = (size + 31) & ~size_t{31};
        p = aligned_alloc(32, size);
        break;
      default:
        p = memalign(4096, size);
        break;
    }
    if (p != nullptr) {
      h->p[h->n] = p;
      h->req[h->n++] = size;
    }
  }
}

// VmRSS in KiB (read(2) on /proc: no allocation between two samples).
long rss_kib() {
  char buf[4096];
  FILE* f = fopen("/proc/self/status", "re");
  if (f == nullptr) return -1;
  long kib = -1;
  while (fgets(buf, sizeof buf, f) != nullptr)
    if (sscanf(buf, "VmRSS: %ld", &kib) == 1) break;
  fclose(f);
  return kib;
}

// Full mode: 200,000 blocks recorded and freed leave the table's pages
// touched; reset() must give them back.
void check_reset_releases() {
  static void* blocks[200000];
  for (void*& b : blocks) b = malloc(opaque<size_t>(40));
  for (void* b : blocks) free(b);
  const long before = rss_kib();
  g_abi->reset();
  const long after = rss_kib();
  printf("drift_preload: reset: VmRSS %ld KiB -> %ld KiB\n", before, after);
  PROBE_CHECK(before - after >= 4096);  // the entries covered > 6 MiB of table
}

}  // namespace

int main() {
  g_abi = probe::find_abi();
  if (g_abi == nullptr) {
    fprintf(stderr, "drift_preload: run me with LD_PRELOAD=libmallocinfo_preload.so\n");
    return 2;
  }
  const mi_abi_status s = status();
  if (s.recording != 1 || s.mode == MI_MODE_OFF) {
    fprintf(stderr, "drift_preload: not recording (MALLOCINFO_TRACE_EXE? MALLOCINFO_TRACE?)\n");
    return 2;
  }
  const bool sample = s.mode == MI_MODE_SAMPLE;

  static Held held[kThreads];
  // Phases: threads started; s0 read; work done; s1 read; blocks freed; s2
  // read; threads exit. Between two reads only the workers allocate
  // (barriers do not), and no thread exits (exit frees thread state).
  std::barrier<> sync(kThreads + 1);
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i)
    ts.emplace_back([&sync, i] {
      sync.arrive_and_wait();
      sync.arrive_and_wait();
      worker(i, &held[i]);
      sync.arrive_and_wait();
      sync.arrive_and_wait();
      for (size_t k = 0; k < held[i].n; ++k) free(held[i].p[k]);
      sync.arrive_and_wait();
      sync.arrive_and_wait();
    });
  sync.arrive_and_wait();
  const mi_abi_status s0 = status();
  sync.arrive_and_wait();
  sync.arrive_and_wait();
  const mi_abi_status s1 = status();
  int64_t live_usable = 0, live_requested = 0;
  size_t nheld = 0;
  for (auto& h : held) {
    nheld += h.n;
    for (size_t k = 0; k < h.n; ++k) {
      live_usable += static_cast<int64_t>(malloc_usable_size(h.p[k]));
      live_requested += static_cast<int64_t>(h.req[k]);
    }
  }
  sync.arrive_and_wait();
  sync.arrive_and_wait();
  const mi_abi_status s2 = status();
  sync.arrive_and_wait();
  for (auto& t : ts) t.join();

  const int64_t moved = net(s1) - net(s0);
  if (net(s2) != net(s0))
    fprintf(stderr, "drift_preload: after freeing: %lld (allocated %llu, freed %llu since s0)\n",
            static_cast<long long>(net(s2) - net(s0)),
            static_cast<unsigned long long>(s2.bytes_allocated - s0.bytes_allocated),
            static_cast<unsigned long long>(s2.bytes_freed - s0.bytes_freed));
  if (sample) {
    // allocated - freed is the estimate of the live sampled bytes: it comes
    // back exactly once they are all freed, and it is positive while they
    // live (the workers hold megabytes: many sampled blocks).
    printf("drift_preload: sample: live %zu blocks, %lld usable bytes; estimate moved by %lld\n",
           nheld, static_cast<long long>(live_usable), static_cast<long long>(moved));
    PROBE_CHECK(moved > 0);
    PROBE_CHECK(net(s2) == net(s0));
    PROBE_CHECK(s1.live_entries > s0.live_entries);
    PROBE_CHECK(s2.live_entries == s0.live_entries);
  } else {
    // Full mode counts the requested bytes of what the table recorded,
    // counters mode the usable bytes of every call (track/tracker.h).
    const bool full = s.mode == MI_MODE_FULL;
    printf("drift_preload: %s: live %zu blocks, %lld %s bytes; allocated - freed moved by %lld\n",
           full ? "full" : "counters", nheld,
           static_cast<long long>(full ? live_requested : live_usable),
           full ? "requested" : "usable", static_cast<long long>(moved));
    PROBE_CHECK(nheld > 0);
    PROBE_CHECK(moved == (full ? live_requested : live_usable));
    PROBE_CHECK(net(s2) == net(s0));
    PROBE_CHECK(s1.calls[MI_FN_REALLOC] - s0.calls[MI_FN_REALLOC] > 0);
    if (s.mode == MI_MODE_FULL) {
      PROBE_CHECK(s1.dropped == s0.dropped);
      PROBE_CHECK(s1.live_entries - s0.live_entries == nheld);
    }
  }
  if (s.mode == MI_MODE_FULL) check_reset_releases();
  return probe::finish("drift_preload");
}
