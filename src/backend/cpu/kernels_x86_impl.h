// x86 SIMD kernels shared by the AVX2 and AVX-512 levels. This header is included
// only by kernels_avx2.cc and kernels_avx512.cc, each compiled with its own target
// flags; everything here sits in an anonymous namespace so the two instantiations
// never merge at link time (a merged AVX-512 copy would crash an AVX2-only CPU).
// Avoid non-inline library templates here for the same reason.
//
// Integer paths work on 256-bit vectors, one 32-element block per vector: with
// AVX-512 VNNI the u8 x s8 products are vpdpbusd (and K-quant scales vpdpwssd);
// with AVX2 they are vpmaddubsw + vpmaddwd. Float paths use the full width
// (16 lanes with AVX-512, 8 with AVX2) via VecF below.
//
// Microkernels compute an NR x NT (rows x tokens) tile, loading each weight block
// once per tile and reusing it for every token.
#pragma once

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kernels_x86_impl.h needs -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/kernels.h"
#include "tensor/quant_blocks.h"

namespace dserve::cpu {
namespace {

// 32 vector registers with AVX-512 (also for 256-bit code), 16 with AVX2.
#if defined(__AVX512F__)
constexpr int kTileRows = 4, kTileTokens = 4;
#else
constexpr int kTileRows = 4, kTileTokens = 2;
#endif

// The hint of the decode kernels' software prefetches of weights they will stream:
// into L2, not L1. A decode kernel issues one per cache line it will read, and
// prefetches into L1 hold the core's few fill buffers, which its demand loads then wait
// for. On a Zen 4 core (matmul_bench decode/q8_0/vocab_65536x1024, stream/moe_q8_0, 1
// thread, three alternating rounds) L1 gave 11.6-16.4 and 10.1-16.5 GB/s, L2 16.2-17.9
// and 16.4-17.3. (The AVX2 half panels still use L1: on Zen 4 their A/B was mixed, and
// Zen 3, their machine, is not measured yet.)
constexpr auto kStreamPrefetchHint = _MM_HINT_T1;

inline float f16_load(const uint16_t& h) { return _cvtsh_ss(h); }

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int hsum256_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The sums of a, b, c, d as the four lanes of one vector.
inline __m128 hsum4_256(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b);  // a01 a23 b01 b23 | a45 a67 b45 b67
  const __m256 cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// ---- integer dot-product primitives ----

// acc + sum over each 4 bytes of u8(a) * s8(b), as 8 int32 lanes. Pairs of products
// must fit int16 for the AVX2 form: |a| <= 128 with |b| <= 127 does.
inline __m256i dot_u8s8(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, a, b);
#else
  const __m256i p16 = _mm256_maddubs_epi16(a, b);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
#endif
}

// acc + sum over pairs of int16 a * b, as 8 int32 lanes.
inline __m256i dot_s16(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// The 32 nibbles of a Q4_0/Q4_1 block, in element order (low nibbles are elements
// 0..15, high nibbles 16..31): the 16 bytes in both halves, the upper half shifted
// right by 4 (a 32-bit shift: the bits it pulls in from the next byte are masked).
inline __m256i unpack_nibbles32(const uint8_t* qs) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

// ---- activation quantisation (bit-identical to kernels_scalar.cc) ----

// Quantises 8 * n_vec floats with one scale; returns the scale and the int32 sum.
inline float quantize_span(const float* x, int n_vec, int8_t* q, int* sum_out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax_v = _mm256_setzero_ps();
  for (int i = 0; i < n_vec; ++i) {
    amax_v = _mm256_max_ps(amax_v, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax_v), _mm256_extractf128_ps(amax_v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float amax = _mm_cvtss_f32(m);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 idv = _mm256_set1_ps(id);
  __m256i sum = _mm256_setzero_si256();
  for (int i = 0; i < n_vec; i += 4) {  // 32 values -> 32 bytes
    __m256i v[4];
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * (i + j)), idv));
      sum = _mm256_add_epi32(sum, v[j]);
    }
    // packs work within 128-bit lanes; the permute restores element order.
    const __m256i p01 = _mm256_packs_epi32(v[0], v[1]);
    const __m256i p23 = _mm256_packs_epi32(v[2], v[3]);
    const __m256i p = _mm256_packs_epi16(p01, p23);
    const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * (i / 4)), ordered);
  }
  *sum_out = hsum256_epi32(sum);
  return d;
}

void quantize_q8x32_x86(const float* x, int64_t k, uint8_t* out) {
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* d = reinterpret_cast<float*>(out + round_up(k, kActAlign));
  float* s = d + k / 32;
  for (int64_t b = 0; b < k / 32; ++b) {
    int sum = 0;
    d[b] = quantize_span(x + 32 * b, 4, qs + 32 * b, &sum);
    s[b] = d[b] * static_cast<float>(sum);
  }
}

// quantize_q8x32_x86 + q8x32_copy_to_tiles in one pass: each block's 32 values are
// quantised once and written straight to their tile slots (kernels.h's layout).
void quantize_q8x32_tiles_x86(const float* x, int64_t k, int64_t t, int64_t tile,
                              uint8_t* tiles) {
  const int64_t block_bytes = q8x32_tile_block_bytes(tile);
  uint8_t* base = tiles + t / tile * (k / 32) * block_bytes + 4 * (t % tile);
  alignas(32) int8_t qs[32];
  for (int64_t b = 0; b < k / 32; ++b) {
    int sum = 0;
    const float d = quantize_span(x + 32 * b, 4, qs, &sum);
    store_q8x32_tile_slot(base + b * block_bytes, tile, qs, d, d * static_cast<float>(sum), sum);
  }
}

