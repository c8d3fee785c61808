// Scalar kernels: plain C++ for any CPU. They are the fallback level and, with the
// same activation quantisation as the SIMD levels, the reference those are tested
// against, so they favour clarity over speed.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace dserve::cpu {
namespace {

// ---- activation quantisation (shared rounding rule: see kernels.h) ----

// Quantises n values with one scale; returns the scale, writes q.
float quantize_block(const float* x, int n, int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * id));
  return d;
}

void quantize_q8x32(const float* x, int64_t k, uint8_t* out) {
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* d = reinterpret_cast<float*>(out + round_up(k, kActAlign));
  float* s = d + k / 32;
  for (int64_t b = 0; b < k / 32; ++b) {
    d[b] = quantize_block(x + b * 32, 32, qs + b * 32);
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += qs[b * 32 + i];
    s[b] = d[b] * static_cast<float>(sum);
  }
}

void quantize_q8x256(const float* x, int64_t k, uint8_t* out) {
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float* d = reinterpret_cast<float*>(out + round_up(k, kActAlign));
  int16_t* bsums = reinterpret_cast<int16_t*>(d + k / 256);
  for (int64_t b = 0; b < k / 256; ++b) d[b] = quantize_block(x + b * 256, 256, qs + b * 256);
  for (int64_t g = 0; g < k / 16; ++g) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += qs[g * 16 + i];
    bsums[g] = static_cast<int16_t>(sum);
  }
}

// ---- per-row dot products, one template specialisation per weight type ----

template <DType T>
float dot_row(const uint8_t* w, const uint8_t* x, int64_t k);

template <typename Load>
float dot_float_row(const Load& load, const float* x, int64_t k) {
  float acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) {
    for (int j = 0; j < 4; ++j) acc[j] += load(i + j) * x[i + j];
  }
  for (; i < k; ++i) acc[0] += load(i) * x[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

template <>
float dot_row<DType::kF32>(const uint8_t* w, const uint8_t* x, int64_t k) {
  const float* wf = reinterpret_cast<const float*>(w);
  return dot_float_row([wf](int64_t i) { return wf[i]; }, reinterpret_cast<const float*>(x), k);
}

template <>
float dot_row<DType::kF16>(const uint8_t* w, const uint8_t* x, int64_t k) {
  return dot_float_row(
      [w](int64_t i) {
        uint16_t h;
        std::memcpy(&h, w + 2 * i, 2);
        return f16_to_f32(h);
      },
      reinterpret_cast<const float*>(x), k);
}

template <>
float dot_row<DType::kBF16>(const uint8_t* w, const uint8_t* x, int64_t k) {
  return dot_float_row(
      [w](int64_t i) {
        uint16_t h;
        std::memcpy(&h, w + 2 * i, 2);
        return bf16_to_f32(h);
      },
      reinterpret_cast<const float*>(x), k);
}

template <>
float dot_row<DType::kQ8_0>(const uint8_t* w, const uint8_t* x, int64_t k) {
  const auto* blocks = reinterpret_cast<const block_q8_0*>(w);
  const Q8x32Row a = q8x32_row(x, k);
  float acc = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += blocks[b].qs[i] * a.qs[b * 32 + i];
    acc += f16_to_f32(blocks[b].d) * a.d[b] * static_cast<float>(sum);
  }
  return acc;
}

// Sum over one 32-block of (nibble value) * activation, for Q4_0 / Q4_1 packing.
inline int dot_nibbles32(const uint8_t* qs, const int8_t* a) {
  int sum = 0;
  for (int j = 0; j < 16; ++j) sum += (qs[j] & 0xF) * a[j] + (qs[j] >> 4) * a[j + 16];
  return sum;
}

template <>
float dot_row<DType::kQ4_0>(const uint8_t* w, const uint8_t* x, int64_t k) {
  const auto* blocks = reinterpret_cast<const block_q4_0*>(w);
  const Q8x32Row a = q8x32_row(x, k);
  float acc = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    const int8_t* a8 = a.qs + b * 32;
    int sum = 0;
    for (int j = 0; j < 16; ++j) {
      sum += ((blocks[b].qs[j] & 0xF) - 8) * a8[j] + ((blocks[b].qs[j] >> 4) - 8) * a8[j + 16];
    }
    acc += f16_to_f32(blocks[b].d) * a.d[b] * static_cast<float>(sum);
  }
  return acc;
}

template <>
float dot_row<DType::kQ4_1>(const uint8_t* w, const uint8_t* x, int64_t k) {
  const auto* blocks = reinterpret_cast<const block_q4_1*>(w);
  const Q8x32Row a = q8x32_row(x, k);
  float acc = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    const int sum = dot_nibbles32(blocks[b].qs, a.qs + b * 32);
    acc += f16_to_f32(blocks[b].d) * a.d[b] * static_cast<float>(sum) +
           f16_to_f32(blocks[b].m) * a.s[b];
  }
  return acc;
}

