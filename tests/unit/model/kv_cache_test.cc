#include "model/kv_cache.h"

#include <vector>

#include <gtest/gtest.h>

namespace dserve {
namespace {

// Rows stored through the backend at a sequence's positions land at row p of the
// layer's keys and values, layers apart.
TEST(KvCacheTest, StoresRowsAtPositionsPerLayer) {
  CpuBackendOptions options;
  options.n_threads = 1;
  std::unique_ptr<Backend> backend = make_cpu_backend(options);
  ModelConfig c;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;  // kv_dim 8
  KvCache kv(*backend, c, 16);
  EXPECT_EQ(kv.capacity(), 16);
  EXPECT_EQ(kv.bytes_per_token(), 2u * 2 * 8 * sizeof(float));
  backend->fill_zero(kv.k(0), kv.total_bytes());  // one buffer for every layer

  std::vector<float> k(3 * 8), v(3 * 8);
  for (int i = 0; i < 24; ++i) {
    k[i] = static_cast<float>(i);
    v[i] = static_cast<float>(100 + i);
  }
  const std::vector<int64_t> positions = {5, 6, 7};
  DeviceArray<float> k_dev(backend.get()), v_dev(backend.get());
  DeviceArray<int64_t> slots(backend.get());
  slots.upload(positions.data(), 3);
  k_dev.upload(k.data(), 24);
  v_dev.upload(v.data(), 24);
  auto store = [&](int layer, const float* keys, const float* values) {
    backend->kv_store(DType::kF32, kv.k(layer), 8, keys, slots.get(), 3);
    backend->kv_store(DType::kF32, kv.v(layer), 8, values, slots.get(), 3);
  };
  auto read = [&](float* pool) {
    std::vector<float> rows(16 * 8);
    backend->download(rows.data(), pool, rows.size() * sizeof(float));
    return rows;
  };
  store(1, k_dev.get(), v_dev.get());
  kv.set_n_tokens(8);
  EXPECT_EQ(kv.n_tokens(), 8);
  const std::vector<float> k1 = read(kv.k(1)), v1 = read(kv.v(1));
  for (int t = 0; t < 3; ++t) {
    for (int d = 0; d < 8; ++d) {
      EXPECT_EQ(k1[(5 + t) * 8 + d], k[t * 8 + d]);
      EXPECT_EQ(v1[(5 + t) * 8 + d], v[t * 8 + d]);
    }
  }
  // Layers do not overlap: layer 1's rows stay as they were.
  store(0, v_dev.get(), k_dev.get());
  EXPECT_EQ(read(kv.k(1))[5 * 8], 0.0f);
  EXPECT_EQ(read(kv.k(0))[5 * 8], 100.0f);
  kv.clear();
  EXPECT_EQ(kv.n_tokens(), 0);
}

}  // namespace
}  // namespace dserve