void quantize_q8x256_x86(const float* x, int64_t k, uint8_t* out) {
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* d = reinterpret_cast<float*>(out + round_up(k, kActAlign));
  int16_t* bsums = reinterpret_cast<int16_t*>(d + k / 256);
  for (int64_t b = 0; b < k / 256; ++b) {
    int sum = 0;
    d[b] = quantize_span(x + 256 * b, 32, qs + 256 * b, &sum);
  }
  // Sums of 16 bytes: sign-extend to int16 and add pairs of 16-lane vectors.
  for (int64_t g = 0; g < k / 16; g += 2) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 16 * g));
    const __m256i lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
    const __m256i hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
    bsums[g] = static_cast<int16_t>(hsum256_epi32(_mm256_madd_epi16(lo, _mm256_set1_epi16(1))));
    bsums[g + 1] = static_cast<int16_t>(hsum256_epi32(_mm256_madd_epi16(hi, _mm256_set1_epi16(1))));
  }
}

// ---- tile dispatch: runs Kernel::run<NR, NT> over an n_rows x n_tokens tile ----

struct TileArgs {
  const uint8_t* w;
  size_t w_stride;
  const uint8_t* x;
  size_t x_stride;
  int64_t k;
  float* y;
  int64_t y_stride;
};

// Kernel::run<NR, NT> for NR <= Kernel::kMaxRows, NT <= Kernel::kMaxTokens (both <= 4).
template <typename Kernel, int NR>
inline void dispatch_nt(int nt, const TileArgs& a) {
  if constexpr (NR <= Kernel::kMaxRows) {
    switch (nt) {
      case 1: Kernel::template run<NR, 1>(a); break;
      case 2: if constexpr (Kernel::kMaxTokens >= 2) Kernel::template run<NR, 2>(a); break;
      case 3: if constexpr (Kernel::kMaxTokens >= 3) Kernel::template run<NR, 3>(a); break;
      default: if constexpr (Kernel::kMaxTokens >= 4) Kernel::template run<NR, 4>(a); break;
    }
  }
}

// Prefill tiles are up to kMaxRows x kMaxTokens; single-token (decode) calls use
// kDecodeRows x 1, which spreads the per-row fixed costs over more rows.
template <typename Kernel>
void matmul_tiles(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride, int64_t k,
                  int64_t n_rows, int64_t n_tokens, float* y, int64_t y_stride) {
  static_assert(Kernel::kMaxRows >= 1 && Kernel::kMaxRows <= 4 && Kernel::kMaxTokens >= 1 &&
                Kernel::kMaxTokens <= 4 && Kernel::kDecodeRows <= 4);
  const int max_rows = n_tokens == 1 ? Kernel::kDecodeRows : Kernel::kMaxRows;
  for (int64_t r0 = 0; r0 < n_rows; r0 += max_rows) {
    const int nr = static_cast<int>(n_rows - r0 < max_rows ? n_rows - r0 : max_rows);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += Kernel::kMaxTokens) {
      const int nt = static_cast<int>(
          n_tokens - t0 < Kernel::kMaxTokens ? n_tokens - t0 : Kernel::kMaxTokens);
      const TileArgs a{w + r0 * w_stride, w_stride,     x + t0 * x_stride, x_stride,
                       k,                 y + t0 * y_stride + r0, y_stride};
      if (nt == 1) {
        switch (nr) {
          case 1: Kernel::template run<1, 1>(a); break;
          case 2: if constexpr (Kernel::kDecodeRows >= 2) Kernel::template run<2, 1>(a); break;
          case 3: if constexpr (Kernel::kDecodeRows >= 3) Kernel::template run<3, 1>(a); break;
          default: if constexpr (Kernel::kDecodeRows >= 4) Kernel::template run<4, 1>(a); break;
        }
        continue;
      }
      switch (nr) {
        case 1: dispatch_nt<Kernel, 1>(nt, a); break;
        case 2: dispatch_nt<Kernel, 2>(nt, a); break;
        case 3: dispatch_nt<Kernel, 3>(nt, a); break;
        default: dispatch_nt<Kernel, 4>(nt, a); break;
      }
    }
  }
}

// ---- Q8_0 / Q4_0 / Q4_1 x Q8x32 ----
//
// Blocks are taken 8 at a time: the 8 integer block dots are reduced to one vector
// of 8 sums, so the per-block float work (scale products, conversion, FMA, Q4_1's
// min term) runs once per 8 blocks on full vectors. The 8 block headers come in
// with one gather.

