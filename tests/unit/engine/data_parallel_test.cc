// Data parallelism in one process (run under TSan in `make test`): an API-server-side
// DpEngineClient with one local engine and a HeadlessEngines "node" with another,
// talking over ZeroMQ on localhost. Requests added from many threads give the offline
// engine's greedy outputs and land on both engines; a node whose flags disagree is
// refused naming the flag; a rank that never comes is named after the timeout; a node
// that goes silent is lost: the requests it had not answered yet move to the engine
// left and still give the offline engine's outputs, one it had started ends with
// "error"; a node started again with the same ranks rejoins and takes requests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
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
  void on_engine_lost(const std::string&) override { ++lost; }
  void on_engine_joined() override { ++joined; }
  std::atomic<int> finished{0}, errors{0}, lost{0}, joined{0};
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
  Head(const std::string& dir, int port, double timeout_s = 30, double heartbeat_s = 3) {
    DpEngineClientConfig c;
    c.data_parallel_size = 2;
    c.rpc_port = port;
    c.node = node_config(dir);
    c.startup_timeout_s = timeout_s;
    c.deadlines.heartbeat_s = heartbeat_s;
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
  // wrap: the engine's observer in place of the node's own (which it is given).
  Node(const std::string& dir, int port, engine_msg::NodeConfig config, double timeout_s = 30,
       double heartbeat_s = 3, std::function<EngineObserver*(EngineObserver*)> wrap = {}) {
    HeadlessConfig h;
    h.head_address = "127.0.0.1";
    h.rpc_port = port;
    h.start_rank = 1;
    h.n_engines = 1;
    h.node = config;
    h.startup_timeout_s = timeout_s;
    h.heartbeat_timeout_s = heartbeat_s;
    headless = std::make_unique<HeadlessEngines>(h);
    std::vector<std::unique_ptr<AsyncLlm>> engines;
    engines.push_back(engine(dir, wrap ? wrap(headless->observer(0)) : headless->observer(0)));
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
// Pops into `s` until it has tokens (tokens_only) or its finish.
void take(OutputQueue& q, Seq& s, bool tokens_only = false) {
  while (s.finish.empty() && !(tokens_only && !s.tokens.empty())) {
    for (OutputDelta& d : q.pop(std::chrono::milliseconds(100))) {
      s.tokens.insert(s.tokens.end(), d.token_ids.begin(), d.token_ids.end());
      if (d.finish_reason) {
        s.finish = *d.finish_reason;
        s.error = d.error;
      }
    }
  }
}
Seq collect(OutputQueue& q) {
  Seq s;
  take(q, s);
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

TEST(DataParallel, ASilentNodesUnansweredRequestsMoveToTheEngineLeft) {
  set_log_level("error");
  const std::string dir = write_tiny_llama();
  auto offline = LLM::create(dir, test::small_engine_options());
  ASSERT_TRUE(offline.ok());
  const int port = test::free_port();
  Head head(dir, port, 30, /*heartbeat_s=*/1);
  auto node = std::make_unique<Node>(dir, port, node_config(dir), 30, 1);
  ASSERT_TRUE(head.client->wait_for_engines().ok());
  node.reset();  // the node stops without a word: the head hears nothing more
  // Requests alternate between the (idle) engines: the one sent to the silent node
  // waits for its answer until the node is lost, then moves to the engine left; the
  // caller sees only its (right) output.
  for (int i = 0; i < 4; ++i) {
    auto q = std::make_shared<OutputQueue>();
    auto ids = head.client->add_request(prompt_of(i), greedy(4), q, 0);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    Seq got = collect(*q);
    EXPECT_EQ(got.finish, "length") << got.error;
    auto want = (*offline)->generate({prompt_of(i)}, greedy(4));
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(got.tokens, (*want)[0].token_ids) << "prompt " << i;
  }
  EXPECT_TRUE(head.client->healthy());
  EXPECT_EQ(head.counters[1].lost.load(), 1);
  EXPECT_EQ(head.counters[0].finished.load(), 4);
  EXPECT_TRUE(head.client->wait_idle(std::chrono::seconds(5)));
}

// Forwards an engine's observer calls, and holds its engine thread in the second
// token callback until released: the first token has gone out, the rest never comes.
class Stall : public EngineObserver {
 public:
  explicit Stall(EngineObserver* inner) : inner_(inner) {}
  void on_stats(const EngineStats& s) override { inner_->on_stats(s); }
  void on_tokens(int64_t n_prompt, int64_t n_generated) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (++n_calls_ == 2) {
      held_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    }
    lock.unlock();
    inner_->on_tokens(n_prompt, n_generated);
  }
  void on_first_token(double s) override { inner_->on_first_token(s); }
  void on_inter_token(double s) override { inner_->on_inter_token(s); }
  void on_finished(const std::string& r, int p, int g, double s) override { inner_->on_finished(r, p, g, s); }
  void wait_held() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return held_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  EngineObserver* inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  int n_calls_ = 0;        // GUARDED_BY(mu_)
  bool held_ = false;      // GUARDED_BY(mu_)
  bool released_ = false;  // GUARDED_BY(mu_)
};

TEST(DataParallel, StartedRequestsOfALostNodeEndWithAnErrorAndARestartedNodeRejoins) {
  set_log_level("error");
  const std::string dir = write_tiny_llama();
  const int port = test::free_port();
  Head head(dir, port, 30, /*heartbeat_s=*/1);
  std::unique_ptr<Stall> stall;
  auto node = std::make_unique<Node>(dir, port, node_config(dir), 30, 1, [&](EngineObserver* inner) {
    stall = std::make_unique<Stall>(inner);
    return stall.get();
  });
  ASSERT_TRUE(head.client->wait_for_engines().ok());
  // Two requests, one per engine; the node's has sent its first token, then its engine
  // hangs.
  std::vector<std::shared_ptr<OutputQueue>> queues;
  for (int i = 0; i < 2; ++i) {
    queues.push_back(std::make_shared<OutputQueue>());
    ASSERT_TRUE(head.client->add_request(prompt_of(i), greedy(150), queues.back(), 0).ok());
  }
  stall->wait_held();
  std::vector<Seq> seqs(2);
  for (int i = 0; i < 2; ++i) take(*queues[i], seqs[i], /*tokens_only=*/true);  // both started here
  const auto lost_at = std::chrono::steady_clock::now();
  node->headless->stop();  // and the node goes silent
  for (int i = 0; i < 2; ++i) take(*queues[i], seqs[i]);
  std::sort(seqs.begin(), seqs.end(), [](const Seq& a, const Seq& b) { return a.finish < b.finish; });
  ASSERT_EQ(seqs[0].finish, "error");
  EXPECT_EQ(seqs[1].finish, "length");
  EXPECT_FALSE(seqs[0].tokens.empty()) << "it had started";
  EXPECT_NE(seqs[0].error.find("was lost: stopped answering"), std::string::npos) << seqs[0].error;
  EXPECT_LT(std::chrono::steady_clock::now() - lost_at, std::chrono::seconds(5));
  EXPECT_EQ(head.counters[1].errors.load(), 1);
  EXPECT_TRUE(head.client->healthy());
  stall->release();
  node.reset();

  // The node again, same ranks: it takes requests again.
  node = std::make_unique<Node>(dir, port, node_config(dir), 30, 1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (head.counters[1].joined.load() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(head.counters[1].joined.load(), 1);
  const int before = head.counters[1].finished.load();
  for (int i = 0; i < 4; ++i) {
    auto q = std::make_shared<OutputQueue>();
    ASSERT_TRUE(head.client->add_request(prompt_of(i), greedy(3), q, 0).ok());
    EXPECT_EQ(collect(*q).finish, "length");
  }
  EXPECT_GT(head.counters[1].finished.load(), before);
}

}  // namespace
}  // namespace dserve
