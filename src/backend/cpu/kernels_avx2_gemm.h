// Batched (GEMM-shaped) matmul for the 32-element block types Q8_0 / Q4_0 / Q4_1 on
// AVX2 without VNNI (Haswell .. Zen 3): the packed-panel design of
// kernels_avx512_gemm.h at 256 bits. Included only by kernels_avx2.cc, after
// kernels_x86_impl.h.
//
// One 256-bit register holds 4 consecutive weights of each of 8 rows (lane r <-> row
// r of a "half panel"), so one vpmaddubsw with a token's 4 activations broadcast does
// 8 rows x 4 k with nothing to reduce across lanes, and a tile of 8 rows x kGemmTokens
// tokens loads each weight vector once for all its tokens. A 16-row panel
// (kMatmulPackRows) is two half panels, one after the other, so that decode streams
// each half sequentially.
//
// Integer products without VNNI: vpmaddubsw multiplies unsigned by signed bytes and
// adds pairs into int16 with saturation.
//   Q4_0 / Q4_1: u = nibble (0..15), so a pair is at most 2 * 15 * 127 = 3810 in
//     magnitude and the 8 groups of a block add up in int16 without overflow
//     (30480 < 32767); one vpmaddwd per block and token widens to int32. Q4_0's -8
//     offset is the activation tile's -8 sum(q), added once per block.
//   Q8_0: the weights stay signed; |w| times the activations with w's sign (vpsignb),
//     as the per-row kernel does: a pair is at most 2 * 128 * 127 = 32512, so each
//     group widens to int32 on its own.
// Either way each block's integer dot is exact, the per-row kernels' one.
//
// Same results as the per-row kernels (Q32Kernel in kernels_x86_impl.h), bit for bit:
// a lane does the float operations Q32Kernel does for its row, in the same order (its
// 8 block-lane accumulators, the tail blocks' per-group partials, hsum256's reduction
// tree). So a token's result does not depend on the kernel, the batch or the tile it
// lands in (the engine's batch invariance).
//
// Packed half panel of nb blocks (loads are unaligned: a Q4_0 half is 144 bytes a block):
//   weights  nb x kGroupBytes: Q4: 4 vectors, vector j lane r = row r's qs bytes
//            4j..4j+3 (low nibbles: elements 4j.., high nibbles: 16 + 4j..); Q8_0: 8
//            vectors, vector g lane r = row r's q[4g..4g+3]
//   d        nb x 8 f16, lane order
//   m        nb x 8 f16 (Q4_1 only)
// so a 16-row panel takes exactly the bytes of its 16 rows. Rows past the end of the
// matrix are zeros (they compute zeros that are never stored).
#pragma once

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kernels_avx2_gemm.h needs -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "tensor/quant_blocks.h"

namespace dserve::cpu {
namespace {

constexpr int kHalfRows = 8;
// Tokens per tile. The float accumulators live in memory (half_tile) and a block's
// weights in registers while each token takes its products (half_grouped_block), so
// the registers do not bound it; 8 tokens amortise a block's unpacking.
constexpr int kGemmTokens = 8;

struct HalfQ8_0 {
  using Block = block_q8_0;
  static constexpr bool kNibbles = false;
  static constexpr bool kHasMin = false;
  static constexpr int kOffsetIndex = -1;     // signed weights: no offset
  static constexpr int64_t kGroupBytes = 256;  // 8 vectors
};
struct HalfQ4_0 {
  using Block = block_q4_0;
  static constexpr bool kNibbles = true;
  static constexpr bool kHasMin = false;
  static constexpr int kOffsetIndex = 0;       // -8 sum(q)
  static constexpr int64_t kGroupBytes = 128;  // 4 vectors of nibble pairs
};
struct HalfQ4_1 {
  using Block = block_q4_1;
  static constexpr bool kNibbles = true;
  static constexpr bool kHasMin = true;
  static constexpr int kOffsetIndex = -1;  // unsigned weights, the minimum term instead
  static constexpr int64_t kGroupBytes = 128;
};

template <typename P>
constexpr int64_t half_block_bytes() {
  return P::kGroupBytes + 16 + (P::kHasMin ? 16 : 0);
}

// Where a half panel's parts start (layout above).
template <typename P>
struct HalfPanel {
  const uint8_t* w;
  const uint8_t* d;
  const uint8_t* m;
  HalfPanel(const uint8_t* half, int64_t nb)
      : w(half), d(half + nb * P::kGroupBytes), m(d + nb * 16) {}

  // Weight vector of group g (elements 4g..4g+3 of every row) of block b: unsigned
  // nibbles, or Q8_0's signed bytes.
  __m256i group(int64_t b, int g) const {
    if constexpr (P::kNibbles) {
      const __m256i t =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * P::kGroupBytes + 32 * (g % 4)));
      return _mm256_and_si256(g < 4 ? t : _mm256_srli_epi16(t, 4), _mm256_set1_epi8(0x0F));
    } else {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * P::kGroupBytes + 32 * g));
    }
  }
  __m256 scale_d(int64_t b) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + 16 * b)));
  }
  __m256 scale_m(int64_t b) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m + 16 * b)));
  }
  void prefetch_block(int64_t b) const {
    for (int64_t i = 0; i < P::kGroupBytes; i += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(w + b * P::kGroupBytes + i), _MM_HINT_T0);
    }
  }
};

