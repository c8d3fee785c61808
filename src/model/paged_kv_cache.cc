#include "model/paged_kv_cache.h"

#include <cstring>

#include "base/check.h"
#include "base/mapped_file.h"

namespace dserve {

PagedKvCache::PagedKvCache(const ModelConfig& config, int n_blocks, int block_size)
    : n_layers_(config.n_layers),
      kv_dim_(config.kv_dim()),
      n_blocks_(n_blocks),
      block_size_(block_size) {
  DS_CHECK(n_blocks > 0 && block_size > 0);
  bytes_ = static_cast<size_t>(n_layers_) * 2 * n_slots() * kv_dim_ * sizeof(float);
  data_ = static_cast<float*>(alloc_huge(bytes_));
  DS_CHECK_MSG(data_ != nullptr, "cannot allocate %zu bytes of paged KV cache", bytes_);
  // Touch every page now, at start-up, as a GPU engine's cache is resident from the
  // start: otherwise the kernel zeroes pages inside engine steps as blocks are first
  // used (~8% of a 32-request decode step, measured with perf).
  std::memset(data_, 0, bytes_);
}

PagedKvCache::~PagedKvCache() { free_huge(data_, bytes_); }

void PagedKvCache::copy_block(int src, int dst, int n_tokens) {
  DS_CHECK(src >= 0 && src < n_blocks_ && dst >= 0 && dst < n_blocks_);
  DS_CHECK(n_tokens >= 0 && n_tokens <= block_size_);
  const size_t bytes = static_cast<size_t>(n_tokens) * kv_dim_ * sizeof(float);
  const int64_t src_off = int64_t{src} * block_size_ * kv_dim_;
  const int64_t dst_off = int64_t{dst} * block_size_ * kv_dim_;
  for (int l = 0; l < n_layers_; ++l) {
    std::memmove(k(l) + dst_off, k(l) + src_off, bytes);
    std::memmove(v(l) + dst_off, v(l) + src_off, bytes);
  }
}

}  // namespace dserve