// Q4_K / Q5_K: y = d * sc * q - dmin * mn per 32-sub-block; the min term needs only
// the activation sums of each sub-block.
template <bool kFifthBit, typename Block>
float dot_q45_k(const Block* blocks, const uint8_t* x, int64_t k) {
  const Q8x256Row a = q8x256_row(x, k);
  float acc = 0.0f;
  for (int64_t b = 0; b < k / 256; ++b) {
    const Block& blk = blocks[b];
    const int8_t* q8 = a.qs + b * 256;
    const int16_t* bs = a.bsums + b * 16;
    int isum = 0, msum = 0;
    for (int g = 0; g < 4; ++g) {
      uint8_t sc_lo, mn_lo, sc_hi, mn_hi;
      q_k_scale_min(2 * g, blk.scales, &sc_lo, &mn_lo);
      q_k_scale_min(2 * g + 1, blk.scales, &sc_hi, &mn_hi);
      int sum_lo = 0, sum_hi = 0;
      for (int l = 0; l < 32; ++l) {
        int lo = blk.qs[32 * g + l] & 0xF;
        int hi = blk.qs[32 * g + l] >> 4;
        if constexpr (kFifthBit) {
          const auto* b5 = reinterpret_cast<const block_q5_K*>(&blk);
          lo |= ((b5->qh[l] >> (2 * g)) & 1) << 4;
          hi |= ((b5->qh[l] >> (2 * g + 1)) & 1) << 4;
        }
        sum_lo += lo * q8[64 * g + l];
        sum_hi += hi * q8[64 * g + 32 + l];
      }
      isum += sc_lo * sum_lo + sc_hi * sum_hi;
      msum += mn_lo * (bs[4 * g] + bs[4 * g + 1]) + mn_hi * (bs[4 * g + 2] + bs[4 * g + 3]);
    }
    acc += a.d[b] * (f16_to_f32(blk.d) * static_cast<float>(isum) -
                     f16_to_f32(blk.dmin) * static_cast<float>(msum));
  }
  return acc;
}

template <>
float dot_row<DType::kQ4_K>(const uint8_t* w, const uint8_t* x, int64_t k) {
  return dot_q45_k<false>(reinterpret_cast<const block_q4_K*>(w), x, k);
}

template <>
float dot_row<DType::kQ5_K>(const uint8_t* w, const uint8_t* x, int64_t k) {
  return dot_q45_k<true>(reinterpret_cast<const block_q5_K*>(w), x, k);
}

template <>
float dot_row<DType::kQ6_K>(const uint8_t* w, const uint8_t* x, int64_t k) {
  const auto* blocks = reinterpret_cast<const block_q6_K*>(w);
  const Q8x256Row a = q8x256_row(x, k);
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
      int sums[8] = {};
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        sums[is + 0] += q1 * a8[l];
        sums[is + 2] += q2 * a8[l + 32];
        sums[is + 4] += q3 * a8[l + 64];
        sums[is + 6] += q4 * a8[l + 96];
      }
      for (int j = 0; j < 8; ++j) isum += sc[j] * sums[j];
    }
    acc += a.d[b] * f16_to_f32(blk.d) * static_cast<float>(isum);
  }
  return acc;
}

template <DType T>
void matmul_tile(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride, int64_t k,
                 int64_t n_rows, int64_t n_tokens, float* y, int64_t y_stride) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < n_rows; ++r) {
      y[t * y_stride + r] = dot_row<T>(w + r * w_stride, x + t * x_stride, k);
    }
  }
}

// W8A8 (kernels.h, MatmulI8Fn): the exact int32 dot of two int8 rows, scaled once.
void matmul_i8(const uint8_t* w, size_t w_stride, const float* w_scales, const uint8_t* x,
               size_t x_stride, int64_t k, int64_t n_rows, int64_t n_tokens, float* y,
               int64_t y_stride) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const Q8TokenRow a = q8token_row(x + t * x_stride, k);
    for (int64_t r = 0; r < n_rows; ++r) {
      const auto* q = reinterpret_cast<const int8_t*>(w + r * w_stride);
      int32_t sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += int32_t{q[j]} * int32_t{a.qs[j]};
      y[t * y_stride + r] = static_cast<float>(sum) * (w_scales[r] * a.d);
    }
  }
}

// FP8 E4M3 with block scales (kernels.h, MatmulF8Fn): per block of the reduction, the
// converted weights times x summed as dot_float_row does, then times the block's
// scale, once.
void matmul_f8(const uint8_t* w, size_t w_stride, const BlockScales& scales, const uint8_t* x,
               size_t x_stride, int64_t k, int64_t n_rows, int64_t n_tokens, float* y,
               int64_t y_stride) {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  const int64_t bc = scales.block_cols;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = reinterpret_cast<const float*>(x + t * x_stride);
    for (int64_t r = 0; r < n_rows; ++r) {
      const uint8_t* q = w + r * w_stride;
      const float* s = scales.row(r);
      float acc = 0.0f;
      int64_t b = 0;  // the block: columns [b0, end)
      for (int64_t b0 = 0; b0 < k; ++b) {
        const int64_t end = std::min(k, (b + 1) * bc - scales.col0);
        const uint8_t* qb = q + b0;
        acc += s[b] * dot_float_row([qb](int64_t i) { return table[qb[i]]; }, xt + b0, end - b0);
        b0 = end;
      }
      y[t * y_stride + r] = acc;
    }
  }
}

