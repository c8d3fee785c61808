// SpeculativeSampler: drafts verified against the target's distribution.
//
// The reference is the definition of speculative sampling (Leviathan et al. 2023,
// Chen et al. 2023; vLLM's rejection sampler): with a one-token draft d, the first
// emitted token is distributed as the target's p (softmax of the row), d is accepted
// with probability p(d), and on rejection the token is drawn from p without d,
// renormalised. The tests draw many times over a small vocabulary and compare the
// empirical frequencies with those probabilities, as vLLM's rejection-sampler test
// does; and they check that a seeded sequence emits, draw for draw, the tokens it
// would emit without drafts.
#include "sampling/speculative_sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "base/thread_pool.h"

namespace dserve {
namespace {

constexpr int kVocab = 6;

SamplingParams make(SamplingOptions o) {
  Result<SamplingParams> r = SamplingParams::create(std::move(o));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

std::vector<double> softmax(const std::vector<float>& logits) {
  double total = 0;
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp(double{logits[i]});
  for (double& x : p) x /= total;
  return p;
}

// Pearson's chi-square statistic of counts against probabilities p (n draws).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double x2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double want = p[i] * static_cast<double>(n);
    if (want > 0) x2 += (counts[i] - want) * (counts[i] - want) / want;
  }
  return x2;
}

// Chi-square critical value at significance 1e-4 for 5 degrees of freedom.
constexpr double kChi2Crit5 = 25.74;

TEST(SpeculativeSamplerTest, EmittedTokensFollowTheTargetDistribution) {
  // Two rows: after the last known token, and after the draft.
  const std::vector<float> row0 = {1.2f, 0.3f, -0.5f, 2.0f, 0.0f, -1.0f};
  const std::vector<float> row1 = {-0.2f, 1.5f, 0.4f, 0.1f, -1.3f, 0.9f};
  std::vector<float> logits(row0);
  logits.insert(logits.end(), row1.begin(), row1.end());
  const std::vector<double> p0 = softmax(row0), p1 = softmax(row1);
  const std::vector<int32_t> prompt = {1};
  const int32_t draft = 0;  // p0(draft) ~ 0.24: both outcomes are frequent

  SpeculativeSampler sampler;
  constexpr int64_t kDraws = 200000;
  std::vector<int64_t> first(kVocab, 0), correction(kVocab, 0), bonus(kVocab, 0);
  int64_t n_accepted = 0;
  for (int64_t i = 0; i < kDraws; ++i) {
    SamplingState state(make({.temperature = 1.0f, .seed = static_cast<uint64_t>(i),
                              .max_tokens = 8}),
                        prompt, std::vector<int32_t>{});
    SamplingState* states[] = {&state};
    const int32_t first_row[] = {0};
    const int32_t drafts_of_0[] = {draft};
    const std::span<const int32_t> drafts[] = {drafts_of_0};
    std::vector<SampleResult> out[1];
    sampler.sample(logits, kVocab, states, first_row, drafts, out);
    ASSERT_FALSE(out[0].empty());
    ++first[out[0][0].token];
    if (out[0][0].token == draft) {
      ++n_accepted;
      ASSERT_EQ(out[0].size(), 2u);  // the bonus token after the accepted draft
      ++bonus[out[0][1].token];
    } else {
      ASSERT_EQ(out[0].size(), 1u);  // the correction ends the step
      ++correction[out[0][0].token];
    }
    EXPECT_EQ(state.n_output(), static_cast<int64_t>(out[0].size()));
  }
  // The first token is distributed as p0, drafts or not.
  EXPECT_LT(chi_square(first, p0, kDraws), kChi2Crit5);
  // Acceptance with probability p0(draft): within 5 standard deviations.
  const double sd = std::sqrt(p0[draft] * (1 - p0[draft]) * kDraws);
  EXPECT_NEAR(static_cast<double>(n_accepted), p0[draft] * kDraws, 5 * sd);
  // A correction is drawn from norm(max(0, p0 - onehot(draft))).
  std::vector<double> residual = p0;
  residual[draft] = 0;
  for (double& x : residual) x /= 1 - p0[draft];
  EXPECT_EQ(correction[draft], 0);
  EXPECT_LT(chi_square(correction, residual, kDraws - n_accepted), kChi2Crit5);
  // After an accepted draft, the bonus token follows the next row.
  EXPECT_LT(chi_square(bonus, p1, n_accepted), kChi2Crit5);
}

// A seeded sequence with penalties, sampled one token per step without drafts, and
// the same sequence verifying drafts (right ones, a wrong one) emit the same tokens.
TEST(SpeculativeSamplerTest, SeededSequenceEmitsTheSameTokensAsWithoutDrafts) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  constexpr int kSteps = 24;
  std::vector<float> rows(kSteps * kVocab);
  for (float& x : rows) x = normal(gen);
  const SamplingOptions options = {.temperature = 0.9f, .top_p = 0.95f,
                                   .repetition_penalty = 1.2f, .frequency_penalty = 0.4f,
                                   .seed = 99, .max_tokens = 64, .logprobs = 2};
  const std::vector<int32_t> prompt = {2, 3};
  // Without drafts: one row per step.
  std::vector<int32_t> want;
  {
    SamplingState state(make(options), prompt, std::vector<int32_t>{});
    Sampler sampler;
    for (int t = 0; t < kSteps; ++t) {
      const int32_t token =
          sampler.sample(state, std::span<const float>(rows).subspan(t * kVocab, kVocab)).token;
      want.push_back(token);
      (void)state.accept(token);
    }
  }
  // With drafts: at each step up to 3 drafts, the right tokens except (every third
  // step) a wrong second one; the rows are those of the positions the step covers.
  ThreadPool pool(2);
  SpeculativeSampler sampler(&pool);
  SamplingState state(make(options), prompt, std::vector<int32_t>{});
  std::vector<int32_t> got;
  for (int step = 0; got.size() < static_cast<size_t>(kSteps) - 4; ++step) {
    const size_t at = got.size();
    std::vector<int32_t> drafts(want.begin() + at, want.begin() + at + 3);
    if (step % 3 == 0) drafts[1] = (drafts[1] + 1) % kVocab;
    std::span<const float> step_rows(rows.data() + at * kVocab, 4 * kVocab);
    SamplingState* states[] = {&state};
    const int32_t first_row[] = {0};
    const std::span<const int32_t> d[] = {drafts};
    std::vector<SampleResult> out[1];
    sampler.sample(step_rows, kVocab, states, first_row, d, out);
    ASSERT_EQ(out[0].size(), step % 3 == 0 ? 2u : 4u);
    for (const SampleResult& r : out[0]) got.push_back(r.token);
  }
  ASSERT_LE(got.size(), want.size());
  EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + got.size()));
}

