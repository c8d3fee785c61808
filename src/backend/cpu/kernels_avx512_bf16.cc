// AVX512-BF16 kernels: MLA's absorbed attention over an FP8 latent pool with BF16
// products (vdpbf16ps: 32 multiply-adds per instruction, twice vfmadd231ps's 16), built
// with this level's flags plus -mavx512bf16 (src/backend/CMakeLists.txt) and added to the
// avx512 table only where the CPU has the extension (Zen 4, Sapphire Rapids and later).
//
// Why only FP8 latents: an FP8 value is a BF16 value (3 mantissa bits of BF16's 7), so the
// keys and values enter exactly; what rounds is the query and each softmax weight, to 8
// significant bits (unit roundoff 2^-8), against the FP8 rounding of the latents
// themselves (2^-4). F16 and F32 pools keep the exact float step.
//
// Layouts (paged_attention.cc converts a step's rows once for every tile of its group):
//   keys    BF16 rows, k_stride elements apart, zero-padded to a multiple of 32;
//   values  key pairs interleaved: pair row p holds, for each d < v_dim, one 32-bit word
//           (low half v_{2p}[d], high half v_{2p+1}[d]), v_stride words apart, zero-padded
//           to a multiple of 16 words (an odd step's last key pairs with zeros);
//   queries BF16 rows (AttnStepArgs::q_bf16), zero-padded like the keys.
// Arithmetic per query, as the float step's contract (kernels.h): scores are 32-term dot
// products reduced by the same sum4 tree, the weights exp(s - m) rounded to BF16 (l sums
// the rounded weights, so the output is their exact weighted mean up to f32 sums), and
// each output element one chain in key-pair order. A weight beyond a query's visible keys
// is +0, whose products leave a sum's bits unchanged: a query's bits do not depend on the
// other queries of its tile (batch invariance).
#include "backend/cpu/kernels_x86_impl.h"
#include "base/check.h"

#if !defined(__AVX512BF16__)
#error "kernels_avx512_bf16.cc needs -mavx512bf16"
#endif

namespace dserve::cpu {
namespace {

constexpr int kBf16Lanes = 32;  // BF16 elements per 512-bit vector
constexpr int kMaxPairs = 32;   // most key pairs per step (64 keys)

inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// The mask of the first n - i of 16 lanes (none when n <= i).
inline __mmask16 lanes_below(int64_t n, int64_t i) {
  return n <= i ? 0 : n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
}

// 16 floats rounded to BF16 (nearest even), each in the low half of a 32-bit word.
inline __m512i bf16_words(__m512 x) {
  return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x));
}

// x[n] -> out[n_pad] BF16 (nearest even), zeros past n; n_pad a multiple of 32.
void f32_to_bf16_padded(const float* x, int n, int n_pad, uint16_t* out) {
  for (int i = 0; i < n_pad; i += kBf16Lanes) {
    const __m512 a = _mm512_maskz_loadu_ps(lanes_below(n, i), x + i);
    const __m512 b = _mm512_maskz_loadu_ps(lanes_below(n, i + 16), x + i + 16);
    _mm512_storeu_si512(out + i, (__m512i)_mm512_cvtne2ps_pbh(b, a));  // a's 16, then b's
  }
}

