#include "tensor/quantize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/dequantize.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace dserve {

void quantize_row_q8_0(const float* x, int64_t n, void* dst) {
  auto* blocks = static_cast<block_q8_0*>(dst);
  for (int64_t b = 0; b < n / kQK8; ++b) {
    const float* v = x + b * kQK8;
    float amax = 0.0f;
    for (int i = 0; i < kQK8; ++i) amax = std::max(amax, std::fabs(v[i]));
    // The smallest half at or above max|x| / 127, so that no value needs more than
    // 127 steps: a scale rounded down would clip the largest ones, by up to a tenth of
    // the block where the scale is a subnormal half (a second term's often is).
    uint16_t d16 = f32_to_f16(amax / 127.0f);
    if (f16_to_f32(d16) < amax / 127.0f) ++d16;  // positive halves order as their bits
    const float d = f16_to_f32(d16);  // the scale as stored: the values divide by it
    blocks[b].d = d16;
    for (int i = 0; i < kQK8; ++i) {
      const float q = d > 0.0f ? std::nearbyint(v[i] / d) : 0.0f;
      blocks[b].qs[i] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
  }
}

void quantize_row_q8_0_two_terms(const float* x, int64_t n, void* dst_hi, void* dst_lo) {
  quantize_row_q8_0(x, n, dst_hi);
  std::vector<float> rest(static_cast<size_t>(n));
  dequantize_row(DType::kQ8_0, dst_hi, rest.data(), n);
  for (int64_t i = 0; i < n; ++i) rest[i] = x[i] - rest[i];
  quantize_row_q8_0(rest.data(), n, dst_lo);
}

}  // namespace dserve