// [sum(v[0]), ..., sum(v[7])] of eight 8-lane int32 vectors. Unpacks rather than
// vphaddd: cheaper, and they have EVEX forms, so all 32 registers stay usable.
inline __m256i reduce8_epi32(const __m256i v[8]) {
  __m256i s[4], t[2];
  for (int i = 0; i < 4; ++i) {  // per 128-bit half: [a0+a2, b0+b2, a1+a3, b1+b3]
    s[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                            _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 2; ++i) {  // per 128-bit half: [a, b, c, d] half sums
    t[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(s[2 * i], s[2 * i + 1]),
                            _mm256_unpackhi_epi64(s[2 * i], s[2 * i + 1]));
  }
  return _mm256_add_epi32(_mm256_permute2x128_si256(t[0], t[1], 0x20),
                          _mm256_permute2x128_si256(t[0], t[1], 0x31));
}

// Weight-block traits: unpack() gives 32 weights as bytes; kSigned says whether they
// are signed (then |w| times sign-adjusted x is used) or unsigned nibbles.
struct Q8_0Traits {
  using Block = block_q8_0;
  static constexpr bool kWideDecode = true;
  static constexpr bool kSigned = true;
  static constexpr bool kMin = false;
  static __m256i unpack(const Block& b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
  }
};

struct Q4_0Traits {
  using Block = block_q4_0;
  static constexpr bool kWideDecode = false;
  static constexpr bool kSigned = true;
  static constexpr bool kMin = false;
  static __m256i unpack(const Block& b) {
    return _mm256_sub_epi8(unpack_nibbles32(b.qs), _mm256_set1_epi8(8));
  }
};

struct Q4_1Traits {
  using Block = block_q4_1;
  static constexpr bool kWideDecode = false;
  static constexpr bool kSigned = false;
  static constexpr bool kMin = true;
  static __m256i unpack(const Block& b) { return unpack_nibbles32(b.qs); }
};

template <typename Traits>
struct Q32Kernel {
  using Block = typename Traits::Block;
  // Tile shapes measured on Zen 4: more decode rows per call help Q8_0 but make the
  // nibble types spill.
#if defined(__AVX512F__)
  static constexpr int kMaxRows = 1, kMaxTokens = 4, kDecodeRows = Traits::kWideDecode ? 4 : 2;
#else
  static constexpr int kMaxRows = 1, kMaxTokens = 2, kDecodeRows = 2;
#endif

  // Adds the contribution of blocks [b0, b0 + n) (n <= 8; kFull: n == 8).
  template <bool kFull, int NR, int NT>
  static void group(const Block* const* w, const Q8x32Row* x, int64_t b0, int n,
                    __m256 (&acc)[NR][NT]) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(kFull ? 8 : n), lane);
    __m256 dx[NT], sx[NT];
    for (int t = 0; t < NT; ++t) {
      dx[t] = kFull ? _mm256_loadu_ps(x[t].d + b0) : _mm256_maskload_ps(x[t].d + b0, mask);
      if constexpr (Traits::kMin) {
        sx[t] = kFull ? _mm256_loadu_ps(x[t].s + b0) : _mm256_maskload_ps(x[t].s + b0, mask);
      }
    }
    const __m256i offsets = _mm256_mullo_epi32(lane, _mm256_set1_epi32(sizeof(Block)));
    // Within each 128-bit half: the four d's, then the four m's.
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    for (int r = 0; r < NR; ++r) {
      const Block* blk = w[r] + b0;
      const int* base = reinterpret_cast<const int*>(blk);
      const __m256i head =
          kFull ? _mm256_i32gather_epi32(base, offsets, 1)
                : _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), base, offsets, mask, 1);
      const __m256i dm = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(head, split), 0xd8);
      const __m256 dw = _mm256_cvtph_ps(_mm256_castsi256_si128(dm));
      __m256i q[8], qa[8];
      for (int j = 0; j < 8; ++j) {
        q[j] = (kFull || j < n) ? Traits::unpack(blk[j]) : _mm256_setzero_si256();
        qa[j] = Traits::kSigned ? _mm256_sign_epi8(q[j], q[j]) : q[j];
      }
      for (int t = 0; t < NT; ++t) {
        __m256i dots[8];
        for (int j = 0; j < 8; ++j) {
          if (kFull || j < n) {
            __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].qs + 32 * (b0 + j)));
            if constexpr (Traits::kSigned) xv = _mm256_sign_epi8(xv, q[j]);
            dots[j] = dot_u8s8(_mm256_setzero_si256(), qa[j], xv);
          } else {
            dots[j] = _mm256_setzero_si256();
          }
        }
        const __m256 sums = _mm256_cvtepi32_ps(reduce8_epi32(dots));
        acc[r][t] = _mm256_fmadd_ps(sums, _mm256_mul_ps(dw, dx[t]), acc[r][t]);
        if constexpr (Traits::kMin) {
          const __m256 mw = _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1));
          acc[r][t] = _mm256_fmadd_ps(mw, sx[t], acc[r][t]);
        }
      }
    }
  }

  // Adds the contribution of block b alone: cheaper than a group for a short tail.
  template <int NR, int NT>
  static void single(const Block* const* w, const Q8x32Row* x, int64_t b, __m256 (&acc)[NR][NT]) {
    for (int r = 0; r < NR; ++r) {
      const Block& blk = w[r][b];
      const __m256i q = Traits::unpack(blk);
      const __m256i qa = Traits::kSigned ? _mm256_sign_epi8(q, q) : q;
      const float dw = f16_load(blk.d);
      for (int t = 0; t < NT; ++t) {
        __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].qs + 32 * b));
        if constexpr (Traits::kSigned) xv = _mm256_sign_epi8(xv, q);
        const __m256i dot = dot_u8s8(_mm256_setzero_si256(), qa, xv);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * x[t].d[b]), acc[r][t]);
        if constexpr (Traits::kMin) {
          const float m = f16_load(blk.m);
          acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_zextps128_ps256(_mm_set_ss(m * x[t].s[b])));
        }
      }
    }
  }

  template <int NR, int NT>
  static void run(const TileArgs& a) {
    const int64_t nb = a.k / 32;
    const Block* w[NR];
    for (int r = 0; r < NR; ++r) w[r] = reinterpret_cast<const Block*>(a.w + r * a.w_stride);
    Q8x32Row x[NT];
    for (int t = 0; t < NT; ++t) x[t] = q8x32_row(a.x + t * a.x_stride, a.k);
    __m256 acc[NR][NT];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    int64_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) group<true, NR, NT>(w, x, b0, 8, acc);
    if (nb - b0 >= 4) {
      group<false, NR, NT>(w, x, b0, static_cast<int>(nb - b0), acc);
    } else {
      for (int64_t b = b0; b < nb; ++b) single<NR, NT>(w, x, b, acc);
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) a.y[t * a.y_stride + r] = hsum256(acc[r][t]);
    }
  }
};

// ---- Q4_K / Q5_K / Q6_K x Q8x256 ----

