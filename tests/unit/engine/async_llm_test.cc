// AsyncLlm from many threads at once (run under TSan in `make test`): requests added
// concurrently give the same greedy outputs as the offline LLM; aborts from other
// threads end a request with "abort" and return its blocks; n > 1 choices arrive
// tagged with their index; after everything, every block is free; shutdown refuses new
// requests and the destructor ends whatever runs.
#include <gtest/gtest.h>

#include <thread>

#include "base/log.h"
#include "dserve/async_llm.h"
#include "tiny_llama.h"
#include "test_support/engine_fixtures.h"

namespace dserve {
namespace {

using test::greedy;
// Prompts of 3 to 42 tokens.
std::vector<int32_t> prompt_of(int i) { return test::prompt_of(i, 40, kVocab); }

// Reads a queue until `n` sequences have finished; returns tokens and finish reasons.
struct Collected {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> finish;
};
Collected collect(OutputQueue& q, int n) {
  Collected c{std::vector<std::vector<int32_t>>(n), std::vector<std::string>(n)};
  int done = 0;
  while (done < n) {
    for (OutputDelta& d : q.pop(std::chrono::milliseconds(100))) {
      EXPECT_GE(d.index, 0);
      EXPECT_LT(d.index, n);
      auto& t = c.tokens[d.index];
      t.insert(t.end(), d.token_ids.begin(), d.token_ids.end());
      if (d.finish_reason) {
        c.finish[d.index] = *d.finish_reason;
        ++done;
      }
    }
  }
  return c;
}

// The offline engine (plain decoding) is the reference; `serving` configures the
// AsyncLlm under test.
void check_concurrent_clients(const LlmOptions& serving) {
  set_log_level("warning");
  const std::string dir = write_tiny_llama();
  constexpr int kThreads = 6, kPerThread = 5;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kThreads * kPerThread; ++i) prompts.push_back(prompt_of(i));

  auto offline = LLM::create(dir, test::small_engine_options());
  ASSERT_TRUE(offline.ok()) << offline.status().message();
  auto want = (*offline)->generate(prompts, greedy(8));
  ASSERT_TRUE(want.ok()) << want.status().message();

  auto llm = LLM::create(dir, serving);
  ASSERT_TRUE(llm.ok());
  auto async = AsyncLlm::create(std::move(*llm));
  ASSERT_TRUE(async.ok());
  AsyncLlm& a = **async;

  std::vector<std::thread> threads;
  std::vector<std::string> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        const int i = t * kPerThread + k;
        auto q = std::make_shared<OutputQueue>();
        const bool abort = i % 4 == 3;
        const int n = i % 5 == 1 ? 2 : 1;
        auto ids = a.add_request(prompts[i], greedy(abort ? 150 : 8, n), q, 0);
        if (!ids.ok() || static_cast<int>(ids->size()) != n) {
          failures[t] = "add_request: " + ids.status().message();
          return;
        }
        if (abort) {
          // Wait for a first token, then cancel from this (non-engine) thread.
          std::vector<OutputDelta> first;
          while (first.empty()) first = q->pop(std::chrono::milliseconds(100));
          for (RequestId id : *ids) a.abort(id);
          int done = 0;
          for (const OutputDelta& d : first) done += d.finish_reason.has_value();
          while (done < n) {
            for (const OutputDelta& d : q->pop(std::chrono::milliseconds(100))) {
              if (d.finish_reason) {
                ++done;
                if (*d.finish_reason != "abort" && *d.finish_reason != "length")
                  failures[t] = "aborted request finished with " + *d.finish_reason;
              }
            }
          }
          continue;
        }
        Collected c = collect(*q, n);
        for (int j = 0; j < n; ++j) {
          if (c.tokens[j] != (*want)[i].token_ids || c.finish[j] != "length") {
            failures[t] = "request " + std::to_string(i) + " choice " + std::to_string(j) +
                          " differs from the offline engine";
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& f : failures) EXPECT_EQ(f, "");

  ASSERT_TRUE(a.wait_idle(std::chrono::seconds(30)));
  // The stats are published after the engine's last step.
  EngineStats s = a.stats();
  for (int i = 0; i < 50 && s.n_free_blocks != s.n_blocks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = a.stats();
  }
  EXPECT_EQ(s.n_free_blocks, s.n_blocks);
  EXPECT_EQ(s.n_running + s.n_waiting, 0);

  // Bad requests are refused with the engine's reason; shutdown refuses new ones.
  auto q = std::make_shared<OutputQueue>();
  auto bad = a.add_request({1, kVocab + 5}, greedy(4), q, 0);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto long_running = a.add_request(prompt_of(1), greedy(150), q, 0);
  ASSERT_TRUE(long_running.ok());
  a.stop_accepting();
  EXPECT_EQ(a.add_request(prompt_of(2), greedy(4), q, 0).status().code(),
            StatusCode::kResourceExhausted);
  // The destructor (at scope end) aborts the long-running request and joins.
}

TEST(AsyncLlm, ConcurrentClientsMatchTheOfflineEngine) {
  check_concurrent_clients(test::small_engine_options());
}

// The same with prompt-lookup drafts verified in every step (the tiny model's greedy
// outputs repeat themselves, so drafts come and are partly accepted).
TEST(AsyncLlm, ConcurrentClientsMatchTheOfflineEngineUnderSpeculation) {
  LlmOptions o = test::small_engine_options();
  o.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 3,
                             "prompt_lookup_max": 2})";
  check_concurrent_clients(o);
}

}  // namespace
}  // namespace dserve
