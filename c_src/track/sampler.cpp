#include "sampler.h"

#include <cmath>

namespace mi::track {

namespace {
uint64_t next_u64(uint64_t& x) {
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  return x * 0x2545F4914F6CDD1Dull;
}
}  // namespace

void sampler_seed(SamplerState& s, uint64_t seed, uint64_t mean) {
  s.rng = seed != 0 ? seed : 0x9E3779B97F4A7C15ull;
  s.bytes_until_sample = sampler_next_interval(s, mean);
}

int64_t sampler_next_interval(SamplerState& s, uint64_t mean) {
  if (s.rng == 0) s.rng = 0x9E3779B97F4A7C15ull;
  // 53 random bits -> u in (0, 1]; -ln(u) ~ Exp(1).
  const double u = (static_cast<double>(next_u64(s.rng) >> 11) + 1.0) * 0x1.0p-53;
  const double x = -std::log(u) * static_cast<double>(mean);
  if (x < 1.0) return 1;
  if (x > 9.0e18) return INT64_MAX;
  return static_cast<int64_t>(x);
}

}  // namespace mi::track
