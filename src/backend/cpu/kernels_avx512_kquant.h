// Packed K-quant (Q4_K, Q5_K, Q6_K) matmul for the AVX-512 level (VNNI): the design of
// kernels_avx2_gemm.h's K-quant half panels at 16 rows, with vpdpbusd. Included only by
// kernels_avx512.cc, after kernels_x86_impl.h.
//
// One 512-bit register holds 4 consecutive weights of each of the 16 rows of a panel
// (lane r <-> row r), so one vpdpbusd with a token's 4 activations broadcast does 16
// rows x 4 k into int32 with nothing to reduce across lanes. Per sub-block, the
// vector products add up in int32 (vpdpbusd accumulates), then one vpmulld by the
// rows' sub-block scale: isum = sum_s sc_s sum_e q_e x_e, exactly, as the AVX2
// kernels' int16 route computes it. The minimum (Q4_K/Q5_K) and -32 (Q6_K) terms come
// from the activation row's per-16 sums with vpdpwssd. Then, per row and token, the
// same float operations as the AVX2 packed kernels, in the same order: the results
// equal theirs bit for bit, whatever the batch or tile (the engine's batch invariance).
//
// The activations are Q8x256 rows (kernels.h); a token's 4 bytes are broadcast.
//
// Packed 16-row panel, per super-block (nb of them, one after another):
//   Q4_K / Q5_K:
//     qs   32 x 64 bytes: vector c = 8g + i, lane r = row r's qs bytes 4c..4c+3
//          (low nibbles: elements 64g + 4i.., sub-block 2g; high: 64g + 32 + 4i..)
//     qh   Q5_K: 8 x 64 bytes, vector i lane r = row r's qh bytes 4i..4i+3
//     sc   8 x 16 bytes: [s][r] the 6-bit scale of sub-block s of row r
//     mn   8 x 16 bytes: [s][r] its 6-bit minimum
//     d    16 f16, dmin 16 f16 (lane order)
//   Q6_K (element e = 128h + 32i + l: nibble i >> 1 of ql[64h + 32(i & 1) + l], bits
//   2i, 2i + 1 of qh[32h + l]):
//     ql   32 x 64 bytes: vector (h, c < 16) lane r = row r's ql bytes 64h + 4c..
//     qh   16 x 64 bytes: vector (h, c < 8) lane r = row r's qh bytes 32h + 4c..
//     sc   16 x 16 bytes: [s][r] the signed 8-bit scale of sub-block s (16 elements)
//     d    16 f16
// so a panel takes the bytes of its 16 rows (plus Q4_K/Q5_K's unpacked 6-bit scales).
// Rows past the end of the matrix are zeros (they compute zeros that are never stored).
#pragma once

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__)
#error "kernels_avx512_kquant.h needs -mavx512f -mavx512bw -mavx512vnni"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "tensor/quant_blocks.h"

namespace dserve::cpu {
namespace {

constexpr int kKPanelRows = 16;
static_assert(kKPanelRows == kMatmulPackRows);
// Tokens per tile: a sub-block's unpacked weights stay in registers while each token
// takes its products, and each token's int32 sum and float accumulator are registers
// too (8 + 2 x 8 of the 32).
constexpr int kKPanelTokens = 8;

struct PanelQ4_K {
  using Block = block_q4_K;
  static constexpr bool kFifthBit = false;
};
struct PanelQ5_K {
  using Block = block_q5_K;
  static constexpr bool kFifthBit = true;
};
template <typename P>
constexpr int64_t kpanel_block_bytes() {
  return 2048 + (P::kFifthBit ? 512 : 0) + 128 + 128 + 32 + 32;
}
constexpr int64_t kPanelQ6Bytes = 2048 + 1024 + 256 + 32;

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
inline __m512i load64(const uint8_t* p) { return _mm512_loadu_si512(p); }

// Decode streams a matrix once, and these kernels spend more instructions per byte than
// the hardware prefetcher keeps pace with: each super-block prefetches the one six
// ahead (14-20 KB), reaching into the next panel (panels are consecutive) and, from
// the last panel, into `next` (the matrix the thread reads next, or null). Into L2:
// prefetching a super-block's 37-53 lines into L1 held its fill buffers, which the
// kernel's own loads then waited for. On a Zen 4 core, matmul_bench
// decode/{q4_k,q5_k,q6_k}/vocab_65536x1024 read 11-17, ~7 and ~7 GB/s with two
// super-blocks ahead into L1, 18-33, 13-28 and 16-26 GB/s with 4 to 12 ahead into L2
// (a noisy machine: no distance stood out).
inline void prefetch_ahead(const uint8_t* panel, int64_t b, int64_t nb, int64_t bytes,
                           const uint8_t* next) {
  constexpr int kAhead = 6;
  const uint8_t* p = panel + (b + kAhead) * bytes;
  if (b + kAhead >= nb && next != nullptr) p = next + (b + kAhead - nb) * bytes;
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), kStreamPrefetchHint);
}

