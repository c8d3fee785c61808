// Engines in lockstep (AsyncLlm over a DpLockstep group, as expert-parallel
// data-parallel engines run; here two engines of a tiny Llama in one process, each its
// own rank of a gloo group over localhost, run under TSan in `make test`): requests on
// one engine while the other is idle finish with the offline engine's outputs (the
// idle engine keeps answering the rounds); requests on both at once too; and when one
// engine stops, the other fails its requests with an error naming it instead of
// hanging in a collective.
#include "engine/dp_lockstep.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>

#include "base/log.h"
#include "dist/gloo_communicator.h"
#include "dserve/async_llm.h"
#include "tiny_llama.h"
#include "test_support/net.h"
#include "test_support/engine_fixtures.h"

namespace dserve {
namespace {

using test::greedy;
// Prompts of 3 to 22 tokens.
std::vector<int32_t> prompt_of(int i) { return test::prompt_of(i, 20, kVocab); }

using namespace std::chrono_literals;

// Two ranks of one gloo group, connected concurrently (as cli/expert_parallel does).
std::vector<std::unique_ptr<dist::Communicator>> connect_pair() {
  const int port = test::free_port();
  std::optional<Result<std::unique_ptr<dist::Communicator>>> got[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      dist::GroupOptions o;
      o.rank = r;
      o.world_size = 2;
      o.master_port = port;
      o.timeout = 20s;
      o.shared_memory = false;
      o.fingerprint = "lockstep test";
      got[r] = dist::connect_gloo(std::move(o));
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::unique_ptr<dist::Communicator>> comms;
  for (auto& g : got) {
    EXPECT_TRUE(g->ok()) << g->status().message();
    if (g->ok()) comms.push_back(std::move(*g).value());
  }
  return comms;
}

// Tokens and the finish reason (with its error) of one request.
struct Outcome {
  std::vector<int32_t> tokens;
  std::string finish, error;
};
Outcome run_request(AsyncLlm& engine, int i, int max_tokens) {
  auto q = std::make_shared<OutputQueue>();
  auto ids = engine.add_request(prompt_of(i), greedy(max_tokens), q, 0);
  if (!ids.ok()) return {{}, "refused", ids.status().message()};
  Outcome o;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (o.finish.empty() && std::chrono::steady_clock::now() < deadline) {
    for (OutputDelta& d : q->pop(100ms)) {
      o.tokens.insert(o.tokens.end(), d.token_ids.begin(), d.token_ids.end());
      if (d.finish_reason) {
        o.finish = *d.finish_reason;
        o.error = d.error;
      }
    }
  }
  return o;
}

struct Group {
  std::vector<std::unique_ptr<dist::Communicator>> comms;  // outlive the engines
  std::vector<std::unique_ptr<AsyncLlm>> engines;
};
Group start_group(const std::string& dir) {
  Group g;
  g.comms = connect_pair();
  for (auto& comm : g.comms) {
    auto llm = LLM::create(dir, test::small_engine_options());
    EXPECT_TRUE(llm.ok()) << llm.status().message();
    auto a = AsyncLlm::create(std::move(*llm), nullptr, comm.get());
    EXPECT_TRUE(a.ok());
    g.engines.push_back(std::move(*a));
  }
  return g;
}

TEST(DpLockstep, OneRankGroupAlwaysAgreesWithItself) {
  auto comm = dist::make_single_rank_communicator();
  DpLockstep l(*comm);
  auto r = l.agree(true, false, false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->any_work);
  EXPECT_EQ(r->leaver, -1);
  r = l.agree(false, true, false);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->any_work);
  EXPECT_EQ(r->leaver, 0);
  EXPECT_FALSE(r->leaver_failed);
}

TEST(DpLockstep, EnginesServeWhileTheOtherIsIdleAndStopTogether) {
  set_log_level("error");
  const std::string dir = write_tiny_llama();
  auto offline = LLM::create(dir, test::small_engine_options());
  ASSERT_TRUE(offline.ok());
  std::vector<std::vector<int32_t>> prompts = {prompt_of(0), prompt_of(1), prompt_of(2)};
  auto want = (*offline)->generate(prompts, greedy(40));
  ASSERT_TRUE(want.ok());

  Group g = start_group(dir);
  ASSERT_EQ(g.engines.size(), 2u);
  // Engine 1 idle while engine 0 decodes.
  Outcome o = run_request(*g.engines[0], 0, 40);
  EXPECT_EQ(o.finish, "length");
  EXPECT_EQ(o.tokens, (*want)[0].token_ids);
  // Both at once, and engine 1 alone.
  std::optional<Outcome> both[2];
  std::thread t0([&] { both[0] = run_request(*g.engines[0], 1, 40); });
  std::thread t1([&] { both[1] = run_request(*g.engines[1], 2, 40); });
  t0.join();
  t1.join();
  EXPECT_EQ(both[0]->tokens, (*want)[1].token_ids);
  EXPECT_EQ(both[1]->tokens, (*want)[2].token_ids);
  o = run_request(*g.engines[1], 0, 40);
  EXPECT_EQ(o.tokens, (*want)[0].token_ids);
  EXPECT_TRUE(g.engines[0]->healthy() && g.engines[1]->healthy());

  // Engine 0 stops (its destructor's last round says so): engine 1 cannot step alone.
  const auto t = std::chrono::steady_clock::now();
  g.engines[0].reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t, 10s);
  for (int i = 0; i < 100 && g.engines[1]->healthy(); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(g.engines[1]->healthy());
  o = run_request(*g.engines[1], 1, 8);
  EXPECT_EQ(o.finish, "refused");
  g.engines[1].reset();
}

TEST(DpLockstep, AnEngineThatStopsMidRequestFailsTheOthersRequests) {
  set_log_level("error");
  const std::string dir = write_tiny_llama();
  Group g = start_group(dir);
  ASSERT_EQ(g.engines.size(), 2u);
  auto q = std::make_shared<OutputQueue>();
  SamplingOptions o = greedy(180);
  auto ids = g.engines[1]->add_request(prompt_of(3), o, q, 0);
  ASSERT_TRUE(ids.ok());
  std::vector<OutputDelta> first;
  while (first.empty()) first = q->pop(100ms);  // it runs
  ASSERT_FALSE(first.back().finish_reason);
  g.engines[0].reset();
  std::optional<std::string> finish, error;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!finish && std::chrono::steady_clock::now() < deadline) {
    for (OutputDelta& d : q->pop(100ms)) {
      if (d.finish_reason) {
        finish = d.finish_reason;
        error = d.error;
      }
    }
  }
  ASSERT_TRUE(finish.has_value());
  // Unless it finished between the first token and the stop (180 tokens of a tiny model).
  if (*finish != "length") {
    EXPECT_EQ(*finish, "error");
    EXPECT_NE(error->find("data-parallel engine 0 of the expert-parallel group stopped"), std::string::npos) << *error;
  }
  g.engines[1].reset();
}

}  // namespace
}  // namespace dserve
