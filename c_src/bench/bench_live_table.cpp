// What the live table alone costs, in the access patterns that decided
// between its layouts (issue 26, BENCHMARKS.md "The levelled live table with
// a page directory, tried"): short-lived blocks behind many long-lived ones,
// the steady state of a fragmented heap (a page's blocks recorded at
// different times), frees of unrecorded addresses after a peak, and what it
// keeps resident per live block, densely and sparsely laid out. The table
// is driven directly (no hooks, no stacks), at the default capacity.
// Printed, never asserted: the machine is shared and noisy. Run by
// bench/run.sh; by hand: c_src/build/bench_live_table.
//
// Output: key=value lines, one per case,
//   live_table behind live=N pair_ns=...
//   live_table steady live=N remove_ns=... insert_ns=...
//   live_table miss peak=N remove_ns=...
//   live_table resident layout=dense|sparse live=N bytes_per_block=...
// Times are medians of 5 batches.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../common/mi_limits.h"
#include "../track/live_table.h"

namespace {

using mi::track::LiveTable;

constexpr uint64_t kLongBase = 0x7f0000000010ull;   // long-lived blocks, 80 bytes apart
constexpr uint64_t kShortBase = 0x7e0000000010ull;  // short-lived ones, 48 bytes apart
constexpr int kBatches = 5;

double now_ns() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A table of the default capacity; exits when it cannot be mapped.
void init(LiveTable& t) {
  if (!t.init(mi::limits::kTableSize.default_value)) {
    std::fprintf(stderr, "bench_live_table: cannot map the table\n");
    std::exit(1);
  }
}

// Short-lived pairs, 64 in flight, over 100k addresses of their own, behind
// `live` long-lived blocks recorded in address order.
void behind(size_t live) {
  LiveTable t;
  init(t);
  for (size_t i = 0; i < live; ++i) t.insert(kLongBase + i * 80, 64, i, 1);
  constexpr size_t kCycle = 100000, kPairs = 1000000;
  auto run = [&](size_t pairs) {
    for (size_t k = 0; k < pairs; k += 64) {
      for (size_t j = 0; j < 64; ++j) t.insert(kShortBase + (k + j) % kCycle * 48, 64, 0, 2);
      for (size_t j = 0; j < 64; ++j) t.remove(kShortBase + (k + j) % kCycle * 48, nullptr);
    }
  };
  run(kCycle);  // every short-lived page recorded once
  std::vector<double> ns;
  for (int b = 0; b < kBatches; ++b) {
    const double t0 = now_ns();
    run(kPairs);
    ns.push_back((now_ns() - t0) / kPairs);
  }
  std::printf("live_table behind live=%zu pair_ns=%.1f\n", live, median(ns));
  t.destroy();
}

// `live` blocks recorded in shuffled order (a page's blocks at different
// times), then random ones removed and recorded again.
void steady(size_t live) {
  LiveTable t;
  init(t);
  std::vector<uint64_t> a(live);
  for (size_t i = 0; i < live; ++i) a[i] = kLongBase + i * 80;
  std::mt19937_64 rng(1);
  std::shuffle(a.begin(), a.end(), rng);
  for (const uint64_t x : a) t.insert(x, 64, 0, 1);
  constexpr size_t kOps = 200000;
  std::vector<double> rm, in;
  for (int b = 0; b < kBatches; ++b) {
    std::vector<uint64_t> pick(kOps);
    for (auto& x : pick) x = a[rng() % live];
    std::sort(pick.begin(), pick.end());
    pick.erase(std::unique(pick.begin(), pick.end()), pick.end());
    std::shuffle(pick.begin(), pick.end(), rng);
    const double t0 = now_ns();
    for (const uint64_t x : pick) t.remove(x, nullptr);
    const double t1 = now_ns();
    for (const uint64_t x : pick) t.insert(x, 64, 0, 1);
    const double t2 = now_ns();
    rm.push_back((t1 - t0) / static_cast<double>(pick.size()));
    in.push_back((t2 - t1) / static_cast<double>(pick.size()));
  }
  std::printf("live_table steady live=%zu remove_ns=%.1f insert_ns=%.1f\n", live, median(rm),
              median(in));
  t.destroy();
}

// After a peak of `peak` live blocks, all freed, 10k live: frees of
// addresses never recorded (most frees in sample mode) over 1 GiB of heap.
void miss(size_t peak) {
  LiveTable t;
  init(t);
  for (size_t i = 0; i < peak; ++i) t.insert(kLongBase + i * 80, 64, i, 1);
  for (size_t i = 0; i < peak; ++i) t.remove(kLongBase + i * 80, nullptr);
  for (size_t i = 0; i < 10000; ++i) t.insert(kLongBase + i * 80, 64, i, 1);
  std::mt19937_64 rng(2);
  constexpr size_t kOps = 1000000;
  std::vector<uint64_t> addrs(kOps);
  for (auto& x : addrs) x = 0x560000000000ull + (rng() % (uint64_t{1} << 26)) * 16;
  std::vector<double> ns;
  for (int b = 0; b < kBatches; ++b) {
    const double t0 = now_ns();
    for (const uint64_t x : addrs) t.remove(x, nullptr);
    ns.push_back((now_ns() - t0) / kOps);
  }
  std::printf("live_table miss peak=%zu remove_ns=%.1f\n", peak, median(ns));
  t.destroy();
}

// Resident bytes per live block: blocks 80 bytes apart (glibc's 64-byte
// blocks, packed) or one per 64 KiB (a heap spread thin).
void resident(const char* layout, uint64_t stride, size_t live) {
  LiveTable t;
  init(t);
  for (size_t i = 0; i < live; ++i) t.insert(kLongBase + i * stride, 64, i, 1);
  std::printf("live_table resident layout=%s live=%zu bytes_per_block=%zu\n", layout, live,
              t.resident_bytes() / live);
  t.destroy();
}

}  // namespace

int main() {
  for (const size_t n : {20000, 100000, 1000000}) behind(n);
  for (const size_t n : {100000, 1000000}) steady(n);
  miss(1000000);
  for (const size_t n : {10000, 100000, 1000000}) {
    resident("dense", 80, n);
    resident("sparse", 65536, n);
  }
  return 0;
}
