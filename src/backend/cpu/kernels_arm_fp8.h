// FP8 E4M3 (DType::kF8_E4M3) matmul kernel for the ARM levels: one byte per weight,
// converted to f32 in registers, times F32 activations, with the block scales applied
// once per block of the reduction (kernels.h, MatmulF8Fn). Included by
// kernels_arm_impl.h (inside its anonymous namespace, for each level's flags).
//
// The conversion is the x86 levels' (kernels_x86_fp8.h): a byte s.eeee.mmm,
// sign-extended to 16 bits, shifted left by 7 and masked with 0xBF80 is the IEEE half
// s.0eeee.mmm0000000 = the E4M3 value times 2^-8, normal or subnormal; FCVTL widens it
// exactly and a multiply by 256 gives the value. E4M3's NaN (s.1111.111) is made a
// half NaN first.
//
// A register tile is NR rows x NT tokens, 8 columns (two 4-lane vectors) per step;
// each (row, token) pair has its own block sums and accumulators, and the same
// operations whatever NR and NT are (batch invariance). block_cols and col0 are
// multiples of 16, so only a short last block has a scalar tail.
#pragma once

namespace dserve::cpu {
namespace {

constexpr int kF8RowsNeon = 1, kF8TokensNeon = 4, kF8DecodeRowsNeon = 4;

inline int16x8_t f8x8_to_f16_bits(int8x8_t bytes) {
  const int16x8_t h = vandq_s16(vshlq_n_s16(vmovl_s8(bytes), 7), vdupq_n_s16(-0x4080));
  const uint16x8_t nan = vceqq_s16(vandq_s16(h, vdupq_n_s16(0x3f80)), vdupq_n_s16(0x3f80));
  return vorrq_s16(h, vandq_s16(vreinterpretq_s16_u16(nan), vdupq_n_s16(0x7c00)));
}

// 8 weights from p as two vectors of floats.
inline void f8_load8(const uint8_t* p, float32x4_t* lo, float32x4_t* hi) {
  const float16x8_t h = vreinterpretq_f16_s16(f8x8_to_f16_bits(vreinterpret_s8_u8(vld1_u8(p))));
  *lo = vmulq_n_f32(vcvt_f32_f16(vget_low_f16(h)), 256.0f);
  *hi = vmulq_n_f32(vcvt_high_f32_f16(h), 256.0f);
}

inline float f8_load1_neon(uint8_t b) {
  const float16x8_t h = vreinterpretq_f16_s16(f8x8_to_f16_bits(vdup_n_s8(static_cast<int8_t>(b))));
  return vgetq_lane_f32(vcvt_f32_f16(vget_low_f16(h)), 0) * 256.0f;
}

template <int NR, int NT>
void f8_tile_neon(const uint8_t* w, size_t w_stride, const BlockScales& scales, const float* const* x,
                  int64_t k, float* y, int64_t y_stride) {
  const int64_t bc = scales.block_cols;
  const uint8_t* q[NR];
  const float* s[NR];
  for (int r = 0; r < NR; ++r) {
    q[r] = w + r * w_stride;
    s[r] = scales.row(r);
  }
  float32x4_t acc[NR][NT][2];
  float tail[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      acc[r][t][0] = acc[r][t][1] = vdupq_n_f32(0.0f);
      tail[r][t] = 0.0f;
    }
  }
  int64_t b = 0;  // the block: columns [b0, end)
  for (int64_t b0 = 0; b0 < k; ++b) {
    const int64_t end = (b + 1) * bc - scales.col0 < k ? (b + 1) * bc - scales.col0 : k;
    float32x4_t block[NR][NT][2];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) block[r][t][0] = block[r][t][1] = vdupq_n_f32(0.0f);
    }
    int64_t i = b0;
    for (; i + 8 <= end; i += 8) {
      float32x4_t xv[NT][2];
      for (int t = 0; t < NT; ++t) {
        xv[t][0] = vld1q_f32(x[t] + i);
        xv[t][1] = vld1q_f32(x[t] + i + 4);
      }
      for (int r = 0; r < NR; ++r) {
        float32x4_t lo, hi;
        f8_load8(q[r] + i, &lo, &hi);
        for (int t = 0; t < NT; ++t) {
          block[r][t][0] = vfmaq_f32(block[r][t][0], lo, xv[t][0]);
          block[r][t][1] = vfmaq_f32(block[r][t][1], hi, xv[t][1]);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      const float sv = s[r][b];
      for (int t = 0; t < NT; ++t) {
        acc[r][t][0] = vfmaq_n_f32(acc[r][t][0], block[r][t][0], sv);
        acc[r][t][1] = vfmaq_n_f32(acc[r][t][1], block[r][t][1], sv);
      }
    }
    for (; i < end; ++i) {  // only in a short last block
      for (int r = 0; r < NR; ++r) {
        const float wi = f8_load1_neon(q[r][i]);
        for (int t = 0; t < NT; ++t) tail[r][t] = fma1(wi, x[t][i], tail[r][t]);
      }
    }
    b0 = end;
  }
  const int64_t last = b - 1;
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      const float sum = vaddvq_f32(vaddq_f32(acc[r][t][0], acc[r][t][1]));
      y[t * y_stride + r] = fma1(tail[r][t], s[r][last], sum);
    }
  }
}

void matmul_f8_neon(const uint8_t* w, size_t w_stride, const BlockScales& scales, const uint8_t* x,
                    size_t x_stride, int64_t k, int64_t n_rows, int64_t n_tokens, float* y,
                    int64_t y_stride) {
  if (k <= 0) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = 0; r < n_rows; ++r) y[t * y_stride + r] = 0.0f;
    }
    return;
  }
  constexpr int kMaxRows = kF8RowsNeon > kF8DecodeRowsNeon ? kF8RowsNeon : kF8DecodeRowsNeon;
  const int max_rows = n_tokens == 1 ? kF8DecodeRowsNeon : kF8RowsNeon;
  for (int64_t r0 = 0; r0 < n_rows; r0 += max_rows) {
    const int nr = static_cast<int>(n_rows - r0 < max_rows ? n_rows - r0 : max_rows);
    const BlockScales s = scales.from_row(r0);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kF8TokensNeon) {
      const int nt = static_cast<int>(n_tokens - t0 < kF8TokensNeon ? n_tokens - t0 : kF8TokensNeon);
      const float* xs[kF8TokensNeon];
      for (int t = 0; t < nt; ++t) xs[t] = reinterpret_cast<const float*>(x + (t0 + t) * x_stride);
      float* out = y + t0 * y_stride + r0;
      dispatch_tokens<kMaxRows>(nr, [&](auto r) {
        dispatch_tokens<kF8TokensNeon>(nt, [&](auto t) {
          f8_tile_neon<decltype(r)::value, decltype(t)::value>(w + r0 * w_stride, w_stride, s, xs, k,
                                                               out, y_stride);
        });
      });
    }
  }
}

}  // namespace
}  // namespace dserve::cpu
