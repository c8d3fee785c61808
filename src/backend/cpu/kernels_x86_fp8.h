// FP8 E4M3 (DType::kF8_E4M3) matmul kernels for the x86 levels: one byte per weight,
// converted to f32 in registers, times F32 activations, with the weight's block scales
// applied once per block of the reduction (kernels.h, MatmulF8Fn). Included by
// kernels_avx2.cc and kernels_avx512.cc after kernels_x86_impl.h (VecF: 8 lanes with
// AVX2, 16 with AVX-512), so one source serves both levels.
//
// The conversion: an E4M3 byte s.eeee.mmm, sign-extended to 16 bits, shifted left by
// 7 and masked with 0xBF80 is the IEEE half s.0eeee.mmm0000000, which is the E4M3
// value times 2^-8 (exponent bias 15 instead of 7) for normal and subnormal values
// alike; vcvtph2ps widens it exactly (never a denormal f32 on the way, which would be
// slow on some cores), and the 256 is taken with the block's scale (exact: a power of
// two). 16 bytes are converted at once in 16-bit lanes of a 256-bit register. E4M3 has no infinity;
// its NaN (s.1111.111) would come out as +-480, so it is made a half NaN first, as
// tensor/half.h's fp8_e4m3_to_f32 reads it.
//
// A register tile is NR rows x NT tokens; each (row, token) pair has its own
// accumulators: `block` sums one block of columns (FMA over vectors), then `acc` +=
// block * scale (one FMA per block), and the partial vector of a short last block goes
// to a scalar sum taken by the last scale at the end. The operations of one pair are
// the same whatever NR and NT are, so a token's result does not depend on its batch.
// block_cols and col0 must be multiples of 16 (the model checks them), so only the last
// block can end off a vector boundary.
#pragma once

#if !defined(__AVX2__) || !defined(__F16C__)
#error "kernels_x86_fp8.h needs -mavx2 -mf16c"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/kernels.h"

namespace dserve::cpu {
namespace {

// Rows and tokens per register tile: accumulators (2 per pair) plus the activation
// and weight vectors fit 16 registers (AVX2) or 32 (AVX-512). Decode (one token)
// takes more rows so the per-row work spreads over more loads.
#if defined(__AVX512F__)
constexpr int kF8Rows = 2, kF8Tokens = 4;
#else
constexpr int kF8Rows = 1, kF8Tokens = 4;
#endif
constexpr int kF8DecodeRows = 4;
// A tile reads NR rows side by side, each a short stream of k bytes (1-7 KiB for
// DeepSeek's experts) that ends before the hardware prefetcher is up to speed; so
// each step prefetches the same columns of the next tile's rows (NR rows further).

// 16 E4M3 bytes as IEEE halves (see the top of this file): value / 256 each.
inline __m256i f8x16_to_f16(__m128i bytes) {
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7),
                                     _mm256_set1_epi16(-0x4080));
  const __m256i mag = _mm256_and_si256(h, _mm256_set1_epi16(0x3f80));
  const __m256i nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x3f80));
  return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7c00)));
}

// 16 weights from p as floats divided by 256 (the 256 is folded into the block scale,
// exact as a power of two): one vector with AVX-512, two with AVX2 (lo, hi).
#if defined(__AVX512F__)
inline void f8_load16(const uint8_t* p, VecF::T* lo, VecF::T* /*hi*/) {
  *lo = _mm512_cvtph_ps(f8x16_to_f16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#else
inline void f8_load16(const uint8_t* p, VecF::T* lo, VecF::T* hi) {
  const __m256i h = f8x16_to_f16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}
#endif

// One weight / 256, the same conversion (for the tail of a short last block).
inline float f8_load1(uint8_t b) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm256_castsi256_si128(f8x16_to_f16(_mm_cvtsi32_si128(b)))));
}

