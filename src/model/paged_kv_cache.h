// PagedKvCache: the keys and values of many sequences in blocks of block_size token
// slots, in F32 or F16 (the engine's --kv-cache-dtype): layer l holds
// k [n_blocks * block_size, n_kv_heads * head_dim] and v [n_blocks * block_size,
// n_kv_heads * head_dim] of that dtype; slot of position p of a sequence with block
// table T is T[p / block_size] * block_size + p % block_size (backend.h). Which blocks
// belong to whom is the KvCacheManager's business; this class only holds the tensors,
// which the Backend's kv_store / paged_attention read and write with dtype().
//
// Memory is one buffer of the Backend's (backend.h) per layer, so that an operation on
// one layer's pool hands the backend only that layer; block copies are backend copies.
//
// Thread-safety: not thread-safe; owned by the engine thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/model_batch.h"

namespace dserve {

class PagedKvCache final : public PagedCache {
 public:
  // n_blocks >= 1, block_size >= 1, dtype F32 or F16 (checked).
  PagedKvCache(Backend& backend, const ModelConfig& config, int n_blocks, int block_size,
               DType dtype);
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  // Bytes one token slot takes over all layers (keys and values) in `dtype`.
  static size_t bytes_per_token(const ModelConfig& config, DType dtype) {
    return size_t{2} * config.n_layers * config.kv_dim() * kv_elem_bytes(dtype);
  }

  int n_blocks() const override { return n_blocks_; }
  int block_size() const override { return block_size_; }
  DType dtype() const override { return dtype_; }
  size_t bytes_per_token() const override {
    return size_t{2} * n_layers_ * kv_dim_ * kv_elem_bytes(dtype_);
  }
  size_t total_bytes() const override { return bytes_; }
  void copy_block(int src, int dst, int n_tokens) override;

  int64_t kv_dim() const { return kv_dim_; }
  // [n_slots, kv_dim] elements of dtype(), in backend memory
  void* k(int layer) { return layers_[layer].as<char>(); }
  void* v(int layer) { return layers_[layer].as<char>() + n_slots() * row_bytes(); }

 private:
  int64_t n_slots() const { return int64_t{n_blocks_} * block_size_; }
  int64_t row_bytes() const { return kv_dim_ * static_cast<int64_t>(kv_elem_bytes(dtype_)); }
  int64_t layer_offset(int layer) const { return int64_t{layer} * 2 * n_slots() * row_bytes(); }

  int n_layers_;
  int64_t kv_dim_;
  int n_blocks_;
  int block_size_;
  DType dtype_;
  size_t bytes_;
  Backend& backend_;
  std::vector<BackendBuffer> layers_;  // [n_layers]: k [n_slots, kv_dim], then v
};

}  // namespace dserve
