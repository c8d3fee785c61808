// MlaKvCache: the KV cache of ONE sequence for Multi-head Latent Attention. Per layer
// and position it keeps only what MLA needs to rebuild every head's key and value:
// the compressed latent c_kv (kv_lora_rank values, after kv_a_layernorm) and the
// shared RoPE key k_pe (qk_rope_head_dim values, already rotated), in FP32:
//   layer l: latent(l)[capacity, kv_lora_rank + qk_rope_head_dim], row p = position p,
//            laid out [c_kv | k_pe].
// For DeepSeek-V3 that is 512 + 64 = 576 floats per token and layer, against
// 2 x 128 heads x 192 for the expanded keys and values.
//
// Memory is the Backend's (backend.h), which alone reads and writes it: one buffer
// (MlaKvCache), or one per layer (PagedMlaCache).
//
// Thread-safety: not thread-safe; owned by whoever drives the sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek_config.h"
#include "model/model_batch.h"

namespace dserve {

class MlaKvCache {
 public:
  MlaKvCache(Backend& backend, const DeepseekConfig& config, int64_t capacity);
  MlaKvCache(const MlaKvCache&) = delete;
  MlaKvCache& operator=(const MlaKvCache&) = delete;

  int64_t capacity() const { return capacity_; }
  // Positions [0, n_tokens()) hold valid latents.
  int64_t n_tokens() const { return n_tokens_; }
  void clear() { n_tokens_ = 0; }
  void set_n_tokens(int64_t n) { n_tokens_ = n; }

  int row_dim() const { return row_dim_; }  // kv_lora_rank + qk_rope_head_dim
  // [capacity, row_dim] in backend memory
  float* latent(int layer) {
    return storage_.as<float>() + static_cast<int64_t>(layer) * capacity_ * row_dim_;
  }

  // (kv_lora_rank + qk_rope_head_dim) x layers x sizeof(float).
  size_t bytes_per_token() const {
    return static_cast<size_t>(n_layers_) * row_dim_ * sizeof(float);
  }
  size_t total_bytes() const { return bytes_; }

 private:
  int n_layers_;
  int row_dim_;
  int64_t capacity_;
  int64_t n_tokens_ = 0;
  size_t bytes_;
  BackendBuffer storage_;
};

// PagedMlaCache: the latents of many sequences in blocks of block_size token slots for
// the serving engine, in F32 or F16 (--kv-cache-dtype): layer l holds latent(l)
// [n_blocks * block_size, kv_lora_rank + qk_rope_head_dim] elements of dtype(), slot of
// position p of a sequence with block table T T[p / block_size] * block_size +
// p % block_size (backend.h). Same rows as MlaKvCache.
class PagedMlaCache final : public PagedCache {
 public:
  PagedMlaCache(Backend& backend, const DeepseekConfig& config, int n_blocks, int block_size,
                DType dtype);
  PagedMlaCache(const PagedMlaCache&) = delete;
  PagedMlaCache& operator=(const PagedMlaCache&) = delete;

  static size_t bytes_per_token(const DeepseekConfig& config, DType dtype) {
    return static_cast<size_t>(config.n_layers) * config.latent_dim() * kv_elem_bytes(dtype);
  }
  int n_blocks() const override { return n_blocks_; }
  int block_size() const override { return block_size_; }
  DType dtype() const override { return dtype_; }
  size_t bytes_per_token() const override {
    return static_cast<size_t>(n_layers_) * row_bytes();
  }
  size_t total_bytes() const override { return bytes_; }
  void copy_block(int src, int dst, int n_tokens) override;

  int row_dim() const { return row_dim_; }
  int n_layers() const { return n_layers_; }
  // [n_slots, row_dim] elements of dtype()
  void* latent(int layer) { return layers_[layer].data(); }

 private:
  int64_t n_slots() const { return int64_t{n_blocks_} * block_size_; }
  int64_t row_bytes() const { return int64_t{row_dim_} * static_cast<int64_t>(kv_elem_bytes(dtype_)); }

  int n_layers_;
  int row_dim_;
  int n_blocks_;
  int block_size_;
  DType dtype_;
  size_t bytes_;
  Backend& backend_;
  std::vector<BackendBuffer> layers_;  // [n_layers], one buffer each (see PagedKvCache)
};

}  // namespace dserve
