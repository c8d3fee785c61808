// aarch64 NEON kernels shared by the neon and neon-dotprod levels. This header is
// included only by kernels_neon.cc (-march=armv8-a) and kernels_neon_dotprod.cc
// (-march=armv8.2-a+dotprod); everything here sits in an anonymous namespace so the two
// instantiations never merge at link time (a merged dotprod copy would raise SIGILL on
// an ARMv8.0 core such as the Cortex-A72). For the same reason it converts halves
// with NEON instructions rather than calling tensor/half.h's inline functions.
//
// The two levels differ in one primitive, dot_s8: SDOT with dotprod, widening
// multiplies and pairwise adds without. Integer block sums are exact either way, so
// both levels give the same bits; they differ from the scalar level only in the order
// of float additions.
//
// Every kernel computes each (weight row, token) or (query) result with the same
// operations whatever the number of tokens or queries in the call, so a request's
// output does not depend on its batch (the engine's batch invariance).
#pragma once

#if !defined(__aarch64__) || !defined(__ARM_NEON)
#error "kernels_arm_impl.h is for aarch64 NEON"
#endif

#include <arm_neon.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/kernels.h"
#include "backend/cpu/w8a8_panels.h"
#include "tensor/quant_blocks.h"

namespace dserve::cpu {
namespace {

// ---- primitives ----

// acc + sums of s8(a) * s8(b) (the lanes' split of the sum differs between the two
// forms; callers use only whole-vector sums, which are exact).
inline int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

// The sum over 32 values: a (32 bytes) . b (32 bytes).
inline int dot32(int8x16_t a0, int8x16_t a1, const int8_t* b) {
  const int32x4_t acc = dot_s8(dot_s8(vdupq_n_s32(0), a0, vld1q_s8(b)), a1, vld1q_s8(b + 16));
  return vaddvq_s32(acc);
}

inline float32x4_t f16x4_to_f32(const uint16_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
inline float f16_to_f32_neon(uint16_t h) {
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
inline float bf16_to_f32_neon(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// a * b + c rounded once, spelled out where the float and half instantiations of a
// kernel must round alike (left to contraction, the compiler might fuse one and not
// the other).
inline float fma1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

// ---- activation quantisation (bit-identical to kernels_scalar.cc) ----

// Quantises 4 * n_vec floats (n_vec a multiple of 4) with one scale; returns the scale
// and the int32 sum. vmaxnm ignores NaN as std::fmax does; vcvtn rounds to nearest
// even as std::nearbyint does in the default rounding mode.
inline float quantize_span(const float* x, int n_vec, int8_t* q, int* sum_out) {
  float32x4_t amax_v = vdupq_n_f32(0.0f);
  for (int i = 0; i < n_vec; ++i) amax_v = vmaxnmq_f32(amax_v, vabsq_f32(vld1q_f32(x + 4 * i)));
  const float amax = vmaxnmvq_f32(amax_v);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const float32x4_t idv = vdupq_n_f32(id);
  int32x4_t sum = vdupq_n_s32(0);
  for (int i = 0; i < n_vec; i += 4) {  // 16 values -> 16 bytes
    int32x4_t v[4];
    for (int j = 0; j < 4; ++j) {
      v[j] = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + 4 * (i + j)), idv));
      sum = vaddq_s32(sum, v[j]);
    }
    const int16x8_t lo = vcombine_s16(vqmovn_s32(v[0]), vqmovn_s32(v[1]));
    const int16x8_t hi = vcombine_s16(vqmovn_s32(v[2]), vqmovn_s32(v[3]));
    vst1q_s8(q + 4 * i, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
  }
  *sum_out = vaddvq_s32(sum);
  return d;
}

void quantize_q8x32_neon(const float* x, int64_t k, uint8_t* out) {
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* d = reinterpret_cast<float*>(out + round_up(k, kActAlign));
  float* s = d + k / 32;
  for (int64_t b = 0; b < k / 32; ++b) {
    int sum = 0;
    d[b] = quantize_span(x + 32 * b, 8, qs + 32 * b, &sum);
    s[b] = d[b] * static_cast<float>(sum);
  }
}

void quantize_q8x32_tiles_neon(const float* x, int64_t k, int64_t t, int64_t tile,
                               uint8_t* tiles) {
  const int64_t block_bytes = q8x32_tile_block_bytes(tile);
  uint8_t* base = tiles + t / tile * (k / 32) * block_bytes + 4 * (t % tile);
  alignas(16) int8_t qs[32];
  for (int64_t b = 0; b < k / 32; ++b) {
    int sum = 0;
    const float d = quantize_span(x + 32 * b, 8, qs, &sum);
    store_q8x32_tile_slot(base + b * block_bytes, tile, qs, d, d * static_cast<float>(sum), sum);
  }
}

void quantize_q8x256_neon(const float* x, int64_t k, uint8_t* out) {
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* d = reinterpret_cast<float*>(out + round_up(k, kActAlign));
  int16_t* bsums = reinterpret_cast<int16_t*>(d + k / 256);
  for (int64_t b = 0; b < k / 256; ++b) {
    int sum = 0;
    d[b] = quantize_span(x + 256 * b, 64, qs + 256 * b, &sum);
  }
  for (int64_t g = 0; g < k / 16; ++g) bsums[g] = vaddlvq_s8(vld1q_s8(qs + 16 * g));
}

// ---- Q8_0 / Q4_0 / Q4_1 x Q8x32 ----

// Weight-block traits: unpack() gives the block's 32 weights as two vectors of int8 in
// element order.
struct Q8_0Traits {
  using Block = block_q8_0;
  static constexpr bool kMin = false;
  static void unpack(const Block& b, int8x16_t* lo, int8x16_t* hi) {
    *lo = vld1q_s8(b.qs);
    *hi = vld1q_s8(b.qs + 16);
  }
};

struct Q4_0Traits {
  using Block = block_q4_0;
  static constexpr bool kMin = false;
  static void unpack(const Block& b, int8x16_t* lo, int8x16_t* hi) {
    const uint8x16_t v = vld1q_u8(b.qs);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
  }
};

struct Q4_1Traits {
  using Block = block_q4_1;
  static constexpr bool kMin = true;
  static void unpack(const Block& b, int8x16_t* lo, int8x16_t* hi) {
    const uint8x16_t v = vld1q_u8(b.qs);
    *lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
  }
};

// Every (row, token) result of these types is, on both levels and in every kernel,
// the same sequence of float operations over the blocks in order:
//   r = fma(float(isum_b), d_w[b] * d_x[b], r)        isum_b: the block's exact int dot
//   r = fma(m_w[b], s_x[b], r)                         Q4_1 only
// starting from r = 0. The kernels below vectorise across rows (per-row path) or
// tokens (batched path), never along one result's chain, so each lane does exactly
// this and the batched kernel gives the per-row kernel's bits.

// Rows r0 .. r0+3 of w (a row past n_rows repeats the last one; only real rows are
// stored) as lanes: for each token, the four rows' block dots come from two dot_s8 per
// row, pairwise-added so lane j holds row j's exact sum.
template <typename Traits>
void matmul_q32_rows(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride, int64_t k,
                     int64_t n_rows, int64_t n_tokens, float* y, int64_t y_stride) {
  using Block = typename Traits::Block;
  const int64_t nb = k / 32;
  for (int64_t r0 = 0; r0 < n_rows; r0 += 4) {
    const int nr = static_cast<int>(n_rows - r0 < 4 ? n_rows - r0 : 4);
    const Block* rows[4];
    for (int j = 0; j < 4; ++j) {
      rows[j] = reinterpret_cast<const Block*>(w + (r0 + (j < nr ? j : nr - 1)) * w_stride);
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
      const Q8x32Row xr = q8x32_row(x + t * x_stride, k);
      float32x4_t acc = vdupq_n_f32(0.0f);
      for (int64_t b = 0; b < nb; ++b) {
        const int8x16_t x0 = vld1q_s8(xr.qs + 32 * b), x1 = vld1q_s8(xr.qs + 32 * b + 16);
        int32x4_t part[4];
        uint16_t dh[4], mh[4];
        for (int j = 0; j < 4; ++j) {
          const Block& blk = rows[j][b];
          int8x16_t lo, hi;
          Traits::unpack(blk, &lo, &hi);
          part[j] = dot_s8(dot_s8(vdupq_n_s32(0), lo, x0), hi, x1);
          dh[j] = blk.d;
          if constexpr (Traits::kMin) mh[j] = blk.m;
        }
        const int32x4_t isum = vpaddq_s32(vpaddq_s32(part[0], part[1]), vpaddq_s32(part[2], part[3]));
        acc = vfmaq_f32(acc, vcvtq_f32_s32(isum), vmulq_n_f32(f16x4_to_f32(dh), xr.d[b]));
        if constexpr (Traits::kMin) acc = vfmaq_n_f32(acc, f16x4_to_f32(mh), xr.s[b]);
      }
      float out[4];
      vst1q_f32(out, acc);
      std::memcpy(y + t * y_stride + r0, out, static_cast<size_t>(nr) * sizeof(float));
    }
  }
}

#if defined(__ARM_FEATURE_DOTPROD)
// The batched path (MatmulBatchFn) over activation tiles of kArmTile tokens
// (kernels.h): a tile block's group g holds 4 bytes per token, so 16 bytes are four
// tokens' values of that group, and SDOT by lane multiplies them by one row's 4
// weights of the group: lanes are tokens. A step covers 4 rows x NQ quads of tokens;
// the weights are unpacked once per step for all its tokens. No repacking: the rows
// are read where they are.
constexpr int kArmTile = 8;

template <typename Traits, int NQ>
inline void q32_tile_step(const typename Traits::Block* const* rows, int nr, int64_t nb, const uint8_t* tile,
                          float* y, int64_t y_stride, int nt) {
  constexpr int64_t kBlockBytes = q8x32_tile_block_bytes(kArmTile);
  float32x4_t acc[4][NQ];
  for (int j = 0; j < 4; ++j) {
    for (int q = 0; q < NQ; ++q) acc[j][q] = vdupq_n_f32(0.0f);
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* xb = tile + b * kBlockBytes;
    int8x16_t lo[4], hi[4];
    float dw[4], mw[4];
    for (int j = 0; j < 4; ++j) {
      Traits::unpack(rows[j][b], &lo[j], &hi[j]);
      dw[j] = f16_to_f32_neon(rows[j][b].d);
      if constexpr (Traits::kMin) mw[j] = f16_to_f32_neon(rows[j][b].m);
    }
    int32x4_t isum[4][NQ];
    for (int j = 0; j < 4; ++j) {
      for (int q = 0; q < NQ; ++q) isum[j][q] = vdupq_n_s32(0);
    }
#define DSERVE_Q32_GROUP(G, W)                                                                 \
  for (int q = 0; q < NQ; ++q) {                                                               \
    const int8x16_t xg = vld1q_s8(reinterpret_cast<const int8_t*>(xb) + 4 * ((G) * kArmTile + 4 * q)); \
    for (int j = 0; j < 4; ++j) isum[j][q] = vdotq_laneq_s32(isum[j][q], xg, W[j], (G) % 4);   \
  }
    DSERVE_Q32_GROUP(0, lo)
    DSERVE_Q32_GROUP(1, lo)
    DSERVE_Q32_GROUP(2, lo)
    DSERVE_Q32_GROUP(3, lo)
    DSERVE_Q32_GROUP(4, hi)
    DSERVE_Q32_GROUP(5, hi)
    DSERVE_Q32_GROUP(6, hi)
    DSERVE_Q32_GROUP(7, hi)
#undef DSERVE_Q32_GROUP
    const float* xd = reinterpret_cast<const float*>(xb + 4 * 8 * kArmTile);
    const float* xs = xd + kArmTile;
    for (int q = 0; q < NQ; ++q) {
      const float32x4_t dq = vld1q_f32(xd + 4 * q);
      for (int j = 0; j < 4; ++j) {
        acc[j][q] = vfmaq_f32(acc[j][q], vcvtq_f32_s32(isum[j][q]), vmulq_n_f32(dq, dw[j]));
      }
      if constexpr (Traits::kMin) {
        const float32x4_t sq = vld1q_f32(xs + 4 * q);
        for (int j = 0; j < 4; ++j) acc[j][q] = vfmaq_n_f32(acc[j][q], sq, mw[j]);
      }
    }
  }
  for (int q = 0; q < NQ; ++q) {
    float out[4][4];  // [row][token]
    for (int j = 0; j < 4; ++j) vst1q_f32(out[j], acc[j][q]);
    for (int i = 0; i < 4 && 4 * q + i < nt; ++i) {
      for (int j = 0; j < nr; ++j) y[(4 * q + i) * y_stride + j] = out[j][i];
    }
  }
}

template <typename Traits>
void matmul_q32_batched(const uint8_t* w, size_t w_stride, const uint8_t* x_tiles, int64_t k, int64_t n_rows,
                        int64_t n_tokens, float* y, int64_t y_stride, uint8_t* scratch) {
  using Block = typename Traits::Block;
  const int64_t nb = k / 32;
  // A single token comes in a tile of width 1 (kernels.h), and the steps read four
  // tokens' values at once: widened into scratch (nb * 384 of its nb * 640 bytes).
  // The engine does not call this level with one token (matmul_batched_min_tokens).
  static_assert(matmul_batched_scratch_bytes(32) >= q8x32_tile_block_bytes(kArmTile));
  if (n_tokens == 1) {
    q8x32_widen_tile(x_tiles, k, kArmTile, scratch);
    x_tiles = scratch;
  }
  const int64_t tile_bytes = nb * q8x32_tile_block_bytes(kArmTile);
  for (int64_t r0 = 0; r0 < n_rows; r0 += 4) {
    const int nr = static_cast<int>(n_rows - r0 < 4 ? n_rows - r0 : 4);
    const Block* rows[4];
    for (int j = 0; j < 4; ++j) {
      rows[j] = reinterpret_cast<const Block*>(w + (r0 + (j < nr ? j : nr - 1)) * w_stride);
    }
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kArmTile) {
      const int nt = static_cast<int>(n_tokens - t0 < kArmTile ? n_tokens - t0 : kArmTile);
      const uint8_t* tile = x_tiles + t0 / kArmTile * tile_bytes;
      float* yt = y + t0 * y_stride + r0;
      // Slots past the last token hold stale values whose results are not stored.
      if (nt > 4) {
        q32_tile_step<Traits, 2>(rows, nr, nb, tile, yt, y_stride, nt);
      } else {
        q32_tile_step<Traits, 1>(rows, nr, nb, tile, yt, y_stride, nt);
      }
    }
  }
}
#endif  // __ARM_FEATURE_DOTPROD

// ---- Q4_K / Q5_K / Q6_K x Q8x256 ----
//
// Integer sums per sub-block as in kernels_scalar.cc (exact), then the same float
// expression per 256-block.

template <bool kFifthBit>
float dot_q45k_row(const uint8_t* w, const uint8_t* xb, int64_t k) {
  using Block = std::conditional_t<kFifthBit, block_q5_K, block_q4_K>;
  const Block* blocks = reinterpret_cast<const Block*>(w);
  const Q8x256Row a = q8x256_row(xb, k);
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  float acc = 0.0f;
  for (int64_t b = 0; b < k / 256; ++b) {
    const Block& blk = blocks[b];
    const int8_t* q8 = a.qs + b * 256;
    const int16_t* bs = a.bsums + b * 16;
    uint8x16_t qh0 = vdupq_n_u8(0), qh1 = vdupq_n_u8(0);
    if constexpr (kFifthBit) {
      qh0 = vld1q_u8(blk.qh);
      qh1 = vld1q_u8(blk.qh + 16);
    }
    int isum = 0, msum = 0;
    for (int g = 0; g < 4; ++g) {
      uint8_t sc_lo, mn_lo, sc_hi, mn_hi;
      q_k_scale_min(2 * g, blk.scales, &sc_lo, &mn_lo);
      q_k_scale_min(2 * g + 1, blk.scales, &sc_hi, &mn_hi);
      const uint8x16_t v0 = vld1q_u8(blk.qs + 32 * g), v1 = vld1q_u8(blk.qs + 32 * g + 16);
      uint8x16_t lo0 = vandq_u8(v0, low4), lo1 = vandq_u8(v1, low4);
      uint8x16_t hi0 = vshrq_n_u8(v0, 4), hi1 = vshrq_n_u8(v1, 4);
      if constexpr (kFifthBit) {
        // vtst gives 0xFF where the bit is set; keep 0x10 of it.
        const uint8x16_t sixteen = vdupq_n_u8(0x10);
        const uint8x16_t bit_lo = vdupq_n_u8(static_cast<uint8_t>(1 << (2 * g)));
        const uint8x16_t bit_hi = vdupq_n_u8(static_cast<uint8_t>(1 << (2 * g + 1)));
        lo0 = vorrq_u8(lo0, vandq_u8(vtstq_u8(qh0, bit_lo), sixteen));
        lo1 = vorrq_u8(lo1, vandq_u8(vtstq_u8(qh1, bit_lo), sixteen));
        hi0 = vorrq_u8(hi0, vandq_u8(vtstq_u8(qh0, bit_hi), sixteen));
        hi1 = vorrq_u8(hi1, vandq_u8(vtstq_u8(qh1, bit_hi), sixteen));
      }
      const int sum_lo =
          dot32(vreinterpretq_s8_u8(lo0), vreinterpretq_s8_u8(lo1), q8 + 64 * g);
      const int sum_hi =
          dot32(vreinterpretq_s8_u8(hi0), vreinterpretq_s8_u8(hi1), q8 + 64 * g + 32);
      isum += sc_lo * sum_lo + sc_hi * sum_hi;
      msum += mn_lo * (bs[4 * g] + bs[4 * g + 1]) + mn_hi * (bs[4 * g + 2] + bs[4 * g + 3]);
    }
    acc += a.d[b] * (f16_to_f32_neon(blk.d) * static_cast<float>(isum) -
                     f16_to_f32_neon(blk.dmin) * static_cast<float>(msum));
  }
  return acc;
}

// The sum over 16 values of a Q6_K weight vector (values 0..63, offset by -32 here)
// and 16 activations.
inline int dot16_q6(uint8x16_t q, const int8_t* a) {
  const int8x16_t w = vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(32));
  return vaddvq_s32(dot_s8(vdupq_n_s32(0), w, vld1q_s8(a)));
}

float dot_q6k_row(const uint8_t* w, const uint8_t* xb, int64_t k) {
  const auto* blocks = reinterpret_cast<const block_q6_K*>(w);
  const Q8x256Row a = q8x256_row(xb, k);
  const uint8x16_t low4 = vdupq_n_u8(0x0F), low2 = vdupq_n_u8(0x03);
  float acc = 0.0f;
  for (int64_t b = 0; b < k / 256; ++b) {
    const block_q6_K& blk = blocks[b];
    const int8_t* q8 = a.qs + b * 256;
    int isum = 0;
    for (int h = 0; h < 2; ++h) {  // two halves of 128 elements
      const uint8_t* ql = blk.ql + 64 * h;
      const uint8_t* qh = blk.qh + 32 * h;
      const int8_t* sc = blk.scales + 8 * h;
      const int8_t* a8 = q8 + 128 * h;
      for (int c = 0; c < 2; ++c) {  // elements 16c .. 16c + 15 of each quarter
        const uint8x16_t la = vld1q_u8(ql + 16 * c), lb = vld1q_u8(ql + 32 + 16 * c);
        const uint8x16_t hb = vld1q_u8(qh + 16 * c);
        const uint8x16_t q1 = vorrq_u8(vandq_u8(la, low4), vshlq_n_u8(vandq_u8(hb, low2), 4));
        const uint8x16_t q2 =
            vorrq_u8(vandq_u8(lb, low4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), low2), 4));
        const uint8x16_t q3 =
            vorrq_u8(vshrq_n_u8(la, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), low2), 4));
        const uint8x16_t q4 = vorrq_u8(vshrq_n_u8(lb, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4));
        isum += sc[c + 0] * dot16_q6(q1, a8 + 16 * c);
        isum += sc[c + 2] * dot16_q6(q2, a8 + 32 + 16 * c);
        isum += sc[c + 4] * dot16_q6(q3, a8 + 64 + 16 * c);
        isum += sc[c + 6] * dot16_q6(q4, a8 + 96 + 16 * c);
      }
    }
    acc += a.d[b] * f16_to_f32_neon(blk.d) * static_cast<float>(isum);
  }
  return acc;
}