// Where token t's values for one block sit in an activation tile block of width W
// (kernels.h): W = kGemmTokens, or 1 in a single-token call.
template <int W>
struct HalfTileLayout {
  static constexpr int64_t kBytes = q8x32_tile_block_bytes(W);
  static const uint8_t* qs(const uint8_t* xb, int g, int t) { return xb + 4 * (g * W + t); }
  static const uint8_t* d(const uint8_t* xb, int t) { return xb + 4 * (8 * W + t); }
  static const uint8_t* s(const uint8_t* xb, int t) { return xb + 4 * (9 * W + t); }
  static const uint8_t* offset(const uint8_t* xb, int i, int t) {
    return xb + 4 * ((10 + i) * W + t);
  }
};
using HalfTileBlock = HalfTileLayout<kGemmTokens>;
using HalfSingleTokenBlock = HalfTileLayout<1>;

inline __m256i bcast_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
inline __m256 bcast_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_ps(v);
}

// Q32Kernel groups a row's blocks 8 at a time (block b in lane b % 8) while at least 4
// are left, and adds a shorter tail block by block (its single()).
inline int64_t half_grouped_blocks(int64_t nb) { return nb % 8 >= 4 ? nb : nb - nb % 8; }

// Adds grouped block b for NT tokens to acc (lane b % 8 of Q32Kernel::group):
// acc = fma(dot, d_w d_x, acc), then for Q4_1 acc = fma(m_w, s_x, acc), where dot is
// the block's exact integer dot, one int32 lane per row.
//
// Q4: the block's 8 weight vectors are unpacked once into registers and each token in
// turn takes its 8 products into one int16 sum, so the registers hold 8 weights, a sum
// and a broadcast whatever NT (summing all tokens at once, group by group, needs NT
// sums live besides the weights and spilled at NT = 6).
// Q8_0: |w| times the activations with w's sign, each group widened to int32 on its
// own (pairs reach 32512); the same token by token order.
template <typename P, int NT, typename Tile = HalfTileBlock>
inline void half_grouped_block(const HalfPanel<P>& panel, int64_t b, const uint8_t* xb,
                               __m256 (&acc)[NT]) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 d = panel.scale_d(b);
  if constexpr (P::kNibbles) {
    __m256i u[8];
    for (int g = 0; g < 8; ++g) u[g] = panel.group(b, g);
    const __m256 m = P::kHasMin ? panel.scale_m(b) : _mm256_setzero_ps();
    for (int t = 0; t < NT; ++t) {
      __m256i p16 = _mm256_maddubs_epi16(u[0], bcast_i32(Tile::qs(xb, 0, t)));
#pragma GCC unroll 7
      for (int g = 1; g < 8; ++g) {
        p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(u[g], bcast_i32(Tile::qs(xb, g, t))));
      }
      __m256i dot = _mm256_madd_epi16(p16, ones);
      if constexpr (P::kOffsetIndex >= 0) {
        dot = _mm256_add_epi32(dot, bcast_i32(Tile::offset(xb, P::kOffsetIndex, t)));
      }
      const __m256 scale = _mm256_mul_ps(d, bcast_f32(Tile::d(xb, t)));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[t]);
      if constexpr (P::kHasMin) {
        acc[t] = _mm256_fmadd_ps(m, bcast_f32(Tile::s(xb, t)), acc[t]);
      }
    }
  } else {
    // |w| of the block's 8 groups in registers; w itself, needed only for its signs,
    // is read again from L1 as a memory operand (through a pointer the compiler cannot
    // tie to the first read, or it would keep 8 more registers and spill).
    __m256i wa[8];
    for (int g = 0; g < 8; ++g) {
      const __m256i w = panel.group(b, g);
      wa[g] = _mm256_sign_epi8(w, w);
    }
    const uint8_t* w_again = panel.w + b * P::kGroupBytes;
    __asm__("" : "+r"(w_again));
    for (int t = 0; t < NT; ++t) {
      __m256i dot = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w_again + 32 * g));
        const __m256i xs = _mm256_sign_epi8(bcast_i32(Tile::qs(xb, g, t)), w);
        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(wa[g], xs), ones));
      }
      const __m256 scale = _mm256_mul_ps(d, bcast_f32(Tile::d(xb, t)));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[t]);
    }
  }
}

// Adds tail block b for NT tokens to the 8 lane accumulators (Q32Kernel::single: the
// block's 8 group dots go to lanes 0..7, the Q4_1 minimum term to lane 0).
template <typename P, int NT, typename Tile = HalfTileBlock>
inline void half_tail_block(const HalfPanel<P>& panel, int64_t b, const uint8_t* xb,
                            __m256 (*acc8)[NT]) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 d = panel.scale_d(b);
  for (int t = 0; t < NT; ++t) {
    const __m256 scale = _mm256_mul_ps(d, bcast_f32(Tile::d(xb, t)));
    for (int g = 0; g < 8; ++g) {
      const __m256i w = panel.group(b, g);
      const __m256i xq = bcast_i32(Tile::qs(xb, g, t));
      __m256i dot;
      if constexpr (P::kNibbles) {
        dot = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xq), ones);
        if constexpr (P::kOffsetIndex >= 0) {  // minus 8 times this group's sum(q)
          dot = _mm256_sub_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(8), xq), ones));
        }
      } else {
        dot = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w)), ones);
      }
      acc8[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc8[g][t]);
    }
    if constexpr (P::kHasMin) {  // a rounded product, then an add, as single() does
      __m256 ms = _mm256_mul_ps(panel.scale_m(b), bcast_f32(Tile::s(xb, t)));
      // Keeps the compiler from contracting the two into an FMA (-ffp-contract=fast).
      __asm__("" : "+x"(ms));
      acc8[0][t] = _mm256_add_ps(acc8[0][t], ms);
    }
  }
}