// The 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K/Q5_K block; see
// q_k_scale_min() in quant_blocks.h for the packing.
inline void unpack_k_scales(const uint8_t* scales, uint8_t out[16]) {
  uint32_t w[3];
  std::memcpy(w, scales, 12);
  const uint32_t sc_lo = w[0] & 0x3f3f3f3fu;
  const uint32_t mn_lo = w[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
  const uint32_t o[4] = {sc_lo, sc_hi, mn_lo, mn_hi};
  std::memcpy(out, o, 16);
}

template <bool kFifthBit>
struct Q45KKernel {
  using Block = std::conditional_t<kFifthBit, block_q5_K, block_q4_K>;
  static constexpr int kMaxRows = kTileRows / 2, kMaxTokens = kTileTokens, kDecodeRows = 4;

  template <int NR, int NT>
  static void run(const TileArgs& a) {
    const int64_t nb = a.k / 256;
    const Block* w[NR];
    for (int r = 0; r < NR; ++r) w[r] = reinterpret_cast<const Block*>(a.w + r * a.w_stride);
    Q8x256Row x[NT];
    for (int t = 0; t < NT; ++t) x[t] = q8x256_row(a.x + t * a.x_stride, a.k);
    const __m256i low4 = _mm256_set1_epi8(0x0F);

    __m256 acc[NR][NT];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
      for (int r = 0; r < NR; ++r) {
        const Block& blk = w[r][b];
        alignas(16) uint8_t sm[16];
        unpack_k_scales(blk.scales, sm);
        // Scales as int16 pairs broadcast per sub-block; mins as 8 int32 lanes.
        const __m128i sm_v = _mm_load_si128(reinterpret_cast<const __m128i*>(sm));
        const __m256i mins = _mm256_cvtepu8_epi32(_mm_srli_si128(sm_v, 8));
        __m256i qh;
        if constexpr (kFifthBit) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh));
        __m256i isum[NT], msum[NT];
        for (int t = 0; t < NT; ++t) {
          isum[t] = _mm256_setzero_si256();
          // sum_j mn_j * (bsums[2j] + bsums[2j+1])
          const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].bsums + 16 * b));
          const __m256i bs32 = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));
          msum[t] = _mm256_mullo_epi32(bs32, mins);
        }
        for (int g = 0; g < 4; ++g) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * g));
          __m256i lo = _mm256_and_si256(q, low4);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
          if constexpr (kFifthBit) {
            const __m256i one = _mm256_set1_epi8(1);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
          }
          const __m256i sc_lo = _mm256_set1_epi16(sm[2 * g]);
          const __m256i sc_hi = _mm256_set1_epi16(sm[2 * g + 1]);
          for (int t = 0; t < NT; ++t) {
            const int8_t* xq = x[t].qs + 256 * b + 64 * g;
            const __m256i x_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
            const __m256i x_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
            isum[t] = dot_s16(isum[t], _mm256_maddubs_epi16(lo, x_lo), sc_lo);
            isum[t] = dot_s16(isum[t], _mm256_maddubs_epi16(hi, x_hi), sc_hi);
          }
        }
        const float d = f16_load(blk.d);
        const float dmin = f16_load(blk.dmin);
        for (int t = 0; t < NT; ++t) {
          const float dx = x[t].d[b];
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * dx), acc[r][t]);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[t]), _mm256_set1_ps(-dmin * dx), acc[r][t]);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) a.y[t * a.y_stride + r] = hsum256(acc[r][t]);
    }
  }
};

struct Q6KKernel {
  static constexpr int kMaxRows = kTileRows / 2, kMaxTokens = kTileTokens, kDecodeRows = 4;
  template <int NR, int NT>
  static void run(const TileArgs& a) {
    const int64_t nb = a.k / 256;
    const block_q6_K* w[NR];
    for (int r = 0; r < NR; ++r) w[r] = reinterpret_cast<const block_q6_K*>(a.w + r * a.w_stride);
    Q8x256Row x[NT];
    for (int t = 0; t < NT; ++t) x[t] = q8x256_row(a.x + t * a.x_stride, a.k);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i two = _mm256_set1_epi8(0x03);

    __m256 acc[NR][NT];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
      for (int r = 0; r < NR; ++r) {
        const block_q6_K& blk = w[r][b];
        // 16 int8 scales as int16.
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales)));
        __m256i isum[NT];
        for (int t = 0; t < NT; ++t) {
          // The -32 offset: -32 * sum_j sc_j * bsums_j.
          const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].bsums + 16 * b));
          isum[t] = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5);
          isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), isum[t]);
        }
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = blk.ql + 64 * h;
          const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
          const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * h));
          __m256i q[4];
          q[0] = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, two), 4));
          q[1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                 _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4));
          q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                 _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4));
          q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                 _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4));
          for (int i = 0; i < 4; ++i) {
            // Elements 128h + 32i + [0, 16) use scale 8h + 2i, [16, 32) scale 8h + 2i + 1.
            const int s = 8 * h + 2 * i;
            const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(blk.scales[s + 1]),
                                                _mm_set1_epi16(blk.scales[s]));
            for (int t = 0; t < NT; ++t) {
              const __m256i xv = _mm256_loadu_si256(
                  reinterpret_cast<const __m256i*>(x[t].qs + 256 * b + 128 * h + 32 * i));
              isum[t] = dot_s16(isum[t], _mm256_maddubs_epi16(q[i], xv), sc);
            }
          }
        }
        const float d = f16_load(blk.d);
        for (int t = 0; t < NT; ++t) {
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * x[t].d[b]), acc[r][t]);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) a.y[t * a.y_stride + r] = hsum256(acc[r][t]);
    }
  }
};

// ---- float vectors: full width ----