#if defined(__ARM_FEATURE_DOTPROD)
// ---- Q4_K / Q5_K / Q6_K, batched (MatmulBatchFn over Q8x256 rows) ----
//
// Tokens as SDOT lanes, as for the 32-block types: up to 16 tokens at a time are
// regrouped into the thread's scratch (per 256-block: for each quad of 4 tokens and
// each group of 4 elements, the quad's 4 x 4 bytes; then per quad and sub-block of 32
// the 4 tokens' sums of their values, and their block scales), and each weight row's
// block is unpacked once to 256 int8 values (stack) for those 16 tokens. A block's
// integer dots are exact and its float steps are the per-row kernels' (with
// -ffp-contract=off, written the same way), so every token gets the per-row bits.
constexpr int kKqTokens = 16;
constexpr int kKqQuads = kKqTokens / 4;
constexpr int64_t kKqQsBytes = kKqQuads * 64 * 16;                       // per 256-block
constexpr int64_t kKqBlockBytes = kKqQsBytes + kKqQuads * 8 * 16 + kKqQuads * 16;
static_assert(kKqBlockBytes <= matmul_batched_scratch_bytes(256), "the regrouped tokens fit the scratch");

// Tokens [t0, t0 + nt) of the Q8x256 rows into the layout above; absent tokens are zeros.
inline void regroup_q8x256(const uint8_t* x, size_t x_stride, int64_t k, int64_t t0, int nt, uint8_t* out) {
  const int64_t nb = k / 256;
  std::memset(out, 0, static_cast<size_t>(nb * kKqBlockBytes));
  for (int i = 0; i < nt; ++i) {
    const Q8x256Row a = q8x256_row(x + (t0 + i) * x_stride, k);
    const int q = i / 4, lane = i % 4;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = out + b * kKqBlockBytes;
      uint8_t* qs = blk + q * 64 * 16 + 4 * lane;
      for (int g = 0; g < 64; ++g) std::memcpy(qs + 16 * g, a.qs + 256 * b + 4 * g, 4);
      auto* sums = reinterpret_cast<int32_t*>(blk + kKqQsBytes) + q * 8 * 4 + lane;
      const int16_t* bs = a.bsums + 16 * b;
      for (int sb = 0; sb < 8; ++sb) sums[4 * sb] = bs[2 * sb] + bs[2 * sb + 1];
      auto* d = reinterpret_cast<float*>(blk + kKqQsBytes + kKqQuads * 8 * 16) + 4 * q + lane;
      *d = a.d[b];
    }
  }
}

