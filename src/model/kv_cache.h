// KvCache: the keys and values of ONE sequence, contiguous per layer, in FP32:
// layer l holds k[capacity, n_kv_heads, head_dim] and v[capacity, n_kv_heads, head_dim]
// with row p the token at position p. This is the simple store the first forward
// pass needs; the serving engine later swaps in a paged cache behind the model's
// attention seam (LlamaModel::attend).
//
// Memory comes from alloc_huge() (2 MiB aligned, transparent huge pages advised).
//
// Thread-safety: not thread-safe; owned by whoever drives the sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/config.h"

namespace dserve {

class KvCache {
 public:
  KvCache(const ModelConfig& config, int64_t capacity);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t capacity() const { return capacity_; }
  // Positions [0, n_tokens()) hold valid keys and values.
  int64_t n_tokens() const { return n_tokens_; }
  void clear() { n_tokens_ = 0; }

  float* k(int layer) { return data_ + layer_offset(layer); }  // [capacity, kv_dim]
  float* v(int layer) {
    return data_ + layer_offset(layer) + capacity_ * kv_dim_;
  }  // [capacity, kv_dim]

  // Copies k_new/v_new [n, kv_dim] into rows positions[0..n) of `layer`. Positions
  // must be < capacity (the caller checks).
  void store(int layer, std::span<const int32_t> positions, const float* k_new, const float* v_new);
  // Marks positions up to `n` as valid (after every layer has stored them).
  void set_n_tokens(int64_t n) { n_tokens_ = n; }

  size_t bytes_per_token() const { return size_t{2} * n_layers_ * kv_dim_ * sizeof(float); }
  size_t total_bytes() const { return bytes_; }

 private:
  int64_t layer_offset(int layer) const { return int64_t{layer} * 2 * capacity_ * kv_dim_; }

  int n_layers_;
  int64_t kv_dim_;
  int64_t capacity_;
  int64_t n_tokens_ = 0;
  size_t bytes_;
  float* data_;
};

}  // namespace dserve
