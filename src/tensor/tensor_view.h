// TensorView: a borrowed, read-only view of a weight tensor in memory (usually
// inside a memory-mapped model file).
//
// Shapes are in PyTorch order: shape[0] is the outermost dimension, the last is
// contiguous. A linear layer's weight is [n_out, n_in]; for quantised types the
// blocks run along the last dimension. (GGUF lists dimensions innermost-first;
// the GGUF reader reverses them.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace dserve {

// The block scales of an FP8 (DType::kF8_E4M3) weight [n_rows, n_cols], as DeepSeek
// ships them: one f32 per block of block_rows x block_cols weights (the last blocks
// of a row or column may be shorter), real weight w[r][j] = scale(r, j / block_cols)
// * fp8(q[r][j]). `data` is the scale of the view's first row and column; row0 and
// col0 are their places inside their block, so a view of rows [first, ...) of a bigger
// tensor needs no copy of the scales (data += first / block_rows * stride, row0 =
// first % block_rows), nor does a view of columns [first, ...) (a tensor-parallel shard:
// data += first / block_cols, col0 = first % block_cols, which the kernels need to be a
// multiple of 16). Column j of the view has the scale row(r)[(col0 + j) / block_cols].
struct BlockScales {
  const float* data = nullptr;
  int64_t stride = 0;  // floats from one block row of scales to the next
  int64_t block_rows = 0, block_cols = 0;
  int64_t row0 = 0;  // 0 <= row0 < block_rows
  int64_t col0 = 0;  // 0 <= col0 < block_cols
  // The scales of row r of the view, one per block of block_cols columns (the first
  // block has block_cols - col0 of the view's columns).
  const float* row(int64_t r) const { return data + (row0 + r) / block_rows * stride; }
  float at(int64_t r, int64_t j) const { return row(r)[(col0 + j) / block_cols]; }
  // The same scales for the view's rows [first, ...).
  BlockScales from_row(int64_t first) const {
    BlockScales s = *this;
    s.data = row(first);
    s.row0 = (row0 + first) % block_rows;
    return s;
  }
  // The same scales for the view's columns [first, ...).
  BlockScales from_column(int64_t first) const {
    BlockScales s = *this;
    s.data = data + (col0 + first) / block_cols;
    s.col0 = (col0 + first) % block_cols;
    return s;
  }
};

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t n_bytes = 0;
  // DType::kI8 (W8A8) weights only, else null / 0. row_scales [n_rows]: row r's real
  // values are row_scales[r] * q. input_scale: the static activation scale the
  // checkpoint calibrated (activations q = round(x / input_scale)); 0: activations are
  // quantised per token at run time (scale max|x| / 127). Owned by the loader.
  const float* row_scales = nullptr;
  float input_scale = 0.0f;
  // Static activations' zero point (msModelSlim's input_offset; compressed-tensors: 0):
  // q = round(x / input_scale) + input_offset.
  int input_offset = 0;
  // DType::kI8 only, else null: [n_rows] floats added to the product's outputs (static
  // activations with a zero point, msModelSlim's quant_bias: loader/ascend_quant.h).
  // Owned by the loader.
  const float* row_bias = nullptr;
  // DType::kF8_E4M3 only (else data null): the block scales, owned by whoever
  // attached them (model/fp8_weights.h).
  BlockScales block_scales{};

  int64_t n_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int n_dims() const { return static_cast<int>(shape.size()); }
  // Size of the last (contiguous) dimension; 1 for a scalar.
  int64_t row_length() const { return shape.empty() ? 1 : shape.back(); }
  int64_t n_rows() const { return row_length() == 0 ? 0 : n_elements() / row_length(); }
  size_t row_bytes() const { return dtype_bytes(dtype, row_length()); }
  const uint8_t* row(int64_t i) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(i) * row_bytes();
  }
};

std::string shape_to_string(const std::vector<int64_t>& shape);  // "[576, 1536]"

}  // namespace dserve