// hsum256's tree over the 8 lane accumulators; rows r < n_rows stored.
template <int NT>
inline void half_store(__m256 (*acc8)[NT], float* y, int64_t y_stride, int n_rows) {
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n_rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int t = 0; t < NT; ++t) {
    const __m256 s0 = _mm256_add_ps(acc8[0][t], acc8[4][t]);
    const __m256 s1 = _mm256_add_ps(acc8[1][t], acc8[5][t]);
    const __m256 s2 = _mm256_add_ps(acc8[2][t], acc8[6][t]);
    const __m256 s3 = _mm256_add_ps(acc8[3][t], acc8[7][t]);
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
    if (n_rows == kHalfRows) {
      _mm256_storeu_ps(y + t * y_stride, sum);
    } else {
      _mm256_maskstore_ps(y + t * y_stride, mask, sum);
    }
  }
}

// y[t * y_stride + r] = row r of the half panel . token t of the activation tile, for
// t < NT and r < n_rows. `next` (or null): the half panel read after this one, whose
// blocks are prefetched as this one's are read.
//
// Blocks go in order, each adding to its lane's float accumulators in memory (acc8[b %
// 8], one load and store per block and token), which leaves the registers to the
// block's integer work. A lane still adds its blocks in Q32Kernel's order.
template <typename P, int NT>
void half_tile(const HalfPanel<P>& panel, const HalfPanel<P>* next, int64_t nb,
               const uint8_t* tile, float* y, int64_t y_stride, int n_rows) {
  __m256 acc8[8][NT];
  for (int lane = 0; lane < 8; ++lane) {
    for (int t = 0; t < NT; ++t) acc8[lane][t] = _mm256_setzero_ps();
  }
  const int64_t n_grouped = half_grouped_blocks(nb);
  for (int64_t b = 0; b < n_grouped; ++b) {
    if (next != nullptr) next->prefetch_block(b);
    half_grouped_block<P, NT>(panel, b, tile + b * HalfTileBlock::kBytes, acc8[b % 8]);
  }
  for (int64_t b = n_grouped; b < nb; ++b) {
    if (next != nullptr) next->prefetch_block(b);
    half_tail_block<P, NT>(panel, b, tile + b * HalfTileBlock::kBytes, acc8);
  }
  half_store<NT>(acc8, y, y_stride, n_rows);
}

// One token (decode): blocks in order, so each half streams from memory once, 8 at a
// time so that the 8 lane accumulators stay in registers; the next half (`next`, or
// null) is prefetched block by block meanwhile. The token's activations are a tile of
// width 1 (kernels.h).
// Always inlined into matmul_half_packed: the 8 accumulators, the block's weights and
// its scales fill the 16 registers, and GCC 12 allocates them better there (compiled
// on its own it kept 5 accumulators on the stack, a load and a store per block):
// Q4_1 decode from DRAM 9% faster on a Zen 1 core (matmul_bench), Q8_0 / Q4_0 the same.
// (The K-quant tiles are the other way round: inlined, their decode ran 25-35% slower.)
template <typename P>
[[gnu::always_inline]] inline void half_single(const HalfPanel<P>& panel, const HalfPanel<P>* next,
                                               int64_t nb, const uint8_t* tile, float* y, int n_rows) {
  __m256 acc8[8][1];
  for (int lane = 0; lane < 8; ++lane) acc8[lane][0] = _mm256_setzero_ps();
  const int64_t n_grouped = half_grouped_blocks(nb);
  int64_t b = 0;
  for (; b + 8 <= n_grouped; b += 8) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      if (next != nullptr) next->prefetch_block(b + j);
      half_grouped_block<P, 1, HalfSingleTokenBlock>(
          panel, b + j, tile + (b + j) * HalfSingleTokenBlock::kBytes, acc8[j]);
    }
  }
  for (; b < nb; ++b) {
    if (next != nullptr) next->prefetch_block(b);
    const uint8_t* xb = tile + b * HalfSingleTokenBlock::kBytes;
    if (b < n_grouped) {
      half_grouped_block<P, 1, HalfSingleTokenBlock>(panel, b, xb, acc8[b % 8]);
    } else {
      half_tail_block<P, 1, HalfSingleTokenBlock>(panel, b, xb, acc8);
    }
  }
  half_store<1>(acc8, y, 0, n_rows);
}

template <typename P, int NT>
void half_tile_any(int nt, const HalfPanel<P>& panel, const HalfPanel<P>* next, int64_t nb,
                   const uint8_t* tile, float* y, int64_t y_stride, int n_rows) {
  if constexpr (NT >= 1) {
    if (nt == NT) {
      half_tile<P, NT>(panel, next, nb, tile, y, y_stride, n_rows);
    } else {
      half_tile_any<P, NT - 1>(nt, panel, next, nb, tile, y, y_stride, n_rows);
    }
  }
}

// MatmulPackedFn: rows [0, n_rows) of a packed matrix, half panel by half panel; each
// half serves every token tile of the call while it sits in L1. The last half
// prefetches `next_matrix` (the first half panel of another matrix, whose row length
// may differ: as many bytes as this one's weights, harmless if more than it has).
template <typename P>
void matmul_half_packed(const uint8_t* packed, const uint8_t* x_tiles, int64_t k, int64_t n_rows,
                        int64_t n_tokens, float* y, int64_t y_stride, const uint8_t* next_matrix) {
  const int64_t nb = k / 32;
  const int64_t half_bytes = nb * half_block_bytes<P>();
  const int64_t tile_bytes = nb * HalfTileBlock::kBytes;
  const int64_t n_halves = (n_rows + kHalfRows - 1) / kHalfRows;
  for (int64_t h = 0; h < n_halves; ++h) {
    const int nr = static_cast<int>(n_rows - h * kHalfRows < kHalfRows ? n_rows - h * kHalfRows : kHalfRows);
    const HalfPanel<P> panel(packed + h * half_bytes, nb);
    float* yh = y + h * kHalfRows;
    const bool last = h + 1 == n_halves;
    const HalfPanel<P> next(last ? next_matrix : packed + (h + 1) * half_bytes, nb);
    const HalfPanel<P>* next_ptr = !last || next_matrix != nullptr ? &next : nullptr;
    if (n_tokens == 1) {
      half_single<P>(panel, next_ptr, nb, x_tiles, yh, nr);
      continue;
    }
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kGemmTokens) {
      const int nt = static_cast<int>(n_tokens - t0 < kGemmTokens ? n_tokens - t0 : kGemmTokens);
      half_tile_any<P, kGemmTokens>(nt, panel, t0 == 0 ? next_ptr : nullptr, nb,
                                    x_tiles + t0 / kGemmTokens * tile_bytes, yh + t0 * y_stride,
                                    y_stride, nr);
    }
  }
}