// ---- Q4_K / Q5_K ----

template <typename P, int NT>
void kpanel_tile(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t x_stride, float* y,
                 int64_t y_stride, __mmask16 store_mask, const uint8_t* next) {
  constexpr int64_t kBytes = kpanel_block_bytes<P>();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  Q8x256Row xr[NT];
  for (int t = 0; t < NT; ++t) xr[t] = q8x256_row(x + t * x_stride, nb * 256);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = panel + b * kBytes;
    if constexpr (NT == 1) prefetch_ahead(panel, b, nb, kBytes, next);
    const uint8_t* qh = blk + 2048;
    const uint8_t* sc = qh + (P::kFifthBit ? 512 : 0);
    const uint8_t* mn = sc + 128;
    const uint8_t* dd = mn + 128;
    __m512i isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
    for (int g = 0; g < 4; ++g) {
      for (int part = 0; part < 2; ++part) {  // sub-block 2g + part
        __m512i u[8];
        for (int i = 0; i < 8; ++i) {
          const __m512i q = load64(blk + 64 * (8 * g + i));
          __m512i v = _mm512_and_si512(part == 0 ? q : _mm512_srli_epi16(q, 4), low4);
          if constexpr (P::kFifthBit) {  // bit 2g + part of the row's qh byte
            const __m512i h = _mm512_srli_epi16(load64(qh + 64 * i), 2 * g + part);
            v = _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(1)), 4));
          }
          u[i] = v;
        }
        const __m512i scale = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16 * (2 * g + part))));
        for (int t = 0; t < NT; ++t) {
          const int8_t* xq = xr[t].qs + 256 * b + 64 * g + 32 * part;
          __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], bcast4(xq));
          for (int i = 1; i < 8; ++i) dot = _mm512_dpbusd_epi32(dot, u[i], bcast4(xq + 4 * i));
          isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot, scale));
        }
      }
    }
    // (mn_2p, mn_2p+1) per row as int16 pairs, against each token's two per-32 sums.
    __m512i min_pairs[4];
    for (int p = 0; p < 4; ++p) {
      const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + 32 * p)));
      const __m512i hi =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + 32 * p + 16)));
      min_pairs[p] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dd)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dd + 32)));
    const __m512 neg_dmin = _mm512_sub_ps(_mm512_setzero_ps(), dmin);
    for (int t = 0; t < NT; ++t) {
      const int16_t* bs = xr[t].bsums + 16 * b;
      __m512i msum = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) {  // per-32 sums: per-16 sums in pairs (|s| <= 32 x 127)
        const uint32_t lo = static_cast<uint16_t>(bs[4 * p] + bs[4 * p + 1]);
        const uint32_t hi = static_cast<uint16_t>(bs[4 * p + 2] + bs[4 * p + 3]);
        msum = _mm512_dpwssd_epi32(msum, min_pairs[p], _mm512_set1_epi32(static_cast<int32_t>(lo | hi << 16)));
      }
      const __m512 dx = _mm512_set1_ps(xr[t].d[b]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, dx), acc[t]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(neg_dmin, dx), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * y_stride, store_mask, acc[t]);
}

// PackWeightFn for Q4_K / Q5_K (layout above).
template <typename P>
void pack_weight_kpanel(const uint8_t* w, size_t w_stride, int64_t n_rows, int64_t k, uint8_t* out) {
  using Block = typename P::Block;
  constexpr int64_t kBytes = kpanel_block_bytes<P>();
  const int64_t nb = k / 256;
  const int64_t n_panels = (n_rows + kKPanelRows - 1) / kKPanelRows;
  std::memset(out, 0, static_cast<size_t>(n_panels * nb * kBytes));
  for (int64_t row = 0; row < n_rows; ++row) {
    const int r = static_cast<int>(row % kKPanelRows);
    const Block* blocks = reinterpret_cast<const Block*>(w + row * w_stride);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = out + (row / kKPanelRows * nb + b) * kBytes;
      const Block& src = blocks[b];
      for (int c = 0; c < 32; ++c) std::memcpy(blk + 64 * c + 4 * r, src.qs + 4 * c, 4);
      uint8_t* sc = blk + 2048;
      if constexpr (P::kFifthBit) {
        for (int i = 0; i < 8; ++i) std::memcpy(sc + 64 * i + 4 * r, src.qh + 4 * i, 4);
        sc += 512;
      }
      uint8_t* mn = sc + 128;
      for (int s = 0; s < 8; ++s) q_k_scale_min(s, src.scales, sc + 16 * s + r, mn + 16 * s + r);
      std::memcpy(mn + 128 + 2 * r, &src.d, 2);
      std::memcpy(mn + 128 + 32 + 2 * r, &src.dmin, 2);
    }
  }
}