// A row's 256-block as 16 chunks of 16 int8 weights with one integer scale each (the
// sub-block's), plus Q4_K/Q5_K's minimum terms.
struct KBlock {
  alignas(16) int8_t w[256];
  int32_t scale[16];
  int32_t mn[8];
  float d, dmin;
};

template <bool kFifthBit>
inline void unpack_q45k(const uint8_t* p, KBlock* out) {
  using Block = std::conditional_t<kFifthBit, block_q5_K, block_q4_K>;
  const Block& blk = *reinterpret_cast<const Block*>(p);
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  uint8x16_t qh0 = vdupq_n_u8(0), qh1 = vdupq_n_u8(0);
  if constexpr (kFifthBit) {
    qh0 = vld1q_u8(blk.qh);
    qh1 = vld1q_u8(blk.qh + 16);
  }
  for (int g = 0; g < 4; ++g) {
    uint8_t sc_lo, mn_lo, sc_hi, mn_hi;
    q_k_scale_min(2 * g, blk.scales, &sc_lo, &mn_lo);
    q_k_scale_min(2 * g + 1, blk.scales, &sc_hi, &mn_hi);
    out->scale[4 * g] = out->scale[4 * g + 1] = sc_lo;
    out->scale[4 * g + 2] = out->scale[4 * g + 3] = sc_hi;
    out->mn[2 * g] = mn_lo;
    out->mn[2 * g + 1] = mn_hi;
    const uint8x16_t v0 = vld1q_u8(blk.qs + 32 * g), v1 = vld1q_u8(blk.qs + 32 * g + 16);
    uint8x16_t lo0 = vandq_u8(v0, low4), lo1 = vandq_u8(v1, low4);
    uint8x16_t hi0 = vshrq_n_u8(v0, 4), hi1 = vshrq_n_u8(v1, 4);
    if constexpr (kFifthBit) {
      const uint8x16_t sixteen = vdupq_n_u8(0x10);
      const uint8x16_t bit_lo = vdupq_n_u8(static_cast<uint8_t>(1 << (2 * g)));
      const uint8x16_t bit_hi = vdupq_n_u8(static_cast<uint8_t>(1 << (2 * g + 1)));
      lo0 = vorrq_u8(lo0, vandq_u8(vtstq_u8(qh0, bit_lo), sixteen));
      lo1 = vorrq_u8(lo1, vandq_u8(vtstq_u8(qh1, bit_lo), sixteen));
      hi0 = vorrq_u8(hi0, vandq_u8(vtstq_u8(qh0, bit_hi), sixteen));
      hi1 = vorrq_u8(hi1, vandq_u8(vtstq_u8(qh1, bit_hi), sixteen));
    }
    vst1q_s8(out->w + 64 * g, vreinterpretq_s8_u8(lo0));
    vst1q_s8(out->w + 64 * g + 16, vreinterpretq_s8_u8(lo1));
    vst1q_s8(out->w + 64 * g + 32, vreinterpretq_s8_u8(hi0));
    vst1q_s8(out->w + 64 * g + 48, vreinterpretq_s8_u8(hi1));
  }
  out->d = f16_to_f32_neon(blk.d);
  out->dmin = f16_to_f32_neon(blk.dmin);
}

