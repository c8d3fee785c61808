#include "cli/bench_metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace dserve::cli {
namespace {

TEST(Percentile, MatchesNumpyLinearInterpolation) {
  // numpy.percentile([1, 2, 3, 4], p) for p = 0, 25, 50, 90, 99, 100.
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 25), 1.75);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
  EXPECT_DOUBLE_EQ(percentile({}, 99), 0.0);  // vLLM's np.percentile(x or 0, p)
}

TEST(Percentile, MeanAndPopulationStd) {
  const std::vector<double> v = {2, 4, 4, 4, 5, 5, 7, 9};
  EXPECT_DOUBLE_EQ(mean(v), 5.0);
  EXPECT_DOUBLE_EQ(stddev(v), 2.0);  // numpy's default ddof=0
  EXPECT_DOUBLE_EQ(mean(std::vector<double>{}), 0.0);
}

TEST(Labels, PythonStyle) {
  EXPECT_EQ(percentile_label(99), "99");
  EXPECT_EQ(percentile_label(99.9), "99.9");
  EXPECT_EQ(python_float_str(5), "5.0");
  EXPECT_EQ(python_float_str(0.25), "0.25");
  EXPECT_EQ(python_float_str(INFINITY), "inf");
}

TEST(Parse, GoodputAndMetricLists) {
  auto slos = parse_goodput({"ttft:500", "tpot:50.5"});
  ASSERT_TRUE(slos.ok()) << slos.status().to_string();
  EXPECT_EQ(*slos->ttft_ms, 500);
  EXPECT_EQ(*slos->tpot_ms, 50.5);
  EXPECT_FALSE(slos->e2el_ms.has_value());
  EXPECT_FALSE(parse_goodput({"itl:5"}).ok());
  EXPECT_FALSE(parse_goodput({"ttft"}).ok());
  EXPECT_FALSE(parse_goodput({"ttft:-1"}).ok());
  EXPECT_FALSE(parse_goodput({}).value().any());

  auto names = parse_percentile_metrics("ttft,tpot, e2el");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"ttft", "tpot", "e2el"}));
  EXPECT_FALSE(parse_percentile_metrics("ttft,latency").ok());
  auto ps = parse_metric_percentiles("50,90,99.9");
  ASSERT_TRUE(ps.ok());
  EXPECT_EQ(*ps, (std::vector<double>{50, 90, 99.9}));
  EXPECT_FALSE(parse_metric_percentiles("101").ok());
  EXPECT_FALSE(parse_metric_percentiles("x").ok());
}

RequestOutcome ok_request(int prompt_len, int out, double ttft, double latency,
                          std::vector<double> itl) {
  RequestOutcome r;
  r.success = true;
  r.prompt_len = prompt_len;
  r.output_tokens = out;
  r.ttft = ttft;
  r.latency = latency;
  r.itl = std::move(itl);
  return r;
}

TEST(CalculateMetrics, AsVllm) {
  std::vector<RequestOutcome> rs;
  rs.push_back(ok_request(10, 5, 0.1, 0.5, {0.1, 0.1, 0.1, 0.1}));  // tpot 0.1
  rs.push_back(ok_request(20, 1, 0.2, 0.2, {}));                    // no tpot
  RequestOutcome failed;
  failed.prompt_len = 30;
  failed.error = "HTTP 500";
  rs.push_back(failed);
  rs.push_back(ok_request(30, 3, 0.3, 0.7, {0.2, 0.2}));  // tpot 0.2
  GoodputSlos slos;
  slos.ttft_ms = 250;  // requests 0 and 1 pass
  slos.tpot_ms = 150;  // 0 (100 ms) and 1 (0: one token) pass, 3 fails
  const std::vector<double> ps = {50, 99};
  const BenchmarkMetrics m = calculate_metrics(rs, 2.0, ps, slos);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 60);  // failed requests do not count
  EXPECT_EQ(m.total_output, 9);
  EXPECT_EQ(m.output_lens, (std::vector<int>{5, 1, 0, 3}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.request_goodput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 4.5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 34.5);
  EXPECT_NEAR(m.ttft.mean_ms, 200, 1e-9);
  EXPECT_NEAR(m.ttft.median_ms, 200, 1e-9);
  EXPECT_NEAR(m.tpot.mean_ms, 150, 1e-9);  // only requests with > 1 token
  EXPECT_NEAR(m.itl.mean_ms, (0.4 + 0.4) / 6 * 1000, 1e-9);
  EXPECT_NEAR(m.e2el.mean_ms, (0.5 + 0.2 + 0.7) / 3 * 1000, 1e-9);
  ASSERT_EQ(m.ttft.percentiles_ms.size(), 2u);
  EXPECT_NEAR(m.ttft.percentiles_ms[1].second, 298, 1e-9);

  ReportInfo info;
  info.duration_s = 2.0;
  info.request_rate = INFINITY;
  info.has_goodput = true;
  info.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  const nlohmann::json j = result_json(m, info, rs);
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 1.0);
  EXPECT_TRUE(j.contains("p99_e2el_ms"));
  EXPECT_TRUE(j.contains("p50_itl_ms"));
  EXPECT_TRUE(j.contains("std_tpot_ms"));
  EXPECT_EQ(j["errors"][2], "HTTP 500");
  EXPECT_EQ(j["itls"].size(), 4u);

  const std::string table = format_result_table(m, info);
  EXPECT_NE(table.find("============ Serving Benchmark Result ============\n"), std::string::npos);
  EXPECT_NE(table.find("Successful requests:                     3         \n"), std::string::npos);
  EXPECT_NE(table.find("---------------Time to First Token----------------\n"), std::string::npos);
  EXPECT_NE(table.find("P99 TTFT (ms):                           298.00    \n"), std::string::npos);
  EXPECT_NE(table.find("Request goodput (req/s):"), std::string::npos);
  EXPECT_EQ(table.find("Request rate configured"), std::string::npos);  // inf: not shown
}

TEST(CalculateMetrics, AllFailedGivesZeros) {
  RequestOutcome failed;
  failed.error = "refused";
  const std::vector<RequestOutcome> rs = {failed, failed};
  const BenchmarkMetrics m = calculate_metrics(rs, 1.0, std::vector<double>{99}, GoodputSlos{});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.ttft.mean_ms, 0);
  EXPECT_EQ(m.ttft.percentiles_ms[0].second, 0);
}

}  // namespace
}  // namespace dserve::cli