// ---- Q6_K ----

template <int NT>
void q6k_panel_tile(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t x_stride, float* y,
                    int64_t y_stride, __mmask16 store_mask, const uint8_t* next) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i three = _mm512_set1_epi8(0x03);
  Q8x256Row xr[NT];
  for (int t = 0; t < NT; ++t) xr[t] = q8x256_row(x + t * x_stride, nb * 256);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* ql = panel + b * kPanelQ6Bytes;
    if constexpr (NT == 1) prefetch_ahead(panel, b, nb, kPanelQ6Bytes, next);
    const uint8_t* qh = ql + 2048;
    const uint8_t* sc = qh + 1024;
    const uint8_t* dd = sc + 256;
    auto scale = [&](int s) {
      return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16 * s)));
    };
    // isum starts at -32 sum_s sc_s sum16_s: pairs (sc_2p, sc_2p+1) of int16 per row
    // against the token's (sum16_2p, sum16_2p+1).
    __m512i sc_pairs[8];
    for (int p = 0; p < 8; ++p) {
      sc_pairs[p] = _mm512_or_si512(_mm512_and_si512(scale(2 * p), _mm512_set1_epi32(0xFFFF)),
                                    _mm512_slli_epi32(scale(2 * p + 1), 16));
    }
    __m512i isum[NT];
    for (int t = 0; t < NT; ++t) {
      const int16_t* bs = xr[t].bsums + 16 * b;
      __m512i off = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p) {
        int32_t word;
        std::memcpy(&word, bs + 2 * p, 4);
        off = _mm512_dpwssd_epi32(off, sc_pairs[p], _mm512_set1_epi32(word));
      }
      isum[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(off, 5));
    }
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 4; ++i) {
        for (int half = 0; half < 2; ++half) {  // sub-block 8h + 2i + half: l = 16 half ..
          __m512i u[4];
          for (int j = 0; j < 4; ++j) {
            const int c = 4 * half + j;
            const __m512i q = load64(ql + 64 * (16 * h + 8 * (i & 1) + c));
            const __m512i nib = _mm512_and_si512(i < 2 ? q : _mm512_srli_epi16(q, 4), low4);
            const __m512i bits = _mm512_and_si512(_mm512_srli_epi16(load64(qh + 64 * (8 * h + c)), 2 * i), three);
            u[j] = _mm512_or_si512(nib, _mm512_slli_epi16(bits, 4));
          }
          const __m512i s = scale(8 * h + 2 * i + half);
          for (int t = 0; t < NT; ++t) {
            const int8_t* xq = xr[t].qs + 256 * b + 128 * h + 32 * i + 16 * half;
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], bcast4(xq));
            for (int j = 1; j < 4; ++j) dot = _mm512_dpbusd_epi32(dot, u[j], bcast4(xq + 4 * j));
            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot, s));
          }
        }
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dd)));
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, _mm512_set1_ps(xr[t].d[b])),
                               acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * y_stride, store_mask, acc[t]);
}

// PackWeightFn for Q6_K (layout above).
inline void pack_weight_q6k_panel(const uint8_t* w, size_t w_stride, int64_t n_rows, int64_t k, uint8_t* out) {
  const int64_t nb = k / 256;
  const int64_t n_panels = (n_rows + kKPanelRows - 1) / kKPanelRows;
  std::memset(out, 0, static_cast<size_t>(n_panels * nb * kPanelQ6Bytes));
  for (int64_t row = 0; row < n_rows; ++row) {
    const int r = static_cast<int>(row % kKPanelRows);
    const block_q6_K* blocks = reinterpret_cast<const block_q6_K*>(w + row * w_stride);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = out + (row / kKPanelRows * nb + b) * kPanelQ6Bytes;
      const block_q6_K& src = blocks[b];
      for (int c = 0; c < 32; ++c) std::memcpy(blk + 64 * c + 4 * r, src.ql + 4 * c, 4);
      for (int c = 0; c < 16; ++c) std::memcpy(blk + 2048 + 64 * c + 4 * r, src.qh + 4 * c, 4);
      for (int s = 0; s < 16; ++s) blk[3072 + 16 * s + r] = static_cast<uint8_t>(src.scales[s]);
      std::memcpy(blk + 3328 + 2 * r, &src.d, 2);
    }
  }
}

// ---- the kernel table's entry points ----

