#include "sampling/batch_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <vector>

namespace dserve {
namespace {

constexpr int kVocab = 2000;

SamplingParams make(SamplingOptions o) {
  Result<SamplingParams> r = SamplingParams::create(std::move(o));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

// The logits a model would give sequence `seq` at step `step`: fixed pseudo-random
// rows, so that only the sampler decides what differs between runs.
std::vector<float> row_for(int seq, int step) {
  std::mt19937 gen(seq * 1000 + step);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> row(kVocab);
  for (float& x : row) x = normal(gen);
  return row;
}

// The request under test: seeded, with every processor on.
SamplingOptions probe_options() {
  return {.temperature = 0.8f,
          .top_p = 0.9f,
          .top_k = 50,
          .min_p = 0.02f,
          .repetition_penalty = 1.1f,
          .frequency_penalty = 0.3f,
          .presence_penalty = 0.2f,
          .seed = 1234,
          .max_tokens = 64,
          .logprobs = 3};
}

// Runs `n_steps` decode steps of a batch in which the probe request sits at
// `probe_slot` among `n_others` other requests; returns the probe's tokens.
std::vector<int32_t> run_probe(int n_others, int probe_slot, ThreadPool* pool, int n_steps) {
  std::vector<std::unique_ptr<SamplingState>> states;
  std::vector<int> seq_of;  // which logits stream each slot reads
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  for (int i = 0; i <= n_others; ++i) {
    if (i == probe_slot) {
      states.push_back(
          std::make_unique<SamplingState>(make(probe_options()), prompt, std::vector<int32_t>{}));
      seq_of.push_back(0);
    } else {
      // Others: a mix of greedy, unseeded and differently seeded requests.
      SamplingOptions o{
          .temperature = (i % 3 == 0) ? 0.0f : 1.0f, .top_k = i % 4, .max_tokens = 64};
      if (i % 2 == 0) o.seed = 77 + i;
      states.push_back(std::make_unique<SamplingState>(make(o), prompt, std::vector<int32_t>{},
                                                       /*unseeded_seed=*/i * 31 + n_others));
      seq_of.push_back(100 + i);
    }
  }
  BatchSampler sampler(pool);
  std::vector<int32_t> probe_tokens;
  for (int step = 0; step < n_steps; ++step) {
    std::vector<float> logits;
    std::vector<const SamplingState*> view;
    for (size_t i = 0; i < states.size(); ++i) {
      std::vector<float> row = row_for(seq_of[i], step);
      logits.insert(logits.end(), row.begin(), row.end());
      view.push_back(states[i].get());
    }
    std::vector<SampleResult> out(states.size());
    sampler.sample(logits, kVocab, view, out);
    for (size_t i = 0; i < states.size(); ++i) (void)states[i]->accept(out[i].token);
    probe_tokens.push_back(out[probe_slot].token);
    EXPECT_EQ(out[probe_slot].top_logprobs.size(), 3u);
  }
  return probe_tokens;
}

TEST(BatchSamplerTest, SeededRequestIndependentOfBatchAndThreads) {
  const int n_steps = 24;
  const std::vector<int32_t> alone = run_probe(0, 0, nullptr, n_steps);
  ThreadPool pool(4);
  EXPECT_EQ(run_probe(0, 0, &pool, n_steps), alone);
  EXPECT_EQ(run_probe(7, 3, nullptr, n_steps), alone);
  EXPECT_EQ(run_probe(7, 3, &pool, n_steps), alone);
  EXPECT_EQ(run_probe(15, 15, &pool, n_steps), alone);
  EXPECT_EQ(run_probe(31, 0, &pool, n_steps), alone);
  // Not trivially constant: the probe draws several different tokens.
  EXPECT_GT(std::set<int32_t>(alone.begin(), alone.end()).size(), 5u);
}

TEST(BatchSamplerTest, MatchesOneSamplerPerRow) {
  ThreadPool pool(3);
  BatchSampler batch(&pool);
  std::vector<std::unique_ptr<SamplingState>> states;
  std::vector<const SamplingState*> view;
  std::vector<float> logits;
  for (int i = 0; i < 10; ++i) {
    states.push_back(std::make_unique<SamplingState>(
        make({.temperature = 0.5f + 0.1f * i, .top_p = 0.95f, .seed = uint64_t(i)}),
        std::vector<int32_t>{}, std::vector<int32_t>{}));
    view.push_back(states.back().get());
    std::vector<float> row = row_for(i, 0);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  std::vector<SampleResult> out(10);
  batch.sample(logits, kVocab, view, out);
  Sampler single;
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(out[i].token, single.sample(*states[i], row_for(i, 0)).token) << i;
  }
}

TEST(BatchSamplerTest, LogitBiasIsPerRequest) {
  // Greedy requests over one row: those with a +100 bias on their own id get it, the
  // others the row's argmax, wherever they sit in the batch.
  const std::vector<float> row = row_for(0, 0);
  const int32_t best = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  ThreadPool pool(3);
  BatchSampler batch(&pool);
  std::vector<std::unique_ptr<SamplingState>> states;
  std::vector<const SamplingState*> view;
  std::vector<float> logits;
  for (int i = 0; i < 8; ++i) {
    SamplingOptions o{.temperature = 0.0f};
    if (i % 2 == 0) o.logit_bias = {{static_cast<int32_t>(10 + i), 100.0f}};
    states.push_back(std::make_unique<SamplingState>(make(o), std::vector<int32_t>{},
                                                     std::vector<int32_t>{}));
    view.push_back(states.back().get());
    logits.insert(logits.end(), row.begin(), row.end());
  }
  std::vector<SampleResult> out(8);
  batch.sample(logits, kVocab, view, out);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i].token, i % 2 == 0 ? 10 + i : best) << i;
}

}  // namespace
}  // namespace dserve
