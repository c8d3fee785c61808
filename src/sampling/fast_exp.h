// exp_weights: the unnormalised softmax weights exp((x - max) * inv_t) of a whole
// logits row, as a loop the compiler vectorises: at the baseline ISA (SSE2), about 4x
// faster than calling std::exp per id at a 152k vocabulary, and in a second copy for
// AVX-512 chosen at run time (about 4x faster again). Both copies do the same IEEE
// operations in the same order (no FMA contraction), so they give the same bits: a
// seeded request samples the same tokens on any x86 machine.
//
// exp(y) for y <= 0: y = k ln2 + r with |r| <= ln2 / 2 (ln2 split in two parts, so the
// reduction is exact to float precision even for y near -87), e^r by its Taylor series
// to r^7 (truncation error < 6e-9 relative), times 2^k built in the exponent bits.
// Relative error: a few float ulps. y < -87 (weights under 1.6e-38 of the best, and
// masked -inf logits) gives exactly 0.
//
// Thread-safety: pure function.
#pragma once

#include <span>

namespace dserve {

// out[i] = exp((in[i] - max) * inv_t); requires in[i] <= max (or -inf) and inv_t > 0.
void exp_weights(std::span<const float> in, float max, float inv_t, std::span<float> out);

// For tests: the baseline copy, and the widest copy this CPU runs (false, nothing
// written, when that is the baseline).
void exp_weights_baseline(std::span<const float> in, float max, float inv_t,
                          std::span<float> out);
bool exp_weights_widest(std::span<const float> in, float max, float inv_t,
                        std::span<float> out);

}  // namespace dserve
