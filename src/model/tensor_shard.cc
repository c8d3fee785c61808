#include "model/tensor_shard.h"

#include <cstring>

namespace dserve {

Result<const TensorView*> TensorShards::rows(const TensorView& t, const std::string& name, int64_t begin,
                                             int64_t end) {
  if (t.n_dims() < 1 || t.n_dims() > 2 || begin < 0 || end < begin || end > t.shape[0]) {
    return invalid_argument("tensor '" + name + "' " + shape_to_string(t.shape) + ": cannot take rows [" +
                            std::to_string(begin) + ", " + std::to_string(end) + ")");
  }
  TensorView v = t;
  v.shape[0] = end - begin;
  if (t.n_dims() == 1) {
    if (is_quantized(t.dtype)) return unimplemented("tensor '" + name + "': a quantised vector cannot be split");
    v.data = static_cast<const uint8_t*>(t.data) + dtype_bytes(t.dtype, begin);
    v.n_bytes = dtype_bytes(t.dtype, end - begin);
  } else {
    v.data = t.row(begin);
    v.n_bytes = static_cast<size_t>(end - begin) * t.row_bytes();
    if (t.row_scales != nullptr) v.row_scales = t.row_scales + begin;  // I8: the rows' scales
    if (t.row_bias != nullptr) v.row_bias = t.row_bias + begin;
    if (t.block_scales.data != nullptr) v.block_scales = t.block_scales.from_row(begin);  // FP8
  }
  views_.push_back(std::move(v));
  return &views_.back();
}

Result<const TensorView*> TensorShards::columns(const TensorView& t, const std::string& name, int64_t begin,
                                                int64_t end) {
  if (t.n_dims() != 2 || begin < 0 || end < begin || end > t.shape[1]) {
    return invalid_argument("tensor '" + name + "' " + shape_to_string(t.shape) + ": cannot take columns [" +
                            std::to_string(begin) + ", " + std::to_string(end) + ")");
  }
  const int block = dtype_info(t.dtype).block_size;
  if (begin % block != 0 || end % block != 0) {
    return invalid_argument("tensor '" + name + "' is " + std::string(dtype_name(t.dtype)) + " in blocks of " +
                            std::to_string(block) + " elements, so its input dimension cannot be split at " +
                            std::to_string(begin) + ".." + std::to_string(end) +
                            "; choose a --tensor-parallel-size that keeps each rank's share a multiple of " +
                            std::to_string(block));
  }
  const BlockScales& scales = t.block_scales;  // FP8: the cut must keep whole blocks
  if (scales.data != nullptr && (scales.col0 + begin) % 16 != 0) {
    return invalid_argument("tensor '" + name + "' is FP8, read 16 columns at a time within its blocks of " +
                            std::to_string(scales.block_cols) + " columns, so its input dimension cannot be "
                            "split at " + std::to_string(begin) + "; convert it to bf16 first (--fp8-weights bf16)");
  }
  const int64_t n_rows = t.shape[0];
  const size_t offset = dtype_bytes(t.dtype, begin);
  const size_t row_bytes = dtype_bytes(t.dtype, end - begin);
  const size_t total = row_bytes * static_cast<size_t>(n_rows);
  const size_t alloc = (total + 63) / 64 * 64 + 64;  // aligned_alloc wants a multiple of the alignment
  auto buffer = std::unique_ptr<uint8_t, FreeDeleter>(static_cast<uint8_t*>(std::aligned_alloc(64, alloc)));
  if (buffer == nullptr) return Status(StatusCode::kResourceExhausted, "out of memory copying '" + name + "'");
  for (int64_t r = 0; r < n_rows; ++r) {
    std::memcpy(buffer.get() + static_cast<size_t>(r) * row_bytes, t.row(r) + offset, row_bytes);
  }
  TensorView v = t;
  v.shape[1] = end - begin;
  // I8 row biases are whole-row constants: the partial sums of the ranks add up to the
  // row's product, so only the first columns' share adds the bias (as vllm-ascend's rank 0).
  if (begin != 0) v.row_bias = nullptr;
  if (scales.data != nullptr) v.block_scales = scales.from_column(begin);
  v.data = buffer.get();
  v.n_bytes = total;
  copied_bytes_ += total;
  buffers_.push_back(std::move(buffer));
  views_.push_back(std::move(v));
  return &views_.back();
}

}  // namespace dserve
