// Data parallelism in one process (run under TSan in `make test`): an API-server-side
// DpEngineClient with one local engine and a HeadlessEngines "node" with another,
// talking over ZeroMQ on localhost. Requests added from many threads give the offline
// engine's greedy outputs and land on both engines; a node whose flags disagree is
// refused naming the flag; a rank that never comes is named after the timeout; a node
// that goes silent ends its requests with "error" and new ones go to the engine left.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "base/log.h"
#include "dserve/async_llm.h"
#include "engine/dp_engine_client.h"
#include "engine/headless_engines.h"
#include "tiny_llama.h"
#include "test_support/net.h"
#include "test_support/engine_fixtures.h"

namespace dserve {
namespace {

using test::greedy;
// Prompts of 3 to 32 tokens.
std::vector<int32_t> prompt_of(int i) { return test::prompt_of(i, 30, kVocab); }

// Counts what each engine did.
class Counter : public EngineObserver {
 public:
  void on_finished(const std::string& reason, int, int, double) override {
    if (reason == "error") ++errors;
    else ++finished;
  }
  std::atomic<int> finished{0}, errors{0};
};

engine_msg::NodeConfig node_config(const std::string& dir) {
  engine_msg::NodeConfig c;
  c.model = dir;
  c.data_parallel_size = 2;
  c.block_size = 4;
  return c;
}

std::unique_ptr<AsyncLlm> engine(const std::string& dir, EngineObserver* observer) {
  auto llm = LLM::create(dir, test::small_engine_options());
  EXPECT_TRUE(llm.ok()) << llm.status().message();
  auto a = AsyncLlm::create(std::move(*llm), observer);
  EXPECT_TRUE(a.ok());
  return std::move(*a);
}

struct Head {
  Counter counters[2];
  std::unique_ptr<DpEngineClient> client;
  Head(const std::string& dir, int port, double timeout_s = 30) {
    DpEngineClientConfig c;
    c.data_parallel_size = 2;
    c.rpc_port = port;
    c.node = node_config(dir);
    c.startup_timeout_s = timeout_s;
    c.observer = [this](int rank) { return &counters[rank]; };
    std::vector<std::unique_ptr<AsyncLlm>> local;
    local.push_back(engine(dir, &counters[0]));
    auto made = DpEngineClient::create(c, std::move(local));
    EXPECT_TRUE(made.ok()) << made.status().message();
    client = std::move(*made);
  }
};

// A headless node with rank 1 on its own thread; run()'s status lands in `status`.
struct Node {
  std::unique_ptr<HeadlessEngines> headless;
  std::thread thread;
  Status status;
  Node(const std::string& dir, int port, engine_msg::NodeConfig config, double timeout_s = 30) {
    HeadlessConfig h;
    h.head_address = "127.0.0.1";
    h.rpc_port = port;
    h.start_rank = 1;
    h.n_engines = 1;
    h.node = config;
    h.startup_timeout_s = timeout_s;
    headless = std::make_unique<HeadlessEngines>(h);
    std::vector<std::unique_ptr<AsyncLlm>> engines;
    engines.push_back(engine(dir, headless->observer(0)));
    thread = std::thread([this, e = std::move(engines)]() mutable { status = headless->run(std::move(e)); });
  }
  ~Node() {
    headless->stop();
    thread.join();
  }
};

struct Seq {
  std::vector<int32_t> tokens;
  std::string finish, error;
};
Seq collect(OutputQueue& q) {
  Seq s;
  while (s.finish.empty()) {
    for (OutputDelta& d : q.pop(std::chrono::milliseconds(100))) {
      s.tokens.insert(s.tokens.end(), d.token_ids.begin(), d.token_ids.end());
      if (d.finish_reason) {
        s.finish = *d.finish_reason;
        s.error = d.error;
      }
    }
  }
  return s;
}

TEST(DataParallel, ConcurrentRequestsMatchTheOfflineEngineOnBothEngines) {
  set_log_level("warning");
  const std::string dir = write_tiny_llama();
  constexpr int kThreads = 4, kPerThread = 4;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kThreads * kPerThread; ++i) prompts.push_back(prompt_of(i));
  auto offline = LLM::create(dir, test::small_engine_options());
  ASSERT_TRUE(offline.ok());
  auto want = (*offline)->generate(prompts, greedy(6));
  ASSERT_TRUE(want.ok());