#if defined(__AVX512F__)
struct VecF {
  using T = __m512;
  static constexpr int kWidth = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float a) { return _mm512_set1_ps(a); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static T load_bf16(const uint16_t* p) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T min(T a, T b) { return _mm512_min_ps(a, b); }
  static T round(T a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral n in [-126, 127].
  static T pow2i(T n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static float sum(T v) { return _mm512_reduce_add_ps(v); }
  // Lanes where a >= b (ordered) take x, the others y.
  static T select_ge(T a, T b, T x, T y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GE_OQ), y, x);
  }
  // The sums of a, b, c, d as the four lanes of one vector.
  static __m128 sum4(T a, T b, T c, T d) {
    auto fold = [](T v) {
      return _mm256_add_ps(_mm512_castps512_ps256(v),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    };
    return hsum4_256(fold(a), fold(b), fold(c), fold(d));
  }
};
#else
struct VecF {
  using T = __m256;
  static constexpr int kWidth = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float a) { return _mm256_set1_ps(a); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static T load_bf16(const uint16_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T min(T a, T b) { return _mm256_min_ps(a, b); }
  static T round(T a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T pow2i(T n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static float sum(T v) { return hsum256(v); }
  static T select_ge(T a, T b, T x, T y) {
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_GE_OQ));
  }
  static __m128 sum4(T a, T b, T c, T d) { return hsum4_256(a, b, c, d); }
};
#endif

// ---- F32 / F16 / BF16 weights x F32 activations ----

inline float load_scalar(const uint16_t* p, int64_t i, bool bf16) {
  if (bf16) {
    const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  return _cvtsh_ss(p[i]);
}

template <DType kType>
struct FloatKernel {
  static constexpr int kMaxRows = kTileRows, kMaxTokens = kTileTokens, kDecodeRows = 4;
  using Elem = std::conditional_t<kType == DType::kF32, float, uint16_t>;
  static VecF::T load(const Elem* p) {
    if constexpr (kType == DType::kF32) {
      return VecF::load(p);
    } else if constexpr (kType == DType::kF16) {
      return VecF::load_f16(p);
    } else {
      return VecF::load_bf16(p);
    }
  }
  static float load1(const Elem* p, int64_t i) {
    if constexpr (kType == DType::kF32) {
      return p[i];
    } else {
      return load_scalar(p, i, kType == DType::kBF16);
    }
  }

  template <int NR, int NT>
  static void run(const TileArgs& a) {
    constexpr int W = VecF::kWidth;
    const Elem* w[NR];
    for (int r = 0; r < NR; ++r) w[r] = reinterpret_cast<const Elem*>(a.w + r * a.w_stride);
    const float* x[NT];
    for (int t = 0; t < NT; ++t) x[t] = reinterpret_cast<const float*>(a.x + t * a.x_stride);
    VecF::T acc[NR][NT];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) acc[r][t] = VecF::zero();
    }
    // Decode reads NR rows side by side, each a short stream (2-4 KiB) that ends
    // before the hardware prefetcher is up to speed: each cache line's step also
    // prefetches the same columns of the next tile's rows (into L2: on a Zen 4 core,
    // matmul_bench decode/*/vocab_65536x1024, 1 thread, alternating runs, L1 -> L2 took
    // F32 14-16 -> 17.5-19.4 GB/s, F16 10.2-10.8 -> 13.9-15.5, BF16 10.2-10.3 ->
    // 17.7-18.8, the AVX2 level alike; without any prefetch 7-14).
    constexpr int64_t kLine = 64 / sizeof(Elem);
    const int64_t ahead = NR * static_cast<int64_t>(a.w_stride / sizeof(Elem));
    int64_t i = 0;
    for (; i + W <= a.k; i += W) {
      VecF::T xv[NT];
      for (int t = 0; t < NT; ++t) xv[t] = VecF::load(x[t] + i);
      if constexpr (NT == 1) {
        if (i % kLine == 0) {
          for (int r = 0; r < NR; ++r) _mm_prefetch(reinterpret_cast<const char*>(w[r] + ahead + i), kStreamPrefetchHint);
        }
      }
      for (int r = 0; r < NR; ++r) {
        const VecF::T wv = load(w[r] + i);
        for (int t = 0; t < NT; ++t) acc[r][t] = VecF::fma(wv, xv[t], acc[r][t]);
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) {
        float s = VecF::sum(acc[r][t]);
        for (int64_t j = i; j < a.k; ++j) s += load1(w[r], j) * x[t][j];
        a.y[t * a.y_stride + r] = s;
      }
    }
  }
};

// ---- element-wise ----

float dot_f32_x86(const float* a, const float* b, int64_t n) {
  constexpr int W = VecF::kWidth;
  VecF::T acc0 = VecF::zero(), acc1 = VecF::zero();
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    acc0 = VecF::fma(VecF::load(a + i), VecF::load(b + i), acc0);
    acc1 = VecF::fma(VecF::load(a + i + W), VecF::load(b + i + W), acc1);
  }
  for (; i + W <= n; i += W) acc0 = VecF::fma(VecF::load(a + i), VecF::load(b + i), acc0);
  float s = VecF::sum(VecF::add(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_f32_x86(float alpha, const float* x, float* y, int64_t n) {
  constexpr int W = VecF::kWidth;
  const VecF::T av = VecF::set1(alpha);
  int64_t i = 0;
  for (; i + W <= n; i += W) VecF::store(y + i, VecF::fma(av, VecF::load(x + i), VecF::load(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

void scale_f32_x86(float alpha, float* y, int64_t n) {
  constexpr int W = VecF::kWidth;
  const VecF::T av = VecF::set1(alpha);
  int64_t i = 0;
  for (; i + W <= n; i += W) VecF::store(y + i, VecF::mul(av, VecF::load(y + i)));
  for (; i < n; ++i) y[i] *= alpha;
}

void rms_norm_f32_x86(const float* x, const float* w, float eps, int64_t n, float* out) {
  constexpr int W = VecF::kWidth;
  const float ss = dot_f32_x86(x, x, n);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  const VecF::T rv = VecF::set1(r);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    VecF::store(out + i, VecF::mul(VecF::mul(VecF::load(x + i), rv), VecF::load(w + i)));
  }
  for (; i < n; ++i) out[i] = x[i] * r * w[i];
}

// exp(x) for x in about [-87, 88]: x = n ln2 + f, |f| <= ln2/2, exp(f) by a degree-6
// polynomial (relative error ~2e-7), times 2^n.
inline VecF::T exp_vec(VecF::T x) {
  x = VecF::max(VecF::min(x, VecF::set1(88.0f)), VecF::set1(-87.0f));
  const VecF::T n = VecF::round(VecF::mul(x, VecF::set1(1.44269504088896341f)));
  VecF::T f = VecF::fma(n, VecF::set1(-0.693145751953125f), x);  // ln2 split in two
  f = VecF::fma(n, VecF::set1(-1.428606765330187e-06f), f);
  VecF::T p = VecF::set1(1.0f / 720);
  p = VecF::fma(p, f, VecF::set1(1.0f / 120));
  p = VecF::fma(p, f, VecF::set1(1.0f / 24));
  p = VecF::fma(p, f, VecF::set1(1.0f / 6));
  p = VecF::fma(p, f, VecF::set1(0.5f));
  p = VecF::fma(p, f, VecF::set1(1.0f));
  p = VecF::fma(p, f, VecF::set1(1.0f));
  return VecF::mul(p, VecF::pow2i(n));
}

void silu_mul_f32_x86(const float* gate, const float* up, int64_t n, float* out) {
  constexpr int W = VecF::kWidth;
  const VecF::T one = VecF::set1(1.0f);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const VecF::T g = VecF::load(gate + i);
    const VecF::T e = exp_vec(VecF::sub(VecF::zero(), g));
    VecF::store(out + i, VecF::mul(VecF::div(g, VecF::add(one, e)), VecF::load(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void add_f32_x86(float* x, const float* y, int64_t n) {
  constexpr int W = VecF::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) VecF::store(x + i, VecF::add(VecF::load(x + i), VecF::load(y + i)));
  for (; i < n; ++i) x[i] += y[i];
}

float exp_sub_sum_f32_x86(float* x, float max, int64_t n) {
  constexpr int W = VecF::kWidth;
  const VecF::T mv = VecF::set1(max);
  VecF::T acc = VecF::zero();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const VecF::T e = exp_vec(VecF::sub(VecF::load(x + i), mv));
    VecF::store(x + i, e);
    acc = VecF::add(acc, e);
  }
  float sum = VecF::sum(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  return sum;
}

// ---- F16 KV cache rows ----

// Round to nearest even whatever MXCSR says (the immediate chooses the rounding), the
// same bits as f32_to_f16 in tensor/half.h.
void f32_to_f16_row_x86(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(x + i),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) out[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

void f16_to_f32_row_x86(const uint16_t* x, float* out, int64_t n) {
  constexpr int W = VecF::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) VecF::store(out + i, VecF::load_f16(x + i));
  for (; i < n; ++i) out[i] = _cvtsh_ss(x[i]);
}

// ---- attention ----

// K/V elements as floats: float rows as they are, half rows converted exactly
// (vcvtph2ps; with AVX-512, 16 halves per instruction).
inline VecF::T load_kv(const float* p) { return VecF::load(p); }
inline VecF::T load_kv(const uint16_t* p) { return VecF::load_f16(p); }
inline float load_kv1(const float* p) { return *p; }
inline float load_kv1(const uint16_t* p) { return _cvtsh_ss(*p); }
// FP8 rows: e4m3 bytes widened to IEEE halves of value / 256 by shifts and masks (a
// half has 10 mantissa bits and 5 exponent bits, so every e4m3 value fits, the 2^8
// folded into the bias), then to floats, times 256 (exact). S.1111.111 (NaN) becomes a
// half NaN. Loads read exactly the vector's width of bytes.
inline __m128i kv_f8_to_f16(__m128i bytes) {
  const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7),
                                  _mm_set1_epi16(-0x4080));
  const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x3f80)),
                                      _mm_set1_epi16(0x3f80));
  return _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7c00)));
}
#if defined(__AVX512F__)
inline VecF::T load_kv(const KvF8* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i h = _mm256_set_m128i(kv_f8_to_f16(_mm_srli_si128(raw, 8)), kv_f8_to_f16(raw));
  return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
}
#else
inline VecF::T load_kv(const KvF8* p) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_mul_ps(_mm256_cvtph_ps(kv_f8_to_f16(raw)), _mm256_set1_ps(256.0f));
}
#endif
inline float load_kv1(const KvF8* p) {
  return _cvtsh_ss(static_cast<uint16_t>(_mm_extract_epi16(kv_f8_to_f16(_mm_cvtsi32_si128(p->bits)), 0))) *
         256.0f;
}
void f8_to_f32_row_x86(const KvF8* x, float* out, int64_t n) {
  constexpr int W = VecF::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) VecF::store(out + i, load_kv(x + i));
  for (; i < n; ++i) out[i] = load_kv1(x + i);
}
// a * b + c rounded once. The scalar tails below spell out their fused multiply-adds:
// left to contraction, the compiler may fuse a different product of a sum in the
// float and the half instantiation, and the two would round differently.
inline float fma1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

