// Counter-based random numbers: a uniform draw that is a pure function of
// (seed, stream, counter), with no state carried between draws.
//
// A request's step-t draw is uniform01(seed, sample_index, t). It therefore depends on
// nothing else in the batch, nor on which thread samples it, nor on whether the
// request was preempted and recomputed: the same seed gives the same tokens.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace dserve {

// SplitMix64's finaliser: a bijection on 64 bits with full avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A double in [0, 1) with 53 random bits.
inline double uniform01(uint64_t seed, uint64_t stream, uint64_t counter) {
  const uint64_t h = mix64(mix64(mix64(seed) ^ stream) ^ (counter * 0xD6E8FEB86659FD93ull));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace dserve