// n_keys float rows [head_dim] (head_dim apart) -> the step's BF16 keys (k_stride
// elements apart) and pair-interleaved values of their first v_dim (v_stride words).
void attn_rows_to_bf16(const float* rows, int64_t n_keys, int head_dim, int v_dim,
                       uint16_t* k, int64_t k_stride, uint32_t* v_pairs, int64_t v_stride) {
  for (int64_t j = 0; j < n_keys; ++j) {
    f32_to_bf16_padded(rows + j * head_dim, head_dim, static_cast<int>(k_stride), k + j * k_stride);
  }
  for (int64_t p = 0; 2 * p < n_keys; ++p) {
    const float* even = rows + 2 * p * head_dim;
    const float* odd = 2 * p + 1 < n_keys ? even + head_dim : nullptr;
    for (int d = 0; d < v_stride; d += 16) {
      const __mmask16 m = lanes_below(v_dim, d);
      const __m512i lo = bf16_words(_mm512_maskz_loadu_ps(m, even + d));
      const __m512i hi = odd ? bf16_words(_mm512_maskz_loadu_ps(m, odd + d)) : _mm512_setzero_si512();
      _mm512_storeu_si512(v_pairs + p * v_stride + d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

// acc[b] = acc[b] * corr[b] + sum over pairs of w[b] . v for NQ queries, v_dim in
// chunks of NV vectors (the tail masked).
template <int NQ>
void values_bf16(float* const* acc, const uint32_t (*w)[kMaxPairs], const float* corr,
                 int64_t n_pairs, const uint32_t* v, int64_t v_stride, int vd) {
  auto chunk = [&]<int NV>(int d, __mmask16 tail) {
    __m512 r[NQ][NV];
    for (int b = 0; b < NQ; ++b) {
      const __m512 cv = _mm512_set1_ps(corr[b]);
      for (int u = 0; u < NV; ++u) {
        const __mmask16 m = u == NV - 1 ? tail : 0xffff;
        r[b][u] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, acc[b] + d + u * 16), cv);
      }
    }
    for (int64_t p = 0; p < n_pairs; ++p) {
      const uint32_t* vr = v + p * v_stride + d;
      __m512i vv[NV];
      for (int u = 0; u < NV; ++u) {
        vv[u] = _mm512_loadu_si512(vr + u * 16);
        __asm__("" : "+v"(vv[u]));  // loaded once for all NQ queries
      }
      for (int b = 0; b < NQ; ++b) {
        const __m512i wv = _mm512_set1_epi32(static_cast<int>(w[b][p]));
        for (int u = 0; u < NV; ++u) r[b][u] = dot_pairs(r[b][u], wv, vv[u]);
      }
    }
    for (int b = 0; b < NQ; ++b) {
      for (int u = 0; u < NV; ++u) {
        const __mmask16 m = u == NV - 1 ? tail : 0xffff;
        _mm512_mask_storeu_ps(acc[b] + d + u * 16, m, r[b][u]);
      }
    }
  };
  int d = 0;
  for (; d + 64 <= vd; d += 64) chunk.template operator()<4>(d, 0xffff);
  for (; d + 16 <= vd; d += 16) chunk.template operator()<1>(d, 0xffff);
  if (d < vd) chunk.template operator()<1>(d, static_cast<__mmask16>((1u << (vd - d)) - 1));
}

// One register tile: NQ queries (indices qi) that each see at least one key.
template <int NQ>
void attn_tile_bf16(const AttnStepArgs& a, const int* qi) {
  const int64_t ld = (a.n_keys + 3) & ~int64_t{3};
  const int hd_pad = static_cast<int>(a.k_stride);
  const uint16_t* keys = static_cast<const uint16_t*>(a.k);
  const uint16_t* q[NQ];
  float* s[NQ];
  float* acc[NQ];
  int64_t n[NQ];
  int64_t n_max = 0;
  for (int b = 0; b < NQ; ++b) {
    const int i = qi[b];
    q[b] = a.q_bf16[i];
    s[b] = a.scores + b * ld;
    acc[b] = a.acc + int64_t{i} * a.v_dim;
    n[b] = a.n_visible[i] < a.n_keys ? a.n_visible[i] : a.n_keys;
    n_max = n[b] > n_max ? n[b] : n_max;
  }
  const __m128 scale_v = _mm_set1_ps(a.scale);
  for (int64_t j = 0; j < n_max; j += 4) {
    const uint16_t* kr[4];
    for (int c = 0; c < 4; ++c) kr[c] = keys + (j + c < n_max ? j + c : n_max - 1) * a.k_stride;
    __m512 dot[NQ][4];
    for (int b = 0; b < NQ; ++b) {
      for (int c = 0; c < 4; ++c) dot[b][c] = _mm512_setzero_ps();
    }
    for (int d = 0; d < hd_pad; d += kBf16Lanes) {
      __m512i kv[4];
      for (int c = 0; c < 4; ++c) {
        kv[c] = _mm512_loadu_si512(kr[c] + d);
        __asm__("" : "+v"(kv[c]));
      }
      for (int b = 0; b < NQ; ++b) {
        const __m512i qv = _mm512_loadu_si512(q[b] + d);
        for (int c = 0; c < 4; ++c) dot[b][c] = dot_pairs(dot[b][c], qv, kv[c]);
      }
    }
    for (int b = 0; b < NQ; ++b) {
      const __m128 sv = VecF::sum4(dot[b][0], dot[b][1], dot[b][2], dot[b][3]);
      _mm_storeu_ps(s[b] + j, _mm_mul_ps(sv, scale_v));
    }
  }

  // Per query: the new running max, the factor for what was summed before, and the
  // step's weights exp(s - m) rounded to BF16, in pairs (+0 past its visible keys).
  const int64_t n_pairs = (n_max + 1) / 2;
  uint32_t w[NQ][kMaxPairs];
  float corr[NQ];
  for (int b = 0; b < NQ; ++b) {
    const int i = qi[b];
    float block_max = -INFINITY;
    for (int64_t j = 0; j < n[b]; ++j) block_max = s[b][j] > block_max ? s[b][j] : block_max;
    const float m = a.m[i] > block_max ? a.m[i] : block_max;
    corr[b] = std::exp(a.m[i] - m);  // 0 on the first step (m = -inf)
    exp_sub_sum_f32_x86(s[b], m, n[b]);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < 2 * n_pairs; j += kBf16Lanes) {  // 16 pairs a vector
      const __m512 lo = _mm512_maskz_loadu_ps(lanes_below(n[b], j), s[b] + j);
      const __m512 hi = _mm512_maskz_loadu_ps(lanes_below(n[b], j + 16), s[b] + j + 16);
      const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      _mm512_storeu_si512(w[b] + j / 2, pairs);
      sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)));
      sum = _mm512_add_ps(sum, _mm512_castsi512_ps(
                                   _mm512_and_si512(pairs, _mm512_set1_epi32(-65536))));
    }
    a.l[i] = a.l[i] * corr[b] + _mm512_reduce_add_ps(sum);
    a.m[i] = m;
  }
  values_bf16<NQ>(acc, w, corr, n_pairs, static_cast<const uint32_t*>(a.v), a.v_stride,
                  a.v_dim);
}

