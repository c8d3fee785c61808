#include "model/mla_kv_cache.h"

#include "base/check.h"
#include "base/mapped_file.h"

namespace dserve {

MlaKvCache::MlaKvCache(const DeepseekConfig& config, int64_t capacity)
    : n_layers_(config.n_layers), row_dim_(config.latent_dim()), capacity_(capacity) {
  DS_CHECK(capacity > 0);
  bytes_ = static_cast<size_t>(n_layers_) * capacity_ * row_dim_ * sizeof(float);
  data_ = static_cast<float*>(alloc_huge(bytes_));
  DS_CHECK_MSG(data_ != nullptr, "cannot allocate %zu bytes of MLA KV cache", bytes_);
}

MlaKvCache::~MlaKvCache() { free_huge(data_, bytes_); }

}  // namespace dserve
