#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "sampling/log_softmax.h"

namespace dserve {
namespace {

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::map<int32_t, int> histogram(Sampler& s, const std::vector<float>& logits, int n) {
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) h[s.sample(logits)]++;
  return h;
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
  Sampler s(SamplingParams{.temperature = 0.0f});
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, 2.9f}), 1);
}

TEST(SamplerTest, ValidateRejectsBadValues) {
  EXPECT_FALSE((SamplingParams{.temperature = -1.0f}).validate().ok());
  EXPECT_FALSE((SamplingParams{.top_k = -2}).validate().ok());
  EXPECT_FALSE((SamplingParams{.top_p = 0.0f}).validate().ok());
  EXPECT_FALSE((SamplingParams{.top_p = 1.5f}).validate().ok());
  EXPECT_TRUE((SamplingParams{.temperature = 0.7f, .top_k = 40, .top_p = 0.9f}).validate().ok());
}

TEST(SamplerTest, SameSeedSameStream) {
  std::vector<float> logits = logits_of({0.1, 0.2, 0.3, 0.4});
  Sampler a(SamplingParams{.seed = 42}), b(SamplingParams{.seed = 42}),
      c(SamplingParams{.seed = 43});
  std::vector<int32_t> ra, rb, rc;
  for (int i = 0; i < 64; ++i) {
    ra.push_back(a.sample(logits));
    rb.push_back(b.sample(logits));
    rc.push_back(c.sample(logits));
  }
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
}

TEST(SamplerTest, FrequenciesFollowSoftmax) {
  std::vector<float> logits = logits_of({0.1, 0.2, 0.3, 0.4});
  Sampler s(SamplingParams{.seed = 1});
  const int n = 40000;
  auto h = histogram(s, logits, n);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(h[i] / double(n), 0.1 * (i + 1), 0.01) << i;
}

TEST(SamplerTest, TopKKeepsOnlyBest) {
  std::vector<float> logits = logits_of({0.1, 0.2, 0.3, 0.4});
  Sampler s(SamplingParams{.top_k = 2, .seed = 3});
  const int n = 20000;
  auto h = histogram(s, logits, n);
  EXPECT_EQ(h.count(0), 0u);
  EXPECT_EQ(h.count(1), 0u);
  EXPECT_NEAR(h[2] / double(n), 3.0 / 7.0, 0.015);
  EXPECT_NEAR(h[3] / double(n), 4.0 / 7.0, 0.015);
}

TEST(SamplerTest, TopPKeepsSmallestNucleus) {
  // Sorted: 0.4, 0.3 (cumulative 0.7 >= 0.65): only ids 3 and 2 survive.
  std::vector<float> logits = logits_of({0.1, 0.2, 0.3, 0.4});
  Sampler s(SamplingParams{.top_p = 0.65f, .seed = 5});
  auto h = histogram(s, logits, 10000);
  EXPECT_EQ(h.count(0) + h.count(1), 0u);
  EXPECT_GT(h[2], 0);
  EXPECT_GT(h[3], h[2]);
}

TEST(SamplerTest, TopPOverLargeVocabGrowsPrefix) {
  // 5000 equal tokens: top_p 0.5 needs 2500 of them (one more if rounding falls short),
  // far more than the first sorted prefix.
  std::vector<float> logits(5000, 0.0f);
  Sampler s(SamplingParams{.top_p = 0.5f, .seed = 9});
  for (int i = 0; i < 2000; ++i) EXPECT_LE(s.sample(logits), 2500);
}

TEST(SamplerTest, LowTemperatureSharpens) {
  std::vector<float> logits = logits_of({0.45, 0.55});
  Sampler s(SamplingParams{.temperature = 0.05f, .seed = 11});
  auto h = histogram(s, logits, 2000);
  EXPECT_GT(h[1], 1900);
}

}  // namespace
}  // namespace dserve
