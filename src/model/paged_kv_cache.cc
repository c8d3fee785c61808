#include "model/paged_kv_cache.h"

#include "base/check.h"

namespace dserve {

PagedKvCache::PagedKvCache(Backend& backend, const ModelConfig& config, int n_blocks, int block_size, DType dtype)
    : n_layers_(config.n_layers),
      kv_dim_(config.kv_dim()),
      n_blocks_(n_blocks),
      block_size_(block_size),
      dtype_(dtype),
      backend_(backend) {
  DS_CHECK(n_blocks > 0 && block_size > 0);
  DS_CHECK_MSG(is_kv_cache_dtype(dtype), "paged KV cache: dtype must be f32, f16 or f8_e4m3");
  bytes_ = static_cast<size_t>(n_layers_) * 2 * n_slots() * row_bytes();
  for (int l = 0; l < n_layers_; ++l) layers_.push_back(backend_.alloc(bytes_ / n_layers_));
  // Touch every page now, at start-up, as a GPU engine's cache is resident from the
  // start: otherwise the kernel zeroes pages inside engine steps as blocks are first
  // used (~8% of a 32-request decode step, measured with perf).
  for (BackendBuffer& b : layers_) backend_.fill_zero(b.data(), b.bytes());
}

void PagedKvCache::copy_block(int src, int dst, int n_tokens) {
  DS_CHECK(src >= 0 && src < n_blocks_ && dst >= 0 && dst < n_blocks_);
  DS_CHECK(n_tokens >= 0 && n_tokens <= block_size_);
  const size_t bytes = static_cast<size_t>(n_tokens) * row_bytes();
  const int64_t src_off = int64_t{src} * block_size_ * row_bytes();
  const int64_t dst_off = int64_t{dst} * block_size_ * row_bytes();
  for (int l = 0; l < n_layers_; ++l) {
    char* k_l = static_cast<char*>(k(l));
    char* v_l = static_cast<char*>(v(l));
    backend_.copy(k_l + dst_off, k_l + src_off, bytes);
    backend_.copy(v_l + dst_off, v_l + src_off, bytes);
  }
}

}  // namespace dserve
