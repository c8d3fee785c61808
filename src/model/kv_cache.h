// KvCache: the keys and values of ONE sequence, contiguous per layer, in FP32:
// layer l holds k[capacity, n_kv_heads, head_dim] and v[capacity, n_kv_heads, head_dim]
// with row p the token at position p. This is the simple store the first forward
// pass needs; the serving engine later swaps in a paged cache behind the model's
// attention seam (LlamaModel::attend).
//
// Memory is one buffer of the Backend's (backend.h), which alone reads and writes it.
//
// Thread-safety: not thread-safe; owned by whoever drives the sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "model/config.h"

namespace dserve {

class KvCache {
 public:
  KvCache(Backend& backend, const ModelConfig& config, int64_t capacity);
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t capacity() const { return capacity_; }
  // Positions [0, n_tokens()) hold valid keys and values.
  int64_t n_tokens() const { return n_tokens_; }
  void clear() { n_tokens_ = 0; }

  // [capacity, kv_dim] each, in backend memory
  float* k(int layer) { return storage_.as<float>() + layer_offset(layer); }
  float* v(int layer) { return storage_.as<float>() + layer_offset(layer) + capacity_ * kv_dim_; }

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
  BackendBuffer storage_;
};

}  // namespace dserve