// `v`, kept in a register: a float K/V vector is then loaded once for all the
// queries of a tile, where the compiler would otherwise fold a load into every FMA
// that uses it (one 512-bit load per FMA is the limit of the load ports on some CPUs).
inline VecF::T in_register(VecF::T v) {
  __asm__("" : "+v"(v));
  return v;
}

// Queries per register tile of the attention step: every K and V vector loaded (and,
// for halves, converted) is used by this many queries before the next is loaded. With
// AVX-512 a tile of scores is 6 queries x 4 keys accumulators (of 32 vector
// registers; MLA's 16-head tiles run as 6 + 6 + 4), with AVX2 2 x 4 (of 16).
#if defined(__AVX512F__)
constexpr int kAttnQueries = 6;
#else
constexpr int kAttnQueries = 2;
#endif
// Vectors of v_dim per query that the weighted sum of values keeps in registers.
constexpr int kAttnValueVecs = 4;

// Scores of NQ queries against keys [0, n) of a step: s[b][j] = scale * q[b] . k_j,
// computed four keys at a time; keys past n in the last four are computed on row
// n - 1 and land in the padding of s[b] (a multiple of 4 floats long). Each (query,
// key) pair has its own accumulator: one FMA chain over head_dim in vectors, the
// transposing reduction sum4 (the same tree for each of its inputs), then the
// scalar tail; so a score has the same bits whatever NQ is and whichever queries
// share the tile.
template <typename Elem, int NQ>
void attn_scores_x86(const float* const* q, const Elem* k, int64_t k_stride, int64_t n, int hd,
                     float scale, float* const* s) {
  constexpr int W = VecF::kWidth;
  const __m128 scale_v = _mm_set1_ps(scale);
  for (int64_t j = 0; j < n; j += 4) {
    const Elem* kr[4];
    for (int c = 0; c < 4; ++c) kr[c] = k + (j + c < n ? j + c : n - 1) * k_stride;
    VecF::T acc[NQ][4];
    for (int b = 0; b < NQ; ++b) {
      for (int c = 0; c < 4; ++c) acc[b][c] = VecF::zero();
    }
    int d = 0;
    for (; d + W <= hd; d += W) {
      VecF::T kv[4];
      for (int c = 0; c < 4; ++c) kv[c] = in_register(load_kv(kr[c] + d));
      for (int b = 0; b < NQ; ++b) {
        const VecF::T qv = VecF::load(q[b] + d);
        for (int c = 0; c < 4; ++c) acc[b][c] = VecF::fma(qv, kv[c], acc[b][c]);
      }
    }
    for (int b = 0; b < NQ; ++b) {
      __m128 sv = VecF::sum4(acc[b][0], acc[b][1], acc[b][2], acc[b][3]);
      if (d < hd) {
        float t[4] = {0, 0, 0, 0};
        for (int e = d; e < hd; ++e) {
          for (int c = 0; c < 4; ++c) t[c] = fma1(q[b][e], load_kv1(kr[c] + e), t[c]);
        }
        sv = _mm_add_ps(sv, _mm_loadu_ps(t));
      }
      _mm_storeu_ps(s[b] + j, _mm_mul_ps(sv, scale_v));
    }
  }
}

