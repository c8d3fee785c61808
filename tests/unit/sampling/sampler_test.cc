#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "sampling/log_softmax.h"

namespace dserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

SamplingParams make(SamplingOptions o) {
  Result<SamplingParams> r = SamplingParams::create(std::move(o));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

// n draws from one sequence, accepting each token so that the RNG counter advances.
std::map<int32_t, int> histogram(SamplingOptions o, const std::vector<float>& logits, int n) {
  o.max_tokens = 1 << 30;
  SamplingState state(make(o), {}, {});
  Sampler sampler;
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) {
    const int32_t t = sampler.sample(state, logits).token;
    h[t]++;
    (void)state.accept(t);
  }
  return h;
}

std::vector<float> processed(const SamplingState& state, const std::vector<float>& logits) {
  Sampler sampler;
  std::vector<float> out(logits.size());
  sampler.processed_logits(state, logits, out);
  return out;
}

TEST(LogSoftmaxTest, MatchesDefinition) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, -1000.0f};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(log_sum_exp(x), lse, 1e-9);
  std::vector<float> out(4);
  log_softmax(x, out);
  EXPECT_NEAR(out[2], 3.0 - lse, 1e-6);
  EXPECT_NEAR(log_prob(x, 0), 1.0 - lse, 1e-9);
  EXPECT_EQ(argmax(x), 2);
  EXPECT_EQ(argmax(std::vector<float>{5.0f, 5.0f}), 0);  // lowest index on ties
}

TEST(SamplerTest, GreedyIsArgmax) {
  SamplingState state(make({.temperature = 0.0f}), {}, {});
  Sampler s;
  EXPECT_EQ(s.sample(state, std::vector<float>{0.1f, 3.0f, 2.9f}).token, 1);
}

// The penalty tests use this setup: prompt {0, 1, 1}, output so far {2, 2, 4}.
const std::vector<float> kLogits = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f};

SamplingState penalty_state(SamplingOptions o) {
  o.temperature = 0.0f;  // processed_logits then returns the penalised logits unscaled
  o.max_tokens = 100;
  SamplingState state(make(o), std::vector<int32_t>{0, 1, 1}, {});
  for (int32_t t : {2, 2, 4}) (void)state.accept(t);
  return state;
}

TEST(PenaltyTest, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  // Every id seen in prompt or output, once however often: 0 (prompt), 1 (prompt,
  // twice), 2 (output, twice), 4 (output). 3 and 5 were never seen.
  const float r = 2.0f;
  const std::vector<float> expected = {2.0f / r, -1.0f * r, 0.5f / r, 3.0f, -2.0f * r, 1.0f};
  EXPECT_EQ(processed(penalty_state({.repetition_penalty = r}), kLogits), expected);
  // A penalty < 1 favours repeats: the same rule with r = 0.5.
  const float q = 0.5f;
  const std::vector<float> favoured = {2.0f / q, -1.0f * q, 0.5f / q, 3.0f, -2.0f * q, 1.0f};
  EXPECT_EQ(processed(penalty_state({.repetition_penalty = q}), kLogits), favoured);
}

TEST(PenaltyTest, FrequencyAndPresenceCountOutputOnly) {
  // logit -= f * count + p * (count > 0), count over the output {2: 2, 4: 1} only;
  // prompt ids 0 and 1 are untouched.
  const float f = 0.5f, p = 0.25f;
  const std::vector<float> expected = {2.0f, -1.0f, 0.5f - (f * 2 + p), 3.0f, -2.0f - (f * 1 + p),
                                       1.0f};
  std::vector<float> got =
      processed(penalty_state({.frequency_penalty = f, .presence_penalty = p}), kLogits);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_FLOAT_EQ(got[i], expected[i]) << i;
  // Frequency alone, presence alone.
  got = processed(penalty_state({.frequency_penalty = f}), kLogits);
  EXPECT_FLOAT_EQ(got[2], 0.5f - f * 2);
  EXPECT_FLOAT_EQ(got[4], -2.0f - f * 1);
  got = processed(penalty_state({.presence_penalty = p}), kLogits);
  EXPECT_FLOAT_EQ(got[2], 0.5f - p);
  EXPECT_FLOAT_EQ(got[4], -2.0f - p);
  // Negative penalties (allowed down to -2) encourage repeats.
  got = processed(penalty_state({.frequency_penalty = -1.0f}), kLogits);
  EXPECT_FLOAT_EQ(got[2], 0.5f + 2.0f);
}

