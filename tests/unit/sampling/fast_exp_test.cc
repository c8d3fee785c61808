#include "sampling/fast_exp.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace dserve {
namespace {

TEST(FastExpTest, MatchesStdExpToFloatPrecision) {
  std::vector<float> in;
  for (float y = -90.0f; y <= 0.0f; y += 0.0007f) in.push_back(y);
  in.push_back(0.0f);
  std::vector<float> out(in.size());
  exp_weights(in, 0.0f, 1.0f, out);
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] > -87.0f) {
      const double want = std::exp(static_cast<double>(in[i]));
      ASSERT_LE(std::abs(out[i] - want), 3e-7 * want) << in[i];
    } else {
      ASSERT_EQ(out[i], 0.0f) << in[i];  // below a normal float's range: exactly 0
    }
  }
  EXPECT_EQ(out.back(), 1.0f);
}

TEST(FastExpTest, ShiftsScalesAndZeroesMaskedLogits) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in = {3.0f, 1.0f, -inf, 2.5f};
  std::vector<float> out(4);
  exp_weights(in, 3.0f, 0.5f, out);  // T = 2
  EXPECT_FLOAT_EQ(out[0], 1.0f);
  EXPECT_FLOAT_EQ(out[1], std::exp(-1.0f));
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_FLOAT_EQ(out[3], std::exp(-0.25f));
}

// The AVX-512 copy must give the baseline's bits (a seeded request then samples the
// same tokens whichever copy runs): every float in [-100, 0] on a coarse grid, odd
// lengths (vector tails), masked logits and several temperatures.
TEST(FastExpTest, WidestCopyGivesTheBaselineBits) {
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> logit(-60.0f, 25.0f);
  for (size_t n : {1u, 15u, 17u, 1000u, 49157u}) {
    std::vector<float> in(n);
    for (float& x : in) x = logit(gen);
    in[n / 2] = -inf;
    in[0] = 25.0f;
    for (float inv_t : {1.0f, 0.5f, 1.25f, 10.0f}) {
      std::vector<float> base(n), wide(n);
      exp_weights_baseline(in, 25.0f, inv_t, base);
      if (!exp_weights_widest(in, 25.0f, inv_t, wide)) GTEST_SKIP() << "no wider copy here";
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), std::bit_cast<uint32_t>(base[i]))
            << "n " << n << " i " << i << " x " << in[i] << " inv_t " << inv_t;
      }
    }
  }
  std::vector<float> grid;
  for (float y = -100.0f; y <= 0.0f; y += 0.0003f) grid.push_back(y);
  std::vector<float> base(grid.size()), wide(grid.size());
  exp_weights_baseline(grid, 0.0f, 1.0f, base);
  ASSERT_TRUE(exp_weights_widest(grid, 0.0f, 1.0f, wide));
  for (size_t i = 0; i < grid.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), std::bit_cast<uint32_t>(base[i])) << grid[i];
  }
}

}  // namespace
}  // namespace dserve
