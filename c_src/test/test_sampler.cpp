// Catch2 tests for byte-Poisson sampling: the sample points
// (track/sampler) and the estimator both link units share
// (common/mi_sampling.h).
#include "catch.h"

#include <cmath>
#include <cstdint>

#include "../common/mi_sampling.h"
#include "../track/sampler.h"

using namespace mi::track;

TEST_CASE("sampler: p(n) and unbiased estimates", "[track][sampler]") {
  CHECK(mi::sampling::probability(0, 1000) == 0.0);
  CHECK(mi::sampling::probability(1000, 1000) == Approx(1 - std::exp(-1.0)));
  CHECK(mi::sampling::probability(1 << 30, 1000) == Approx(1.0));

  // 2,000,000 allocations of mixed sizes, mean interval 64 KiB: the
  // weighted sample must estimate count and bytes within a few percent.
  SamplerState s{};
  const uint64_t mean = 64 * 1024;
  sampler_seed(s, 12345, mean);
  const uint64_t sizes[] = {16, 48, 200, 1000, 4096, 100000};
  double est_count = 0, est_bytes = 0, true_count = 0, true_bytes = 0;
  uint64_t samples = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    const uint64_t n = sizes[i % 6];
    true_count += 1;
    true_bytes += static_cast<double>(n);
    if (sampler_hit(s, n, mean)) {
      const double p = mi::sampling::probability(n, mean);
      est_count += 1 / p;
      est_bytes += static_cast<double>(n) / p;
      ++samples;
    }
  }
  INFO("samples " << samples << " est_count " << est_count << " est_bytes " << est_bytes);
  CHECK(samples > 1000);
  CHECK(est_bytes == Approx(true_bytes).epsilon(0.05));
  CHECK(est_count == Approx(true_count).epsilon(0.10));
  // Intervals are exponential with the right mean.
  double sum = 0;
  for (int i = 0; i < 100000; ++i) sum += static_cast<double>(sampler_next_interval(s, mean));
  CHECK(sum / 100000 == Approx(static_cast<double>(mean)).epsilon(0.02));
}

TEST_CASE("sampling: one rule for a zero mean and for empty blocks", "[track][sampler]") {
  using mi::sampling::probability;
  using mi::sampling::weight;
  // A zero mean puts a sample point on every byte: every block is sampled
  // and stands for itself, for the tracker and the readers alike.
  CHECK(probability(1, 0) == 1.0);
  CHECK(probability(100, 0) == 1.0);
  CHECK(weight(1, 0).count == 1.0);
  CHECK(weight(1, 0).bytes == 1.0);
  CHECK(weight(100, 0).bytes == 100.0);
  // A block of 0 bytes is never a sample point; recorded anyway, it
  // stands for itself.
  CHECK(weight(0, 1000).count == 1.0);
  CHECK(weight(0, 1000).bytes == 0.0);
  // Otherwise 1/p blocks of size/p bytes.
  const double p = 1 - std::exp(-1.0);
  CHECK(weight(1000, 1000).count == Approx(1 / p));
  CHECK(weight(1000, 1000).bytes == Approx(1000 / p));
}
