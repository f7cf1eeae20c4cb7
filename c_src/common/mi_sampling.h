// Byte-Poisson sampling's estimator, the one both .so use: the tracker
// (track/) weighs a sampled block into its counters with it, the readers
// (sites/, the NIF) weigh a sampled live block into its call site.
//
// Sample points fall on the stream of allocated bytes as a Poisson process
// with a mean interval of `mean` bytes (track/sampler.h draws them), so a
// block of n bytes is sampled with probability p(n) = 1 - exp(-n / mean),
// independently of everything else. Counting a sampled block as 1/p(n)
// blocks of n/p(n) bytes makes the sums unbiased estimates of the whole
// population (jemalloc and tcmalloc weigh their samples the same way).
//
// Header-only and hook-safe: no allocation, no lock, no state, no
// exception; thread-safe. expm1 is libm's, which the interposer links.
#ifndef MALLOCINFO_COMMON_MI_SAMPLING_H
#define MALLOCINFO_COMMON_MI_SAMPLING_H

#include <cmath>
#include <cstdint>

namespace mi::sampling {

// p(size): the probability that a block of `size` bytes is sampled, in
// [0, 1]. A mean of 0 puts a sample point on every byte: every block is
// sampled (p = 1). A block of 0 bytes is never a sample point (p = 0).
inline double probability(uint64_t size, uint64_t mean) {
  if (mean == 0) return 1.0;
  return -std::expm1(-static_cast<double>(size) / static_cast<double>(mean));
}

// What one sampled block stands for.
struct Weight {
  double count;  // blocks: 1 / p
  double bytes;  // bytes: size / p
};

// The weight of a sampled block of `size` bytes. Where p is 0 (a block of
// 0 bytes, recorded anyway) the block stands for itself: {1, size}.
inline Weight weight(uint64_t size, uint64_t mean) {
  const double p = probability(size, mean);
  const double n = static_cast<double>(size);
  if (!(p > 0)) return Weight{1.0, n};
  return Weight{1.0 / p, n / p};
}

}  // namespace mi::sampling

#endif
