#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace dserve::server {

namespace {
// Prometheus label values escape backslash, double quote and newline.
std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double v) { return fmt::format("{}", v); }

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}
}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name,
                       const std::string& labels) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, number(bounds_[i]),
                       cumulative);
  }
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, count_);
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, number(sum_));
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

// Buckets as vLLM's.
ServerMetrics::ServerMetrics(std::string model_name)
    : labels_("model_name=\"" + escape_label(model_name) + "\""),
      ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
            120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {
  for (const char* r : {"stop", "length", "abort", "error"}) request_success_[r] = 0;
}

void ServerMetrics::on_stats(const EngineStats& stats) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = stats;
}

void ServerMetrics::on_tokens(int64_t n_prompt_tokens, int64_t n_generated_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += n_prompt_tokens;
  generation_tokens_ += n_generated_tokens;
}

void ServerMetrics::on_first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void ServerMetrics::on_inter_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(seconds);
}

void ServerMetrics::on_finished(const std::string& finish_reason, int n_prompt_tokens,
                                int n_generated_tokens, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++request_success_[finish_reason];
  e2e_.observe(seconds);
}

std::string ServerMetrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    header(out, name, "gauge", help);
    out += fmt::format("{}{{{}}} {}\n", name, labels_, number(v));
  };
  auto counter = [&](const char* name, const char* help, int64_t v) {
    header(out, std::string(name) + "_total", "counter", help);
    out += fmt::format("{}_total{{{}}} {}\n", name, labels_, v);
  };
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
        stats_.n_running);
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
        stats_.n_waiting);
  const double usage =
      stats_.n_blocks > 0 ? 1.0 - static_cast<double>(stats_.n_free_blocks) / stats_.n_blocks
                          : 0.0;
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage);
  counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
          stats_.n_prefix_queried_tokens);
  counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
          stats_.n_prefix_hit_tokens);
  counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
          stats_.n_preemptions);
  counter("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt_tokens_);
  counter("vllm:generation_tokens", "Number of generation tokens processed.", generation_tokens_);
  header(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (const auto& [reason, n] : request_success_) {
    out += fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels_,
                       reason, n);
  }
  header(out, "vllm:time_to_first_token_seconds", "histogram",
         "Histogram of time to first token in seconds.");
  ttft_.render(out, "vllm:time_to_first_token_seconds", labels_);
  header(out, "vllm:inter_token_latency_seconds", "histogram",
         "Histogram of inter-token latency in seconds.");
  itl_.render(out, "vllm:inter_token_latency_seconds", labels_);
  header(out, "vllm:e2e_request_latency_seconds", "histogram",
         "Histogram of e2e request latency in seconds.");
  e2e_.render(out, "vllm:e2e_request_latency_seconds", labels_);
  return out;
}

}  // namespace dserve::server