// Rows of FP8 weights as f8_load16 / f8_load1 give them (values / 256) into out,
// k floats per row: what f8_tile<..., true> reads instead of converting again.
void f8_convert_rows(const uint8_t* w, size_t w_stride, int n_rows, int64_t k, float* out) {
  for (int r = 0; r < n_rows; ++r) {
    const uint8_t* q = w + r * w_stride;
    float* o = out + r * k;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
      VecF::T lo, hi;
      f8_load16(q + i, &lo, &hi);
      VecF::store(o + i, lo);
      if constexpr (VecF::kWidth == 8) VecF::store(o + i + 8, hi);
    }
    for (; i < k; ++i) o[i] = f8_load1(q[i]);
  }
}

// kConverted: w holds f8_convert_rows' floats (w_stride = 4 k bytes) instead of FP8
// bytes; the same values in the same chain, so the same bits.
template <int NR, int NT, bool kConverted>
void f8_tile(const uint8_t* w, size_t w_stride, const BlockScales& scales, const float* const* x,
             int64_t k, float* y, int64_t y_stride) {
  constexpr int W = VecF::kWidth;
  const int64_t bc = scales.block_cols;
  const uint8_t* q[NR];
  const float* s[NR];
  for (int r = 0; r < NR; ++r) {
    q[r] = w + r * w_stride;
    s[r] = scales.row(r);
  }
  const size_t ahead = NR * w_stride;
  VecF::T acc[NR][NT];
  float tail[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      acc[r][t] = VecF::zero();
      tail[r][t] = 0.0f;
    }
  }
  int64_t b = 0;  // the block: columns [b0, end)
  for (int64_t b0 = 0; b0 < k; ++b) {
    const int64_t end = (b + 1) * bc - scales.col0 < k ? (b + 1) * bc - scales.col0 : k;
    VecF::T block[NR][NT];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) block[r][t] = VecF::zero();
    }
    // 16 weights a step, converted together; with AVX2 they are two vectors, added
    // into the block in column order as one vector at a time would be.
    int64_t i = b0;
    for (; i + 16 <= end; i += 16) {
      VecF::T xv[NT];
      [[maybe_unused]] VecF::T xh[NT];
      for (int t = 0; t < NT; ++t) {
        xv[t] = VecF::load(x[t] + i);
        if constexpr (W == 8) xh[t] = VecF::load(x[t] + i + 8);
      }
      if (!kConverted && (i & 63) == 0) {  // the next tile's rows, the same columns (see above)
        for (int r = 0; r < NR; ++r) _mm_prefetch(reinterpret_cast<const char*>(q[r] + ahead + i), _MM_HINT_T0);
      }
      for (int r = 0; r < NR; ++r) {
        VecF::T lo, hi;
        if constexpr (kConverted) {
          lo = VecF::load(reinterpret_cast<const float*>(q[r]) + i);
          if constexpr (W == 8) hi = VecF::load(reinterpret_cast<const float*>(q[r]) + i + 8);
        } else {
          f8_load16(q[r] + i, &lo, &hi);
        }
        for (int t = 0; t < NT; ++t) block[r][t] = VecF::fma(lo, xv[t], block[r][t]);
        if constexpr (W == 8) {
          for (int t = 0; t < NT; ++t) block[r][t] = VecF::fma(hi, xh[t], block[r][t]);
        }
      }
    }
    if constexpr (W == 8) {
      if (i + 8 <= end) {  // only in a short last block
        VecF::T xv[NT];
        for (int t = 0; t < NT; ++t) xv[t] = VecF::load(x[t] + i);
        for (int r = 0; r < NR; ++r) {
          VecF::T lo, hi;
          if constexpr (kConverted) {
            lo = VecF::load(reinterpret_cast<const float*>(q[r]) + i);
          } else {
            alignas(16) uint8_t buf[16] = {};
            std::memcpy(buf, q[r] + i, 8);
            f8_load16(buf, &lo, &hi);
          }
          for (int t = 0; t < NT; ++t) block[r][t] = VecF::fma(lo, xv[t], block[r][t]);
        }
        i += 8;
      }
    }
    for (int r = 0; r < NR; ++r) {
      const VecF::T sv = VecF::set1(s[r][b] * 256.0f);
      for (int t = 0; t < NT; ++t) acc[r][t] = VecF::fma(block[r][t], sv, acc[r][t]);
    }
    for (; i < end; ++i) {  // only in a short last block
      for (int r = 0; r < NR; ++r) {
        const float wi = kConverted ? reinterpret_cast<const float*>(q[r])[i] : f8_load1(q[r][i]);
        for (int t = 0; t < NT; ++t) tail[r][t] = fma1(wi, x[t][i], tail[r][t]);
      }
    }
    b0 = end;
  }
  const int64_t last = b - 1;
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      y[t * y_stride + r] = fma1(tail[r][t], s[r][last] * 256.0f, VecF::sum(acc[r][t]));
    }
  }
}

