#include "cli/bench_serve.h"

#include <gtest/gtest.h>

#include <cmath>

#include "cli/bench_metrics.h"

namespace dserve::cli {
namespace {

// Mean and coefficient of variation of the gaps between arrivals.
std::pair<double, double> gap_stats(const std::vector<double>& t) {
  std::vector<double> gaps;
  for (size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i] - t[i - 1]);
  return {mean(gaps), stddev(gaps) / mean(gaps)};
}

TEST(ArrivalTimes, InfiniteRateSendsAllAtOnce) {
  const std::vector<double> t = arrival_times(5, INFINITY, 1.0, 0);
  EXPECT_EQ(t, std::vector<double>(5, 0.0));
}

TEST(ArrivalTimes, PoissonAndGammaAsVllm) {
  const int n = 20000;
  // Poisson: exponential gaps, mean 1/rate, CV 1; the first request at 0.
  std::vector<double> t = arrival_times(n, 4.0, 1.0, 1);
  EXPECT_EQ(t[0], 0.0);
  for (int i = 1; i < n; ++i) ASSERT_GE(t[i], t[i - 1]);
  auto [m, cv] = gap_stats(t);
  EXPECT_NEAR(m, 0.25, 0.25 * 4 / std::sqrt(n));
  EXPECT_NEAR(cv, 1.0, 0.05);
  // Gamma with shape = burstiness keeps the mean; CV = 1 / sqrt(burstiness).
  std::tie(m, cv) = gap_stats(arrival_times(n, 4.0, 0.25, 1));
  EXPECT_NEAR(m, 0.25, 0.25 * 4 * 2 / std::sqrt(n));
  EXPECT_NEAR(cv, 2.0, 0.15);
  std::tie(m, cv) = gap_stats(arrival_times(n, 4.0, 4.0, 1));
  EXPECT_NEAR(cv, 0.5, 0.03);
  // Same seed, same schedule.
  EXPECT_EQ(arrival_times(10, 2.0, 1.0, 9), arrival_times(10, 2.0, 1.0, 9));
}

}  // namespace
}  // namespace dserve::cli