inline void unpack_q6k(const uint8_t* p, KBlock* out) {
  const block_q6_K& blk = *reinterpret_cast<const block_q6_K*>(p);
  const uint8x16_t low4 = vdupq_n_u8(0x0F), low2 = vdupq_n_u8(0x03);
  const int8x16_t off = vdupq_n_s8(32);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = blk.ql + 64 * h;
    const uint8_t* qh = blk.qh + 32 * h;
    for (int c = 0; c < 2; ++c) {
      const uint8x16_t la = vld1q_u8(ql + 16 * c), lb = vld1q_u8(ql + 32 + 16 * c);
      const uint8x16_t hb = vld1q_u8(qh + 16 * c);
      const uint8x16_t q[4] = {
          vorrq_u8(vandq_u8(la, low4), vshlq_n_u8(vandq_u8(hb, low2), 4)),
          vorrq_u8(vandq_u8(lb, low4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), low2), 4)),
          vorrq_u8(vshrq_n_u8(la, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), low2), 4)),
          vorrq_u8(vshrq_n_u8(lb, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4))};
      for (int quarter = 0; quarter < 4; ++quarter) {
        vst1q_s8(out->w + 128 * h + 32 * quarter + 16 * c, vsubq_s8(vreinterpretq_s8_u8(q[quarter]), off));
      }
    }
  }
  for (int c = 0; c < 16; ++c) out->scale[c] = blk.scales[c];
  out->d = f16_to_f32_neon(blk.d);
}

