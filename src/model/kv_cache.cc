#include "model/kv_cache.h"

#include "base/check.h"

namespace dserve {

KvCache::KvCache(Backend& backend, const ModelConfig& config, int64_t capacity)
    : n_layers_(config.n_layers), kv_dim_(config.kv_dim()), capacity_(capacity) {
  DS_CHECK(capacity > 0);
  bytes_ = static_cast<size_t>(n_layers_) * 2 * capacity_ * kv_dim_ * sizeof(float);
  storage_ = backend.alloc(bytes_);
}

}  // namespace dserve