// PackWeightFn: every 16-row panel of w in the packed form (layout above). Runs once
// per weight at load, so plain byte copies are fast enough.
template <typename P>
void pack_weight_half(const uint8_t* w, size_t w_stride, int64_t n_rows, int64_t k, uint8_t* out) {
  using Block = typename P::Block;
  const int64_t nb = k / 32;
  const int64_t half_bytes = nb * half_block_bytes<P>();
  const int64_t n_halves = (n_rows + kMatmulPackRows - 1) / kMatmulPackRows * (kMatmulPackRows / kHalfRows);
  std::memset(out, 0, static_cast<size_t>(n_halves * half_bytes));
  for (int64_t row = 0; row < n_rows; ++row) {
    uint8_t* half = out + row / kHalfRows * half_bytes;
    const int r = static_cast<int>(row % kHalfRows);
    uint8_t* wd = half + nb * P::kGroupBytes;
    uint8_t* wm = wd + nb * 16;
    const Block* blocks = reinterpret_cast<const Block*>(w + row * w_stride);
    for (int64_t b = 0; b < nb; ++b) {
      const Block& blk = blocks[b];
      for (int j = 0; j < P::kGroupBytes / 32; ++j) {
        std::memcpy(half + b * P::kGroupBytes + 32 * j + 4 * r,
                    reinterpret_cast<const uint8_t*>(blk.qs) + 4 * j, 4);
      }
      std::memcpy(wd + 16 * b + 2 * r, &blk.d, 2);
      if constexpr (P::kHasMin) std::memcpy(wm + 16 * b + 2 * r, &blk.m, 2);
    }
  }
}

// MatmulBatchFn for weights nobody packed at load: each 16-row panel is packed into
// the thread's scratch, then served as a packed one.
template <typename P>
void matmul_half_batched(const uint8_t* w, size_t w_stride, const uint8_t* x_tiles, int64_t k,
                         int64_t n_rows, int64_t n_tokens, float* y, int64_t y_stride,
                         uint8_t* scratch) {
  for (int64_t r0 = 0; r0 < n_rows; r0 += kMatmulPackRows) {
    const int64_t nr = n_rows - r0 < kMatmulPackRows ? n_rows - r0 : kMatmulPackRows;
    pack_weight_half<P>(w + r0 * w_stride, w_stride, nr, k, scratch);
    matmul_half_packed<P>(scratch, x_tiles, k, nr, n_tokens, y + r0, y_stride, nullptr);
  }
}

template <typename P>
void add_half_kernels(KernelTable& t, DType dtype) {
  const int i = static_cast<int>(dtype);
  t.matmul_batched[i] = matmul_half_batched<P>;
  t.pack_weight[i] = pack_weight_half<P>;
  t.matmul_packed[i] = matmul_half_packed<P>;
  t.packed_layout[i].block_bytes = 2 * half_block_bytes<P>();
}

// ---- Q4_K / Q5_K: packed half panels over Q8x256 activation rows ----
//
// A 256-element super-block of 8 rows is read as 32 vectors, vector c (0..31) lane r =
// row r's qs bytes 4c..4c+3: c = 8g + i holds elements 64g + 4i.. (low nibbles,
// sub-block 2g) and 64g + 32 + 4i.. (high nibbles, sub-block 2g + 1). Per sub-block s,
// the 8 vectors' vpmaddubsw products with the token's 4 activations add up in int16
// (at most 8 x 2 x 15 x 127 = 30480 for 4 bits; Q5_K's 31 allows 4 vectors, so it
// widens twice per sub-block), and one vpmaddwd by the rows' 6-bit scale sc_s widens
// and scales them: isum = sum_s sc_s sum_e q_e x_e, exactly. The minimum term msum =
// sum_s mn_s (sum of the sub-block's activations) is another vpmaddwd per pair of
// sub-blocks from the activation row's per-16 sums. Then, per row and token, as the
// scalar kernel: acc = fma(isum, d dx, acc), acc = fma(msum, -dmin dx, acc) (the
// integers are exact in float). Each token's arithmetic is its own, so results do not
// depend on the batch; they differ from the per-row kernels only in float rounding
// (the level's per-row K kernels are then unused: these serve every token count).
//
// The activations are Q8x256 rows (kernels.h), not tiles: a token's 4 bytes are
// broadcast from its row.
//
// Packed half panel, per super-block (nb of them, one after another):
//   qs   32 x 32 bytes (above)
//   qh   Q5_K: 8 x 32 bytes, vector i lane r = row r's qh bytes 4i..4i+3 (bit 2g of byte
//        l: the fifth bit of element 64g + l; bit 2g + 1: of element 64g + 32 + l)
//   sc   64 bytes: the rows' 6-bit scales of sub-blocks 2q, 2q + 1 in 16 bytes each
//        (scale_pair_offset), read by sub_block_pairs
//   mn   64 bytes: the rows' 6-bit minima, per pair of sub-blocks 2p, 2p + 1 16 bytes
//        (mn_2p row 0, mn_2p+1 row 0, mn_2p row 1, ..): one zero-extending load gives
//        lane r = (mn_2p, mn_2p+1) of row r, the pair the per-32 sums meet
//   d    8 f16, dmin 8 f16 (lane order)
struct HalfQ4_K {
  using Block = block_q4_K;
  static constexpr bool kFifthBit = false;
};
struct HalfQ5_K {
  using Block = block_q5_K;
  static constexpr bool kFifthBit = true;
};
template <typename P>
constexpr int64_t half_kblock_bytes() {
  return 1024 + (P::kFifthBit ? 256 : 0) + 64 + 64 + 16 + 16;
}
// Tokens per tile. The kernels hold a run of unpacked weights in registers while each
// token takes its products (its int32 sums may spill: they are touched once per run),
// so more tokens amortise the unpacking; 6 measured faster than 3 for all three types.
constexpr int kKTokens = 6;

