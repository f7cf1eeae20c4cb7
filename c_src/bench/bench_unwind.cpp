// What a stack capture costs, warm and cold: capture_cached() from the leaf
// of the unwinder tests' fixture chain (test/unwind_fixture.cpp: 12 levels,
// two frames each, every frame shape), as the tracker's hook would call it.
// Printed, never asserted: the machine is shared and noisy. Run by
// bench/run.sh; by hand: c_src/build/bench_unwind.
//
// Output: one key=value line,
//   unwind frames=N warm_ns=... warm_ns_per_frame=... relearn_ns=...
//     relearn_ns_per_frame=... first_capture_ns=... first_frames=N
// warm: every rule cached and the stack window learnt (median of 9 batches
// of 20000); relearn: every rule forgotten before each capture
// (unwind_code_unmapped), the window kept; first capture: a new thread with
// a fresh cache (median of 21 threads).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../test/unwind_fixture.h"
#include "../track/unwind.h"

#if defined(__x86_64__)

namespace {

using unwind_fixture::Shape;

enum class Mode { kWarm, kRulesFlushed, kNewThread };

struct Bench {
  mi::track::UnwindCache* cache;
  Mode mode;
  int reps;
  size_t frames = 0;
  double ns = 0;  // per capture, median of the batches
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void* map_cache() {
  void* mem = mmap(nullptr, mi::track::unwind_cache_bytes(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("bench_unwind: mmap");
    std::exit(1);
  }
  return mem;
}

__attribute__((noipa)) void bench_leaf(void* arg) {
  auto* b = static_cast<Bench*>(arg);
  uintptr_t out[128];
  std::vector<double> samples;
  // A new thread's first capture happens once: one sample of it.
  const int batches = b->mode == Mode::kNewThread ? 1 : 9;
  for (int batch = 0; batch < batches; ++batch) {
    double total = 0;
    for (int i = 0; i < b->reps; ++i) {
      if (b->mode == Mode::kRulesFlushed) mi::track::unwind_code_unmapped();
      const auto t0 = std::chrono::steady_clock::now();
      b->frames = mi::track::capture_cached(b->cache, out, 128);
      total +=
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    }
    samples.push_back(total / b->reps);
  }
  b->ns = median(samples);
}

void run(Bench* b) {
  const std::vector<Shape> shapes = {Shape::kFp,   Shape::kNoFp, Shape::kAlloca,
                                     Shape::kBusy, Shape::kVla,  Shape::kAligned};
  unwind_fixture::Ctx ctx{shapes.data(), shapes.size(), 12, 64, bench_leaf, b, nullptr, 0};
  unwind_fixture_run(&ctx, 0);
}

// The first capture on a thread: a fresh cache, no rules and no window.
double first_capture_ns(size_t* frames) {
  std::vector<double> samples;
  for (int i = 0; i < 21; ++i) {
    std::thread([&samples, frames] {
      void* mem = map_cache();
      Bench b{mi::track::unwind_cache_init(mem), Mode::kNewThread, 1};
      run(&b);
      samples.push_back(b.ns);
      *frames = b.frames;
      munmap(mem, mi::track::unwind_cache_bytes());
    }).join();
  }
  return median(samples);
}

}  // namespace

int main() {
  void* mem = map_cache();
  Bench warm{mi::track::unwind_cache_init(mem), Mode::kWarm, 20000};
  run(&warm);
  Bench cold{warm.cache, Mode::kRulesFlushed, 200};
  run(&cold);
  size_t first_frames = 0;
  const double first = first_capture_ns(&first_frames);
  munmap(mem, mi::track::unwind_cache_bytes());
  // The fixture is 12 levels of two frames: fewer means the unwinder
  // stopped early, and the numbers would not measure what they say.
  if (warm.frames <= 24) {
    std::fprintf(stderr, "bench_unwind: only %zu frames captured\n", warm.frames);
    return 1;
  }
  std::printf(
      "unwind frames=%zu warm_ns=%.0f warm_ns_per_frame=%.1f relearn_ns=%.0f "
      "relearn_ns_per_frame=%.0f first_capture_ns=%.0f first_frames=%zu\n",
      warm.frames, warm.ns, warm.ns / static_cast<double>(warm.frames), cold.ns,
      cold.ns / static_cast<double>(cold.frames), first, first_frames);
  return 0;
}

#else

int main() {
  std::printf("unwind n/a (x86_64 only)\n");
  return 0;
}

#endif