  const int port = test::free_port();
  Node node(dir, port, node_config(dir));  // the node first: either order works
  Head head(dir, port);
  ASSERT_TRUE(head.client->wait_for_engines().ok());
  std::vector<std::thread> threads;
  std::vector<Seq> got(prompts.size());
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::shared_ptr<OutputQueue>> queues;
      for (int k = 0; k < kPerThread; ++k) {
        const int i = t * kPerThread + k;
        auto q = std::make_shared<OutputQueue>();
        auto ids = head.client->add_request(prompts[i], greedy(6), q, 0);
        EXPECT_TRUE(ids.ok()) << ids.status().message();
        queues.push_back(q);
      }
      for (int k = 0; k < kPerThread; ++k) got[t * kPerThread + k] = collect(*queues[k]);
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].finish, "length") << got[i].error;
    EXPECT_EQ(got[i].tokens, (*want)[i].token_ids) << "prompt " << i;
  }
  EXPECT_TRUE(head.client->wait_idle(std::chrono::seconds(10)));
  EXPECT_GT(head.counters[0].finished.load(), 0);
  EXPECT_GT(head.counters[1].finished.load(), 0);
  EXPECT_EQ(head.counters[0].finished + head.counters[1].finished, static_cast<int>(prompts.size()));
}

TEST(DataParallel, DisagreeingFlagsAreRefusedByName) {
  set_log_level("error");
  const std::string dir = write_tiny_llama();
  const int port = test::free_port();
  Head head(dir, port);
  engine_msg::NodeConfig other = node_config(dir);
  other.block_size = 16;
  Node node(dir, port, other);
  Status s = head.client->wait_for_engines();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--block-size 4 vs 16"), std::string::npos) << s.message();
  node.thread.join();
  EXPECT_NE(node.status.message().find("--block-size 4 vs 16"), std::string::npos)
      << node.status.message();
  node.thread = std::thread([] {});
}

TEST(DataParallel, MissingRankIsNamedAfterTheTimeout) {
  set_log_level("error");
  const std::string dir = write_tiny_llama();
  Head head(dir, test::free_port(), /*timeout_s=*/0.5);
  Status s = head.client->wait_for_engines();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank(s) 1 never connected"), std::string::npos) << s.message();
}

TEST(DataParallel, ASilentNodeEndsItsRequestsAndTheOtherEngineServes) {
  set_log_level("error");
  const std::string dir = write_tiny_llama();
  const int port = test::free_port();
  Head head(dir, port);
  auto node = std::make_unique<Node>(dir, port, node_config(dir));
  ASSERT_TRUE(head.client->wait_for_engines().ok());
  node.reset();  // the node stops without a word: the head hears nothing more
  // Requests alternate between the (idle) engines: the one sent to the silent node
  // waits for its answer until the node is declared dead, then fails naming it.
  std::vector<std::string> outcome;
  for (int i = 0; i < 2; ++i) {
    auto q = std::make_shared<OutputQueue>();
    auto ids = head.client->add_request(prompt_of(i), greedy(4), q, 0);
    if (!ids.ok()) {
      EXPECT_NE(ids.status().message().find("stopped answering"), std::string::npos)
          << ids.status().message();
      outcome.push_back("refused");
    } else {
      outcome.push_back(collect(*q).finish);
    }
  }
  std::sort(outcome.begin(), outcome.end());
  EXPECT_EQ(outcome, (std::vector<std::string>{"length", "refused"}));
  EXPECT_TRUE(head.client->healthy());
  for (int i = 0; i < 3; ++i) {
    auto q = std::make_shared<OutputQueue>();
    ASSERT_TRUE(head.client->add_request(prompt_of(i), greedy(4), q, 0).ok());
    EXPECT_EQ(collect(*q).finish, "length");
  }
}

}  // namespace
}  // namespace dserve
