#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace dserve {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  ThreadPool pool(4);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::atomic<int>> hits(97);
    pool.run(97, [&](int64_t task, int thread) {
      ASSERT_GE(thread, 0);
      ASSERT_LT(thread, 4);
      hits[task].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPoolTest, ParallelForCoversRangeWithoutOverlap) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 5, 64, 1000, 4097}) {
    std::vector<int> seen(n, 0);
    pool.parallel_for(n, 16, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) seen[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPoolTest, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  int sum = 0;  // no synchronisation needed: everything runs on this thread
  pool.run(10, [&](int64_t t, int thread) {
    EXPECT_EQ(thread, 0);
    sum += static_cast<int>(t);
  });
  EXPECT_EQ(sum, 45);
}

}  // namespace
}  // namespace dserve
