// RoPE frequencies against values printed by transformers 5.24's
// modeling_rope_utils (ROPE_INIT_FUNCTIONS[rope_type](config)) for head_dim 32.
#include "model/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace dserve {
namespace {

RopeConfig base_rope(RopeScalingType type, double theta) {
  RopeConfig r;
  r.type = type;
  r.theta = theta;
  r.rotary_dim = 32;
  return r;
}

void expect_freqs(const RopeFrequencies& got, const std::vector<double>& want) {
  ASSERT_EQ(got.inv_freq.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got.inv_freq[i], want[i], 1e-6 * want[i]) << "pair " << i;
  }
}

TEST(RopeTest, DefaultIsThetaPower) {
  RopeFrequencies f = rope_frequencies(base_rope(RopeScalingType::kDefault, 10000.0));
  ASSERT_EQ(f.inv_freq.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    EXPECT_NEAR(f.inv_freq[i], std::pow(10000.0, -2.0 * i / 32), 1e-6 * f.inv_freq[i]);
  }
  EXPECT_EQ(f.attention_scaling, 1.0f);
}

TEST(RopeTest, LinearMatchesTransformers) {
  RopeConfig r = base_rope(RopeScalingType::kLinear, 500000.0);
  r.factor = 2.0;
  expect_freqs(rope_frequencies(r),
               {0.5, 0.220183313, 0.0969613791, 0.042698551, 0.0188030154, 0.00828022044,
                0.00364633254, 0.00160572305, 0.000707106723, 0.000311386219, 0.000137124094,
                6.03848712e-05, 2.65914787e-05, 1.17099989e-05, 5.15669262e-06, 2.27083524e-06});
}

TEST(RopeTest, Llama3MatchesTransformers) {
  RopeConfig r = base_rope(RopeScalingType::kLlama3, 10000.0);
  r.factor = 8.0;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position_embeddings = 256;
  RopeFrequencies f = rope_frequencies(r);
  expect_freqs(f, {1.0, 0.562341332, 0.316227764, 0.177827939, 0.100000001, 0.0282067824,
                   0.00661310693, 0.00222284929, 0.00124999997, 0.000702926656, 0.000395284733,
                   0.000222284929, 0.000125000006, 7.02926627e-05, 3.95284733e-05, 2.22284925e-05});
  EXPECT_EQ(f.attention_scaling, 1.0f);
}

TEST(RopeTest, YarnMatchesTransformers) {
  RopeConfig r = base_rope(RopeScalingType::kYarn, 10000.0);
  r.factor = 4.0;
  r.original_max_position_embeddings = 256;
  RopeFrequencies f = rope_frequencies(r);
  expect_freqs(f, {1.0, 0.502090454, 0.248464689, 0.120668955, 0.0571428537, 0.0261087008,
                   0.011293849, 0.00444569858, 0.00249999994, 0.00140585331, 0.000790569466,
                   0.000444569858, 0.000250000012, 0.000140585325, 7.90569466e-05, 4.44569851e-05});
  EXPECT_NEAR(f.attention_scaling, 1.138629436111989, 1e-6);
}

TEST(RopeTest, YarnWithMscaleMatchesTransformers) {
  RopeConfig r = base_rope(RopeScalingType::kYarn, 10000.0);
  r.factor = 4.0;
  r.original_max_position_embeddings = 256;
  r.beta_fast = 16;
  r.beta_slow = 2;
  r.mscale = 0.707;
  r.mscale_all_dim = 1.0;
  RopeFrequencies f = rope_frequencies(r);
  expect_freqs(f, {1.0, 0.562341332, 0.268793613, 0.124479562, 0.0549999997, 0.0224936493,
                   0.00790569466, 0.00444569858, 0.00249999994, 0.00140585331, 0.000790569466,
                   0.000444569858, 0.000250000012, 0.000140585325, 7.90569466e-05, 4.44569851e-05});
  EXPECT_NEAR(f.attention_scaling, 0.964326914892074, 1e-6);
}

TEST(RopeTest, TableHoldsScaledCosSin) {
  RopeConfig r = base_rope(RopeScalingType::kYarn, 10000.0);
  r.factor = 4.0;
  r.original_max_position_embeddings = 256;
  RopeCache cache(r, 100);
  const RopeTable& t = cache.table();
  ASSERT_EQ(t.rotary_dim, 32);
  ASSERT_EQ(t.n_positions, 100);
  const float scale = cache.frequencies().attention_scaling;
  for (int p : {0, 1, 57, 99}) {
    for (int i = 0; i < 16; ++i) {
      const double angle = double(cache.frequencies().inv_freq[i]) * p;
      EXPECT_NEAR(t.cos[p * 16 + i], std::cos(angle) * scale, 1e-5);
      EXPECT_NEAR(t.sin[p * 16 + i], std::sin(angle) * scale, 1e-5);
    }
  }
}

TEST(RopeTest, FreqFactorsDivide) {
  RopeConfig r = base_rope(RopeScalingType::kDefault, 10000.0);
  std::vector<float> factors(16, 1.0f);
  factors[15] = 8.0f;
  RopeCache cache(r, 4, factors);
  EXPECT_NEAR(cache.frequencies().inv_freq[15], std::pow(10000.0, -30.0 / 32) / 8, 1e-9);
}

}  // namespace
}  // namespace dserve
