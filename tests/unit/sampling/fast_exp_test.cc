#include "sampling/fast_exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

}  // namespace
}  // namespace dserve
