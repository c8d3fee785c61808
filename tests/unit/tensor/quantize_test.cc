// quantize_row_q8_0 and its two-term form against their contract, read back through
// the reference dequantiser (itself checked bit for bit against gguf-py's in
// tests/reference/test_gguf_dequant.py).
#include "tensor/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "tensor/dequantize.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace dserve {
namespace {

std::vector<float> random_row(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  x[5] = 0.3f;    // an outlier sets its block's scale
  x[40] = -0.2f;  // and a negative one the next block's
  return x;
}

float block_amax(const std::vector<float>& x, int64_t b) {
  float m = 0.0f;
  for (int i = 0; i < kQK8; ++i) m = std::max(m, std::fabs(x[b * kQK8 + i]));
  return m;
}

TEST(QuantizeQ8_0, ScaleIsBlockMaxOver127AndValuesWithinHalfAStep) {
  constexpr int64_t kN = 512;
  const std::vector<float> x = random_row(kN, 1);
  std::vector<block_q8_0> q(kN / kQK8);
  quantize_row_q8_0(x.data(), kN, q.data());
  std::vector<float> back(kN);
  dequantize_row(DType::kQ8_0, q.data(), back.data(), kN);
  for (int64_t b = 0; b < kN / kQK8; ++b) {
    // The smallest half at or above max / 127.
    const float d = f16_to_f32(q[b].d), want = block_amax(x, b) / 127.0f;
    EXPECT_GE(d, want) << "block " << b;
    EXPECT_LT(f16_to_f32(static_cast<uint16_t>(q[b].d - 1)), want) << "block " << b;
    for (int i = 0; i < kQK8; ++i) {
      EXPECT_LE(std::fabs(x[b * kQK8 + i] - back[b * kQK8 + i]), 0.5f * d * (1.0f + 1e-6f))
          << "block " << b << " value " << i;
    }
  }
  EXPECT_EQ(q[0].qs[5], 127);
  EXPECT_EQ(q[1].qs[8], -127);
}

TEST(QuantizeQ8_0, ValuesAlreadyOnTheGridComeBackExactly) {
  block_q8_0 src[2];
  for (int b = 0; b < 2; ++b) {
    src[b].d = f32_to_f16(b == 0 ? 0.0078125f : 3.0f);
    for (int i = 0; i < kQK8; ++i) src[b].qs[i] = static_cast<int8_t>((i * 37) % 255 - 127);
    src[b].qs[3] = 127;  // the block's largest magnitude, so its scale is found again
  }
  std::vector<float> x(64);
  dequantize_row(DType::kQ8_0, src, x.data(), 64);
  block_q8_0 hi[2], lo[2];
  quantize_row_q8_0_two_terms(x.data(), 64, hi, lo);
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(hi[b].d, src[b].d);
    for (int i = 0; i < kQK8; ++i) EXPECT_EQ(hi[b].qs[i], src[b].qs[i]);
    for (int i = 0; i < kQK8; ++i) EXPECT_EQ(lo[b].qs[i], 0);
  }
}

TEST(QuantizeQ8_0, TwoTermsWithinTwoToTheMinus15OfTheBlockMax) {
  constexpr int64_t kN = 1024;
  const std::vector<float> x = random_row(kN, 2);
  std::vector<block_q8_0> hi(kN / kQK8), lo(kN / kQK8);
  quantize_row_q8_0_two_terms(x.data(), kN, hi.data(), lo.data());
  std::vector<float> a(kN), b(kN), one(kN);
  dequantize_row(DType::kQ8_0, hi.data(), a.data(), kN);
  dequantize_row(DType::kQ8_0, lo.data(), b.data(), kN);
  quantize_row_q8_0(x.data(), kN, hi.data());
  dequantize_row(DType::kQ8_0, hi.data(), one.data(), kN);
  double err_two = 0, err_one = 0;
  for (int64_t blk = 0; blk < kN / kQK8; ++blk) {
    // 2^-15 of the block's largest value, and half a step of a subnormal half scale.
    const float bound = block_amax(x, blk) * std::ldexp(1.0f, -15) + std::ldexp(1.0f, -25);
    for (int i = 0; i < kQK8; ++i) {
      const int64_t j = blk * kQK8 + i;
      EXPECT_LE(std::fabs(x[j] - (a[j] + b[j])), bound) << "value " << j;
      err_two += std::fabs(x[j] - (a[j] + b[j]));
      err_one += std::fabs(x[j] - one[j]);
    }
  }
  EXPECT_LT(err_two * 100, err_one);  // the second term takes off >99% of the error
}

TEST(QuantizeQ8_0, ZeroBlockHasZeroScale) {
  std::vector<float> x(32, 0.0f);
  block_q8_0 hi, lo;
  quantize_row_q8_0_two_terms(x.data(), 32, &hi, &lo);
  EXPECT_EQ(f16_to_f32(hi.d), 0.0f);
  EXPECT_EQ(f16_to_f32(lo.d), 0.0f);
  for (int i = 0; i < kQK8; ++i) EXPECT_EQ(hi.qs[i] | lo.qs[i], 0);
}

}  // namespace
}  // namespace dserve
