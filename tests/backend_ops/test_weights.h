// Random weights of every dtype for the backend op tests: GGUF block types with random
// quants and sane scales, W8A8 int8 rows with their scales, FP8 with block scales.
//
// Thread-safety: test helpers for one test thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend_configs.h"
#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"
#include "tensor/tensor_view.h"

namespace dserve::test {

inline uint16_t f16(float x) { return f32_to_f16(x); }

// Random weights [n, k] of type t: random quants, sane scales.
inline std::vector<uint8_t> random_weights(DType t, int64_t n, int64_t k, std::mt19937& rng) {
  const size_t bytes = dtype_bytes(t, n * k);
  std::vector<uint8_t> w(bytes);
  std::uniform_real_distribution<float> scale(0.002f, 0.02f), offset(-0.1f, 0.1f);
  if (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) {
    std::vector<float> f = random_floats(n * k, rng, 0.1f);
    for (int64_t i = 0; i < n * k; ++i) {
      if (t == DType::kF32) {
        std::memcpy(w.data() + 4 * i, &f[i], 4);
      } else {
        uint16_t h = t == DType::kF16 ? f16(f[i]) : f32_to_bf16(f[i]);
        std::memcpy(w.data() + 2 * i, &h, 2);
      }
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const int64_t n_blocks = (n * k) / dtype_info(t).block_size;
  for (int64_t i = 0; i < n_blocks; ++i) {
    switch (t) {
      case DType::kQ8_0: reinterpret_cast<block_q8_0*>(w.data())[i].d = f16(scale(rng)); break;
      case DType::kQ4_0: reinterpret_cast<block_q4_0*>(w.data())[i].d = f16(scale(rng)); break;
      case DType::kQ4_1: {
        auto& b = reinterpret_cast<block_q4_1*>(w.data())[i];
        b.d = f16(scale(rng));
        b.m = f16(offset(rng));
        break;
      }
      case DType::kQ4_K: {
        auto& b = reinterpret_cast<block_q4_K*>(w.data())[i];
        b.d = f16(scale(rng) * 0.1f);
        b.dmin = f16(scale(rng) * 0.1f);
        break;
      }
      case DType::kQ5_K: {
        auto& b = reinterpret_cast<block_q5_K*>(w.data())[i];
        b.d = f16(scale(rng) * 0.1f);
        b.dmin = f16(scale(rng) * 0.1f);
        break;
      }
      case DType::kQ6_K: reinterpret_cast<block_q6_K*>(w.data())[i].d = f16(scale(rng) * 0.1f); break;
      case DType::kF32:
      case DType::kF16:
      case DType::kBF16:
      case DType::kI8:  // scales beside the rows: see W8A8Weights
      case DType::kF8_E4M3:
      case DType::kQ5_0:
      case DType::kQ5_1:
      case DType::kI32:
      case DType::kI64: break;
    }
  }
  return w;
}

// Random int8 weights [n, k] over the whole range (-128 included) and row scales.
struct W8A8Weights {
  std::vector<int8_t> q;
  std::vector<float> scales;
  TensorView view;
  W8A8Weights(int64_t n, int64_t k, std::mt19937& rng, float input_scale = 0.0f)
      : q(n * k), scales(n) {
    std::uniform_int_distribution<int> byte(-128, 127);
    std::uniform_real_distribution<float> scale(0.0005f, 0.004f);
    for (auto& v : q) v = static_cast<int8_t>(byte(rng));
    for (int64_t i = 0; i < std::min<int64_t>(k, 3); ++i) q[i] = -128;  // the extreme
    for (auto& s : scales) s = scale(rng);
    view = TensorView{DType::kI8, {n, k}, q.data(), q.size()};
    view.row_scales = scales.data();
    view.input_scale = input_scale;
  }
};

// Random E4M3 weights [n, k] (every finite code, NaN left out: a quantised checkpoint
// has none) and random block scales [ceil(n / br), ceil(k / bc)].
struct Fp8Weights {
  std::vector<uint8_t> q;
  std::vector<float> scales;
  TensorView view;
  Fp8Weights(int64_t n, int64_t k, int64_t br, int64_t bc, std::mt19937& rng) : q(n * k) {
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& v : q) {
      do {
        v = static_cast<uint8_t>(byte(rng));
      } while ((v & 0x7f) == 0x7f);
    }
    const int64_t n_rb = (n + br - 1) / br, n_cb = (k + bc - 1) / bc;
    std::uniform_real_distribution<float> scale(1e-4f, 1e-3f);  // |w| up to ~0.45
    scales.resize(n_rb * n_cb);
    for (auto& s : scales) s = scale(rng);
    view = TensorView{DType::kF8_E4M3, {n, k}, q.data(), q.size()};
    view.block_scales = BlockScales{scales.data(), n_cb, br, bc, 0};
  }
  // Columns [first, first + n) of `whole` (a tensor-parallel shard's cut): the bytes
  // copied, the scales the same, read from the first column's block on.
  Fp8Weights(const Fp8Weights& whole, int64_t first, int64_t n) : scales(whole.scales) {
    const int64_t rows = whole.view.shape[0], k = whole.view.shape[1];
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = whole.q.data() + r * k + first;
      q.insert(q.end(), row, row + n);
    }
    view = TensorView{DType::kF8_E4M3, {rows, n}, q.data(), q.size()};
    view.block_scales = whole.view.block_scales;
    view.block_scales.data = scales.data();
    view.block_scales = view.block_scales.from_column(first);
  }
  // The real weight, from the format's definition (tensor/half.h's conversion).
  double at(int64_t r, int64_t j) const {
    return double{fp8_e4m3_to_f32(q[r * view.shape[1] + j])} * view.block_scales.at(r, j);
  }
};

}  // namespace dserve::test