// The rows' values (scales) of sub-blocks 2q and 2q + 1 as int16 pairs, the form
// vpmaddwd wants against int16 pairs of one row: lane r of pair[0] = (v_2q,r, v_2q,r),
// of pair[1] the same for 2q + 1. The 16 bytes at v16 are [2q rows 0-3, 2q + 1 rows
// 0-3, 2q rows 4-7, 2q + 1 rows 4-7] (scale_pair_offset): vpunpck works within 128-bit
// halves, whose first 4 words are then rows 0-3 and 4-7 of 2q. One widening load and
// two vpunpck for two sub-blocks, where widening each 8 bytes to int32 and doubling
// took 4 instructions for one.
template <bool kSigned>
inline void sub_block_pairs(const uint8_t* v16, __m256i* pair) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v16));
  const __m256i v = kSigned ? _mm256_cvtepi8_epi16(raw) : _mm256_cvtepu8_epi16(raw);
  pair[0] = _mm256_unpacklo_epi16(v, v);
  pair[1] = _mm256_unpackhi_epi16(v, v);
}
// Where the packed value of sub-block s of row r sits (sub_block_pairs' layout).
constexpr int scale_pair_offset(int s, int r) { return 16 * (s / 2) + 4 * (s % 2) + (r % 4) + 8 * (r / 4); }

// Prefetches the super-block two past block b of a half (`bytes` each). The packed
// halves of a matrix are consecutive, so near a half's end this reaches into the next
// one, which is read right after; from the matrix's last half it reaches into `next`
// (the matrix the thread reads next, or null: then past the end, where a prefetch does
// nothing). The hardware prefetcher alone leaves the K-quant kernels, which spend more
// instructions per byte than Q8_0's, waiting on DRAM for much of a decode.
inline void prefetch_kblock(const uint8_t* half, int64_t b, int64_t nb, int64_t bytes, const uint8_t* next) {
  constexpr int kAhead = 2;
  const uint8_t* p = half + (b + kAhead) * bytes;
  if (b + kAhead >= nb && next != nullptr) p = next + (b + kAhead - nb) * bytes;
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

template <typename P, int NT>
void half_kquant_tile(const uint8_t* half, int64_t nb, const uint8_t* x, int64_t x_stride,
                      float* y, int64_t y_stride, int n_rows, const uint8_t* next) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  Q8x256Row xr[NT];
  for (int t = 0; t < NT; ++t) xr[t] = q8x256_row(x + t * x_stride, nb * 256);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = half + b * half_kblock_bytes<P>();
    if constexpr (NT == 1) prefetch_kblock(half, b, nb, half_kblock_bytes<P>(), next);
    const uint8_t* qh = blk + 1024;
    const uint8_t* sc = blk + 1024 + (P::kFifthBit ? 256 : 0);
    const uint8_t* mn = sc + 64;
    const uint8_t* dd = mn + 64;
    __m256i pairs[16];  // scales of sub-blocks 0..7, then minima of pairs of sub-blocks
    for (int q = 0; q < 4; ++q) sub_block_pairs<false>(sc + 16 * q, pairs + 2 * q);
    for (int p = 0; p < 4; ++p) {  // (mn_2p, mn_2p+1) per row, against two per-32 sums
      pairs[8 + p] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + 16 * p)));
    }
    // Sub-block 2g + part (the low or high nibbles of group g), kSpan vectors at a time:
    // they are unpacked once into registers and each token in turn takes its products
    // into one int16 sum (kSpan x 2 x 31 x 127 fits), widened and scaled by the rows'
    // sub-block scales into its int32 sum. The integers are exact, so their order is
    // free; registers hold the kSpan weights and a token's sum, whatever NT.
    constexpr int kSpan = P::kFifthBit ? 4 : 8;
    __m256i isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
    for (int g = 0; g < 4; ++g) {
      for (int part = 0; part < 2; ++part) {
        for (int run = 0; run < 8 / kSpan; ++run) {
          __m256i u[kSpan];
          for (int j = 0; j < kSpan; ++j) {
            const int i = run * kSpan + j;
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * (8 * g + i)));
            __m256i v = _mm256_and_si256(part == 0 ? q : _mm256_srli_epi16(q, 4), low4);
            if constexpr (P::kFifthBit) {  // bit 2g + part of the row's qh byte
              const __m256i h = _mm256_srli_epi16(
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * i)), 2 * g + part);
              v = _mm256_or_si256(v, _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(1)), 4));
            }
            u[j] = v;
          }
          for (int t = 0; t < NT; ++t) {
            const uint8_t* xq = reinterpret_cast<const uint8_t*>(xr[t].qs) + 256 * b + 64 * g + 32 * part +
                                4 * run * kSpan;
            __m256i p16 = _mm256_maddubs_epi16(u[0], bcast_i32(xq));
            for (int j = 1; j < kSpan; ++j) {
              p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(u[j], bcast_i32(xq + 4 * j)));
            }
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p16, pairs[2 * g + part]));
          }
        }
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dd)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dd + 16)));
    const __m256 neg_dmin = _mm256_sub_ps(_mm256_setzero_ps(), dmin);
    for (int t = 0; t < NT; ++t) {
      // Per-32 activation sums as int16 pairs (s_2p, s_2p+1): the per-16 sums added
      // in pairs (at most 32 x 127, so int16 holds them).
      const int16_t* bs = xr[t].bsums + 16 * b;
      __m256i msum = _mm256_setzero_si256();
      for (int p = 0; p < 4; ++p) {
        const uint32_t lo = static_cast<uint16_t>(bs[4 * p] + bs[4 * p + 1]);
        const uint32_t hi = static_cast<uint16_t>(bs[4 * p + 2] + bs[4 * p + 3]);
        const __m256i pair = _mm256_set1_epi32(static_cast<int32_t>(lo | hi << 16));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(pairs[8 + p], pair));
      }
      const __m256 dx = _mm256_set1_ps(xr[t].d[b]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, dx), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(neg_dmin, dx), acc[t]);
    }
  }
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n_rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int t = 0; t < NT; ++t) _mm256_maskstore_ps(y + t * y_stride, mask, acc[t]);
}