// ---- float helpers ----

float dot_f32(const float* a, const float* b, int64_t n) {
  return dot_float_row([a](int64_t i) { return a[i]; }, b, n);
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scale_f32(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

void rms_norm_f32(const float* x, const float* w, float eps, int64_t n, float* out) {
  const float ss = dot_f32(x, x, n);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r * w[i];
}

void silu_mul_f32(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_f32(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

float exp_sub_sum_f32(float* x, float max, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  return sum;
}

// A KV row element as float: floats as they are, halves converted exactly.
inline float kv_load(const float* p, int64_t i) { return p[i]; }
inline float kv_load(const uint16_t* p, int64_t i) { return f16_to_f32(p[i]); }
inline float kv_load(const KvF8* p, int64_t i) { return fp8_e4m3_to_f32(p[i].bits); }

// The plain online-softmax step (kernels.h), one query at a time, over K/V rows of
// Elem (float or IEEE half): the same operations in the same order for both.
template <typename Elem>
void attn_step(const AttnStepArgs& a) {
  const Elem* k = static_cast<const Elem*>(a.k);
  const Elem* v = static_cast<const Elem*>(a.v);
  for (int i = 0; i < a.n_q; ++i) {
    const int64_t n = std::min(a.n_keys, a.n_visible[i]);
    if (n <= 0) continue;
    float* s = a.scores;
    float block_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const Elem* kr = k + j * a.k_stride;
      s[j] = dot_float_row([kr](int64_t d) { return kv_load(kr, d); }, a.q[i], a.head_dim) *
             a.scale;
      block_max = std::fmax(block_max, s[j]);
    }
    const float m = std::fmax(a.m[i], block_max);
    const float correction = std::exp(a.m[i] - m);  // 0 on the first step (m = -inf)
    const float sum = exp_sub_sum_f32(s, m, n);
    float* acc = a.acc + int64_t{i} * a.v_dim;
    scale_f32(correction, acc, a.v_dim);
    for (int64_t j = 0; j < n; ++j) {
      const Elem* vr = v + j * a.v_stride;
      for (int d = 0; d < a.v_dim; ++d) acc[d] += s[j] * kv_load(vr, d);
    }
    a.l[i] = a.l[i] * correction + sum;
    a.m[i] = m;
  }
}

void f32_to_f16_row(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

void f16_to_f32_row(const uint16_t* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(x[i]);
}

void f8_to_f32_row(const KvF8* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fp8_e4m3_to_f32(x[i].bits);
}

KernelTable make_table() {
  KernelTable t{};
  t.isa = CpuIsa::kScalar;
  t.quantize_q8x32 = quantize_q8x32;
  t.quantize_q8x256 = quantize_q8x256;
  t.quantize_q8x32_tiles = q8x32_quantize_to_tiles_generic;
  t.matmul[static_cast<int>(DType::kF32)] = matmul_tile<DType::kF32>;
  t.matmul[static_cast<int>(DType::kF16)] = matmul_tile<DType::kF16>;
  t.matmul[static_cast<int>(DType::kBF16)] = matmul_tile<DType::kBF16>;
  t.matmul[static_cast<int>(DType::kQ8_0)] = matmul_tile<DType::kQ8_0>;
  t.matmul[static_cast<int>(DType::kQ4_0)] = matmul_tile<DType::kQ4_0>;
  t.matmul[static_cast<int>(DType::kQ4_1)] = matmul_tile<DType::kQ4_1>;
  t.matmul[static_cast<int>(DType::kQ4_K)] = matmul_tile<DType::kQ4_K>;
  t.matmul[static_cast<int>(DType::kQ5_K)] = matmul_tile<DType::kQ5_K>;
  t.matmul[static_cast<int>(DType::kQ6_K)] = matmul_tile<DType::kQ6_K>;
  t.matmul_i8 = matmul_i8;
  t.matmul_f8 = matmul_f8;
  t.dot_f32 = dot_f32;
  t.axpy_f32 = axpy_f32;
  t.scale_f32 = scale_f32;
  t.rms_norm_f32 = rms_norm_f32;
  t.silu_mul_f32 = silu_mul_f32;
  t.add_f32 = add_f32;
  t.exp_sub_sum_f32 = exp_sub_sum_f32;
  t.attn_step_f32 = attn_step<float>;
  t.attn_step_f16 = attn_step<uint16_t>;
  t.attn_step_f8 = attn_step<KvF8>;
  t.f32_to_f16_row = f32_to_f16_row;
  t.f16_to_f32_row = f16_to_f32_row;
  t.f8_to_f32_row = f8_to_f32_row;
  return t;
}

}  // namespace

const KernelTable& kernels_scalar() {
  static const KernelTable table = make_table();
  return table;
}

}  // namespace dserve::cpu
