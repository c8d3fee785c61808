#include "tensor/dequantize.h"

#include <cstring>

#include "base/check.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace dserve {
namespace {

// Each function converts n_blocks consecutive blocks. The arithmetic is written in
// the same order as ggml's reference (and gguf-py's numpy) code so results are
// bit-identical: floats are not associative.

void dequant_q8_0(const block_q8_0* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < kQK8; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
    y += kQK8;
  }
}

void dequant_q4_0(const block_q4_0* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < kQK4 / 2; ++j) {
      y[j] = static_cast<float>((x[i].qs[j] & 0xF) - 8) * d;
      y[j + kQK4 / 2] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
    y += kQK4;
  }
}

void dequant_q4_1(const block_q4_1* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float m = f16_to_f32(x[i].m);
    for (int j = 0; j < kQK4 / 2; ++j) {
      y[j] = static_cast<float>(x[i].qs[j] & 0xF) * d + m;
      y[j + kQK4 / 2] = static_cast<float>(x[i].qs[j] >> 4) * d + m;
    }
    y += kQK4;
  }
}

// The 5-bit value of element i (0..31) of a Q5_0 / Q5_1 block, before offset.
int q5_value(const uint8_t* qs, const uint8_t* qh, int i) {
  const uint32_t h = static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
                     static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
  const int nibble = i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4);
  return nibble | static_cast<int>((h >> i) & 1) << 4;
}

void dequant_q5_0(const block_q5_0* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q5_value(x[i].qs, x[i].qh, j) - 16) * d;
    y += 32;
  }
}

void dequant_q5_1(const block_q5_1* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float m = f16_to_f32(x[i].m);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q5_value(x[i].qs, x[i].qh, j)) * d + m;
    y += 32;
  }
}

void dequant_q4_k(const block_q4_K* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float dmin = f16_to_f32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    for (int g = 0; g < 4; ++g) {  // 4 groups of 64 = 2 sub-blocks sharing 32 bytes
      uint8_t sc, mn;
      q_k_scale_min(2 * g, x[i].scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      q_k_scale_min(2 * g + 1, x[i].scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
      y += 64;
    }
  }
}

void dequant_q5_k(const block_q5_K* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float dmin = f16_to_f32(x[i].dmin);
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    for (int g = 0; g < 4; ++g) {
      uint8_t sc, mn;
      q_k_scale_min(2 * g, x[i].scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      q_k_scale_min(2 * g + 1, x[i].scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      const uint8_t u1 = static_cast<uint8_t>(1u << (2 * g));
      const uint8_t u2 = static_cast<uint8_t>(2u << (2 * g));
      for (int l = 0; l < 32; ++l) {
        const int q = (ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0);
        y[l] = d1 * static_cast<float>(q) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        const int q = (ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0);
        y[32 + l] = d2 * static_cast<float>(q) - m2;
      }
      ql += 32;
      y += 64;
    }
  }
}

void dequant_q6_k(const block_q6_K* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int half = 0; half < 2; ++half) {  // two halves of 128 elements
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  const int block = dtype_info(type).block_size;
  DS_CHECK_MSG(n >= 0 && n % block == 0, "dequantize_row: n=%lld is not a multiple of %d",
               static_cast<long long>(n), block);
  const int64_t n_blocks = n / block;
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      // Unaligned-safe: GGUF data is aligned, but callers may pass any offset.
      const auto* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    }
    case DType::kBF16: {
      const auto* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    }
    case DType::kQ8_0: dequant_q8_0(static_cast<const block_q8_0*>(src), dst, n_blocks); return;
    case DType::kQ4_0: dequant_q4_0(static_cast<const block_q4_0*>(src), dst, n_blocks); return;
    case DType::kQ4_1: dequant_q4_1(static_cast<const block_q4_1*>(src), dst, n_blocks); return;
    case DType::kQ4_K: dequant_q4_k(static_cast<const block_q4_K*>(src), dst, n_blocks); return;
    case DType::kQ5_K: dequant_q5_k(static_cast<const block_q5_K*>(src), dst, n_blocks); return;
    case DType::kQ6_K: dequant_q6_k(static_cast<const block_q6_K*>(src), dst, n_blocks); return;
    case DType::kQ5_0: dequant_q5_0(static_cast<const block_q5_0*>(src), dst, n_blocks); return;
    case DType::kQ5_1: dequant_q5_1(static_cast<const block_q5_1*>(src), dst, n_blocks); return;
    case DType::kI8: {  // without its row scales (applied by the caller)
      const auto* p = static_cast<const int8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(p[i]);
      return;
    }
    case DType::kI32: {  // integer metadata (loader/ascend_quant.h); exact below 2^24
      const auto* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        dst[i] = static_cast<float>(v);
      }
      return;
    }
    case DType::kI64: {
      const auto* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        int64_t v;
        std::memcpy(&v, p + 8 * i, 8);
        dst[i] = static_cast<float>(v);
      }
      return;
    }
    case DType::kF8_E4M3: {  // without its block scales (applied by the caller)
      const auto* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp8_e4m3_to_f32(p[i]);
      return;
    }
  }
  DS_CHECK_MSG(false, "dequantize_row: bad dtype %d", static_cast<int>(type));
}

}  // namespace dserve