TEST(PenaltyTest, RepetitionThenFrequencyAndPresence) {
  // vLLM applies the repetition penalty first, then subtracts the others.
  const float r = 2.0f, f = 0.5f, p = 0.25f;
  const std::vector<float> expected = {
      2.0f / r, -1.0f * r, 0.5f / r - (f * 2 + p), 3.0f, -2.0f * r - (f * 1 + p), 1.0f};
  std::vector<float> got = processed(
      penalty_state({.repetition_penalty = r, .frequency_penalty = f, .presence_penalty = p}),
      kLogits);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_FLOAT_EQ(got[i], expected[i]) << i;
}

TEST(PenaltyTest, GreedyChoiceFollowsPenalisedLogits) {
  // Without penalty greedy picks 3; a presence penalty on output token 3 moves it to 0.
  SamplingState state(make({.temperature = 0.0f, .presence_penalty = 1.5f, .max_tokens = 9}), {},
                      {});
  Sampler s;
  EXPECT_EQ(s.sample(state, kLogits).token, 3);
  (void)state.accept(3);
  EXPECT_EQ(s.sample(state, kLogits).token, 0);  // 3 - 1.5 = 1.5 < 2
}

TEST(LogitBiasTest, AddedAfterMinTokensMaskingAndBeforePenalties) {
  // vLLM v1's order: min_tokens masking, then logit_bias, then the penalties. Id 0 (a
  // prompt id, logit 2) with bias -4 becomes -2, then the repetition penalty multiplies
  // it: -4 (penalising first would give 2 / 2 - 4 = -3). Id 3 (unseen) just gets +1.5.
  const float r = 2.0f;
  std::vector<float> got = processed(
      penalty_state({.repetition_penalty = r, .logit_bias = {{0, -4.0f}, {3, 1.5f}}}), kLogits);
  EXPECT_FLOAT_EQ(got[0], (2.0f - 4.0f) * r);
  EXPECT_FLOAT_EQ(got[3], 3.0f + 1.5f);
  EXPECT_FLOAT_EQ(got[5], 1.0f);  // neither biased nor seen
  // A stop id masked by min_tokens stays masked whatever its bias.
  SamplingState masked(
      make({.temperature = 0.0f, .logit_bias = {{1, 100.0f}}, .max_tokens = 9, .min_tokens = 2}),
      {}, std::vector<int32_t>{1});
  EXPECT_EQ(processed(masked, kLogits)[1], kNegInf);
}

TEST(LogitBiasTest, SteersGreedyAndSampledChoicesButNotTheRawLogprobs) {
  // Greedy: the argmax 3 banned (-100) gives the runner-up 0; +100 on 4 forces 4.
  Sampler s;
  SamplingState banned(make({.temperature = 0.0f, .logit_bias = {{3, -100.0f}}, .logprobs = 2}),
                       {}, {});
  SampleResult r = s.sample(banned, kLogits);
  EXPECT_EQ(r.token, 0);
  // Logprobs stay vLLM's raw_logprobs: the unbiased distribution, in which 3 is best.
  EXPECT_NEAR(r.logprob, log_prob(kLogits, 0), 1e-5);
  EXPECT_EQ(r.rank, 2);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].id, 3);
  SamplingState boosted(make({.temperature = 0.0f, .logit_bias = {{4, 100.0f}}}), {}, {});
  EXPECT_EQ(s.sample(boosted, kLogits).token, 4);
  // Sampling at temperature 1: a banned token never comes, a boosted one always does.
  const std::vector<float> flat = logits_of({0.25, 0.25, 0.25, 0.25});
  std::map<int32_t, int> h = histogram({.logit_bias = {{2, -100.0f}}, .seed = 3}, flat, 2000);
  EXPECT_EQ(h.count(2), 0u);
  EXPECT_EQ(h.size(), 3u);
  h = histogram({.logit_bias = {{1, 100.0f}}, .seed = 3}, flat, 500);
  EXPECT_EQ(h[1], 500);
  // A moderate bias shifts the odds as exp(bias) does: +log(3) on id 0 of four equal ids
  // gives it 3 / 6 of the mass.
  h = histogram({.logit_bias = {{0, static_cast<float>(std::log(3.0))}}, .seed = 5}, flat, 20000);
  EXPECT_NEAR(h[0] / 20000.0, 0.5, 0.015);
}

