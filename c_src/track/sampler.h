// Byte-Poisson sampling, as jemalloc and tcmalloc do it: sample points fall
// on the stream of allocated bytes as a Poisson process with mean interval
// `mean` bytes, so an allocation of n bytes is sampled with probability
// p(n) = 1 - exp(-n / mean), independently of everything else. Weighting a
// sampled block by 1/p(n) (count) and n/p(n) (bytes) gives unbiased
// estimates of the live population: that estimator is
// common/mi_sampling.h's, shared with the readers.
//
// SamplerState belongs to one thread. Never allocates; no locks.
#ifndef MALLOCINFO_TRACK_SAMPLER_H
#define MALLOCINFO_TRACK_SAMPLER_H

#include <cstdint>

namespace mi::track {

struct SamplerState {
  int64_t bytes_until_sample;  // <= 0: not yet drawn
  uint64_t rng;                // xorshift64* state; 0: not yet seeded
};

// Seeds the state (tests pass a fixed seed; the tracker mixes thread and
// time). Draws the first interval.
void sampler_seed(SamplerState& s, uint64_t seed, uint64_t mean);

// A draw from Exp(mean), at least 1.
int64_t sampler_next_interval(SamplerState& s, uint64_t mean);

// True when the allocation of `size` bytes is a sample point.
inline bool sampler_hit(SamplerState& s, uint64_t size, uint64_t mean) {
  s.bytes_until_sample -= static_cast<int64_t>(size);
  if (s.bytes_until_sample > 0) return false;
  // Several sample points may fall inside one large block: it is still one
  // sample, weighted by mi::sampling::weight() (which accounts for that
  // probability).
  s.bytes_until_sample = sampler_next_interval(s, mean);
  return true;
}

}  // namespace mi::track

#endif
