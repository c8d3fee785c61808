#include "model/kv_cache.h"

#include <vector>

#include <gtest/gtest.h>

namespace dserve {
namespace {

TEST(KvCacheTest, StoresRowsAtPositionsPerLayer) {
  ModelConfig c;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;  // kv_dim 8
  KvCache kv(c, 16);
  EXPECT_EQ(kv.capacity(), 16);
  EXPECT_EQ(kv.bytes_per_token(), 2u * 2 * 8 * sizeof(float));

  std::vector<float> k(3 * 8), v(3 * 8);
  for (int i = 0; i < 24; ++i) {
    k[i] = static_cast<float>(i);
    v[i] = static_cast<float>(100 + i);
  }
  const std::vector<int32_t> positions = {5, 6, 7};
  kv.store(1, positions, k.data(), v.data());
  kv.set_n_tokens(8);
  EXPECT_EQ(kv.n_tokens(), 8);
  for (int t = 0; t < 3; ++t) {
    for (int d = 0; d < 8; ++d) {
      EXPECT_EQ(kv.k(1)[(5 + t) * 8 + d], k[t * 8 + d]);
      EXPECT_EQ(kv.v(1)[(5 + t) * 8 + d], v[t * 8 + d]);
    }
  }
  // Layers do not overlap: layer 0's rows stay untouched.
  kv.store(0, positions, v.data(), k.data());
  EXPECT_EQ(kv.k(1)[5 * 8], 0.0f);
  EXPECT_EQ(kv.k(0)[5 * 8], 100.0f);
  kv.clear();
  EXPECT_EQ(kv.n_tokens(), 0);
}

}  // namespace
}  // namespace dserve
