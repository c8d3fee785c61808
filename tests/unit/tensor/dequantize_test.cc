// Hand-built blocks with known values for every DType. The bit-exact comparison
// against gguf-py's numpy dequantiser lives in tests/reference/test_gguf_dequant.py.
#include "tensor/dequantize.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace dserve {
namespace {

TEST(Dequantize, F32F16BF16) {
  const float in[4] = {1.5f, -2.0f, 0.0f, 65504.0f};
  float out[4];
  dequantize_row(DType::kF32, in, out, 4);
  EXPECT_EQ(std::memcmp(in, out, sizeof(in)), 0);

  uint16_t h[4], b[4];
  for (int i = 0; i < 4; ++i) {
    h[i] = f32_to_f16(in[i]);
    b[i] = f32_to_bf16(in[i]);
  }
  dequantize_row(DType::kF16, h, out, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], in[i]);
  dequantize_row(DType::kBF16, b, out, 4);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], in[i]);
  EXPECT_EQ(out[3], 65536.0f);  // 65504 rounds to 65536 in bf16
}

TEST(Dequantize, Q8_0) {
  block_q8_0 blk[2];
  for (int b = 0; b < 2; ++b) {
    blk[b].d = f32_to_f16(b == 0 ? 0.5f : -0.25f);
    for (int j = 0; j < 32; ++j) blk[b].qs[j] = static_cast<int8_t>(j * 8 - 128);
  }
  float out[64];
  dequantize_row(DType::kQ8_0, blk, out, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(out[j], 0.5f * (j * 8 - 128));
    EXPECT_EQ(out[32 + j], -0.25f * (j * 8 - 128));
  }
}

TEST(Dequantize, Q4_0AndQ4_1) {
  block_q4_0 a;
  block_q4_1 b;
  a.d = f32_to_f16(2.0f);
  b.d = f32_to_f16(0.5f);
  b.m = f32_to_f16(-1.0f);
  for (int j = 0; j < 16; ++j) {
    a.qs[j] = b.qs[j] = static_cast<uint8_t>((j & 0xF) | ((15 - j) << 4));
  }
  float out[32];
  dequantize_row(DType::kQ4_0, &a, out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * (j - 8));
    EXPECT_EQ(out[16 + j], 2.0f * (15 - j - 8));
  }
  dequantize_row(DType::kQ4_1, &b, out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * j - 1.0f);
    EXPECT_EQ(out[16 + j], 0.5f * (15 - j) - 1.0f);
  }
}

// Packs 8 (scale, min) 6-bit pairs the way q_k_scale_min() unpacks them.
void pack_scales(const uint8_t sc[8], const uint8_t mn[8], uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
}

TEST(Dequantize, ScaleMinPacking) {
  const uint8_t sc[8] = {0, 1, 63, 17, 42, 63, 5, 32};
  const uint8_t mn[8] = {63, 2, 0, 33, 21, 16, 63, 7};
  uint8_t packed[12];
  pack_scales(sc, mn, packed);
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    q_k_scale_min(j, packed, &s, &m);
    EXPECT_EQ(s, sc[j]) << j;
    EXPECT_EQ(m, mn[j]) << j;
  }
}

TEST(Dequantize, Q4_KAndQ5_K) {
  const uint8_t sc[8] = {1, 2, 3, 4, 5, 6, 7, 63};
  const uint8_t mn[8] = {0, 1, 2, 3, 4, 5, 6, 62};
  block_q4_K k4;
  block_q5_K k5;
  k4.d = k5.d = f32_to_f16(0.5f);
  k4.dmin = k5.dmin = f32_to_f16(0.25f);
  pack_scales(sc, mn, k4.scales);
  pack_scales(sc, mn, k5.scales);
  // Element e: sub-block s = e / 32, 4-bit value v(e) = (e * 7) & 15, fifth bit e & 1.
  auto v = [](int e) { return (e * 7) & 15; };
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      k4.qs[32 * g + l] = k5.qs[32 * g + l] =
          static_cast<uint8_t>(v(64 * g + l) | (v(64 * g + 32 + l) << 4));
    }
  }
  for (int l = 0; l < 32; ++l) {
    uint8_t h = 0;
    for (int g = 0; g < 4; ++g) {
      h |= static_cast<uint8_t>(((64 * g + l) & 1) << (2 * g));
      h |= static_cast<uint8_t>(((64 * g + 32 + l) & 1) << (2 * g + 1));
    }
    k5.qh[l] = h;
  }
  float out4[256], out5[256];
  dequantize_row(DType::kQ4_K, &k4, out4, 256);
  dequantize_row(DType::kQ5_K, &k5, out5, 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    const float d = 0.5f * sc[s], m = 0.25f * mn[s];
    EXPECT_EQ(out4[e], d * v(e) - m) << e;
    EXPECT_EQ(out5[e], d * (v(e) + 16 * (e & 1)) - m) << e;
  }
}

TEST(Dequantize, Q6_K) {
  block_q6_K k;
  k.d = f32_to_f16(0.125f);
  for (int s = 0; s < 16; ++s) k.scales[s] = static_cast<int8_t>(s * 9 - 70);
  // Element e has 6-bit value q(e) = (e * 5 + 3) & 63.
  auto q = [](int e) { return (e * 5 + 3) & 63; };
  std::memset(k.ql, 0, sizeof(k.ql));
  std::memset(k.qh, 0, sizeof(k.qh));
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    // quarter 0: ql[l] low, 1: ql[l+32] low, 2: ql[l] high, 3: ql[l+32] high.
    uint8_t& lo = k.ql[64 * half + l + (quarter & 1) * 32];
    lo |= static_cast<uint8_t>((q(e) & 0xF) << ((quarter >> 1) * 4));
    k.qh[32 * half + l] |= static_cast<uint8_t>((q(e) >> 4) << (2 * quarter));
  }
  float out[256];
  dequantize_row(DType::kQ6_K, &k, out, 256);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(out[e], 0.125f * k.scales[e / 16] * (q(e) - 32)) << e;
  }
}

}  // namespace
}  // namespace dserve