// acc[q] (lane i = token 4q + i), q < NQ, += this block's term for NQ quads of the regrouped tile
// block `xb`, as dot_q45k_row / dot_q6k_row add it.
template <bool kHasMin, int NQ>
inline void kquant_block(const KBlock& w, const uint8_t* xb, float32x4_t* acc) {
  const int8_t* xq = reinterpret_cast<const int8_t*>(xb);
  int32x4_t isum[NQ];
  for (int q = 0; q < NQ; ++q) isum[q] = vdupq_n_s32(0);
  for (int c = 0; c < 16; ++c) {
    const int8x16_t wc = vld1q_s8(w.w + 16 * c);
    for (int q = 0; q < NQ; ++q) {
      const int8_t* x = xq + q * 64 * 16 + 4 * c * 16;  // groups 4c .. 4c + 3
      int32x4_t dot = vdupq_n_s32(0);
      dot = vdotq_laneq_s32(dot, vld1q_s8(x), wc, 0);
      dot = vdotq_laneq_s32(dot, vld1q_s8(x + 16), wc, 1);
      dot = vdotq_laneq_s32(dot, vld1q_s8(x + 32), wc, 2);
      dot = vdotq_laneq_s32(dot, vld1q_s8(x + 48), wc, 3);
      isum[q] = vmlaq_n_s32(isum[q], dot, w.scale[c]);
    }
  }
  const auto* sums = reinterpret_cast<const int32_t*>(xb + kKqQsBytes);
  const auto* dx = reinterpret_cast<const float*>(xb + kKqQsBytes + kKqQuads * 8 * 16);
  for (int q = 0; q < NQ; ++q) {
    const float32x4_t d = vld1q_f32(dx + 4 * q);
    if constexpr (kHasMin) {
      int32x4_t msum = vdupq_n_s32(0);
      for (int sb = 0; sb < 8; ++sb) msum = vmlaq_n_s32(msum, vld1q_s32(sums + 4 * (8 * q + sb)), w.mn[sb]);
      // acc += d_x * (d * isum - dmin * msum)
      const float32x4_t t = vsubq_f32(vmulq_n_f32(vcvtq_f32_s32(isum[q]), w.d),
                                      vmulq_n_f32(vcvtq_f32_s32(msum), w.dmin));
      acc[q] = vaddq_f32(acc[q], vmulq_f32(d, t));
    } else {
      // acc += d_x * d * isum
      acc[q] = vaddq_f32(acc[q], vmulq_f32(vmulq_n_f32(d, w.d), vcvtq_f32_s32(isum[q])));
    }
  }
}

template <int kType>  // 4: Q4_K, 5: Q5_K, 6: Q6_K
void matmul_kquant_batched_neon(const uint8_t* w, size_t w_stride, const uint8_t* x, int64_t k, int64_t n_rows,
                                int64_t n_tokens, float* y, int64_t y_stride, uint8_t* scratch) {
  constexpr bool kHasMin = kType != 6;
  constexpr int64_t kBlockBytes = kType == 4 ? sizeof(block_q4_K) : kType == 5 ? sizeof(block_q5_K)
                                                                                 : sizeof(block_q6_K);
  const int64_t nb = k / 256;
  const size_t x_stride = static_cast<size_t>(act_row_bytes(ActFormat::kQ8x256, k));
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kKqTokens) {
    const int nt = static_cast<int>(n_tokens - t0 < kKqTokens ? n_tokens - t0 : kKqTokens);
    regroup_q8x256(x, x_stride, k, t0, nt, scratch);
    for (int64_t r = 0; r < n_rows; ++r) {
      float32x4_t acc[kKqQuads];
      for (int q = 0; q < kKqQuads; ++q) acc[q] = vdupq_n_f32(0.0f);
      KBlock kb;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = w + r * w_stride + b * kBlockBytes;
        if constexpr (kType == 6) {
          unpack_q6k(p, &kb);
        } else {
          unpack_q45k<kType == 5>(p, &kb);
        }
        const uint8_t* xb = scratch + b * kKqBlockBytes;
        if (nt > 8) {
          kquant_block<kHasMin, 4>(kb, xb, acc);
        } else if (nt > 4) {
          kquant_block<kHasMin, 2>(kb, xb, acc);
        } else {
          kquant_block<kHasMin, 1>(kb, xb, acc);
        }
      }
      float out[kKqTokens];
      for (int q = 0; q < kKqQuads; ++q) vst1q_f32(out + 4 * q, acc[q]);
      for (int i = 0; i < nt; ++i) y[(t0 + i) * y_stride + r] = out[i];
    }
  }
}
#endif  // __ARM_FEATURE_DOTPROD

// ---- F32 / F16 / BF16 x F32 ----

template <DType T>
inline float32x4_t load_w4(const uint8_t* w, int64_t i) {
  if constexpr (T == DType::kF32) {
    return vld1q_f32(reinterpret_cast<const float*>(w) + i);
  } else if constexpr (T == DType::kF16) {
    return f16x4_to_f32(reinterpret_cast<const uint16_t*>(w) + i);
  } else {
    const uint16x4_t h = vld1_u16(reinterpret_cast<const uint16_t*>(w) + i);
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
  }
}