template <typename P, int NT>
void half_kquant_any(int nt, const uint8_t* half, int64_t nb, const uint8_t* x, int64_t x_stride,
                     float* y, int64_t y_stride, int n_rows, const uint8_t* next) {
  if constexpr (NT >= 1) {
    if (nt == NT) {
      half_kquant_tile<P, NT>(half, nb, x, x_stride, y, y_stride, n_rows, next);
    } else {
      half_kquant_any<P, NT - 1>(nt, half, nb, x, x_stride, y, y_stride, n_rows, next);
    }
  }
}

// MatmulPackedFn for Q4_K / Q5_K: `x` is Q8x256 rows.
template <typename P>
void matmul_kquant_packed(const uint8_t* packed, const uint8_t* x, int64_t k, int64_t n_rows,
                          int64_t n_tokens, float* y, int64_t y_stride, const uint8_t* next_matrix) {
  const int64_t nb = k / 256;
  const int64_t half_bytes = nb * half_kblock_bytes<P>();
  const int64_t x_stride = act_row_bytes(ActFormat::kQ8x256, k);
  const int64_t n_halves = (n_rows + kHalfRows - 1) / kHalfRows;
  for (int64_t h = 0; h < n_halves; ++h) {
    const int nr = static_cast<int>(n_rows - h * kHalfRows < kHalfRows ? n_rows - h * kHalfRows : kHalfRows);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kKTokens) {
      const int nt = static_cast<int>(n_tokens - t0 < kKTokens ? n_tokens - t0 : kKTokens);
      half_kquant_any<P, kKTokens>(nt, packed + h * half_bytes, nb, x + t0 * x_stride, x_stride,
                                   y + t0 * y_stride + h * kHalfRows, y_stride, nr,
                                   h + 1 == n_halves ? next_matrix : nullptr);
    }
  }
}

// PackWeightFn for Q4_K / Q5_K (layout above).
template <typename P>
void pack_weight_kquant(const uint8_t* w, size_t w_stride, int64_t n_rows, int64_t k, uint8_t* out) {
  using Block = typename P::Block;
  const int64_t nb = k / 256;
  const int64_t half_bytes = nb * half_kblock_bytes<P>();
  const int64_t n_halves = (n_rows + kMatmulPackRows - 1) / kMatmulPackRows * (kMatmulPackRows / kHalfRows);
  std::memset(out, 0, static_cast<size_t>(n_halves * half_bytes));
  for (int64_t row = 0; row < n_rows; ++row) {
    const int r = static_cast<int>(row % kHalfRows);
    const Block* blocks = reinterpret_cast<const Block*>(w + row * w_stride);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = out + row / kHalfRows * half_bytes + b * half_kblock_bytes<P>();
      const Block& src = blocks[b];
      for (int c = 0; c < 32; ++c) std::memcpy(blk + 32 * c + 4 * r, src.qs + 4 * c, 4);
      uint8_t* sc = blk + 1024;
      if constexpr (P::kFifthBit) {
        for (int i = 0; i < 8; ++i) std::memcpy(blk + 1024 + 32 * i + 4 * r, src.qh + 4 * i, 4);
        sc += 256;
      }
      uint8_t* mn = sc + 64;
      for (int sb = 0; sb < 8; ++sb) {
        q_k_scale_min(sb, src.scales, sc + scale_pair_offset(sb, r), mn + 16 * (sb / 2) + 2 * r + sb % 2);
      }
      std::memcpy(mn + 64 + 2 * r, &src.d, 2);
      std::memcpy(mn + 64 + 16 + 2 * r, &src.dmin, 2);
    }
  }
}

// MatmulBatchFn for Q4_K / Q5_K weights nobody packed at load (x: Q8x256 rows).
template <typename P>
void matmul_kquant_batched(const uint8_t* w, size_t w_stride, const uint8_t* x, int64_t k,
                           int64_t n_rows, int64_t n_tokens, float* y, int64_t y_stride,
                           uint8_t* scratch) {
  for (int64_t r0 = 0; r0 < n_rows; r0 += kMatmulPackRows) {
    const int64_t nr = n_rows - r0 < kMatmulPackRows ? n_rows - r0 : kMatmulPackRows;
    pack_weight_kquant<P>(w + r0 * w_stride, w_stride, nr, k, scratch);
    matmul_kquant_packed<P>(scratch, x, k, nr, n_tokens, y + r0, y_stride, nullptr);
  }
}