// acc[b] = acc[b] * corr[b] + sum_{j < n[b]} p[b][j] v_j for NQ queries; keys
// [0, n_common) are shared by all of them (n_common = min n[b]). Every element of
// acc[b] is one chain, multiply then FMAs in key order, in vector or scalar form
// alike: the same bits whatever NQ is and whichever queries share the tile. Each V
// vector is loaded once for the NQ queries over the shared keys.
template <typename Elem, int NQ>
void attn_values_x86(float* const* acc, const float* const* p, const float* corr,
                     const int64_t* n, int64_t n_common, const Elem* v, int64_t v_stride,
                     int vd) {
  constexpr int W = VecF::kWidth;
  // One pass over v_dim in chunks of NV vectors.
  auto chunk = [&]<int NV>(int d) {
    VecF::T r[NQ][NV];
    for (int b = 0; b < NQ; ++b) {
      const VecF::T cv = VecF::set1(corr[b]);
      for (int u = 0; u < NV; ++u) r[b][u] = VecF::mul(VecF::load(acc[b] + d + u * W), cv);
    }
    for (int64_t j = 0; j < n_common; ++j) {
      const Elem* vr = v + j * v_stride + d;
      VecF::T vv[NV];
      for (int u = 0; u < NV; ++u) vv[u] = in_register(load_kv(vr + u * W));
      for (int b = 0; b < NQ; ++b) {
        const VecF::T pv = VecF::set1(p[b][j]);
        for (int u = 0; u < NV; ++u) r[b][u] = VecF::fma(pv, vv[u], r[b][u]);
      }
    }
    for (int b = 0; b < NQ; ++b) {
      for (int64_t j = n_common; j < n[b]; ++j) {  // keys only some queries see
        const Elem* vr = v + j * v_stride + d;
        const VecF::T pv = VecF::set1(p[b][j]);
        for (int u = 0; u < NV; ++u) r[b][u] = VecF::fma(pv, load_kv(vr + u * W), r[b][u]);
      }
      for (int u = 0; u < NV; ++u) VecF::store(acc[b] + d + u * W, r[b][u]);
    }
  };
  int d = 0;
  for (; d + kAttnValueVecs * W <= vd; d += kAttnValueVecs * W) {
    chunk.template operator()<kAttnValueVecs>(d);
  }
  for (; d + W <= vd; d += W) chunk.template operator()<1>(d);
  for (; d < vd; ++d) {
    for (int b = 0; b < NQ; ++b) {
      float r = acc[b][d] * corr[b];
      for (int64_t j = 0; j < n[b]; ++j) r = fma1(p[b][j], load_kv1(v + j * v_stride + d), r);
      acc[b][d] = r;
    }
  }
}