// One tile of nt (1..kKPanelTokens) tokens: Tile<NT> instantiated for each count.
template <template <int> class Tile, int NT>
void kpanel_any(int nt, const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t x_stride, float* y,
                int64_t y_stride, __mmask16 store_mask, const uint8_t* next) {
  if constexpr (NT >= 1) {
    if (nt == NT) {
      Tile<NT>::run(panel, nb, x, x_stride, y, y_stride, store_mask, next);
    } else {
      kpanel_any<Tile, NT - 1>(nt, panel, nb, x, x_stride, y, y_stride, store_mask, next);
    }
  }
}

template <typename P>
struct KTile {
  template <int NT>
  struct Of {
    static void run(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t x_stride, float* y,
                    int64_t y_stride, __mmask16 store_mask, const uint8_t* next) {
      kpanel_tile<P, NT>(panel, nb, x, x_stride, y, y_stride, store_mask, next);
    }
  };
};
template <int NT>
struct Q6KTile {
  static void run(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t x_stride, float* y,
                  int64_t y_stride, __mmask16 store_mask, const uint8_t* next) {
    q6k_panel_tile<NT>(panel, nb, x, x_stride, y, y_stride, store_mask, next);
  }
};

// MatmulPackedFn over panels of kPanelBytes per super-block; `x` is Q8x256 rows.
template <template <int> class Tile, int64_t kPanelBytes>
void matmul_kpanel_packed(const uint8_t* packed, const uint8_t* x, int64_t k, int64_t n_rows,
                          int64_t n_tokens, float* y, int64_t y_stride, const uint8_t* next_matrix) {
  const int64_t nb = k / 256;
  const int64_t x_stride = act_row_bytes(ActFormat::kQ8x256, k);
  for (int64_t r0 = 0; r0 < n_rows; r0 += kKPanelRows) {
    const int nr = static_cast<int>(n_rows - r0 < kKPanelRows ? n_rows - r0 : kKPanelRows);
    const __mmask16 store_mask = static_cast<__mmask16>((1u << nr) - 1);
    const uint8_t* panel = packed + r0 / kKPanelRows * nb * kPanelBytes;
    const uint8_t* next = r0 + kKPanelRows >= n_rows ? next_matrix : nullptr;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kKPanelTokens) {
      const int nt = static_cast<int>(n_tokens - t0 < kKPanelTokens ? n_tokens - t0 : kKPanelTokens);
      kpanel_any<Tile, kKPanelTokens>(nt, panel, nb, x + t0 * x_stride, x_stride, y + t0 * y_stride + r0,
                                      y_stride, store_mask, next);
    }
  }
}

// MatmulBatchFn for weights nobody packed at load: 16 rows at a time into scratch.
template <PackWeightFn kPack, MatmulPackedFn kMatmul>
void matmul_kpanel_batched(const uint8_t* w, size_t w_stride, const uint8_t* x, int64_t k, int64_t n_rows,
                           int64_t n_tokens, float* y, int64_t y_stride, uint8_t* scratch) {
  for (int64_t r0 = 0; r0 < n_rows; r0 += kKPanelRows) {
    const int64_t nr = n_rows - r0 < kKPanelRows ? n_rows - r0 : kKPanelRows;
    kPack(w + r0 * w_stride, w_stride, nr, k, scratch);
    kMatmul(scratch, x, k, nr, n_tokens, y + r0, y_stride, nullptr);
  }
}

template <PackWeightFn kPack, MatmulPackedFn kMatmul, int64_t kPanelBytes>
void add_kpanel(KernelTable& t, DType dtype) {
  const int i = static_cast<int>(dtype);
  t.pack_weight[i] = kPack;
  t.matmul_packed[i] = kMatmul;
  t.matmul_batched[i] = matmul_kpanel_batched<kPack, kMatmul>;
  t.packed_layout[i].block_bytes = kPanelBytes / 8;  // per 32 elements of a panel
}

// Installs the K-quant packed kernels into an AVX-512 table. Like its Q32 panels they
// serve every token count.
inline void add_avx512_kquant(KernelTable& t) {
  constexpr int64_t q4 = kpanel_block_bytes<PanelQ4_K>(), q5 = kpanel_block_bytes<PanelQ5_K>();
  add_kpanel<pack_weight_kpanel<PanelQ4_K>, matmul_kpanel_packed<KTile<PanelQ4_K>::Of, q4>, q4>(t, DType::kQ4_K);
  add_kpanel<pack_weight_kpanel<PanelQ5_K>, matmul_kpanel_packed<KTile<PanelQ5_K>::Of, q5>, q5>(t, DType::kQ5_K);
  add_kpanel<pack_weight_q6k_panel, matmul_kpanel_packed<Q6KTile, kPanelQ6Bytes>, kPanelQ6Bytes>(t, DType::kQ6_K);
}

}  // namespace
}  // namespace dserve::cpu
