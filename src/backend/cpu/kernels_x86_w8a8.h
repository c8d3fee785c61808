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
// Packed half panel (8 rows; a 16-row panel is two halves one after the other):
//   q      k/4 vectors of 32 bytes, vector g lane r = row r's q[4g .. 4g+3]
//   scale  8 f32, the rows' scales in lane order
// Rows past the end of the matrix are zeros (they compute zeros never stored).
#pragma once

#if !defined(__AVX2__)
#error "kernels_x86_w8a8.h needs -mavx2"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels.h"

namespace dserve::cpu {
namespace {

constexpr int kI8HalfRows = 8;
// Tokens per register tile: NT int32 accumulators plus the weight vectors and
// temporaries fit 16 registers (AVX2) or 32 (AVX-512).
#if defined(__AVX512F__)
constexpr int kI8Tokens = 8;
#else
constexpr int kI8Tokens = 6;
#endif

constexpr int64_t i8_half_bytes(int64_t k) { return 8 * k + 4 * kI8HalfRows; }

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

// PackI8Fn: the layout above. Runs once per weight at load; plain copies suffice.
void pack_i8_x86(const uint8_t* w, size_t w_stride, const float* w_scales, int64_t n_rows,
                 int64_t k, uint8_t* out) {
  const int64_t half = i8_half_bytes(k);
  const int64_t n_halves =
      (n_rows + kMatmulPackRows - 1) / kMatmulPackRows * (kMatmulPackRows / kI8HalfRows);
  std::memset(out, 0, static_cast<size_t>(n_halves * half));
  for (int64_t row = 0; row < n_rows; ++row) {
    uint8_t* dst = out + row / kI8HalfRows * half;
    const int64_t r = row % kI8HalfRows;
    const uint8_t* src = w + row * w_stride;
    for (int64_t g = 0; g < k / 4; ++g) std::memcpy(dst + 32 * g + 4 * r, src + 4 * g, 4);
    std::memcpy(dst + 8 * k + 4 * r, &w_scales[row], 4);
  }
}

// y[t * y_stride + r] for the half panel's rows r < n_rows and NT tokens whose
// activation rows are x_rows[t] (scales x_scales[t]).
template <int NT>
inline void i8_half_tile(const uint8_t* half, int64_t k, const int8_t* const* x_rows,
                         const float* x_scales, float* y, int64_t y_stride, int n_rows) {
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

template <int NT>
void i8_half_tile_any(int nt, const uint8_t* half, int64_t k, const int8_t* const* x_rows,
                      const float* x_scales, float* y, int64_t y_stride, int n_rows) {
  if constexpr (NT >= 1) {
    if (nt == NT) {
      i8_half_tile<NT>(half, k, x_rows, x_scales, y, y_stride, n_rows);
    } else {
      i8_half_tile_any<NT - 1>(nt, half, k, x_rows, x_scales, y, y_stride, n_rows);
    }
  }
}

// MatmulPackedFn for kI8: activations are kQ8Token rows. Half panel by half panel,
// each serving every token of the call while it sits in L1/L2.
void matmul_i8_packed_x86(const uint8_t* packed, const uint8_t* x, int64_t k, int64_t n_rows,
                          int64_t n_tokens, float* y, int64_t y_stride) {
  const int64_t half = i8_half_bytes(k);
  const int64_t x_stride = act_row_bytes(ActFormat::kQ8Token, k);
  const int64_t n_halves = (n_rows + kI8HalfRows - 1) / kI8HalfRows;
  for (int64_t h = 0; h < n_halves; ++h) {
    const int nr = static_cast<int>(n_rows - h * kI8HalfRows < kI8HalfRows ? n_rows - h * kI8HalfRows
                                                                           : kI8HalfRows);
    const uint8_t* hp = packed + h * half;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kI8Tokens) {
      const int nt = static_cast<int>(n_tokens - t0 < kI8Tokens ? n_tokens - t0 : kI8Tokens);
      const int8_t* rows[kI8Tokens];
      float scales[kI8Tokens];
      for (int t = 0; t < nt; ++t) {
        const Q8TokenRow a = q8token_row(x + (t0 + t) * x_stride, k);
        rows[t] = a.qs;
        scales[t] = a.d;
      }
      i8_half_tile_any<kI8Tokens>(nt, hp, k, rows, scales, y + t0 * y_stride + h * kI8HalfRows,
                                  y_stride, nr);
    }
  }
}

inline void add_x86_w8a8(KernelTable& t) {
  const int i = static_cast<int>(DType::kI8);
  t.matmul_i8 = matmul_i8_x86;
  t.pack_i8 = pack_i8_x86;
  t.matmul_packed[i] = matmul_i8_packed_x86;
  t.packed_layout[i].block_bytes = 2 * 8 * 32;  // 16 rows x 32 bytes per 32 columns
  t.packed_layout[i].panel_extra_bytes = 2 * 4 * kI8HalfRows;
}

}  // namespace
}  // namespace dserve::cpu
