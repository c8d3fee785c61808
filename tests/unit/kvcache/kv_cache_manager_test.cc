#include "kvcache/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace dserve::kvcache {
namespace {

std::vector<int32_t> tokens(int n, int32_t start = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

KvCacheManager make(int n_blocks, int block_size, bool caching = true) {
  KvCacheConfig c;
  c.n_blocks = n_blocks;
  c.block_size = block_size;
  c.enable_prefix_caching = caching;
  return KvCacheManager(c);
}

TEST(KvCacheConfig, Validate) {
  KvCacheConfig c;
  EXPECT_FALSE(c.validate().ok());
  c.n_blocks = 4;
  EXPECT_TRUE(c.validate().ok());
  c.block_size = 0;
  EXPECT_FALSE(c.validate().ok());
}

TEST(KvCacheManager, AllocatesBlocksAsTokensGrow) {
  KvCacheManager kv = make(8, 16);
  std::vector<int32_t> t = tokens(40);
  ASSERT_TRUE(kv.allocate_slots(1, t, 0, 20));  // chunk of 20: 2 blocks
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  ASSERT_TRUE(kv.allocate_slots(1, t, 20, 12));  // up to 32: still 2
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  ASSERT_TRUE(kv.allocate_slots(1, t, 32, 8));  // 40: 3
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  EXPECT_EQ(kv.n_free_blocks(), 5);
  EXPECT_DOUBLE_EQ(kv.stats().usage, 3.0 / 8);
  EXPECT_TRUE(kv.check_invariants().ok());
  kv.free(1);
  EXPECT_EQ(kv.n_free_blocks(), 8);
  EXPECT_TRUE(kv.block_table(1).empty());
  EXPECT_TRUE(kv.check_invariants().ok());
}

TEST(KvCacheManager, RefusesWithoutChangingAnything) {
  KvCacheManager kv = make(4, 16);
  std::vector<int32_t> t = tokens(100);
  ASSERT_TRUE(kv.allocate_slots(1, t, 0, 48));
  EXPECT_FALSE(kv.allocate_slots(2, t, 0, 17));  // needs 2, 1 free
  EXPECT_TRUE(kv.block_table(2).empty());
  EXPECT_EQ(kv.n_free_blocks(), 1);
  EXPECT_TRUE(kv.allocate_slots(2, t, 0, 16));
  EXPECT_TRUE(kv.check_invariants().ok());
}

// The acceptance case: a second request sharing a 1,000-token prefix reuses
// floor(1000 / block_size) blocks; with prefix caching off, none.
TEST(KvCacheManager, SharedPrefixHitsFullBlocksOnly) {
  for (int bs : {16, 128}) {
    for (bool caching : {true, false}) {
      SCOPED_TRACE("block_size " + std::to_string(bs) + (caching ? " caching" : " no caching"));
      KvCacheManager kv = make(200, bs, caching);
      const std::vector<int32_t> prefix = tokens(1000, 7);
      const std::vector<int32_t> a = concat(prefix, tokens(30, 50000));
      const std::vector<int32_t> b = concat(prefix, tokens(45, 60000));

      PrefixHit ha = kv.get_computed_blocks(1, a);
      EXPECT_EQ(ha.n_tokens, 0);
      ASSERT_TRUE(kv.allocate_slots(1, a, 0, int(a.size()), &ha));
      PrefixHit hb = kv.get_computed_blocks(2, b);
      const int expect = caching ? (1000 / bs) * bs : 0;
      EXPECT_EQ(hb.n_tokens, expect);
      ASSERT_TRUE(kv.allocate_slots(2, b, hb.n_tokens, int(b.size()) - hb.n_tokens, &hb));
      std::span<const BlockId> ta = kv.block_table(1), tb = kv.block_table(2);
      for (int i = 0; i < 1000 / bs; ++i) {
        if (caching) {
          EXPECT_EQ(ta[i], tb[i]) << "block " << i << " shared";
          EXPECT_EQ(kv.pool().ref_cnt(ta[i]), 2);
        } else {
          EXPECT_NE(ta[i], tb[i]);
        }
      }
      const KvCacheStats s = kv.stats();
      EXPECT_EQ(s.n_queried_tokens, int64_t(a.size() + b.size()));
      EXPECT_EQ(s.n_hit_tokens, expect);
      EXPECT_TRUE(kv.check_invariants().ok());
      kv.free(1);
      kv.free(2);
      EXPECT_EQ(kv.n_free_blocks(), 200);
      EXPECT_TRUE(kv.check_invariants().ok());
    }
  }
}

TEST(KvCacheManager, NeverHitsTheWholePrompt) {
  KvCacheManager kv = make(8, 16);
  const std::vector<int32_t> t = tokens(32);
  PrefixHit h0 = kv.get_computed_blocks(1, t);
  ASSERT_TRUE(kv.allocate_slots(1, t, 0, 32, &h0));
  PrefixHit h = kv.get_computed_blocks(2, t);
  EXPECT_EQ(h.n_tokens, 16) << "the last token must be computed for logits";
  const std::vector<int32_t> one = tokens(1);
  EXPECT_EQ(kv.get_computed_blocks(3, one).n_tokens, 0);
}

TEST(KvCacheManager, SameBlockUnderADifferentParentMisses) {
  KvCacheManager kv = make(8, 4);
  const std::vector<int32_t> a = {1, 2, 3, 4, 9, 9, 9, 9, 0};
  const std::vector<int32_t> b = {5, 6, 7, 8, 9, 9, 9, 9, 0};  // second block equal to a's
  PrefixHit ha = kv.get_computed_blocks(1, a);
  ASSERT_TRUE(kv.allocate_slots(1, a, 0, 9, &ha));
  EXPECT_EQ(kv.get_computed_blocks(2, b).n_tokens, 0);
  EXPECT_EQ(kv.get_computed_blocks(3, a).n_tokens, 8);
}

TEST(KvCacheManager, FreedPrefixIsReusedUntilEvictedLeastRecentlyUsed) {
  KvCacheManager kv = make(4, 4);
  const std::vector<int32_t> a = tokens(9, 0), b = tokens(9, 100);
  PrefixHit h = kv.get_computed_blocks(1, a);
  ASSERT_TRUE(kv.allocate_slots(1, a, 0, 8, &h));  // 2 full blocks, cached
  kv.free(1);
  EXPECT_EQ(kv.n_free_blocks(), 4);
  EXPECT_EQ(kv.get_computed_blocks(2, a).n_tokens, 8) << "freed but still cached";

  // Request 3 takes the two never-used blocks first, then must evict a's tail block
  // (freed before its head), which breaks the chain after one block.
  PrefixHit hb = kv.get_computed_blocks(3, b);
  ASSERT_TRUE(kv.allocate_slots(3, b, 0, 9, &hb));
  EXPECT_EQ(kv.get_computed_blocks(4, a).n_tokens, 4);
  kv.free(3);
  kv.free(2);
  kv.free(4);
  EXPECT_TRUE(kv.check_invariants().ok());
}

TEST(KvCacheManager, HitOnFreeBlocksCountsAgainstFreeSpace) {
  KvCacheManager kv = make(3, 4);
  const std::vector<int32_t> a = tokens(12);
  PrefixHit h = kv.get_computed_blocks(1, a);
  ASSERT_TRUE(kv.allocate_slots(1, a, 0, 12, &h));
  kv.free(1);
  // Request 2 hits 2 free cached blocks and needs 2 more: 4 > 3 free.
  const std::vector<int32_t> b = concat(tokens(8), tokens(8, 500));
  PrefixHit hb = kv.get_computed_blocks(2, b);
  ASSERT_EQ(hb.n_tokens, 8);
  EXPECT_FALSE(kv.allocate_slots(2, b, 8, 8, &hb));
  EXPECT_EQ(kv.n_free_blocks(), 3);
  EXPECT_TRUE(kv.allocate_slots(2, b, 8, 4, &hb));
  EXPECT_TRUE(kv.check_invariants().ok());
}

TEST(KvCacheManager, ForkSharesFullBlocksAndCopiesThePartialOne) {
  for (bool caching : {true, false}) {
    KvCacheManager kv = make(16, 16, caching);
    const std::vector<int32_t> p = tokens(40);
    PrefixHit h = kv.get_computed_blocks(1, p);
    ASSERT_TRUE(kv.allocate_slots(1, p, 0, 40, &h));
    auto f = kv.fork(1, 2, 40);
    ASSERT_TRUE(f.has_value());
    ASSERT_TRUE(f->copy.has_value());
    std::span<const BlockId> tp = kv.block_table(1), tc = kv.block_table(2);
    ASSERT_EQ(tc.size(), 3u);
    EXPECT_EQ(tc[0], tp[0]);
    EXPECT_EQ(tc[1], tp[1]);
    EXPECT_NE(tc[2], tp[2]);
    EXPECT_EQ(f->copy->src, tp[2]);
    EXPECT_EQ(f->copy->dst, tc[2]);
    EXPECT_EQ(f->copy->n_tokens, 8);
    EXPECT_EQ(kv.pool().ref_cnt(tp[0]), 2);
    EXPECT_TRUE(kv.check_invariants().ok());

    // The branches diverge: each grows its own blocks.
    std::vector<int32_t> c1 = concat(p, tokens(30, 900)), c2 = concat(p, tokens(30, 800));
    ASSERT_TRUE(kv.allocate_slots(1, c1, 40, 30));
    ASSERT_TRUE(kv.allocate_slots(2, c2, 40, 30));
    auto g = kv.fork(2, 3, 64);  // a block boundary: nothing to copy
    ASSERT_TRUE(g.has_value());
    EXPECT_FALSE(g->copy.has_value());
    EXPECT_EQ(kv.block_table(3).size(), 4u);
    EXPECT_TRUE(kv.check_invariants().ok());
    kv.free(2);
    kv.free(1);
    kv.free(3);
    EXPECT_EQ(kv.n_free_blocks(), 16);
    EXPECT_TRUE(kv.check_invariants().ok());
  }
}

TEST(KvCacheManager, ForkFailsCleanlyWhenNoBlockIsFree) {
  KvCacheManager kv = make(2, 4);
  const std::vector<int32_t> p = tokens(6);
  ASSERT_TRUE(kv.allocate_slots(1, p, 0, 6));
  EXPECT_FALSE(kv.fork(1, 2, 6).has_value());
  EXPECT_FALSE(kv.has_request(2));
  EXPECT_TRUE(kv.check_invariants().ok());
}

// Random interleavings of lookups, growth, forks and frees; invariants after each.
TEST(KvCacheManager, RandomOperationsKeepInvariants) {
  for (uint32_t seed = 0; seed < 30; ++seed) {
    std::mt19937 rng(seed);
    const int bs = std::vector<int>{1, 4, 16, 128}[seed % 4];
    const int n_blocks = 8 + int(rng() % 40);
    KvCacheManager kv = make(n_blocks, bs, seed % 5 != 0);
    struct Seq {
      std::vector<int32_t> tokens;
      int n_computed = 0;
    };
    std::map<RequestId, Seq> live;
    RequestId next_id = 1;
    for (int step = 0; step < 400; ++step) {
      const int op = int(rng() % 10);
      if (op < 3 || live.empty()) {  // a new request, often sharing a prefix with a few templates
        Seq s;
        const int n = 1 + int(rng() % (3 * bs + 5));
        const int32_t base = int32_t(rng() % 3) * 1000;
        for (int i = 0; i < n; ++i)
          s.tokens.push_back(base + (rng() % 4 == 0 ? int32_t(rng() % 7) : i));
        PrefixHit h = kv.get_computed_blocks(next_id, s.tokens);
        ASSERT_LT(h.n_tokens, n);
        if (kv.allocate_slots(next_id, s.tokens, h.n_tokens, n - h.n_tokens, &h)) {
          s.n_computed = n;
          live[next_id] = s;
        } else {
          kv.free(next_id);
        }
        ++next_id;
      } else if (op < 7) {  // grow a random live request by a few tokens
        auto it = std::next(live.begin(), rng() % live.size());
        Seq& s = it->second;
        const int add = 1 + int(rng() % 5);
        for (int i = 0; i < add; ++i) s.tokens.push_back(int32_t(rng() % 50));
        if (kv.allocate_slots(it->first, s.tokens, s.n_computed, add))
          s.n_computed += add;
        else
          s.tokens.resize(s.n_computed);
      } else if (op < 8) {
        auto it = std::next(live.begin(), rng() % live.size());
        if (kv.fork(it->first, next_id, it->second.n_computed)) live[next_id] = it->second;
        ++next_id;
      } else {
        auto it = std::next(live.begin(), rng() % live.size());
        kv.free(it->first);
        live.erase(it);
      }
      Status st = kv.check_invariants();
      ASSERT_TRUE(st.ok()) << "seed " << seed << " step " << step << ": " << st.to_string();
      for (const auto& [id, s] : live) {
        ASSERT_GE(int(kv.block_table(id).size()), kv.blocks_for(s.n_computed));
      }
    }
    for (const auto& [id, s] : live) kv.free(id);
    EXPECT_EQ(kv.n_free_blocks(), n_blocks);
    EXPECT_TRUE(kv.check_invariants().ok());
  }
}

}  // namespace
}  // namespace dserve::kvcache
