// ServerMetrics: the engine's and the server's counters in the Prometheus text format,
// under vLLM's metric names so that dashboards built for vLLM work unchanged:
//   gauges     vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
//   counters   vllm:prompt_tokens, vllm:generation_tokens, vllm:num_preemptions,
//              vllm:prefix_cache_queries, vllm:prefix_cache_hits,
//              vllm:request_success{finished_reason="stop"|"length"|"abort"|"error"}
//   histograms vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
//              vllm:e2e_request_latency_seconds
// The token counters move every engine step (as vLLM's), so their rate is right
// during long generations too. Every sample carries model_name. Counters are exposed as <name>_total, TYPE line
// included, as prometheus_client writes them in the text format 0.0.4.
//
// Thread-safety: the EngineObserver callbacks run on the engine thread, render() on
// HTTP threads; one mutex guards everything.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dserve/async_llm.h"

namespace dserve::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // The _bucket (cumulative, with +Inf), _sum and _count lines.
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; last: above every bound
  double sum_ = 0.0;
  int64_t count_ = 0;
};

class ServerMetrics : public EngineObserver {
 public:
  explicit ServerMetrics(std::string model_name);

  void on_stats(const EngineStats& stats) override;
  void on_tokens(int64_t n_prompt_tokens, int64_t n_generated_tokens) override;
  void on_first_token(double seconds_since_arrival) override;
  void on_inter_token(double seconds) override;
  void on_finished(const std::string& finish_reason, int n_prompt_tokens,
                   int n_generated_tokens, double seconds_since_arrival) override;

  // The exposition text served at GET /metrics.
  std::string render() const;

 private:
  const std::string labels_;  // model_name="..."

  mutable std::mutex mu_;
  EngineStats stats_;                                 // GUARDED_BY(mu_)
  int64_t prompt_tokens_ = 0;                         // GUARDED_BY(mu_)
  int64_t generation_tokens_ = 0;                     // GUARDED_BY(mu_)
  std::map<std::string, int64_t> request_success_;   // GUARDED_BY(mu_)
  Histogram ttft_, itl_, e2e_;                        // GUARDED_BY(mu_)
};

}  // namespace dserve::server
