// PagedKvCache: the keys and values of many sequences in blocks of block_size token
// slots, in FP32: layer l holds k [n_blocks * block_size, n_kv_heads * head_dim] and
// v [n_blocks * block_size, n_kv_heads * head_dim]; slot of position p of a sequence
// with block table T is T[p / block_size] * block_size + p % block_size (backend.h).
// Which blocks belong to whom is the KvCacheManager's business; this class only holds
// the tensors.
//
// Memory comes from alloc_huge() (2 MiB aligned, transparent huge pages advised).
//
// Thread-safety: not thread-safe; owned by the engine thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/config.h"
#include "model/model_batch.h"

namespace dserve {

class PagedKvCache final : public PagedCache {
 public:
  // n_blocks >= 1, block_size >= 1 (checked).
  PagedKvCache(const ModelConfig& config, int n_blocks, int block_size);
  ~PagedKvCache() override;
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  // Bytes one token slot takes over all layers (keys and values).
  static size_t bytes_per_token(const ModelConfig& config) {
    return size_t{2} * config.n_layers * config.kv_dim() * sizeof(float);
  }

  int n_blocks() const override { return n_blocks_; }
  int block_size() const override { return block_size_; }
  size_t bytes_per_token() const override {
    return size_t{2} * n_layers_ * kv_dim_ * sizeof(float);
  }
  size_t total_bytes() const override { return bytes_; }
  void copy_block(int src, int dst, int n_tokens) override;

  int64_t kv_dim() const { return kv_dim_; }
  float* k(int layer) { return data_ + layer_offset(layer); }  // [n_slots, kv_dim]
  float* v(int layer) { return data_ + layer_offset(layer) + n_slots() * kv_dim_; }

 private:
  int64_t n_slots() const { return int64_t{n_blocks_} * block_size_; }
  int64_t layer_offset(int layer) const { return int64_t{layer} * 2 * n_slots() * kv_dim_; }

  int n_layers_;
  int64_t kv_dim_;
  int n_blocks_;
  int block_size_;
  size_t bytes_;
  float* data_;
};

}  // namespace dserve
