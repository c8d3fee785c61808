// W8A8 (DType::kI8) matmul kernels for the x86 levels: int8 weight rows with one f32
// scale each, times int8 activation rows with one scale per token (kQ8Token, see
// kernels.h). Included by kernels_avx2.cc and kernels_avx512.cc after
// kernels_x86_impl.h, whose dot_u8s8 is vpmaddubsw + vpmaddwd on AVX2 and VNNI's
// vpdpbusd on AVX-512, so one source serves both levels.
//
// The products: vpmaddubsw / vpdpbusd multiply unsigned by signed bytes, so the
// weight's sign moves onto the activation (vpsignb) and |w| (at most 128, read as
// unsigned) multiplies it. Activations are in [-127, 127] (quantize_q8_token), so a
// pair of products is at most 2 * 128 * 127 = 32512 and fits vpmaddubsw's int16, and
// negating an activation never overflows. Every dot is the exact int32 sum; the
// result is float(sum) * (w_scale * x_scale), the scalar kernel's operations, so all
// levels and both kernels here give the same bits whatever the batch.
//
// The packed form (8-row half panels: group g of 32 bytes is one register, lane r =
// row r's q[4g .. 4g+3]) and the loop over it are shared with the ARM levels
// (w8a8_panels.h); this file has the x86 register tile.
#pragma once

#if !defined(__AVX2__)
#error "kernels_x86_w8a8.h needs -mavx2"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/w8a8_panels.h"

namespace dserve::cpu {
namespace {

// Tokens per register tile: NT int32 accumulators plus the weight vectors and
// temporaries fit 16 registers (AVX2) or 32 (AVX-512).
#if defined(__AVX512F__)
constexpr int kI8Tokens = 8;
#else
constexpr int kI8Tokens = 6;
#endif

inline __m256i i8_bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// MatmulI8Fn: one row and token at a time, 32 bytes per step, the k % 32 tail in
// scalar code (the integer sum is the same either way).
void matmul_i8_x86(const uint8_t* w, size_t w_stride, const float* w_scales, const uint8_t* x,
                   size_t x_stride, int64_t k, int64_t n_rows, int64_t n_tokens, float* y,
                   int64_t y_stride) {
  const int64_t k32 = k / 32 * 32;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const Q8TokenRow a = q8token_row(x + t * x_stride, k);
    for (int64_t r = 0; r < n_rows; ++r) {
      const auto* q = reinterpret_cast<const int8_t*>(w + r * w_stride);
      __m256i acc = _mm256_setzero_si256();
      for (int64_t j = 0; j < k32; j += 32) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + j));
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs + j));
        acc = dot_u8s8(acc, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
      }
      int32_t sum = hsum256_epi32(acc);
      for (int64_t j = k32; j < k; ++j) sum += int32_t{q[j]} * int32_t{a.qs[j]};
      y[t * y_stride + r] = static_cast<float>(sum) * (w_scales[r] * a.d);
    }
  }
}

// y[t * y_stride + r] for the half panel's rows r < n_rows and NT tokens whose
// activation rows are x_rows[t] (scales x_scales[t]).
template <int NT>
struct I8HalfTileX86 {
  static void run(const uint8_t* half, int64_t k, const int8_t* const* x_rows, const float* x_scales, float* y,
                  int64_t y_stride, int n_rows);
};

template <int NT>
void I8HalfTileX86<NT>::run(const uint8_t* half, int64_t k, const int8_t* const* x_rows, const float* x_scales,
                            float* y, int64_t y_stride, int n_rows) {
  __m256i acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_si256();
  for (int64_t g = 0; g < k / 4; ++g) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half + 32 * g));
    const __m256i wa = _mm256_sign_epi8(wv, wv);
    for (int t = 0; t < NT; ++t) {
      acc[t] = dot_u8s8(acc[t], wa, _mm256_sign_epi8(i8_bcast4(x_rows[t] + 4 * g), wv));
    }
  }
  const __m256 ws = _mm256_loadu_ps(reinterpret_cast<const float*>(half + 8 * k));
  const __m256i mask =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(n_rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int t = 0; t < NT; ++t) {
    const __m256 scale = _mm256_mul_ps(ws, _mm256_set1_ps(x_scales[t]));
    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[t]), scale);
    if (n_rows == kI8HalfRows) {
      _mm256_storeu_ps(y + t * y_stride, v);
    } else {
      _mm256_maskstore_ps(y + t * y_stride, mask, v);
    }
  }
}

inline void add_x86_w8a8(KernelTable& t) {
  const int i = static_cast<int>(DType::kI8);
  t.matmul_i8 = matmul_i8_x86;
  t.pack_i8 = pack_i8_halves;
  t.matmul_packed[i] = matmul_i8_packed_halves<kI8Tokens, I8HalfTileX86>;
  t.packed_layout[i].block_bytes = 2 * 8 * 32;  // 16 rows x 32 bytes per 32 columns
  t.packed_layout[i].panel_extra_bytes = 2 * 4 * kI8HalfRows;
}

}  // namespace
}  // namespace dserve::cpu