template <DType T>
inline float load_w1(const uint8_t* w, int64_t i) {
  uint16_t h;
  if constexpr (T == DType::kF32) {
    float f;
    std::memcpy(&f, w + 4 * i, 4);
    return f;
  } else if constexpr (T == DType::kF16) {
    std::memcpy(&h, w + 2 * i, 2);
    return f16_to_f32_neon(h);
  } else {
    std::memcpy(&h, w + 2 * i, 2);
    return bf16_to_f32_neon(h);
  }
}

// Four FMA chains 16 values apart, summed in a fixed tree, then the tail in order.
template <DType T>
float dot_float_row(const uint8_t* w, const uint8_t* xb, int64_t k) {
  const float* x = reinterpret_cast<const float*>(xb);
  float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    a0 = vfmaq_f32(a0, load_w4<T>(w, i), vld1q_f32(x + i));
    a1 = vfmaq_f32(a1, load_w4<T>(w, i + 4), vld1q_f32(x + i + 4));
    a2 = vfmaq_f32(a2, load_w4<T>(w, i + 8), vld1q_f32(x + i + 8));
    a3 = vfmaq_f32(a3, load_w4<T>(w, i + 12), vld1q_f32(x + i + 12));
  }
  for (; i + 4 <= k; i += 4) a0 = vfmaq_f32(a0, load_w4<T>(w, i), vld1q_f32(x + i));
  float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
  for (; i < k; ++i) s = fma1(load_w1<T>(w, i), x[i], s);
  return s;
}

// ---- the per-row matmul: every (row, token) result is one call of Dot ----

template <float (*Dot)(const uint8_t*, const uint8_t*, int64_t)>
void matmul_rows(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride, int64_t k,
                 int64_t n_rows, int64_t n_tokens, float* y, int64_t y_stride) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* wr = w + r * w_stride;
    for (int64_t t = 0; t < n_tokens; ++t) y[t * y_stride + r] = Dot(wr, x + t * x_stride, k);
  }
}

// ---- element-wise ----

float dot_f32_neon(const float* a, const float* b, int64_t n) {
  return dot_float_row<DType::kF32>(reinterpret_cast<const uint8_t*>(a),
                                    reinterpret_cast<const uint8_t*>(b), n);
}

void axpy_f32_neon(float alpha, const float* x, float* y, int64_t n) {
  const float32x4_t av = vdupq_n_f32(alpha);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), av, vld1q_f32(x + i)));
  for (; i < n; ++i) y[i] = fma1(alpha, x[i], y[i]);
}

void scale_f32_neon(float alpha, float* y, int64_t n) {
  const float32x4_t av = vdupq_n_f32(alpha);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(av, vld1q_f32(y + i)));
  for (; i < n; ++i) y[i] *= alpha;
}

void rms_norm_f32_neon(const float* x, const float* w, float eps, int64_t n, float* out) {
  const float ss = dot_f32_neon(x, x, n);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  const float32x4_t rv = vdupq_n_f32(r);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    vst1q_f32(out + i, vmulq_f32(vmulq_f32(vld1q_f32(x + i), rv), vld1q_f32(w + i)));
  }
  for (; i < n; ++i) out[i] = x[i] * r * w[i];
}

// exp(x) for x in about [-87, 88]: x = n ln2 + f, |f| <= ln2/2, exp(f) by a degree-6
// polynomial (relative error ~2e-7), times 2^n (the x86 levels' constants).
inline float32x4_t exp_vec(float32x4_t x) {
  x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.0f)), vdupq_n_f32(-87.0f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t f = vfmaq_f32(x, n, vdupq_n_f32(-0.693145751953125f));  // ln2 split in two
  f = vfmaq_f32(f, n, vdupq_n_f32(-1.428606765330187e-06f));
  float32x4_t p = vdupq_n_f32(1.0f / 720);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, f);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, f);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, f);
  p = vfmaq_f32(vdupq_n_f32(0.5f), p, f);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

void silu_mul_f32_neon(const float* gate, const float* up, int64_t n, float* out) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t g = vld1q_f32(gate + i);
    const float32x4_t e = exp_vec(vnegq_f32(g));
    vst1q_f32(out + i, vmulq_f32(vdivq_f32(g, vaddq_f32(one, e)), vld1q_f32(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void add_f32_neon(float* x, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vaddq_f32(vld1q_f32(x + i), vld1q_f32(y + i)));
  for (; i < n; ++i) x[i] += y[i];
}

float exp_sub_sum_f32_neon(float* x, float max, int64_t n) {
  const float32x4_t mv = vdupq_n_f32(max);
  float32x4_t acc = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t e = exp_vec(vsubq_f32(vld1q_f32(x + i), mv));
    vst1q_f32(x + i, e);
    acc = vaddq_f32(acc, e);
  }
  float sum = vaddvq_f32(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  return sum;
}

// ---- F16 KV cache rows ----

// FCVTN rounds to nearest even (the default FPCR mode, which dserve never changes):
// the same bits as f32_to_f16 in tensor/half.h.
void f32_to_f16_row_neon(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
  }
  for (; i < n; ++i) {
    out[i] = vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(x[i]))), 0);
  }
}

void f16_to_f32_row_neon(const uint16_t* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(out + i, f16x4_to_f32(x + i));
  for (; i < n; ++i) out[i] = f16_to_f32_neon(x[i]);
}

// ---- attention ----

inline float32x4_t load_kv4(const float* p) { return vld1q_f32(p); }
inline float32x4_t load_kv4(const uint16_t* p) { return f16x4_to_f32(p); }
inline float load_kv1(const float* p) { return *p; }
inline float load_kv1(const uint16_t* p) { return f16_to_f32_neon(*p); }
// FP8 rows: e4m3 bytes widened to halves of value / 256 (shifts and masks, as the x86
// levels do), to floats, times 256 (exact). Reads exactly 4 (or 1) bytes.
inline float16x4_t kv_f8x4_to_f16(uint32_t four) {
  const int16x4_t w = vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(four))));
  const int16x4_t h = vand_s16(vshl_n_s16(w, 7), vdup_n_s16(-0x4080));
  const uint16x4_t nan = vceq_s16(vand_s16(h, vdup_n_s16(0x3f80)), vdup_n_s16(0x3f80));
  return vreinterpret_f16_s16(vorr_s16(h, vand_s16(vreinterpret_s16_u16(nan), vdup_n_s16(0x7c00))));
}
inline float32x4_t load_kv4(const KvF8* p) {
  uint32_t four;
  std::memcpy(&four, p, 4);
  return vmulq_n_f32(vcvt_f32_f16(kv_f8x4_to_f16(four)), 256.0f);
}
inline float load_kv1(const KvF8* p) {
  return vgetq_lane_f32(vcvt_f32_f16(kv_f8x4_to_f16(p->bits)), 0) * 256.0f;
}