TEST(MinTokensTest, StopIdsMaskedUntilReached) {
  // eos (5) and a stop_token_id (3) have the best logits; greedy must avoid both for
  // the first min_tokens tokens and may pick them afterwards.
  std::vector<float> logits = {0.0f, 1.0f, 2.0f, 9.0f, 0.5f, 10.0f};
  SamplingState state(
      make({.temperature = 0.0f, .stop_token_ids = {3}, .max_tokens = 10, .min_tokens = 3}), {},
      std::vector<int32_t>{5});
  Sampler s;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(state.stop_ids_masked());
    const int32_t t = s.sample(state, logits).token;
    EXPECT_EQ(t, 2) << i;
    EXPECT_EQ(state.accept(t), std::nullopt);
  }
  EXPECT_FALSE(state.stop_ids_masked());
  const int32_t t = s.sample(state, logits).token;
  EXPECT_EQ(t, 5);
  EXPECT_EQ(state.accept(t), FinishReason::kStop);
}

TEST(MinTokensTest, IgnoreEosMasksAndStopsOnlyOnStopTokenIds) {
  std::vector<float> logits = {0.0f, 1.0f, 2.0f, 9.0f, 0.5f, 10.0f};
  SamplingState state(make({.temperature = 0.0f,
                            .stop_token_ids = {3},
                            .ignore_eos = true,
                            .max_tokens = 10,
                            .min_tokens = 1}),
                      {}, std::vector<int32_t>{5});
  Sampler s;
  EXPECT_EQ(s.sample(state, logits).token, 5);  // eos is an ordinary token now, not masked
  EXPECT_EQ(state.accept(5), std::nullopt);
  EXPECT_EQ(state.accept(3), FinishReason::kStop);
}

TEST(AcceptTest, LengthAndStop) {
  SamplingState state(make({.stop_token_ids = {7}, .max_tokens = 2}), {}, std::vector<int32_t>{9});
  EXPECT_EQ(state.accept(1), std::nullopt);
  EXPECT_EQ(state.accept(1), FinishReason::kLength);
  SamplingState s2(make({.stop_token_ids = {7}, .max_tokens = 5}), {}, std::vector<int32_t>{9});
  EXPECT_EQ(s2.accept(9), FinishReason::kStop);
  EXPECT_EQ(s2.n_output(), 1);
}

TEST(SeedTest, SameSeedSameStreamDifferentSeedDiffers) {
  std::vector<float> logits = logits_of({0.1, 0.2, 0.3, 0.4});
  auto draws = [&](std::optional<uint64_t> seed, uint64_t unseeded, int sample_index) {
    SamplingState state(make({.seed = seed, .max_tokens = 1000}), {}, {}, unseeded, sample_index);
    Sampler s;
    std::vector<int32_t> r;
    for (int i = 0; i < 64; ++i) {
      r.push_back(s.sample(state, logits).token);
      (void)state.accept(r.back());
    }
    return r;
  };
  EXPECT_EQ(draws(42, 0, 0), draws(42, 999, 0));  // the engine's entropy is unused when seeded
  EXPECT_NE(draws(42, 0, 0), draws(43, 0, 0));
  EXPECT_NE(draws(42, 0, 0), draws(42, 0, 1));  // n > 1 siblings differ
  EXPECT_NE(draws(std::nullopt, 1, 0), draws(std::nullopt, 2, 0));
}

TEST(SamplerTest, FrequenciesFollowSoftmax) {
  const int n = 40000;
  auto h = histogram({.seed = 1}, logits_of({0.1, 0.2, 0.3, 0.4}), n);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(h[i] / double(n), 0.1 * (i + 1), 0.01) << i;
}

TEST(SamplerTest, TemperatureScalesLogits) {
  // T = 2 samples softmax(log p / 2) ~ sqrt(p).
  const int n = 40000;
  auto h = histogram({.temperature = 2.0f, .seed = 2}, logits_of({0.1, 0.9}), n);
  const double expect1 = std::sqrt(0.9) / (std::sqrt(0.1) + std::sqrt(0.9));
  EXPECT_NEAR(h[1] / double(n), expect1, 0.01);
}

