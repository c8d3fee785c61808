// The packed form of W8A8 (DType::kI8) weights that the x86 and ARM levels share, and
// the loop that runs a level's register tile over it. The levels differ only in the
// tile (kernels_x86_w8a8.h: vpmaddubsw / vpdpbusd; kernels_arm_impl.h: SDOT by lane).
//
// Half panel (8 rows; a kMatmulPackRows = 16-row panel is two halves one after the
// other), for a row length k that is a multiple of 32:
//   q      k/4 groups of 32 bytes: group g holds rows 0..7's q[4g .. 4g+3], row r at
//          byte 4r (an AVX2 register of 8 int32 lanes, or two NEON registers of 4)
//   scale  8 f32, the rows' scales in row order
// Rows past the end of the matrix are zeros (they compute zeros that are never stored).
//
// Included by one translation unit per level, inside its anonymous namespace, so that
// each level's copy is compiled with its own target flags and never merged with
// another's at link time.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/kernels.h"

namespace dserve::cpu {
namespace {

constexpr int kI8HalfRows = 8;

constexpr int64_t i8_half_bytes(int64_t k) { return 8 * k + 4 * kI8HalfRows; }

// Calls f(std::integral_constant<int, nt>{}) for a run-time nt in [1, Max]: register
// tiles are templates on their token count.
template <int Max, typename F>
inline void dispatch_tokens(int nt, F&& f) {
  if constexpr (Max >= 1) {
    if (nt == Max) {
      f(std::integral_constant<int, Max>{});
    } else {
      dispatch_tokens<Max - 1>(nt, f);
    }
  }
}

// PackI8Fn: the layout above. Runs once per weight at load; plain copies suffice.
inline void pack_i8_halves(const uint8_t* w, size_t w_stride, const float* w_scales, int64_t n_rows, int64_t k,
                    uint8_t* out) {
  const int64_t half = i8_half_bytes(k);
  const int64_t n_halves = (n_rows + kMatmulPackRows - 1) / kMatmulPackRows * (kMatmulPackRows / kI8HalfRows);
  std::memset(out, 0, static_cast<size_t>(n_halves * half));
  for (int64_t row = 0; row < n_rows; ++row) {
    uint8_t* dst = out + row / kI8HalfRows * half;
    const int64_t r = row % kI8HalfRows;
    const uint8_t* src = w + row * w_stride;
    for (int64_t g = 0; g < k / 4; ++g) std::memcpy(dst + 32 * g + 4 * r, src + 4 * g, 4);
    std::memcpy(dst + 8 * k + 4 * r, &w_scales[row], 4);
  }
}

// MatmulPackedFn for kI8 (activations: kQ8Token rows), half panel by half panel, each
// serving every token of the call in tiles of up to MaxTokens while it sits in L1/L2.
// Tile<NT>::run(half, k, x_rows[NT], x_scales[NT], y, y_stride, n_rows) writes
// y[t * y_stride + r] for the half's rows r < n_rows.
template <int MaxTokens, template <int> class Tile>
void matmul_i8_packed_halves(const uint8_t* packed, const uint8_t* x, int64_t k, int64_t n_rows, int64_t n_tokens,
                             float* y, int64_t y_stride, const uint8_t* /*next*/) {
  const int64_t half = i8_half_bytes(k);
  const int64_t x_stride = act_row_bytes(ActFormat::kQ8Token, k);
  const int64_t n_halves = (n_rows + kI8HalfRows - 1) / kI8HalfRows;
  for (int64_t h = 0; h < n_halves; ++h) {
    const int nr = static_cast<int>(n_rows - h * kI8HalfRows < kI8HalfRows ? n_rows - h * kI8HalfRows : kI8HalfRows);
    const uint8_t* hp = packed + h * half;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += MaxTokens) {
      const int nt = static_cast<int>(n_tokens - t0 < MaxTokens ? n_tokens - t0 : MaxTokens);
      const int8_t* rows[MaxTokens];
      float scales[MaxTokens];
      for (int t = 0; t < nt; ++t) {
        const Q8TokenRow a = q8token_row(x + (t0 + t) * x_stride, k);
        rows[t] = a.qs;
        scales[t] = a.d;
      }
      float* out = y + t0 * y_stride + h * kI8HalfRows;
      dispatch_tokens<MaxTokens>(nt, [&](auto n) {
        Tile<decltype(n)::value>::run(hp, k, rows, scales, out, y_stride, nr);
      });
    }
  }
}

}  // namespace
}  // namespace dserve::cpu
