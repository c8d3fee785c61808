#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <mutex>
#include <thread>
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

// The calling thread's CPUs, ascending.
std::vector<int> affinity_of_this_thread() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

// The default follows the affinity mask (taskset, a container's cpuset), not the
// online CPUs: narrowed to one CPU, one thread.
TEST(ThreadPoolTest, DefaultThreadCountFollowsTheAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  const std::vector<int> cpus = affinity_of_this_thread();
  EXPECT_EQ(ThreadPool::allowed_cpus(), cpus);
  EXPECT_EQ(ThreadPool::default_thread_count(), CPU_COUNT(&saved));
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus.back(), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(ThreadPool::default_thread_count(), 1);
  EXPECT_EQ(ThreadPool::allowed_cpus(), std::vector<int>{cpus.back()});
  ThreadPool pool(0);
  EXPECT_EQ(pool.n_threads(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
}

// --pin-threads: worker i runs on the i-th allowed CPU (wrapping around), worker 0 being
// the thread that calls run(), not the one that built the pool (which stays unpinned).
TEST(ThreadPoolTest, PinsWorkersToAllowedCpusAndTheCallerOfRun) {
  const std::vector<int> cpus = ThreadPool::allowed_cpus();
  const std::vector<int> before = affinity_of_this_thread();
  ThreadPool pool(3, /*pin=*/true);
  std::mutex mu;
  std::vector<std::vector<int>> seen(3);  // per worker index: its CPUs when it ran
  std::thread caller([&] {
    for (int round = 0; round < 50; ++round) {
      pool.run(64, [&](int64_t, int thread) {
        std::vector<int> mine = affinity_of_this_thread();
        std::lock_guard<std::mutex> lock(mu);
        seen[thread] = mine;
      });
    }
  });
  caller.join();
  ASSERT_FALSE(seen[0].empty());  // the caller always takes part
  for (int t = 0; t < 3; ++t) {
    if (seen[t].empty()) continue;  // a worker may find every task taken
    EXPECT_EQ(seen[t], std::vector<int>{cpus[t % cpus.size()]}) << "worker " << t;
  }
  EXPECT_EQ(affinity_of_this_thread(), before);
}

}  // namespace
}  // namespace dserve
