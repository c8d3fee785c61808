// Metrics of an online serving benchmark, computed as vLLM's `vllm bench serve` does
// (benchmarks/serve.py: calculate_metrics): per-request TTFT, TPOT, ITL and E2E
// latency, their mean / median / std / percentiles (numpy's linear interpolation), the
// goodput under SLOs, the summary table it prints and the JSON fields it saves.
//
// Pure functions over plain data; thread-safety: none needed.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dserve::cli {

// What the client measured for one request. Times in seconds from the request's send.
struct RequestOutcome {
  bool success = false;
  int prompt_len = 0;       // input tokens, as the dataset counted them
  int output_tokens = 0;    // the server's usage.completion_tokens, else counted from the text
  double ttft = 0;          // first chunk with a choice
  double latency = 0;       // last chunk with a choice (E2EL)
  std::vector<double> itl;  // one per chunk with a choice after the first
  std::string generated_text;
  std::string error;  // empty on success
};

// Service-level objectives of --goodput, in milliseconds; a request is good when it
// meets every one given.
struct GoodputSlos {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

// "ttft:500" "tpot:50" "e2el:2000" -> SLOs; InvalidArgument names the bad item.
Result<GoodputSlos> parse_goodput(const std::vector<std::string>& items);
// "ttft,tpot,itl" -> the names, each one of ttft, tpot, itl, e2el.
Result<std::vector<std::string>> parse_percentile_metrics(const std::string& text);
// "50,90,99" -> percentiles in [0, 100].
Result<std::vector<double>> parse_metric_percentiles(const std::string& text);

// numpy.percentile(values, p) with the default linear interpolation; 0 when empty
// (as vLLM's np.percentile(x or 0, p)).
double percentile(std::vector<double> values, double p);
double mean(std::span<const double> values);    // 0 when empty
double stddev(std::span<const double> values);  // population (numpy's ddof=0); 0 when empty

// "99" for 99, "99.9" for 99.9: the key part of "p99_ttft_ms".
std::string percentile_label(double p);

struct MetricSummary {  // all in milliseconds
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};

struct BenchmarkMetrics {
  int completed = 0;
  int failed = 0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double request_throughput = 0;  // completed / duration
  double request_goodput = 0;     // good / duration
  double output_throughput = 0;
  double total_token_throughput = 0;
  MetricSummary ttft, tpot, itl, e2el;
  std::vector<int> output_lens;  // per request; 0 for failed ones
};

// As vLLM: TPOT = (latency - ttft) / (output_tokens - 1) over requests with more than
// one output token (counted as 0 against a TPOT SLO otherwise); ITLs pooled over all
// requests; failed requests count in no latency and in no token total.
BenchmarkMetrics calculate_metrics(std::span<const RequestOutcome> outcomes, double duration_s,
                                   std::span<const double> percentiles, const GoodputSlos& slos);

// What the summary reports besides the metrics.
struct ReportInfo {
  std::optional<int> max_concurrency;
  double request_rate = 0;  // +inf: all at once
  bool has_goodput = false;
  double duration_s = 0;
  std::vector<std::string> percentile_metrics;  // which of ttft, tpot, itl, e2el to show
};

// vLLM's table, from "==== Serving Benchmark Result ====" to the closing "====" line.
std::string format_result_table(const BenchmarkMetrics& m, const ReportInfo& info);

// vLLM's result fields: duration, completed, failed, totals, throughputs, goodput,
// per-request lists (input_lens, output_lens, ttfts, itls, generated_texts, errors) and
// mean/median/std/pNN of each shown metric (mean_ttft_ms, p99_tpot_ms, ...).
nlohmann::json result_json(const BenchmarkMetrics& m, const ReportInfo& info,
                           std::span<const RequestOutcome> outcomes);

// Python's str(float): "5.0", "0.5", "inf" (vLLM's result file names use it).
std::string python_float_str(double v);

// Speculative decoding's counters as a server's /metrics exposes them
// (vllm:spec_decode_*_total, summed over engines), and their change over a run.
struct SpecDecodeCounts {
  double drafts = 0, draft_tokens = 0, accepted_tokens = 0;
  std::vector<double> accepted_per_pos;  // by the position label

  SpecDecodeCounts minus(const SpecDecodeCounts& before) const;
};
// From the Prometheus text format; absent counters are 0.
SpecDecodeCounts parse_spec_decode_counts(const std::string& prometheus_text);
// vLLM's "Speculative Decoding" section: acceptance rate and length (1 + accepted
// drafts per draft), counts, per-position acceptance. Empty when no draft was made.
std::string format_spec_decode_table(const SpecDecodeCounts& run);
// The same as result fields (spec_decode_acceptance_length, ...); none without drafts.
void add_spec_decode_json(const SpecDecodeCounts& run, nlohmann::json* result);

}  // namespace dserve::cli
