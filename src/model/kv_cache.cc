#include "model/kv_cache.h"

#include <cstring>

#include "base/check.h"
#include "base/mapped_file.h"

namespace dserve {

KvCache::KvCache(const ModelConfig& config, int64_t capacity)
    : n_layers_(config.n_layers), kv_dim_(config.kv_dim()), capacity_(capacity) {
  DS_CHECK(capacity > 0);
  bytes_ = static_cast<size_t>(n_layers_) * 2 * capacity_ * kv_dim_ * sizeof(float);
  data_ = static_cast<float*>(alloc_huge(bytes_));
  DS_CHECK_MSG(data_ != nullptr, "cannot allocate %zu bytes of KV cache", bytes_);
}

KvCache::~KvCache() { free_huge(data_, bytes_); }

void KvCache::store(int layer, std::span<const int32_t> positions, const float* k_new,
                    const float* v_new) {
  float* k_layer = k(layer);
  float* v_layer = v(layer);
  const size_t row_bytes = kv_dim_ * sizeof(float);
  for (size_t t = 0; t < positions.size(); ++t) {
    const int64_t p = positions[t];
    DS_CHECK(p >= 0 && p < capacity_);
    std::memcpy(k_layer + p * kv_dim_, k_new + t * kv_dim_, row_bytes);
    std::memcpy(v_layer + p * kv_dim_, v_new + t * kv_dim_, row_bytes);
  }
}

}  // namespace dserve
