// Float rows to Q8_0 blocks, for weights dserve derives at load from a file's own
// (DeepSeek's W_UK regrouped along the latent for MLA's expanded form): per block of
// 32 values the scale max|x| / 127 as the nearest IEEE half at or above it, each value
// x / scale rounded to the nearest integer (ties to even), so within half a step.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace dserve {

// dst: n / 32 block_q8_0 (quant_blocks.h); n a multiple of 32.
void quantize_row_q8_0(const float* x, int64_t n, void* dst);

// x as hi + lo, two Q8_0 rows: hi = quantize_row_q8_0(x), lo = the same of what hi
// leaves (x - hi). Within 2^-15 of each block's largest |x| (plus half a step of
// the second scale's half precision, at most 2^-25 where it is subnormal), where one
// Q8_0 row is within 2^-8. dst_hi and dst_lo: n / 32 block_q8_0 each.
void quantize_row_q8_0_two_terms(const float* x, int64_t n, void* dst_hi, void* dst_lo);

}  // namespace dserve
