#include "kvcache/block_pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace dserve::kvcache {
namespace {

BlockHash h(uint64_t n) { return hash_block(root_hash(0), n, {}); }

TEST(BlockPool, StartsFreeInIdOrder) {
  BlockPool pool(4);
  EXPECT_EQ(pool.n_free(), 4);
  EXPECT_EQ(pool.free_list(), (std::vector<BlockId>{0, 1, 2, 3}));
  EXPECT_DOUBLE_EQ(pool.usage(), 0.0);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(BlockPool, RefCounting) {
  BlockPool pool(4);
  std::vector<BlockId> a = pool.allocate(2);
  EXPECT_EQ(a, (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(pool.ref_cnt(0), 1);
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.5);
  pool.touch(a);  // a second owner (a forked sequence)
  EXPECT_EQ(pool.ref_cnt(0), 2);
  EXPECT_EQ(pool.n_free(), 2);
  pool.release(a);
  EXPECT_EQ(pool.ref_cnt(1), 1);
  EXPECT_EQ(pool.n_free(), 2) << "still held by the first owner";
  pool.release(a);
  EXPECT_EQ(pool.n_free(), 4);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(BlockPool, FreedBlocksAreReusedLeastRecentlyUsedFirst) {
  BlockPool pool(5);
  std::vector<BlockId> all = pool.allocate(5);
  // Release in the order 3, 0, 4 (1 and 2 stay held).
  pool.release(std::vector<BlockId>{3});
  pool.release(std::vector<BlockId>{0});
  pool.release(std::vector<BlockId>{4});
  EXPECT_EQ(pool.free_list(), (std::vector<BlockId>{3, 0, 4}));
  EXPECT_EQ(pool.allocate(1), std::vector<BlockId>{3});
  pool.release(std::vector<BlockId>{2});
  EXPECT_EQ(pool.free_list(), (std::vector<BlockId>{0, 4, 2}));
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(BlockPool, CachedBlocksStayFindableUntilEvicted) {
  BlockPool pool(3);
  std::vector<BlockId> b = pool.allocate(3);
  ASSERT_TRUE(pool.cache(b[0], h(10)));
  ASSERT_TRUE(pool.cache(b[1], h(11)));
  EXPECT_FALSE(pool.cache(b[2], h(10))) << "a hash maps to one block";
  EXPECT_FALSE(pool.cache(b[0], h(12))) << "a block has one hash";
  pool.release(std::vector<BlockId>{b[1], b[0], b[2]});
  EXPECT_EQ(pool.lookup(h(10)), b[0]);
  EXPECT_EQ(pool.lookup(h(11)), b[1]);

  // A hit leaves the free list and counts an owner, keeping its contents.
  pool.touch(std::vector<BlockId>{b[0]});
  EXPECT_EQ(pool.ref_cnt(b[0]), 1);
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_EQ(pool.free_list(), (std::vector<BlockId>{b[1], b[2]}));

  // Allocation takes the least recently freed block: b[1], evicting hash 11.
  EXPECT_EQ(pool.allocate(1), std::vector<BlockId>{b[1]});
  EXPECT_FALSE(pool.lookup(h(11)).has_value());
  EXPECT_FALSE(pool.is_cached(b[1]));
  EXPECT_EQ(pool.lookup(h(10)), b[0]);
  EXPECT_EQ(pool.n_cached(), 1);
  EXPECT_TRUE(pool.check_invariants().ok());

  pool.reset_cache();
  EXPECT_FALSE(pool.lookup(h(10)).has_value());
  EXPECT_EQ(pool.ref_cnt(b[0]), 1);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(BlockPoolDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  BlockPool pool(2);
  EXPECT_DEATH(pool.allocate(3), "allocate 3 blocks with 2 free");
  EXPECT_DEATH(pool.release(std::vector<BlockId>{0}), "released more often than taken");
}

}  // namespace
}  // namespace dserve::kvcache
