#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "fake_runner.h"

namespace dserve::sched {
namespace {

std::unique_ptr<Scheduler> make(int budget, int max_seqs, int max_len, int n_blocks, int bs = 16,
                                bool caching = true) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = budget;
  sc.max_num_seqs = max_seqs;
  sc.max_model_len = max_len;
  kvcache::KvCacheConfig kc;
  kc.n_blocks = n_blocks;
  kc.block_size = bs;
  kc.enable_prefix_caching = caching;
  auto r = Scheduler::create(sc, kc);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

RequestSpec spec(RequestId id, int n_prompt, int max_tokens, int32_t first = 0) {
  RequestSpec s;
  s.id = id;
  s.prompt.resize(n_prompt);
  std::iota(s.prompt.begin(), s.prompt.end(), first);
  s.max_tokens = max_tokens;
  return s;
}

// One step; every sampling request gets `token`.
struct Step {
  SchedulerOutput plan;
  std::vector<RequestOutput> outputs;
};
Step step(Scheduler& s, int32_t token = 5) {
  Step st;
  st.plan = s.schedule();
  EXPECT_TRUE(testing::check_plan(st.plan, s));
  std::vector<int32_t> sampled(st.plan.requests.size(), token);
  st.outputs = s.update_from_output(st.plan, sampled);
  EXPECT_TRUE(s.check_invariants().ok());
  return st;
}

TEST(SchedulerConfig, RejectsNonsense) {
  SchedulerConfig c;
  EXPECT_TRUE(c.validate().ok());
  c.max_num_seqs = 0;
  EXPECT_FALSE(c.validate().ok());
}

TEST(Scheduler, CreateFailsWhenMaxModelLenCannotFitOnce) {
  SchedulerConfig sc;
  sc.max_model_len = 4096;
  kvcache::KvCacheConfig kc;
  kc.n_blocks = 100;  // 1,600 tokens
  auto r = Scheduler::create(sc, kc);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("max_model_len <= 1601"), std::string::npos)
      << r.status().message();
}

TEST(Scheduler, RejectsImpossibleRequestsBeforeQueueing) {
  auto s = make(128, 4, 100, 16);
  EXPECT_EQ(s->add_request(spec(1, 100, 5)).code(), StatusCode::kInvalidArgument)
      << "no room to generate";
  EXPECT_EQ(s->add_request(spec(2, 0, 5)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->add_request(spec(3, 10, 0)).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(s->add_request(spec(4, 99, 5)).ok()) << "generation is capped at max_model_len";
  EXPECT_EQ(s->add_request(spec(4, 10, 5)).code(), StatusCode::kInvalidArgument) << "duplicate id";
  EXPECT_EQ(s->stats().n_waiting, 1);
  Step st = step(*s);
  ASSERT_EQ(st.outputs.size(), 1u);
  EXPECT_EQ(st.outputs[0].finish_reason, FinishReason::kLength);
  EXPECT_FALSE(s->has_unfinished_requests());
}

TEST(Scheduler, ChunkedPrefillSplitsAPromptLongerThanTheBudget) {
  auto s = make(32, 4, 512, 32);
  ASSERT_TRUE(s->add_request(spec(1, 100, 3)).ok());
  std::vector<int> starts, sizes;
  for (int i = 0; i < 4; ++i) {
    Step st = step(*s);
    ASSERT_EQ(st.plan.requests.size(), 1u);
    const ScheduledRequest& r = st.plan.requests[0];
    starts.push_back(r.start_pos);
    sizes.push_back(r.n_tokens);
    EXPECT_EQ(r.is_new, i == 0);
    EXPECT_EQ(r.sample, i == 3) << "only the chunk that reaches the end samples";
    EXPECT_EQ(st.outputs.size(), i == 3 ? 1u : 0u);
  }
  EXPECT_EQ(starts, (std::vector<int>{0, 32, 64, 96}));
  EXPECT_EQ(sizes, (std::vector<int>{32, 32, 32, 4}));
  Step d = step(*s);  // decode: the sampled token at position 100
  ASSERT_EQ(d.plan.requests.size(), 1u);
  EXPECT_EQ(d.plan.requests[0].start_pos, 100);
  EXPECT_EQ(d.plan.requests[0].n_tokens, 1);
  EXPECT_EQ(d.plan.requests[0].token_ids, std::vector<int32_t>{5});
}

TEST(Scheduler, DecodesGoFirstAndPrefillChunksFillTheBudget) {
  auto s = make(20, 8, 512, 64);
  ASSERT_TRUE(s->add_request(spec(1, 4, 50)).ok());
  ASSERT_TRUE(s->add_request(spec(2, 4, 50)).ok());
  step(*s);  // both prefill (8 tokens)
  ASSERT_TRUE(s->add_request(spec(3, 100, 5)).ok());
  Step st = step(*s);
  ASSERT_EQ(st.plan.requests.size(), 3u);
  EXPECT_EQ(st.plan.requests[0].n_tokens, 1);
  EXPECT_EQ(st.plan.requests[1].n_tokens, 1);
  EXPECT_EQ(st.plan.requests[2].id, 3u);
  EXPECT_EQ(st.plan.requests[2].n_tokens, 18) << "the rest of the budget";
  EXPECT_EQ(st.plan.n_scheduled_tokens, 20);
}

TEST(Scheduler, MaxNumSeqsCapsTheRunningBatch) {
  auto s = make(1000, 3, 512, 64);
  for (RequestId id = 1; id <= 5; ++id)
    ASSERT_TRUE(s->add_request(spec(id, 8, 4, int32_t(id * 100))).ok());
  Step st = step(*s);
  EXPECT_EQ(st.plan.requests.size(), 3u);
  EXPECT_EQ(s->stats().n_running, 3);
  EXPECT_EQ(s->stats().n_waiting, 2);
  while (s->has_unfinished_requests()) step(*s);  // check_plan asserts the cap every step
}

TEST(Scheduler, FirstComeFirstServedDoesNotSkipTheHead) {
  auto s = make(1000, 8, 128, 8, 16);                      // 128 tokens of cache
  ASSERT_TRUE(s->add_request(spec(1, 100, 20)).ok());      // 7 blocks
  ASSERT_TRUE(s->add_request(spec(2, 40, 5, 1000)).ok());  // 3 blocks: does not fit beside 1
  ASSERT_TRUE(s->add_request(spec(3, 5, 5, 2000)).ok());   // would fit, but must wait its turn
  Step st = step(*s);
  ASSERT_EQ(st.plan.requests.size(), 1u);
  EXPECT_EQ(st.plan.requests[0].id, 1u);
}

TEST(Scheduler, PreemptsTheNewestAndResumesWithoutLosingTokens) {
  // 4 blocks of 4 tokens; two requests of 6 prompt tokens growing to 14 cannot coexist.
  auto s = make(100, 4, 16, 4, 4, /*caching=*/false);
  ASSERT_TRUE(s->add_request(spec(1, 6, 8, 0)).ok());
  ASSERT_TRUE(s->add_request(spec(2, 6, 8, 100)).ok());
  int32_t next = 1000;
  std::map<RequestId, std::vector<int32_t>> outs;
  bool saw_preempt = false, saw_resume = false;
  while (s->has_unfinished_requests()) {
    SchedulerOutput plan = s->schedule();
    ASSERT_TRUE(testing::check_plan(plan, *s));
    for (RequestId id : plan.preempted) {
      EXPECT_EQ(id, 2u) << "the newest request is preempted";
      saw_preempt = true;
      EXPECT_EQ(s->find(id)->state, RequestState::kPreempted);
      EXPECT_EQ(s->find(id)->n_computed_tokens, 0);
    }
    for (const auto& r : plan.requests) {
      if (r.is_resumed) {
        saw_resume = true;
        EXPECT_EQ(r.start_pos, 0);
        // Recompute covers prompt + every output so far, then samples the next token.
        EXPECT_EQ(r.token_ids.size(), 6 + outs[r.id].size());
        EXPECT_TRUE(std::equal(outs[r.id].begin(), outs[r.id].end(), r.token_ids.begin() + 6));
      }
    }
    std::vector<int32_t> sampled(plan.requests.size());
    for (auto& t : sampled) t = next++;
    for (const auto& o : s->update_from_output(plan, sampled)) outs[o.id].push_back(o.token);
  }
  EXPECT_TRUE(saw_preempt);
  EXPECT_TRUE(saw_resume);
  EXPECT_EQ(outs[1].size(), 8u);
  EXPECT_EQ(outs[2].size(), 8u);
  std::vector<int32_t> all = outs[1];
  all.insert(all.end(), outs[2].begin(), outs[2].end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "a token was repeated";
  EXPECT_GT(s->stats().n_preemptions, 0);
  EXPECT_EQ(s->kv_cache().n_free_blocks(), 4);
}

TEST(Scheduler, StopTokensMinTokensAndLength) {
  auto s = make(100, 4, 30, 8, 4);
  RequestSpec a = spec(1, 4, 10);
  a.stop_token_ids = {5};
  a.min_tokens = 2;
  ASSERT_TRUE(s->add_request(a).ok());
  ASSERT_TRUE(s->add_request(spec(2, 25, 100, 50)).ok());
  std::map<RequestId, int> n;
  std::map<RequestId, FinishReason> why;
  while (s->has_unfinished_requests()) {
    for (const auto& o : step(*s, 5).outputs) {
      ++n[o.id];
      if (o.finish_reason) why[o.id] = *o.finish_reason;
    }
  }
  EXPECT_EQ(n[1], 2) << "the stop token counts only from min_tokens on";
  EXPECT_EQ(why[1], FinishReason::kStop);
  EXPECT_EQ(n[2], 5) << "25 + 5 = max_model_len";
  EXPECT_EQ(why[2], FinishReason::kLength);
}

TEST(Scheduler, PrefixCachingSkipsASharedPrefix) {
  for (bool caching : {true, false}) {
    auto s = make(4096, 8, 2048, 256, 16, caching);
    RequestSpec a = spec(1, 1000, 1);
    ASSERT_TRUE(s->add_request(a).ok());
    step(*s);
    EXPECT_FALSE(s->has_unfinished_requests());
    RequestSpec b = a;
    b.id = 2;
    for (int i = 0; i < 20; ++i) b.prompt.push_back(9000 + i);
    ASSERT_TRUE(s->add_request(b).ok());
    Step st = step(*s);
    ASSERT_EQ(st.plan.requests.size(), 1u);
    EXPECT_EQ(st.plan.requests[0].start_pos, caching ? 992 : 0);
    EXPECT_EQ(st.plan.requests[0].n_tokens, caching ? 28 : 1020);
    EXPECT_EQ(st.plan.requests[0].new_block_ids.size(), 64u) << "the whole table for a new request";
    EXPECT_EQ(s->stats().kv.n_hit_tokens, caching ? 992 : 0);
    EXPECT_EQ(s->stats().kv.n_queried_tokens, 2020);
  }
}

TEST(Scheduler, APrefixFilledThisStepIsReusedInTheSameStep) {
  // The runner writes a step's keys and values before attention reads them, so blocks
  // allocated (and hashed) earlier in the plan can serve a later request of the plan.
  auto s = make(1000, 8, 512, 32, 16);
  ASSERT_TRUE(s->add_request(spec(1, 100, 2)).ok());
  ASSERT_TRUE(s->add_request(spec(2, 100, 2)).ok());
  Step st = step(*s);
  ASSERT_EQ(st.plan.requests.size(), 2u);
  EXPECT_EQ(st.plan.requests[1].start_pos, 96);
  EXPECT_EQ(st.plan.requests[1].n_tokens, 4);
  EXPECT_EQ(s->stats().kv.n_hit_tokens, 96);
}

TEST(Scheduler, AbortFreesBlocksAtAnyStage) {
  auto s = make(32, 4, 512, 32, 16);
  ASSERT_TRUE(s->add_request(spec(1, 100, 10)).ok());
  ASSERT_TRUE(s->add_request(spec(2, 10, 10, 500)).ok());
  ASSERT_TRUE(s->add_request(spec(3, 10, 10, 900)).ok());
  step(*s);  // 1 gets a 32-token chunk; 2 and 3 wait
  EXPECT_LT(s->kv_cache().n_free_blocks(), 32);
  EXPECT_TRUE(s->abort_request(3).ok());  // waiting
  EXPECT_TRUE(s->abort_request(1).ok());  // mid-prefill
  EXPECT_EQ(s->kv_cache().n_free_blocks(), 32);
  EXPECT_EQ(s->abort_request(1).code(), StatusCode::kNotFound);
  Step st = step(*s);
  EXPECT_EQ(st.plan.finished, (std::vector<RequestId>{3, 1}));
  ASSERT_EQ(st.plan.requests.size(), 1u);
  // Abort during a step: applied with the step, no token comes out.
  SchedulerOutput plan = s->schedule();
  EXPECT_TRUE(s->abort_request(2).ok());
  EXPECT_NE(s->find(2), nullptr);
  std::vector<int32_t> sampled(plan.requests.size(), 1);
  EXPECT_TRUE(s->update_from_output(plan, sampled).empty());
  EXPECT_EQ(s->find(2), nullptr);
  EXPECT_FALSE(s->has_unfinished_requests());
  EXPECT_EQ(s->kv_cache().n_free_blocks(), 32);
  EXPECT_EQ(s->schedule().finished, std::vector<RequestId>{2});
}

TEST(Scheduler, ForksShareThePromptBlocksOnceThePromptIsComputed) {
  auto s = make(1000, 8, 512, 32, 16, /*caching=*/false);
  RequestSpec a = spec(1, 40, 3);
  a.fork_ids = {2, 3};
  ASSERT_TRUE(s->add_request(a).ok());
  EXPECT_EQ(s->find(2)->state, RequestState::kForkPending);
  Step st = step(*s);  // the parent's prompt; the forks join at its update
  ASSERT_EQ(st.plan.requests.size(), 1u);
  EXPECT_EQ(s->find(2)->state, RequestState::kRunning);
  EXPECT_EQ(s->find(3)->n_computed_tokens, 39);
  std::span<const kvcache::BlockId> tp = s->kv_cache().block_table(1);
  std::span<const kvcache::BlockId> tc = s->kv_cache().block_table(2);
  ASSERT_EQ(tc.size(), 3u);
  EXPECT_EQ(tc[0], tp[0]);
  EXPECT_EQ(tc[1], tp[1]);
  EXPECT_NE(tc[2], tp[2]) << "the partial block is copied, not shared";
  EXPECT_EQ(s->kv_cache().pool().ref_cnt(tp[0]), 3);

  SchedulerOutput plan = s->schedule();
  ASSERT_EQ(plan.requests.size(), 3u);
  ASSERT_EQ(plan.block_copies.size(), 2u);
  EXPECT_EQ(plan.block_copies[0].src, tp[2]);
  EXPECT_EQ(plan.block_copies[0].n_tokens, 39 - 32);
  const ScheduledRequest& c = plan.requests[1];
  EXPECT_EQ(c.id, 2u);
  EXPECT_TRUE(c.is_new);
  EXPECT_EQ(c.start_pos, 39);
  EXPECT_EQ(c.token_ids, std::vector<int32_t>{39})
      << "the last prompt token, for the fork's own logits";
  EXPECT_EQ(c.new_block_ids, std::vector<kvcache::BlockId>(tc.begin(), tc.end()));
  std::vector<int32_t> sampled(plan.requests.size(), 7);
  EXPECT_EQ(s->update_from_output(plan, sampled).size(), 3u);
  while (s->has_unfinished_requests()) step(*s);
  EXPECT_EQ(s->kv_cache().n_free_blocks(), 32);
}

TEST(Scheduler, ForksOfAnAbortedParentRunOnTheirOwn) {
  auto s = make(16, 8, 512, 32, 16);
  RequestSpec a = spec(1, 40, 3);
  a.fork_ids = {2};
  ASSERT_TRUE(s->add_request(a).ok());
  EXPECT_EQ(s->add_request(spec(2, 4, 4)).code(), StatusCode::kInvalidArgument)
      << "id taken by a fork";
  step(*s);  // a 16-token chunk of the parent
  ASSERT_TRUE(s->abort_request(1).ok());
  EXPECT_EQ(s->find(2)->state, RequestState::kWaiting);
  ASSERT_TRUE(s->abort_request(2).ok());
  EXPECT_FALSE(s->has_unfinished_requests());
  RequestSpec b = spec(5, 10, 3);
  b.fork_ids = {6, 6};
  EXPECT_EQ(s->add_request(b).code(), StatusCode::kInvalidArgument);
}

TEST(SchedulerDeathTest, StepsMustAlternate) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto s = make(32, 4, 512, 32);
  ASSERT_TRUE(s->add_request(spec(1, 10, 10)).ok());
  (void)s->schedule();
  EXPECT_DEATH((void)s->schedule(), "before update_from_output");
}

}  // namespace
}  // namespace dserve::sched