// Greedy: drafts are kept while they equal the argmax; sequences without drafts, and
// rows in any order, mix in one call.
TEST(SpeculativeSamplerTest, GreedyKeepsDraftsWhileTheyAreTheArgmax) {
  // Rows: seq A (no drafts) row 0; seq B rows 1..3 (2 drafts).
  const std::vector<float> logits = {
      0, 5, 0, 0, 0, 0,   // A: argmax 1
      0, 0, 7, 0, 0, 0,   // B after its last token: argmax 2
      0, 0, 0, 0, 9, 0,   // B after draft 1: argmax 4
      3, 0, 0, 0, 0, 0};  // B after draft 2: argmax 0
  const std::vector<int32_t> prompt = {1};
  SamplingState a(make({.temperature = 0.0f}), prompt, std::vector<int32_t>{});
  SamplingState b(make({.temperature = 0.0f}), prompt, std::vector<int32_t>{});
  SamplingState* states[] = {&b, &a};
  const int32_t first_row[] = {1, 0};
  const std::vector<int32_t> b_drafts = {2, 5};  // the first right, the second wrong
  const std::span<const int32_t> drafts[] = {b_drafts, {}};
  std::vector<SampleResult> out[2];
  SpeculativeSampler sampler;
  sampler.sample(logits, kVocab, states, first_row, drafts, out);
  ASSERT_EQ(out[0].size(), 2u);
  EXPECT_EQ(out[0][0].token, 2);
  EXPECT_EQ(out[0][1].token, 4);  // the correction at the rejected draft
  ASSERT_EQ(out[1].size(), 1u);
  EXPECT_EQ(out[1][0].token, 1);
}

// A stop id among the accepted drafts ends the sequence there.
TEST(SpeculativeSamplerTest, StopIdEndsVerification) {
  const std::vector<float> logits = {0, 0, 9, 0, 0, 0,   // argmax 2 (the stop id)
                                     0, 9, 0, 0, 0, 0};  // would be 1
  const std::vector<int32_t> prompt = {1};
  const std::vector<int32_t> eos = {2};
  SamplingState s(make({.temperature = 0.0f}), prompt, eos);
  SamplingState* states[] = {&s};
  const int32_t first_row[] = {0};
  const std::vector<int32_t> d = {2};
  const std::span<const int32_t> drafts[] = {d};
  std::vector<SampleResult> out[1];
  SpeculativeSampler sampler;
  sampler.sample(logits, kVocab, states, first_row, drafts, out);
  ASSERT_EQ(out[0].size(), 1u);
  EXPECT_EQ(out[0][0].token, 2);
}

}  // namespace
}  // namespace dserve
