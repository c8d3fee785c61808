// End-to-end runs of the Scheduler against FakeRunner: many requests under a KV cache
// far too small for all of them must produce exactly what each request produces alone.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "fake_runner.h"
#include "sched/scheduler.h"

namespace dserve::sched {
namespace {

using testing::check_plan;
using testing::FakeRunner;
using testing::run_alone;

constexpr int kVocab = 512;

// Runs every request to the end through FakeRunner, checking each plan and the
// invariants after each step, and compares each request's outputs with `expected`
// (prompt + outputs of its solo run).
void run_and_compare(Scheduler& sched, const kvcache::KvCacheConfig& kc,
                     const std::map<RequestId, std::vector<int32_t>>& expected) {
  FakeRunner runner(kc.n_blocks, kc.block_size, kVocab);
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, std::optional<FinishReason>> reasons;
  auto truth = [&](RequestId id) -> const std::vector<int32_t>& { return expected.at(id); };
  int steps = 0;
  while (sched.has_unfinished_requests()) {
    ASSERT_LT(++steps, 100000) << "no progress";
    SchedulerOutput out = sched.schedule();
    ASSERT_TRUE(check_plan(out, sched));
    ASSERT_FALSE(out.requests.empty()) << "a step with work left schedules nothing";
    std::vector<int32_t> sampled = runner.execute(out, truth);
    ASSERT_TRUE(runner.tables_match(out, sched));
    for (const RequestOutput& o : sched.update_from_output(out, sampled)) {
      got[o.id].push_back(o.token);
      if (o.finish_reason) reasons[o.id] = o.finish_reason;
    }
    Status st = sched.check_invariants();
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  for (auto& [id, seq] : expected) {
    const int n_prompt = int(seq.size()) - int(got[id].size());
    ASSERT_GE(n_prompt, 1);
    EXPECT_TRUE(std::equal(got[id].begin(), got[id].end(), seq.begin() + n_prompt))
        << "request " << id << " differs from running alone";
    EXPECT_TRUE(reasons[id].has_value()) << "request " << id << " never finished";
  }
  std::printf("%d steps\n", steps);
}

struct SimCase {
  int block_size;
  bool prefix_caching;
};

class SchedulerSim : public ::testing::TestWithParam<SimCase> {};

// 64 requests, prompt lengths spread over 1..1500 (a quarter share a 600-token prefix),
// varied max_tokens, half with a stop token; a cache of 2,560 tokens.
TEST_P(SchedulerSim, ConcurrentRequestsMatchRunningAlone) {
  const SimCase p = GetParam();
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 256;
  sc.max_num_seqs = 32;
  sc.max_model_len = 2048;
  kvcache::KvCacheConfig kc;
  kc.block_size = p.block_size;
  kc.n_blocks = 2560 / p.block_size;
  kc.enable_prefix_caching = p.prefix_caching;
  auto created = Scheduler::create(sc, kc);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  Scheduler& sched = **created;

  std::mt19937 rng(1234);
  std::vector<int32_t> shared(600);
  for (auto& t : shared) t = int32_t(rng() % kVocab);
  std::map<RequestId, std::vector<int32_t>> expected;
  for (int i = 0; i < 64; ++i) {
    RequestSpec spec;
    spec.id = 1000 + i;
    const int len = 1 + (i * 37 % 64) * 1499 / 63;  // 1..1500, shuffled
    if (i % 4 == 0 && len > 600) spec.prompt = shared;
    while (int(spec.prompt.size()) < len) spec.prompt.push_back(int32_t(rng() % kVocab));
    spec.max_tokens = 1 + (i * 13) % 120;
    if (i % 2 == 0) spec.stop_token_ids = {7, 11};
    spec.min_tokens = i % 3;
    expected[spec.id] = run_alone(spec, sc.max_model_len, kVocab);
    ASSERT_TRUE(sched.add_request(spec).ok());
  }

  run_and_compare(sched, kc, expected);
  const SchedulerStats s = sched.stats();
  EXPECT_GT(s.n_preemptions, 0) << "the cache is meant to be too small";
  EXPECT_EQ(s.kv.n_free_blocks, kc.n_blocks) << "blocks leaked";
  if (p.prefix_caching) {
    EXPECT_GT(s.kv.n_hit_tokens, 0);
  } else {
    EXPECT_EQ(s.kv.n_hit_tokens, 0);
  }
  std::printf("block_size %d caching %d: %lld preemptions, %lld/%lld prefix tokens hit\n",
              p.block_size, int(p.prefix_caching), static_cast<long long>(s.n_preemptions),
              static_cast<long long>(s.kv.n_hit_tokens),
              static_cast<long long>(s.kv.n_queried_tokens));
}

// n > 1: groups of 1..4 sequences over one prompt, forked from the parent's prompt
// blocks, under a cache small enough to preempt; every sequence matches its solo run
// (each samples with its own seed, so siblings diverge).
TEST_P(SchedulerSim, ForkedSequencesMatchRunningAlone) {
  const SimCase p = GetParam();
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 128;
  sc.max_num_seqs = 12;
  sc.max_model_len = 1024;
  kvcache::KvCacheConfig kc;
  kc.block_size = p.block_size;
  kc.n_blocks = 1536 / p.block_size;
  kc.enable_prefix_caching = p.prefix_caching;
  auto created = Scheduler::create(sc, kc);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  Scheduler& sched = **created;
  std::mt19937 rng(99);
  std::map<RequestId, std::vector<int32_t>> expected;
  RequestId next_id = 1;
  for (int g = 0; g < 16; ++g) {
    RequestSpec spec;
    spec.id = next_id++;
    const int len = 1 + int(rng() % 700);
    for (int i = 0; i < len; ++i) spec.prompt.push_back(int32_t(rng() % kVocab));
    spec.max_tokens = 1 + int(rng() % 80);
    spec.stop_token_ids = {3};
    for (int k = int(rng() % 4); k > 0; --k) spec.fork_ids.push_back(next_id++);
    expected[spec.id] = run_alone(spec, sc.max_model_len, kVocab);
    for (RequestId f : spec.fork_ids) {
      RequestSpec c = spec;
      c.id = f;
      expected[f] = run_alone(c, sc.max_model_len, kVocab);
    }
    ASSERT_TRUE(sched.add_request(spec).ok());
  }
  run_and_compare(sched, kc, expected);
  EXPECT_EQ(sched.kv_cache().n_free_blocks(), kc.n_blocks) << "blocks leaked";
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, SchedulerSim,
                         ::testing::Values(SimCase{16, true}, SimCase{16, false},
                                           SimCase{128, true}, SimCase{128, false}),
                         [](const auto& info) {
                           return "bs" + std::to_string(info.param.block_size) +
                                  (info.param.prefix_caching ? "_caching" : "_nocaching");
                         });

// Random configurations, arrivals, aborts and stop strings; every invariant checked after
// every schedule() and every update, and every surviving request still matches its solo
// run.
TEST(SchedulerProperty, RandomWorkloadsKeepInvariants) {
  int64_t total_steps = 0, total_preemptions = 0, total_hits = 0;
  for (uint32_t seed = 0; seed < 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto pick = [&](std::vector<int> v) { return v[rng() % v.size()]; };
    SchedulerConfig sc;
    sc.max_num_batched_tokens = pick({1, 3, 16, 64, 200});
    sc.max_num_seqs = pick({1, 2, 5, 16});
    sc.max_model_len = pick({40, 100, 300});
    kvcache::KvCacheConfig kc;
    kc.block_size = pick({1, 2, 4, 16, 128});
    const int min_blocks = (sc.max_model_len - 1 + kc.block_size - 1) / kc.block_size;
    kc.n_blocks = min_blocks + int(rng() % (min_blocks + 2));
    kc.enable_prefix_caching = rng() % 4 != 0;
    auto created = Scheduler::create(sc, kc);
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    Scheduler& sched = **created;
    FakeRunner runner(kc.n_blocks, kc.block_size, kVocab);

    std::map<RequestId, std::vector<int32_t>> expected;
    std::map<RequestId, size_t> n_outputs, n_prompt;
    std::vector<RequestId> live;
    std::vector<int32_t> base(sc.max_model_len);
    for (auto& t : base) t = int32_t(rng() % kVocab);
    RequestId next_id = 1, next_fork = 0;
    const int n_requests = 10 + int(rng() % 30);
    auto truth = [&](RequestId id) -> const std::vector<int32_t>& { return expected.at(id); };
    for (int step = 0;
         step < 5000 && (next_id <= RequestId(n_requests) || sched.has_unfinished_requests());
         ++step) {
      // Arrivals: some share a prefix of `base`; some are invalid and must be refused.
      while (next_id <= RequestId(n_requests) && rng() % 3 == 0) {
        RequestSpec spec;
        spec.id = next_id++;
        const int len = 1 + int(rng() % (sc.max_model_len + 5));
        const int shared = rng() % 2 ? int(rng() % (len + 1)) : 0;
        spec.prompt.assign(base.begin(), base.begin() + std::min(shared, sc.max_model_len));
        while (int(spec.prompt.size()) < len) spec.prompt.push_back(int32_t(rng() % kVocab));
        spec.max_tokens = 1 + int(rng() % 60);
        if (rng() % 2) spec.stop_token_ids = {int32_t(rng() % 16)};
        if (rng() % 4 == 0) {
          for (int k = 1 + int(rng() % 3); k > 0; --k)
            spec.fork_ids.push_back(1000000 + next_fork++);
        }
        Status st = sched.add_request(spec);
        if (len >= sc.max_model_len) {
          EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
          continue;
        }
        ASSERT_TRUE(st.ok()) << st.to_string();
        std::vector<RequestId> ids = spec.fork_ids;
        ids.push_back(spec.id);
        for (RequestId id : ids) {
          RequestSpec one = spec;
          one.id = id;
          expected[id] = run_alone(one, sc.max_model_len, kVocab);
          n_outputs[id] = 0;
          n_prompt[id] = spec.prompt.size();
          live.push_back(id);
        }
      }
      if (!sched.has_unfinished_requests()) continue;
      // Aborts (and stop strings) between steps.
      if (!live.empty() && rng() % 10 == 0) {
        const size_t k = rng() % live.size();
        ASSERT_TRUE(
            sched.finish_request(live[k], rng() % 2 ? FinishReason::kAbort : FinishReason::kStop)
                .ok());
        expected.erase(live[k]);
        live.erase(live.begin() + k);
      }
      if (!sched.has_unfinished_requests()) continue;
      SchedulerOutput out = sched.schedule();
      ASSERT_TRUE(check_plan(out, sched));
      // An abort during the step takes effect when it is applied.
      RequestId aborted_in_flight = 0;
      if (!live.empty() && rng() % 20 == 0) {
        const size_t k = rng() % live.size();
        aborted_in_flight = live[k];
        ASSERT_TRUE(sched.abort_request(aborted_in_flight).ok());
        live.erase(live.begin() + k);
      }
      std::vector<int32_t> sampled = runner.execute(out, truth);
      ASSERT_TRUE(runner.tables_match(out, sched));
      if (aborted_in_flight) expected.erase(aborted_in_flight);
      for (const RequestOutput& o : sched.update_from_output(out, sampled)) {
        ASSERT_NE(o.id, aborted_in_flight) << "a request aborted mid-step still produced a token";
        const std::vector<int32_t>& e = expected.at(o.id);
        const size_t pos = n_prompt[o.id] + n_outputs[o.id]++;
        ASSERT_LT(pos, e.size()) << "request " << o.id << " runs past its solo run";
        ASSERT_EQ(o.token, e[pos]) << "request " << o.id << " output " << pos - n_prompt[o.id];
        if (o.finish_reason) {
          EXPECT_EQ(pos + 1, e.size()) << "request " << o.id << " stops early";
          live.erase(std::find(live.begin(), live.end(), o.id));
        }
      }
      ASSERT_FALSE(sched.find(aborted_in_flight)) << "aborted request survived the step";
      Status st = sched.check_invariants();
      ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.to_string();
    }
    EXPECT_FALSE(sched.has_unfinished_requests()) << "work left after 5000 steps";
    EXPECT_EQ(sched.kv_cache().n_free_blocks(), kc.n_blocks) << "blocks leaked";
    EXPECT_TRUE(sched.check_invariants().ok());
    total_steps += sched.stats().n_steps;
    total_preemptions += sched.stats().n_preemptions;
    total_hits += sched.stats().kv.n_hit_tokens;
  }
  std::printf("%lld steps, %lld preemptions, %lld prefix tokens hit over all seeds\n",
              static_cast<long long>(total_steps), static_cast<long long>(total_preemptions),
              static_cast<long long>(total_hits));
  EXPECT_GT(total_preemptions, 0);
  EXPECT_GT(total_hits, 0);
}

}  // namespace
}  // namespace dserve::sched