void f8_to_f32_row_neon(const KvF8* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(out + i, load_kv4(x + i));
  for (; i < n; ++i) out[i] = load_kv1(x + i);
}

// q . k over n elements: two FMA chains, a fixed reduction, the tail fused in order.
template <typename Elem>
inline float dot_kv(const float* q, const Elem* k, int n) {
  float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
  int d = 0;
  for (; d + 8 <= n; d += 8) {
    a0 = vfmaq_f32(a0, vld1q_f32(q + d), load_kv4(k + d));
    a1 = vfmaq_f32(a1, vld1q_f32(q + d + 4), load_kv4(k + d + 4));
  }
  for (; d + 4 <= n; d += 4) a0 = vfmaq_f32(a0, vld1q_f32(q + d), load_kv4(k + d));
  float s = vaddvq_f32(vaddq_f32(a0, a1));
  for (; d < n; ++d) s = fma1(q[d], load_kv1(k + d), s);
  return s;
}

// The online-softmax step (kernels.h), one query at a time over K/V rows of Elem
// (float, or uint16_t for IEEE halves: converted on load, then the same arithmetic in
// the same order, so both pools give the same bits). A query's result depends only on
// its own inputs.
template <typename Elem>
void attn_step_neon(const AttnStepArgs& a) {
  const Elem* k = static_cast<const Elem*>(a.k);
  const Elem* v = static_cast<const Elem*>(a.v);
  float* s = a.scores;
  for (int i = 0; i < a.n_q; ++i) {
    const int64_t n = a.n_visible[i] < a.n_keys ? a.n_visible[i] : a.n_keys;
    if (n <= 0) continue;  // no key of this step: state unchanged
    float block_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = dot_kv(a.q[i], k + j * a.k_stride, a.head_dim) * a.scale;
      block_max = s[j] > block_max ? s[j] : block_max;
    }
    const float m = a.m[i] > block_max ? a.m[i] : block_max;
    const float corr = std::exp(a.m[i] - m);  // 0 on the first step (m = -inf)
    const float sum = exp_sub_sum_f32_neon(s, m, n);
    float* acc = a.acc + int64_t{i} * a.v_dim;
    const float32x4_t cv = vdupq_n_f32(corr);
    int d = 0;
    for (; d + 8 <= a.v_dim; d += 8) {
      float32x4_t r0 = vmulq_f32(vld1q_f32(acc + d), cv);
      float32x4_t r1 = vmulq_f32(vld1q_f32(acc + d + 4), cv);
      for (int64_t j = 0; j < n; ++j) {
        const Elem* vr = v + j * a.v_stride + d;
        const float32x4_t pv = vdupq_n_f32(s[j]);
        r0 = vfmaq_f32(r0, pv, load_kv4(vr));
        r1 = vfmaq_f32(r1, pv, load_kv4(vr + 4));
      }
      vst1q_f32(acc + d, r0);
      vst1q_f32(acc + d + 4, r1);
    }
    for (; d < a.v_dim; ++d) {
      float r = acc[d] * corr;
      for (int64_t j = 0; j < n; ++j) r = fma1(s[j], load_kv1(v + j * a.v_stride + d), r);
      acc[d] = r;
    }
    a.l[i] = a.l[i] * corr + sum;
    a.m[i] = m;
  }
}


// ---- prompt attention: queries in vector lanes (attn_prompt_impl.h) ----

// 24 accumulators of 32 vector registers.
struct PromptVecNeon {
  using T = float32x4_t;
  static constexpr int kWidth = 4, kPromptAcc = 24;
  static T zero() { return vdupq_n_f32(0.0f); }
  static T set1(float a) { return vdupq_n_f32(a); }
  static T load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, T v) { vst1q_f32(p, v); }
  static T fma(T a, T b, T c) { return vfmaq_f32(c, a, b); }
  static T add(T a, T b) { return vaddq_f32(a, b); }
  static T sub(T a, T b) { return vsubq_f32(a, b); }
  static T mul(T a, T b) { return vmulq_f32(a, b); }
  static T max(T a, T b) { return vmaxq_f32(a, b); }
  static T select_ge(T a, T b, T x, T y) { return vbslq_f32(vcgeq_f32(a, b), x, y); }
  static T exp(T x) { return exp_vec(x); }
};

#include "backend/cpu/attn_prompt_impl.h"

// ---- W8A8 (DType::kI8): int8 rows with one f32 scale each, kQ8Token activations ----
// Both operands are signed, which is what SDOT (and vmull_s8) multiply, so no sign
// juggling as on x86. Every dot is the exact int32 sum (|w| <= 128, |x| <= 127: a
// widened pair of products fits int16 without dotprod), and the result is
// float(sum) * (w_scale * x_scale), the scalar kernel's operations: every level gives
// the same bits.

// MatmulI8Fn: one row and token at a time, 16 bytes per step, the k % 16 tail scalar.
void matmul_i8_neon(const uint8_t* w, size_t w_stride, const float* w_scales, const uint8_t* x, size_t x_stride,
                    int64_t k, int64_t n_rows, int64_t n_tokens, float* y, int64_t y_stride) {
  const int64_t k16 = k / 16 * 16;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const Q8TokenRow a = q8token_row(x + t * x_stride, k);
    for (int64_t r = 0; r < n_rows; ++r) {
      const auto* q = reinterpret_cast<const int8_t*>(w + r * w_stride);
      int32x4_t acc = vdupq_n_s32(0);
      for (int64_t j = 0; j < k16; j += 16) acc = dot_s8(acc, vld1q_s8(q + j), vld1q_s8(a.qs + j));
      int32_t sum = vaddvq_s32(acc);
      for (int64_t j = k16; j < k; ++j) sum += int32_t{q[j]} * int32_t{a.qs[j]};
      y[t * y_stride + r] = static_cast<float>(sum) * (w_scales[r] * a.d);
    }
  }
}

#if defined(__ARM_FEATURE_DOTPROD)
// The packed half panel (w8a8_panels.h) as two registers per group of 4 columns: rows
// 0-3 and rows 4-7, 4 bytes each. SDOT by lane multiplies every row's 4 bytes by the
// same 4 activation bytes, so 16 activation bytes loaded once serve 4 groups.
// NT tokens keep 2 NT accumulators and NT activation registers: NT = 8 uses 26 of 32.
constexpr int kI8TokensNeon = 8;