// Calls f(std::integral_constant<int, n>{}) for a run-time n in [1, Max].
template <int Max, typename F>
inline void f8_dispatch(int n, F&& f) {
  if constexpr (Max >= 1) {
    if (n == Max) {
      f(std::integral_constant<int, Max>{});
    } else {
      f8_dispatch<Max - 1>(n, f);
    }
  }
}

void matmul_f8_x86(const uint8_t* w, size_t w_stride, const BlockScales& scales, const uint8_t* x,
                   size_t x_stride, int64_t k, int64_t n_rows, int64_t n_tokens, float* y,
                   int64_t y_stride) {
  if (k <= 0) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = 0; r < n_rows; ++r) y[t * y_stride + r] = 0.0f;
    }
    return;
  }
  constexpr int kMaxRows = kF8Rows > kF8DecodeRows ? kF8Rows : kF8DecodeRows;
  const int max_rows = n_tokens == 1 ? kF8DecodeRows : kF8Rows;
  // More tokens than one tile: each row tile is converted once, into a buffer that
  // stays in L1, and every token tile reads it (the conversion costs more than the
  // FMAs it feeds).
  const bool convert = n_tokens > kF8Tokens;
  thread_local std::vector<float> converted;
  if (convert && converted.size() < static_cast<size_t>(kF8Rows * k)) converted.resize(kF8Rows * k);
  for (int64_t r0 = 0; r0 < n_rows; r0 += max_rows) {
    const int nr = static_cast<int>(n_rows - r0 < max_rows ? n_rows - r0 : max_rows);
    const BlockScales s = scales.from_row(r0);
    if (convert) f8_convert_rows(w + r0 * w_stride, w_stride, nr, k, converted.data());
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kF8Tokens) {
      const int nt = static_cast<int>(n_tokens - t0 < kF8Tokens ? n_tokens - t0 : kF8Tokens);
      const float* xs[kF8Tokens];
      for (int t = 0; t < nt; ++t) xs[t] = reinterpret_cast<const float*>(x + (t0 + t) * x_stride);
      float* out = y + t0 * y_stride + r0;
      f8_dispatch<kMaxRows>(nr, [&](auto r) {
        f8_dispatch<kF8Tokens>(nt, [&](auto t) {
          constexpr int R = decltype(r)::value, T = decltype(t)::value;
          if (convert) {
            if constexpr (R <= kF8Rows) {
              f8_tile<R, T, true>(reinterpret_cast<const uint8_t*>(converted.data()), k * sizeof(float), s,
                                  xs, k, out, y_stride);
            }
          } else {
            f8_tile<R, T, false>(w + r0 * w_stride, w_stride, s, xs, k, out, y_stride);
          }
        });
      });
    }
  }
}

inline void add_x86_fp8(KernelTable& t) { t.matmul_f8 = matmul_f8_x86; }

}  // namespace
}  // namespace dserve::cpu