// The step (kernels.h, attn_step_bf16): queries in register tiles of kAttnQueries.
void attn_step_bf16(const AttnStepArgs& a) {
  DS_CHECK(a.n_keys <= 2 * kMaxPairs && a.k_stride % kBf16Lanes == 0 && a.v_stride % 16 == 0);
  int qi[kAttnQueries];
  int nb = 0;
  auto flush = [&] {
    switch (nb) {
      case 1: attn_tile_bf16<1>(a, qi); break;
      case 2: attn_tile_bf16<2>(a, qi); break;
      case 3: attn_tile_bf16<3>(a, qi); break;
      case 4: attn_tile_bf16<4>(a, qi); break;
      case 5: attn_tile_bf16<5>(a, qi); break;
      case 6: attn_tile_bf16<6>(a, qi); break;
    }
    nb = 0;
  };
  static_assert(kAttnQueries == 6, "see the switch above");
  for (int i = 0; i < a.n_q; ++i) {
    if (a.n_visible[i] <= 0) continue;
    qi[nb++] = i;
    if (nb == kAttnQueries) flush();
  }
  flush();
}

}  // namespace

void add_avx512_bf16(KernelTable& t) {
  t.attn_step_bf16 = attn_step_bf16;
  t.attn_rows_to_bf16 = attn_rows_to_bf16;
  t.f32_to_bf16_padded = f32_to_bf16_padded;
}

}  // namespace dserve::cpu
