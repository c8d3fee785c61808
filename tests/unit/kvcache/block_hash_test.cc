#include "kvcache/block_hash.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <unordered_set>
#include <vector>

namespace dserve::kvcache {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t start) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(BlockHash, DeterministicAndSensitiveToEveryInput) {
  const BlockHash root = root_hash(0);
  for (int bs : {1, 16, 17, 128}) {
    std::vector<int32_t> t = iota_tokens(bs, 100);
    const BlockHash h = hash_block(root, 7, t);
    EXPECT_EQ(h, hash_block(root, 7, t));
    EXPECT_NE(h, hash_block(root, 8, t)) << "extra key (model, LoRA) must change the hash";
    EXPECT_NE(h, hash_block(root_hash(1), 7, t)) << "seed must change the hash";
    for (int i = 0; i < bs; ++i) {
      std::vector<int32_t> u = t;
      u[i] += 1;
      EXPECT_NE(h, hash_block(root, 7, u)) << "token " << i << " of " << bs;
    }
    if (bs > 1) {
      std::vector<int32_t> u = t;
      std::swap(u[0], u[bs - 1]);
      EXPECT_NE(h, hash_block(root, 7, u)) << "order must matter";
    }
  }
}

TEST(BlockHash, ChainingSameTokensUnderDifferentParentsDiffer) {
  const BlockHash root = root_hash(0);
  const std::vector<int32_t> a = iota_tokens(16, 0), b = iota_tokens(16, 1000),
                             x = iota_tokens(16, 5);
  const BlockHash after_a = hash_block(hash_block(root, 0, a), 0, x);
  const BlockHash after_b = hash_block(hash_block(root, 0, b), 0, x);
  EXPECT_NE(after_a, after_b);
  EXPECT_NE(hash_block(root, 0, x), after_a);
}

TEST(BlockHash, NoCollisionsAmongManyRandomBlocks) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> tok(
      0, 255);  // a small vocabulary makes near-duplicates likely
  std::unordered_set<BlockHash, BlockHashHasher> seen;
  std::unordered_set<uint64_t> seen_hi, seen_lo;
  BlockHash parent = root_hash(3);
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> t(16);
    for (auto& v : t) v = tok(rng);
    const BlockHash h = hash_block(parent, 0, t);
    seen.insert(h);
    seen_hi.insert(h.hi);
    seen_lo.insert(h.lo);
    if (i % 3 == 0) parent = h;
  }
  EXPECT_EQ(seen.size(), size_t(n));
  EXPECT_EQ(seen_hi.size(), size_t(n)) << "each lane alone should already be collision-free here";
  EXPECT_EQ(seen_lo.size(), size_t(n));
}

TEST(BlockHash, StringKeys) {
  EXPECT_EQ(hash_string("llama-3-8b"), hash_string("llama-3-8b"));
  EXPECT_NE(hash_string("llama-3-8b"), hash_string("llama-3-8B"));
  EXPECT_NE(hash_string(""), hash_string(std::string_view("\0", 1)));
  EXPECT_NE(hash_string("abcdefgh"), hash_string("abcdefgh", 1));
}

}  // namespace
}  // namespace dserve::kvcache
