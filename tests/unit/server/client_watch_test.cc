// ClientWatch and WorkerPool: the HTTP front end's shared state between I/O threads and
// workers (run under TSan too).
#include "server/client_watch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "server/worker_pool.h"

namespace dserve::server {
namespace {

TEST(ClientWatch, CallbacksRunOnceWhenTheClientGoes) {
  auto w = std::make_shared<ClientWatch>();
  int n = 0;
  ClientWatch::Subscription s = w->on_gone([&] { ++n; });
  EXPECT_FALSE(w->gone());
  w->client_gone();
  w->client_gone();
  EXPECT_TRUE(w->gone());
  EXPECT_EQ(n, 1);
}

TEST(ClientWatch, SubscribingAfterTheClientWentRunsAtOnce) {
  auto w = std::make_shared<ClientWatch>();
  w->client_gone();
  int n = 0;
  ClientWatch::Subscription s = w->on_gone([&] { ++n; });
  EXPECT_EQ(n, 1);
}

TEST(ClientWatch, ADroppedSubscriptionDoesNotRun) {
  auto w = std::make_shared<ClientWatch>();
  int n = 0;
  { ClientWatch::Subscription s = w->on_gone([&] { ++n; }); }
  w->client_gone();
  EXPECT_EQ(n, 0);
}

TEST(ClientWatch, CurrentIsPerThreadAndScoped) {
  EXPECT_EQ(ClientWatch::current(), nullptr);
  int n = 0;
  {
    ClientWatch::Subscription none = ClientWatch::on_current_gone([&] { ++n; });
  }
  auto outer = std::make_shared<ClientWatch>();
  auto inner = std::make_shared<ClientWatch>();
  {
    ClientWatch::Scope a(outer);
    {
      ClientWatch::Scope b(inner);
      EXPECT_EQ(ClientWatch::current(), inner);
      std::thread([] { EXPECT_EQ(ClientWatch::current(), nullptr); }).join();
    }
    EXPECT_EQ(ClientWatch::current(), outer);
  }
  EXPECT_EQ(ClientWatch::current(), nullptr);
  EXPECT_EQ(n, 0);
}

TEST(ClientWatch, GoneRacesWithSubscribeAndUnsubscribe) {
  for (int round = 0; round < 50; ++round) {
    auto w = std::make_shared<ClientWatch>();
    std::atomic<int> runs{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 20; ++i) {
          ClientWatch::Subscription s = w->on_gone([&] { ++runs; });
          if (i % 2) s.reset();
        }
      });
    }
    threads.emplace_back([&] { w->client_gone(); });
    for (auto& t : threads) t.join();
    EXPECT_TRUE(w->gone());
    EXPECT_LE(runs.load(), 4 * 20);
  }
}

TEST(WorkerPool, RunsTasksAndRefusesBeyondItsThreads) {
  WorkerPool pool(2, std::chrono::seconds(10));
  ASSERT_TRUE(pool.start(1).ok());
  std::atomic<bool> release{false};
  std::atomic<int> done{0};
  auto blocker = [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ++done;
  };
  ASSERT_TRUE(pool.try_run(blocker));
  ASSERT_TRUE(pool.try_run(blocker));  // a second thread is made
  EXPECT_FALSE(pool.try_run(blocker));  // no queue: refused
  EXPECT_EQ(pool.n_busy(), 2);
  release = true;
  ASSERT_TRUE(pool.shutdown(std::chrono::seconds(10)));
  EXPECT_EQ(done.load(), 2);
  EXPECT_FALSE(pool.try_run([] {}));
}

TEST(WorkerPool, IdleThreadsEnd) {
  WorkerPool pool(4, std::chrono::milliseconds(50));
  ASSERT_TRUE(pool.start(3).ok());
  for (int i = 0; i < 100 && pool.n_threads() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(pool.n_threads(), 0);
  std::atomic<int> ran{0};
  ASSERT_TRUE(pool.try_run([&] { ++ran; }));
  ASSERT_TRUE(pool.shutdown(std::chrono::seconds(10)));
  EXPECT_EQ(ran.load(), 1);
}

TEST(WorkerPool, ManyTasksFromManyThreads) {
  WorkerPool pool(8, std::chrono::seconds(10));
  std::atomic<int> ran{0}, refused{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < 4; ++t) {
    submitters.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (!pool.try_run([&] { ++ran; })) ++refused;
      }
    });
  }
  for (auto& t : submitters) t.join();
  ASSERT_TRUE(pool.shutdown(std::chrono::seconds(10)));
  EXPECT_EQ(ran.load() + refused.load(), 800);
  EXPECT_GT(ran.load(), 0);
}

}  // namespace
}  // namespace dserve::server