// One register tile of the step: NQ queries (indices qi into the step's arrays) that
// each see at least one of the keys.
template <typename Elem, int NQ>
void attn_tile_x86(const AttnStepArgs& a, const int* qi) {
  constexpr int W = VecF::kWidth;
  const int64_t ld = (a.n_keys + 3) & ~int64_t{3};  // floats per row of scores
  const float* q[NQ];
  float* s[NQ];
  float* acc[NQ];
  int64_t n[NQ];
  int64_t n_max = 0, n_common = a.n_keys;
  for (int b = 0; b < NQ; ++b) {
    const int i = qi[b];
    q[b] = a.q[i];
    s[b] = a.scores + b * ld;
    acc[b] = a.acc + int64_t{i} * a.v_dim;
    // (Plain comparisons, not std::min / std::fmax: see the top of this file.)
    n[b] = a.n_visible[i] < a.n_keys ? a.n_visible[i] : a.n_keys;
    n_max = n[b] > n_max ? n[b] : n_max;
    n_common = n[b] < n_common ? n[b] : n_common;
  }
  attn_scores_x86<Elem, NQ>(q, static_cast<const Elem*>(a.k), a.k_stride, n_max, a.head_dim,
                            a.scale, s);

  // Per query: the new running max, the factor for what was summed before, and the
  // step's exp(s - m) in place of its scores.
  float corr[NQ];
  for (int b = 0; b < NQ; ++b) {
    const int i = qi[b];
    int64_t j = 0;
    float block_max = -INFINITY;
    if (n[b] >= W) {
      VecF::T mv = VecF::load(s[b]);
      for (j = W; j + W <= n[b]; j += W) mv = VecF::max(mv, VecF::load(s[b] + j));
      alignas(64) float lanes[W];
      VecF::store(lanes, mv);
      for (int e = 0; e < W; ++e) block_max = lanes[e] > block_max ? lanes[e] : block_max;
    }
    for (; j < n[b]; ++j) block_max = s[b][j] > block_max ? s[b][j] : block_max;
    const float m = a.m[i] > block_max ? a.m[i] : block_max;
    corr[b] = std::exp(a.m[i] - m);  // 0 on the first step (m = -inf)
    const float sum = exp_sub_sum_f32_x86(s[b], m, n[b]);
    a.l[i] = a.l[i] * corr[b] + sum;
    a.m[i] = m;
  }
  attn_values_x86<Elem, NQ>(acc, s, corr, n, n_common, static_cast<const Elem*>(a.v),
                            a.v_stride, a.v_dim);
}

// The online-softmax step (kernels.h) over K/V rows of Elem (float, or uint16_t for
// IEEE halves: converted on load, then the same arithmetic in the same order). The
// step's keys and values (at most a block) stay in L1 while the queries read them;
// inside a register tile of kAttnQueries queries each K and V vector is loaded once
// and feeds every query's own accumulators, so the arithmetic of a query does not
// depend on which queries share its tile (batch invariance, kernels.h).
template <typename Elem>
void attn_step_x86(const AttnStepArgs& a) {
  int qi[kAttnQueries];
  int nb = 0;
  auto flush = [&] {
    switch (nb) {
      case 1: attn_tile_x86<Elem, 1>(a, qi); break;
      case 2: attn_tile_x86<Elem, 2>(a, qi); break;
#if defined(__AVX512F__)
      case 3: attn_tile_x86<Elem, 3>(a, qi); break;
      case 4: attn_tile_x86<Elem, 4>(a, qi); break;
      case 5: attn_tile_x86<Elem, 5>(a, qi); break;
      case 6: attn_tile_x86<Elem, 6>(a, qi); break;
#endif
    }
    nb = 0;
  };
  static_assert(kAttnQueries == 6 || kAttnQueries == 2, "see the switch above");
  for (int i = 0; i < a.n_q; ++i) {
    if (a.n_visible[i] <= 0) continue;  // no key of this step: state unchanged
    qi[nb++] = i;
    if (nb == kAttnQueries) flush();
  }
  flush();
}

// ---- prompt attention: queries in vector lanes (attn_prompt_impl.h) ----

// 24 accumulators of 32 vector registers with AVX-512, 12 of 16 with AVX2.
struct PromptVecX86 : VecF {
#if defined(__AVX512F__)
  static constexpr int kPromptAcc = 24;
#else
  static constexpr int kPromptAcc = 12;
#endif
  static T exp(T x) { return exp_vec(x); }
};

#include "backend/cpu/attn_prompt_impl.h"

[[maybe_unused]] KernelTable make_x86_table(CpuIsa isa) {
  KernelTable t{};
  t.isa = isa;
  t.quantize_q8x32 = quantize_q8x32_x86;
  t.quantize_q8x256 = quantize_q8x256_x86;
  t.quantize_q8x32_tiles = quantize_q8x32_tiles_x86;
  t.matmul[static_cast<int>(DType::kF32)] = matmul_tiles<FloatKernel<DType::kF32>>;
  t.matmul[static_cast<int>(DType::kF16)] = matmul_tiles<FloatKernel<DType::kF16>>;
  t.matmul[static_cast<int>(DType::kBF16)] = matmul_tiles<FloatKernel<DType::kBF16>>;
  t.matmul[static_cast<int>(DType::kQ8_0)] = matmul_tiles<Q32Kernel<Q8_0Traits>>;
  t.matmul[static_cast<int>(DType::kQ4_0)] = matmul_tiles<Q32Kernel<Q4_0Traits>>;
  t.matmul[static_cast<int>(DType::kQ4_1)] = matmul_tiles<Q32Kernel<Q4_1Traits>>;
  t.matmul[static_cast<int>(DType::kQ4_K)] = matmul_tiles<Q45KKernel<false>>;
  t.matmul[static_cast<int>(DType::kQ5_K)] = matmul_tiles<Q45KKernel<true>>;
  t.matmul[static_cast<int>(DType::kQ6_K)] = matmul_tiles<Q6KKernel>;
  t.dot_f32 = dot_f32_x86;
  t.axpy_f32 = axpy_f32_x86;
  t.scale_f32 = scale_f32_x86;
  t.rms_norm_f32 = rms_norm_f32_x86;
  t.silu_mul_f32 = silu_mul_f32_x86;
  t.add_f32 = add_f32_x86;
  t.exp_sub_sum_f32 = exp_sub_sum_f32_x86;
  t.attn_step_f32 = attn_step_x86<float>;
  t.attn_step_f16 = attn_step_x86<uint16_t>;
  t.attn_step_f8 = attn_step_x86<KvF8>;
  t.attn_prompt_f32 = attn_prompt<PromptVecX86>;
  t.attn_prompt_queries = kAttnPromptVectors * VecF::kWidth;
  t.f32_to_f16_row = f32_to_f16_row_x86;
  t.f16_to_f32_row = f16_to_f32_row_x86;
  t.f8_to_f32_row = f8_to_f32_row_x86;
  return t;
}

}  // namespace
}  // namespace dserve::cpu