template <int NT>
struct I8HalfTileNeon {
  static void run(const uint8_t* half, int64_t k, const int8_t* const* x_rows, const float* x_scales, float* y,
                  int64_t y_stride, int n_rows) {
    int32x4_t lo[NT], hi[NT];
    for (int t = 0; t < NT; ++t) lo[t] = hi[t] = vdupq_n_s32(0);
    const auto* wq = reinterpret_cast<const int8_t*>(half);
    for (int64_t g = 0; g < k / 4; g += 4) {  // k % 32 == 0: whole steps of 4 groups
      int8x16_t xv[NT];
      for (int t = 0; t < NT; ++t) xv[t] = vld1q_s8(x_rows[t] + 4 * g);
      const int8_t* wg = wq + 32 * g;
#define DSERVE_I8_GROUP(L)                                           \
  {                                                                  \
    const int8x16_t w0 = vld1q_s8(wg + 32 * (L));                    \
    const int8x16_t w1 = vld1q_s8(wg + 32 * (L) + 16);               \
    for (int t = 0; t < NT; ++t) {                                   \
      lo[t] = vdotq_laneq_s32(lo[t], w0, xv[t], L);                  \
      hi[t] = vdotq_laneq_s32(hi[t], w1, xv[t], L);                  \
    }                                                                \
  }
      DSERVE_I8_GROUP(0)
      DSERVE_I8_GROUP(1)
      DSERVE_I8_GROUP(2)
      DSERVE_I8_GROUP(3)
#undef DSERVE_I8_GROUP
    }
    const float* ws = reinterpret_cast<const float*>(half + 8 * k);
    const float32x4_t ws_lo = vld1q_f32(ws), ws_hi = vld1q_f32(ws + 4);
    for (int t = 0; t < NT; ++t) {
      const float32x4_t xs = vdupq_n_f32(x_scales[t]);
      float out[kI8HalfRows];
      vst1q_f32(out, vmulq_f32(vcvtq_f32_s32(lo[t]), vmulq_f32(ws_lo, xs)));
      vst1q_f32(out + 4, vmulq_f32(vcvtq_f32_s32(hi[t]), vmulq_f32(ws_hi, xs)));
      std::memcpy(y + t * y_stride, out, static_cast<size_t>(n_rows) * sizeof(float));
    }
  }
};
#endif  // __ARM_FEATURE_DOTPROD

}  // namespace
}  // namespace dserve::cpu

// FP8 E4M3 weights, converted in registers (matmul_f8_neon).
#include "backend/cpu/kernels_arm_fp8.h"

namespace dserve::cpu {
namespace {

KernelTable make_arm_table(CpuIsa isa) {
  KernelTable t{};
  t.isa = isa;
  t.quantize_q8x32 = quantize_q8x32_neon;
  t.quantize_q8x256 = quantize_q8x256_neon;
  t.quantize_q8x32_tiles = quantize_q8x32_tiles_neon;
  t.matmul[static_cast<int>(DType::kF32)] = matmul_rows<dot_float_row<DType::kF32>>;
  t.matmul[static_cast<int>(DType::kF16)] = matmul_rows<dot_float_row<DType::kF16>>;
  t.matmul[static_cast<int>(DType::kBF16)] = matmul_rows<dot_float_row<DType::kBF16>>;
  t.matmul[static_cast<int>(DType::kQ8_0)] = matmul_q32_rows<Q8_0Traits>;
  t.matmul[static_cast<int>(DType::kQ4_0)] = matmul_q32_rows<Q4_0Traits>;
  t.matmul[static_cast<int>(DType::kQ4_1)] = matmul_q32_rows<Q4_1Traits>;
  t.matmul[static_cast<int>(DType::kQ4_K)] = matmul_rows<dot_q45k_row<false>>;
  t.matmul[static_cast<int>(DType::kQ5_K)] = matmul_rows<dot_q45k_row<true>>;
  t.matmul[static_cast<int>(DType::kQ6_K)] = matmul_rows<dot_q6k_row>;
  t.matmul_i8 = matmul_i8_neon;
  t.matmul_f8 = matmul_f8_neon;
#if defined(__ARM_FEATURE_DOTPROD)
  // Prompts and decode batches of 4 tokens or more: tokens as SDOT lanes (the per-row
  // kernels' bits); fewer go per row.
  t.matmul_batched[static_cast<int>(DType::kQ8_0)] = matmul_q32_batched<Q8_0Traits>;
  t.matmul_batched[static_cast<int>(DType::kQ4_0)] = matmul_q32_batched<Q4_0Traits>;
  t.matmul_batched[static_cast<int>(DType::kQ4_1)] = matmul_q32_batched<Q4_1Traits>;
  t.matmul_batched[static_cast<int>(DType::kQ4_K)] = matmul_kquant_batched_neon<4>;
  t.matmul_batched[static_cast<int>(DType::kQ5_K)] = matmul_kquant_batched_neon<5>;
  t.matmul_batched[static_cast<int>(DType::kQ6_K)] = matmul_kquant_batched_neon<6>;
  t.matmul_batched_min_tokens = 4;
  t.matmul_batched_tile = kArmTile;
  // W8A8's packed panels need SDOT's per-lane sums (the ARMv8.0 level runs per row).
  t.pack_i8 = pack_i8_halves;
  t.matmul_packed[static_cast<int>(DType::kI8)] = matmul_i8_packed_halves<kI8TokensNeon, I8HalfTileNeon>;
  t.packed_layout[static_cast<int>(DType::kI8)].block_bytes = 2 * 8 * 32;  // 16 rows x 32 bytes / 32 columns
  t.packed_layout[static_cast<int>(DType::kI8)].panel_extra_bytes = 2 * 4 * kI8HalfRows;
#endif
  t.dot_f32 = dot_f32_neon;
  t.axpy_f32 = axpy_f32_neon;
  t.scale_f32 = scale_f32_neon;
  t.rms_norm_f32 = rms_norm_f32_neon;
  t.silu_mul_f32 = silu_mul_f32_neon;
  t.add_f32 = add_f32_neon;
  t.exp_sub_sum_f32 = exp_sub_sum_f32_neon;
  t.attn_step_f32 = attn_step_neon<float>;
  t.attn_step_f16 = attn_step_neon<uint16_t>;
  t.attn_step_f8 = attn_step_neon<KvF8>;
  t.attn_prompt_f32 = attn_prompt<PromptVecNeon>;
  t.attn_prompt_queries = kAttnPromptVectors * PromptVecNeon::kWidth;
  t.f32_to_f16_row = f32_to_f16_row_neon;
  t.f16_to_f32_row = f16_to_f32_row_neon;
  t.f8_to_f32_row = f8_to_f32_row_neon;
  return t;
}

}  // namespace
}  // namespace dserve::cpu