TEST(SamplerTest, TopKSamplesOnlyFromAllowedSet) {
  const int n = 20000;
  auto h = histogram({.top_k = 2, .seed = 3}, logits_of({0.1, 0.2, 0.3, 0.4}), n);
  EXPECT_EQ(h.count(0) + h.count(1), 0u);
  EXPECT_NEAR(h[2] / double(n), 3.0 / 7.0, 0.015);
  EXPECT_NEAR(h[3] / double(n), 4.0 / 7.0, 0.015);
}

TEST(SamplerTest, TopPSamplesOnlyFromSmallestNucleus) {
  // Sorted: 0.4, 0.3 (cumulative 0.7 >= 0.65): only ids 4 and 3 survive.
  const int n = 20000;
  auto h = histogram({.top_p = 0.65f, .seed = 5}, logits_of({0.05, 0.1, 0.15, 0.3, 0.4}), n);
  EXPECT_EQ(h.count(0) + h.count(1) + h.count(2), 0u);
  EXPECT_NEAR(h[3] / double(n), 3.0 / 7.0, 0.015);
  EXPECT_NEAR(h[4] / double(n), 4.0 / 7.0, 0.015);
}

TEST(SamplerTest, MinPKeepsTokensAboveFractionOfBest) {
  // min_p 0.5: keep p >= 0.5 * 0.4 = 0.2, i.e. ids 3 and 4.
  const int n = 20000;
  auto h = histogram({.min_p = 0.5f, .seed = 6}, logits_of({0.05, 0.1, 0.15, 0.3, 0.4}), n);
  EXPECT_EQ(h.count(0) + h.count(1) + h.count(2), 0u);
  EXPECT_NEAR(h[4] / double(n), 4.0 / 7.0, 0.015);
  // After temperature 2 the probabilities are ~ sqrt(p): the best is sqrt(0.4) = 0.632,
  // min_p 0.55 keeps sqrt(p) >= 0.348: ids 2 (0.387), 3 and 4.
  h = histogram({.temperature = 2.0f, .min_p = 0.55f, .seed = 6},
                logits_of({0.05, 0.1, 0.15, 0.3, 0.4}), n);
  EXPECT_EQ(h.count(0) + h.count(1), 0u);
  EXPECT_GT(h[2], 0);
}

TEST(SamplerTest, TopKThenTopPOverRenormalisedSet) {
  // top_p is measured on the distribution left by top_k, renormalised (vLLM, HF).
  // top_k 3 leaves {0.4, 0.3, 0.15}, renormalised {0.47, 0.35, 0.18}: top_p 0.8 is
  // reached after two (0.82). Without top_k, 0.4 + 0.3 = 0.7 < 0.8 needs three.
  const std::vector<float> logits = logits_of({0.05, 0.1, 0.15, 0.3, 0.4});
  auto kept = [&](SamplingOptions o) {
    SamplingState state(make(o), {}, {});
    std::vector<float> out = processed(state, logits);
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < 5; ++i) {
      if (out[i] != kNegInf) ids.push_back(i);
    }
    return ids;
  };
  EXPECT_EQ(kept({.top_p = 0.8f, .top_k = 3}), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(kept({.top_p = 0.8f}), (std::vector<int32_t>{2, 3, 4}));
  // Renormalised after top_k 2: 0.4/0.7 = 0.57 >= 0.55 keeps one id only.
  EXPECT_EQ(kept({.top_p = 0.55f, .top_k = 2}), (std::vector<int32_t>{4}));
  EXPECT_EQ(kept({.top_p = 0.55f}), (std::vector<int32_t>{3, 4}));
}

TEST(SamplerTest, TopPOverLargeVocabGrowsPrefix) {
  // 5000 equal tokens: top_p 0.5 needs 2500 of them (one more if rounding falls short),
  // far more than the first sorted prefix; equal logits are ordered by id.
  std::vector<float> logits(5000, 0.0f);
  auto h = histogram({.top_p = 0.5f, .seed = 9}, logits, 2000);
  EXPECT_LE(h.rbegin()->first, 2500);
}