template <typename P>
void add_kquant_kernels(KernelTable& t, DType dtype) {
  const int i = static_cast<int>(dtype);
  t.matmul_batched[i] = matmul_kquant_batched<P>;
  t.pack_weight[i] = pack_weight_kquant<P>;
  t.matmul_packed[i] = matmul_kquant_packed<P>;
  // Per 32 elements of a 16-row panel: two halves' super-blocks over 8.
  t.packed_layout[i].block_bytes = 2 * half_kblock_bytes<P>() / 8;
}

// ---- Q6_K: packed half panels over Q8x256 activation rows ----
//
// Element e = 128h + 32i + l of a super-block (h < 2, i < 4, l < 32) is
//   u = (nibble i >> 1 of ql[64h + 32(i & 1) + l]) | (bits 2i, 2i + 1 of qh[32h + l]) << 4,
// the weight d sc_s (u - 32) with s = e / 16 (signed 8-bit scales). The packed half
// regroups those 6-bit values at load, 4 to 3 bytes, so that the kernel assembles
// each with one or two masks rather than from a nibble and two high bits: per h and
// column c < 8 (l = 4c .. 4c + 3) three vectors X, Y, Z, whose lane r holds row r's
// 4 elements of i = 0, 1, 2 in bits 0-5 of each byte, and the i = 3 element's 6 bits
// two at a time in bits 6-7 of X, Y and Z. Then the scales and d, exactly the rows'
// bytes: the scales of sub-blocks 2q and 2q + 1 in 16 bytes (sub_block_pairs'
// layout). Same size as the rows.
// u <= 63, so two vpmaddubsw products fit int16 before one vpmaddwd by the sub-block's
// scale. The -32 is taken once per super-block from the activation row's per-16 sums:
// -32 sum_s sc_s sum16_s. Then acc = fma(isum, d dx, acc) per row and token.
constexpr int64_t kHalfQ6Bytes = 1024 + 512 + 128 + 16;

template <int NT>
void half_q6k_tile(const uint8_t* half, int64_t nb, const uint8_t* x, int64_t x_stride, float* y,
                   int64_t y_stride, int n_rows, const uint8_t* next) {
  const __m256i low6 = _mm256_set1_epi8(0x3F);
  Q8x256Row xr[NT];
  for (int t = 0; t < NT; ++t) xr[t] = q8x256_row(x + t * x_stride, nb * 256);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* qs = half + b * kHalfQ6Bytes;
    if constexpr (NT == 1) prefetch_kblock(half, b, nb, kHalfQ6Bytes, next);
    const uint8_t* sc = qs + 1536;
    const uint8_t* dd = sc + 128;
    __m256i scale[16];
    for (int q = 0; q < 8; ++q) sub_block_pairs<true>(sc + 16 * q, scale + 2 * q);
    __m256i isum[NT];
    for (int t = 0; t < NT; ++t) {
      // -32 sum_s sc_s sum16_s: pairs (sc_2p, sc_2p+1) against (sum16_2p, sum16_2p+1).
      const int16_t* bs = xr[t].bsums + 16 * b;
      __m256i off = _mm256_setzero_si256();
      for (int p = 0; p < 8; ++p) {
        const __m256i sc_pair = _mm256_blend_epi16(scale[2 * p], scale[2 * p + 1], 0xAA);
        int32_t word;
        std::memcpy(&word, bs + 2 * p, 4);
        off = _mm256_add_epi32(off, _mm256_madd_epi16(sc_pair, _mm256_set1_epi32(word)));
      }
      isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
    }
    for (int h = 0; h < 2; ++h) {
      for (int cp = 0; cp < 4; ++cp) {  // qs columns c = 2cp, 2cp + 1: l = 8cp .. 8cp + 7
        __m256i u[4][2];
        for (int j = 0; j < 2; ++j) {
          const uint8_t* xyz = qs + 96 * (8 * h + 2 * cp + j);
          const __m256i vx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xyz));
          const __m256i vy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xyz + 32));
          const __m256i vz = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xyz + 64));
          u[0][j] = _mm256_and_si256(vx, low6);
          u[1][j] = _mm256_and_si256(vy, low6);
          u[2][j] = _mm256_and_si256(vz, low6);
          // Bits 6-7 of X, Y, Z to bits 0-1, 2-3, 4-5 by 16-bit shifts (what crosses
          // from the neighbouring byte lands outside each mask).
          u[3][j] = _mm256_or_si256(
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(vx, 6), _mm256_set1_epi8(0x03)),
                              _mm256_and_si256(_mm256_srli_epi16(vy, 4), _mm256_set1_epi8(0x0C))),
              _mm256_and_si256(_mm256_srli_epi16(vz, 2), _mm256_set1_epi8(0x30)));
        }
        for (int t = 0; t < NT; ++t) {
          const uint8_t* xq = reinterpret_cast<const uint8_t*>(xr[t].qs) + 256 * b + 128 * h + 8 * cp;
          for (int i = 0; i < 4; ++i) {
            const __m256i p = _mm256_add_epi16(
                _mm256_maddubs_epi16(u[i][0], bcast_i32(xq + 32 * i)),
                _mm256_maddubs_epi16(u[i][1], bcast_i32(xq + 32 * i + 4)));
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, scale[8 * h + 2 * i + cp / 2]));
          }
        }
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dd)));
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, _mm256_set1_ps(xr[t].d[b])),
                               acc[t]);
    }
  }
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n_rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int t = 0; t < NT; ++t) _mm256_maskstore_ps(y + t * y_stride, mask, acc[t]);
}

