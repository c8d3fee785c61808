// ServerMetrics: the engine's and the server's counters in the Prometheus text format,
// under vLLM's metric names so that dashboards built for vLLM work unchanged:
//   gauges     vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
//   counters   vllm:prompt_tokens, vllm:generation_tokens, vllm:num_preemptions,
//              vllm:prefix_cache_queries, vllm:prefix_cache_hits,
//              vllm:spec_decode_num_drafts, vllm:spec_decode_num_draft_tokens,
//              vllm:spec_decode_num_accepted_tokens,
//              vllm:spec_decode_num_accepted_tokens_per_pos (label position),
//              vllm:request_success{finished_reason="stop"|"length"|"abort"|"error"}
//   histograms vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
//              vllm:e2e_request_latency_seconds
// the engines' liveness (data parallelism: engine/dp_engine_client.h):
//   dserve:engine_alive (gauge, per engine: 1 serving, 0 failed or lost),
//   dserve:engine_losses_total (counter, per engine), dserve:engines_alive (gauge: how many serve),
// and the HTTP front end's own (vLLM has none for these):
//   dserve:http_connections (gauge: open connections),
//   dserve:http_requests_rejected_total{reason="max_waiting_requests"|"max_connections"|
//                                       "no_worker_thread"} (counter: answered 503)
// The token counters move every engine step (as vLLM's), so their rate is right
// during long generations too. Every sample carries model_name and, as vLLM's, the
// data-parallel rank of its engine (engine="0", engine="1", ...): one series per engine,
// which add up to the server's totals. Counters are exposed as <name>_total, TYPE line
// included, as prometheus_client writes them in the text format 0.0.4.
//
// Thread-safety: each engine's EngineObserver callbacks run on its engine thread (or,
// for a remote engine, on the data-parallel client's I/O thread), render() on HTTP
// threads; one mutex guards everything.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
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

class ServerMetrics {
 public:
  explicit ServerMetrics(std::string model_name, int n_engines = 1);
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // The observer of engine (data-parallel rank) i, 0 <= i < n_engines.
  EngineObserver* engine(int i);

  // The HTTP front end's figures; any thread.
  enum class Rejection { kMaxWaitingRequests, kMaxConnections, kNoWorkerThread };
  void count_rejected(Rejection why);
  void add_connections(int64_t delta) { n_connections_ += delta; }

  // The exposition text served at GET /metrics.
  std::string render() const;

  // Every engine's figures added up (the periodic log line's source).
  struct Totals {
    int64_t prompt_tokens = 0, generation_tokens = 0;
    int64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;
    int running = 0, waiting = 0;
    int64_t blocks = 0, free_blocks = 0;
    SpecDecodeStats spec;
  };
  Totals totals() const;

 private:
  class Engine;
  const std::string model_label_;  // model_name="..."
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Engine>> engines_;  // their state is GUARDED_BY(mu_)
  std::atomic<int64_t> n_connections_{0};
  std::atomic<int64_t> n_rejected_[3] = {};  // by Rejection
};

}  // namespace dserve::server