TEST(SamplerTest, LowTemperatureSharpens) {
  auto h = histogram({.temperature = 0.05f, .seed = 11}, logits_of({0.45, 0.55}), 2000);
  EXPECT_GT(h[1], 1900);
}

TEST(LogprobsTest, RawLogprobsAndTopKEqualFullSortReference) {
  // A DeepSeek-V3-sized vocabulary with repeated values, so that ties are exercised.
  const int vocab = 129280;
  std::mt19937 gen(17);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = std::round(normal(gen) * 64.0f) / 64.0f;
  for (int i : {5, 77, 1000, 129279}) logits[i] = 20.0f;  // a four-way tie at the top

  SamplingState state(make({.temperature = 0.7f,
                            .top_p = 0.9f,
                            .repetition_penalty = 1.3f,
                            .seed = 4,
                            .max_tokens = 10,
                            .logprobs = kMaxLogprobs}),
                      std::vector<int32_t>{5, 77}, {});
  Sampler s;
  SampleResult r = s.sample(state, logits);

  // Reference: full sort of (logit desc, id asc), logprob = logit - logsumexp(raw).
  double max = *std::max_element(logits.begin(), logits.end()), sum = 0.0;
  for (float x : logits) sum += std::exp(x - max);
  const double lse = max + std::log(sum);
  std::vector<int32_t> order(vocab);
  for (int i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  ASSERT_EQ(r.top_logprobs.size(), static_cast<size_t>(kMaxLogprobs));
  for (int i = 0; i < kMaxLogprobs; ++i) {
    EXPECT_EQ(r.top_logprobs[i].id, order[i]) << i;
    EXPECT_NEAR(r.top_logprobs[i].logprob, logits[order[i]] - lse, 1e-5) << i;
  }
  // The sampled token's logprob is raw: before penalties (5 and 77 were penalised) and
  // temperature.
  EXPECT_NEAR(r.logprob, logits[r.token] - lse, 1e-5);
  int32_t rank = 0;
  for (float x : logits) rank += x >= logits[r.token];
  EXPECT_EQ(r.rank, rank);

  // logprobs = 0: the sampled token only.
  SamplingState none(make({.temperature = 0.0f, .logprobs = 0}), {}, {});
  r = s.sample(none, logits);
  EXPECT_EQ(r.token, 5);
  EXPECT_EQ(r.rank, 4);  // four ids share the best logit
  EXPECT_TRUE(r.top_logprobs.empty());
  EXPECT_NEAR(r.logprob, 20.0 - lse, 1e-5);
}

TEST(SamplerTest, TopKKeepsExactlyTheBestKBothSelectionPaths) {
  // k <= 4096 uses a bounded heap, larger k nth_element; both must keep exactly the
  // k best of a full sort (ties by lower id), here with many repeated logits.
  const int vocab = 20000;
  std::mt19937 gen(21);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = std::round(normal(gen) * 16.0f) / 16.0f;
  std::vector<int32_t> order(vocab);
  for (int i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int k : {1, 7, 4096, 4097, 12345}) {
    SamplingState state(make({.top_k = k}), {}, {});
    std::vector<float> out = processed(state, logits);
    std::vector<int32_t> kept;
    for (int32_t i = 0; i < vocab; ++i) {
      if (out[i] != kNegInf) kept.push_back(i);
    }
    std::vector<int32_t> want(order.begin(), order.begin() + k);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(kept, want) << "k=" << k;
  }
}

TEST(SamplerTest, SampledTokenIsAlwaysInProcessedSupport) {
  // Random logits, combined filters: every draw lies where processed_logits is finite.
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(3000);
  for (float& x : logits) x = normal(gen);
  SamplingState state(make({.temperature = 0.9f,
                            .top_p = 0.8f,
                            .top_k = 40,
                            .min_p = 0.05f,
                            .repetition_penalty = 1.2f,
                            .seed = 8,
                            .max_tokens = 1000}),
                      std::vector<int32_t>{1, 2, 3}, {});
  Sampler s;
  for (int i = 0; i < 300; ++i) {
    std::vector<float> support = processed(state, logits);
    const int32_t t = s.sample(state, logits).token;
    ASSERT_NE(support[t], kNegInf) << i;
    (void)state.accept(t);
  }
}

// A constraint over a fixed allowed set, "complete" after `complete_after` tokens.
class FixedConstraint : public TokenConstraint {
 public:
  FixedConstraint(std::vector<int32_t> allowed, int complete_after)
      : allowed_(std::move(allowed)), complete_after_(complete_after) {}
  void fill_allowed(std::span<uint64_t> bits) override {
    for (int32_t id : allowed_) bits[id >> 6] |= uint64_t{1} << (id & 63);
  }
  bool accept(int32_t token) override {
    if (std::find(allowed_.begin(), allowed_.end(), token) == allowed_.end()) return false;
    ++n_accepted;
    return true;
  }
  bool is_complete() const override { return n_accepted >= complete_after_; }
  int n_accepted = 0;

 private:
  std::vector<int32_t> allowed_;
  int complete_after_;
};

TEST(SamplerConstraintTest, OnlyAllowedIdsAndStopWhenComplete) {
  // 200 ids; the model prefers 0 (eos) and 1 strongly; the constraint allows 70 and 130.
  std::vector<float> logits(200, 0.0f);
  logits[0] = 9.0f;
  logits[1] = 8.0f;
  SamplingOptions o;
  o.temperature = 1.0f;
  o.max_tokens = 1000;
  o.logprobs = 2;
  const std::vector<int32_t> eos = {0};
  SamplingState state(make(o), {}, eos, /*unseeded_seed=*/7);
  auto* c = new FixedConstraint({70, 130}, /*complete_after=*/3);
  state.set_constraint(std::unique_ptr<TokenConstraint>(c));
  Sampler sampler;
  for (int i = 0; i < 3; ++i) {
    SampleResult r = sampler.sample(state, logits);
    EXPECT_TRUE(r.token == 70 || r.token == 130) << r.token;
    // Logprobs come from the masked logits, as in vLLM: two ids share the mass.
    EXPECT_NEAR(r.logprob, std::log(0.5), 1e-5);
    EXPECT_FALSE(state.accept(r.token).has_value());
  }
  EXPECT_EQ(c->n_accepted, 3);
  // Complete: eos (far more likely) is allowed now, and ends the sequence.
  SampleResult r = sampler.sample(state, logits);
  EXPECT_EQ(r.token, 0);
  EXPECT_EQ(state.accept(r.token), FinishReason::kStop);
  EXPECT_EQ(c->n_accepted, 3);  // stop ids do not advance the constraint
  EXPECT_FALSE(state.constraint_broken());
}

TEST(SamplerConstraintTest, BiasCannotReviveADisallowedId) {
  // The constraint allows 5 and 6; +100 on the disallowed 9 changes nothing, while a
  // bias between the allowed ids decides among them.
  std::vector<float> logits(64, 0.0f);
  logits[5] = 2.0f;
  SamplingState state(make({.temperature = 0.0f, .logit_bias = {{9, 100.0f}, {6, 5.0f}}}), {},
                      {});
  state.set_constraint(std::make_unique<FixedConstraint>(std::vector<int32_t>{5, 6}, 0));
  Sampler sampler;
  EXPECT_EQ(sampler.sample(state, logits).token, 6);
}

TEST(SamplerConstraintTest, MinTokensHoldsStopIdsBackUnlessNothingElseIsAllowed) {
  std::vector<float> logits(64, 0.0f);
  logits[2] = 5.0f;
  SamplingOptions o;
  o.temperature = 0.0f;
  o.min_tokens = 5;
  o.max_tokens = 10;
  const std::vector<int32_t> eos = {2};
  {
    SamplingState state(make(o), {}, eos);
    state.set_constraint(std::make_unique<FixedConstraint>(std::vector<int32_t>{9}, 0));
    Sampler sampler;
    EXPECT_EQ(sampler.sample(state, logits).token, 9);  // complete, but min_tokens
  }
  {
    // A dead end (nothing allowed, not complete): the stop id is the way out, even
    // before min_tokens.
    SamplingState state(make(o), {}, eos);
    state.set_constraint(std::make_unique<FixedConstraint>(std::vector<int32_t>{}, 1));
    Sampler sampler;
    EXPECT_EQ(sampler.sample(state, logits).token, 2);
  }
}

}  // namespace
}  // namespace dserve