template <int NT>
void half_q6k_any(int nt, const uint8_t* half, int64_t nb, const uint8_t* x, int64_t x_stride,
                  float* y, int64_t y_stride, int n_rows, const uint8_t* next) {
  if constexpr (NT >= 1) {
    if (nt == NT) {
      half_q6k_tile<NT>(half, nb, x, x_stride, y, y_stride, n_rows, next);
    } else {
      half_q6k_any<NT - 1>(nt, half, nb, x, x_stride, y, y_stride, n_rows, next);
    }
  }
}

// MatmulPackedFn for Q6_K: `x` is Q8x256 rows.
void matmul_q6k_packed(const uint8_t* packed, const uint8_t* x, int64_t k, int64_t n_rows,
                       int64_t n_tokens, float* y, int64_t y_stride, const uint8_t* next_matrix) {
  const int64_t nb = k / 256;
  const int64_t half_bytes = nb * kHalfQ6Bytes;
  const int64_t x_stride = act_row_bytes(ActFormat::kQ8x256, k);
  const int64_t n_halves = (n_rows + kHalfRows - 1) / kHalfRows;
  for (int64_t h = 0; h < n_halves; ++h) {
    const int nr = static_cast<int>(n_rows - h * kHalfRows < kHalfRows ? n_rows - h * kHalfRows : kHalfRows);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kKTokens) {
      const int nt = static_cast<int>(n_tokens - t0 < kKTokens ? n_tokens - t0 : kKTokens);
      half_q6k_any<kKTokens>(nt, packed + h * half_bytes, nb, x + t0 * x_stride, x_stride,
                             y + t0 * y_stride + h * kHalfRows, y_stride, nr,
                             h + 1 == n_halves ? next_matrix : nullptr);
    }
  }
}

// PackWeightFn for Q6_K (layout above).
void pack_weight_q6k(const uint8_t* w, size_t w_stride, int64_t n_rows, int64_t k, uint8_t* out) {
  const int64_t nb = k / 256;
  const int64_t half_bytes = nb * kHalfQ6Bytes;
  const int64_t n_halves = (n_rows + kMatmulPackRows - 1) / kMatmulPackRows * (kMatmulPackRows / kHalfRows);
  std::memset(out, 0, static_cast<size_t>(n_halves * half_bytes));
  for (int64_t row = 0; row < n_rows; ++row) {
    const int r = static_cast<int>(row % kHalfRows);
    const block_q6_K* blocks = reinterpret_cast<const block_q6_K*>(w + row * w_stride);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = out + row / kHalfRows * half_bytes + b * kHalfQ6Bytes;
      const block_q6_K& src = blocks[b];
      for (int h = 0; h < 2; ++h) {
        for (int l = 0; l < 32; ++l) {
          uint8_t u[4];
          for (int i = 0; i < 4; ++i) {
            const uint8_t q = src.ql[64 * h + 32 * (i & 1) + l];
            u[i] = static_cast<uint8_t>((i < 2 ? q & 0x0F : q >> 4) | ((src.qh[32 * h + l] >> (2 * i)) & 3) << 4);
          }
          uint8_t* xyz = blk + 96 * (8 * h + l / 4) + 4 * r + l % 4;
          for (int v = 0; v < 3; ++v) xyz[32 * v] = static_cast<uint8_t>(u[v] | ((u[3] >> (2 * v)) & 3) << 6);
        }
      }
      for (int sb = 0; sb < 16; ++sb) blk[1536 + scale_pair_offset(sb, r)] = static_cast<uint8_t>(src.scales[sb]);
      std::memcpy(blk + 1664 + 2 * r, &src.d, 2);
    }
  }
}

void matmul_q6k_batched(const uint8_t* w, size_t w_stride, const uint8_t* x, int64_t k,
                        int64_t n_rows, int64_t n_tokens, float* y, int64_t y_stride,
                        uint8_t* scratch) {
  for (int64_t r0 = 0; r0 < n_rows; r0 += kMatmulPackRows) {
    const int64_t nr = n_rows - r0 < kMatmulPackRows ? n_rows - r0 : kMatmulPackRows;
    pack_weight_q6k(w + r0 * w_stride, w_stride, nr, k, scratch);
    matmul_q6k_packed(scratch, x, k, nr, n_tokens, y + r0, y_stride, nullptr);
  }
}

// Installs the batched kernels into the AVX2 table. They serve every token count: a
// single token streams the packed halves without the per-row kernels' gathers and
// horizontal sums, and the results are the per-row kernels' anyway.
inline void add_avx2_batched(KernelTable& t) {
  add_half_kernels<HalfQ8_0>(t, DType::kQ8_0);
  add_half_kernels<HalfQ4_0>(t, DType::kQ4_0);
  add_half_kernels<HalfQ4_1>(t, DType::kQ4_1);
  add_kquant_kernels<HalfQ4_K>(t, DType::kQ4_K);
  add_kquant_kernels<HalfQ5_K>(t, DType::kQ5_K);
  const int q6 = static_cast<int>(DType::kQ6_K);
  t.matmul_batched[q6] = matmul_q6k_batched;
  t.pack_weight[q6] = pack_weight_q6k;
  t.matmul_packed[q6] = matmul_q6k_packed;
  t.packed_layout[q6].block_bytes = 2 * kHalfQ6Bytes / 8;
  t.matmul_batched_min_tokens = 1;
  t.matmul_batched_tile = kGemmTokens;
}

}  // namespace
}  // namespace dserve::cpu
