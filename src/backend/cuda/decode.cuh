// Weight decoding shared by the CUDA kernels that read weights (matmuls, embedding
// rows, MoE experts): every weight dtype in 32-element units as FP32, with the same
// block layouts as tensor/quant_blocks.h, and a host-side dispatch from a DType to the
// kernel template instantiated for it.
#pragma once

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace dserve::cuda {

constexpr int kUnit = 32;

__host__ __device__ inline uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

// Q4_K / Q5_K's 6-bit scale and minimum of sub-block j (tensor/quant_blocks.h).
__host__ __device__ inline void k_scale_min(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Elements [32u, 32u + n) of row r as floats into v; returns n (32, less only at the
// end of a plain or FP8 row).
template <DType T>
__host__ __device__ inline int decode_unit(const DeviceMatrix& w, int64_t r, int64_t u, float* v) {
  const uint8_t* row = w.data + r * w.row_bytes;
  const int64_t j0 = u * kUnit;
  const int n = static_cast<int>(min64(kUnit, w.n_cols - j0));
  if constexpr (T == DType::kF32) {
    const float* p = reinterpret_cast<const float*>(row) + j0;
    for (int i = 0; i < n; ++i) v[i] = p[i];
  } else if constexpr (T == DType::kF16 || T == DType::kBF16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + j0;
    for (int i = 0; i < n; ++i) {
      v[i] = T == DType::kF16 ? half_bits_to_float(p[i]) : bf16_bits_to_float(p[i]);
    }
  } else if constexpr (T == DType::kQ8_0) {
    const uint8_t* b = row + u * 34;
    const float d = half_bits_to_float(load_u16(b));
    for (int i = 0; i < kUnit; ++i) v[i] = d * static_cast<float>(static_cast<int8_t>(b[2 + i]));
  } else if constexpr (T == DType::kQ4_0 || T == DType::kQ4_1) {
    const uint8_t* b = row + u * (T == DType::kQ4_0 ? 18 : 20);
    const float d = half_bits_to_float(load_u16(b));
    const float m = T == DType::kQ4_1 ? half_bits_to_float(load_u16(b + 2)) : 0.0f;
    const uint8_t* qs = b + (T == DType::kQ4_0 ? 2 : 4);
    const int offset = T == DType::kQ4_0 ? 8 : 0;
    for (int i = 0; i < 16; ++i) {
      v[i] = d * static_cast<float>((qs[i] & 0xF) - offset) + m;
      v[i + 16] = d * static_cast<float>((qs[i] >> 4) - offset) + m;
    }
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    constexpr bool kFifth = T == DType::kQ5_K;
    const uint8_t* b = row + (u / 8) * (kFifth ? 176 : 144);
    const int sub = static_cast<int>(u % 8), g = sub / 2, hi = sub % 2;
    const float d = half_bits_to_float(load_u16(b)), dmin = half_bits_to_float(load_u16(b + 2));
    int sc, mn;
    k_scale_min(sub, b + 4, &sc, &mn);
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (kFifth ? 48 : 16) + 32 * g;
    for (int l = 0; l < kUnit; ++l) {
      int q = hi ? qs[l] >> 4 : qs[l] & 0xF;
      if (kFifth) q |= ((qh[l] >> sub) & 1) << 4;
      v[l] = d * static_cast<float>(sc) * static_cast<float>(q) - dmin * static_cast<float>(mn);
    }
  } else if constexpr (T == DType::kQ6_K) {
    const uint8_t* b = row + (u / 8) * 210;
    const int sub = static_cast<int>(u % 8), h = sub / 4, quarter = sub % 4;
    const uint8_t* ql = b + 64 * h + (quarter % 2) * 32;
    const uint8_t* qh = b + 128 + 32 * h;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + 2 * quarter;
    const float d = half_bits_to_float(load_u16(b + 208));
    const int shift = 2 * quarter;
    for (int l = 0; l < kUnit; ++l) {
      const int lo = quarter < 2 ? ql[l] & 0xF : ql[l] >> 4;
      const int q = (lo | (((qh[l] >> shift) & 3) << 4)) - 32;
      v[l] = d * static_cast<float>(sc[l / 16]) * static_cast<float>(q);
    }
  } else if constexpr (T == DType::kI8) {
    const int8_t* p = reinterpret_cast<const int8_t*>(row) + j0;
    const float s = w.row_scales[r];
    for (int i = 0; i < n; ++i) v[i] = s * static_cast<float>(p[i]);
  } else if constexpr (T == DType::kF8_E4M3) {
    const uint8_t* p = row + j0;
    const float* s = w.scales + (w.row0 + r) / w.block_rows * w.scale_stride;
    for (int i = 0; i < n; ++i) {
      v[i] = s[(w.col0 + j0 + i) / w.block_cols] * fp8_e4m3_to_float(p[i]);
    }
  }
  return n;
}

// One warp's dot product of row r of w with x [w.n_cols]; every lane gets the sum.
template <DType T>
__device__ __forceinline__ float warp_dot_row(const DeviceMatrix& w, int64_t r, const float* x) {
  float v[kUnit];
  float acc = 0.0f;
  const int64_t n_units = (w.n_cols + kUnit - 1) / kUnit;
  for (int64_t u = threadIdx.x % kWarp; u < n_units; u += kWarp) {
    const int n = decode_unit<T>(w, r, u, v);
    const float* xu = x + u * kUnit;
    for (int i = 0; i < n; ++i) acc = fmaf(v[i], xu[i], acc);
  }
  return warp_sum(acc);
}

// Calls f.template operator()<T>() for w's dtype.
template <typename F>
void dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f.template operator()<DType::kF32>(); return;
    case DType::kF16: f.template operator()<DType::kF16>(); return;
    case DType::kBF16: f.template operator()<DType::kBF16>(); return;
    case DType::kQ8_0: f.template operator()<DType::kQ8_0>(); return;
    case DType::kQ4_0: f.template operator()<DType::kQ4_0>(); return;
    case DType::kQ4_1: f.template operator()<DType::kQ4_1>(); return;
    case DType::kQ4_K: f.template operator()<DType::kQ4_K>(); return;
    case DType::kQ5_K: f.template operator()<DType::kQ5_K>(); return;
    case DType::kQ6_K: f.template operator()<DType::kQ6_K>(); return;
    case DType::kI8: f.template operator()<DType::kI8>(); return;
    case DType::kF8_E4M3: f.template operator()<DType::kF8_E4M3>(); return;
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kI32:
    case DType::kI64:
      return;  // never a weight here (matmul_dtype_supported)
  }
}


}  // namespace dserve::cuda
