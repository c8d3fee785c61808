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

const char* rejection_name(ServerMetrics::Rejection r) {
  switch (r) {
    case ServerMetrics::Rejection::kMaxWaitingRequests: return "max_waiting_requests";
    case ServerMetrics::Rejection::kMaxConnections: return "max_connections";
    case ServerMetrics::Rejection::kNoWorkerThread: return "no_worker_thread";
  }
  return "";
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

// One engine's figures.
class ServerMetrics::Engine : public EngineObserver {
 public:
  // Buckets as vLLM's.
  Engine(std::mutex* mu, std::string labels)
      : mu_(mu),
        labels(std::move(labels)),
        ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
              7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
        itl({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0}),
        e2e({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
             120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {
    for (const char* r : {"stop", "length", "abort", "error"}) request_success[r] = 0;
  }

  void on_stats(const EngineStats& s) override {
    std::lock_guard<std::mutex> lock(*mu_);
    stats = s;
  }
  void on_tokens(int64_t n_prompt_tokens, int64_t n_generated_tokens) override {
    std::lock_guard<std::mutex> lock(*mu_);
    prompt_tokens += n_prompt_tokens;
    generation_tokens += n_generated_tokens;
  }
  void on_first_token(double seconds) override {
    std::lock_guard<std::mutex> lock(*mu_);
    ttft.observe(seconds);
  }
  void on_inter_token(double seconds) override {
    std::lock_guard<std::mutex> lock(*mu_);
    itl.observe(seconds);
  }
  void on_finished(const std::string& finish_reason, int n_prompt_tokens, int n_generated_tokens,
                   double seconds) override {
    std::lock_guard<std::mutex> lock(*mu_);
    ++request_success[finish_reason];
    e2e.observe(seconds);
  }
  void on_engine_lost(const std::string&) override {
    std::lock_guard<std::mutex> lock(*mu_);
    if (alive) ++losses;
    alive = false;
  }
  void on_engine_joined() override {
    std::lock_guard<std::mutex> lock(*mu_);
    alive = true;
  }

 private:
  std::mutex* const mu_;  // the ServerMetrics' mutex, which render() holds too

 public:
  // GUARDED_BY(*mu_), read by render().
  const std::string labels;  // model_name="...",engine="i"
  EngineStats stats;
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  std::map<std::string, int64_t> request_success;
  Histogram ttft, itl, e2e;
  bool alive = true;   // false once lost, until it joins again
  int64_t losses = 0;  // times it was lost
};

ServerMetrics::ServerMetrics(std::string model_name, int n_engines)
    : model_label_("model_name=\"" + escape_label(model_name) + "\"") {
  for (int i = 0; i < n_engines; ++i) {
    engines_.push_back(
        std::make_unique<Engine>(&mu_, model_label_ + ",engine=\"" + std::to_string(i) + "\""));
  }
}

ServerMetrics::~ServerMetrics() = default;

EngineObserver* ServerMetrics::engine(int i) { return engines_.at(i).get(); }

std::string ServerMetrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  // One family: its header, then one sample per engine.
  auto gauge = [&](const char* name, const char* help, auto value) {
    header(out, name, "gauge", help);
    for (const auto& e : engines_) out += fmt::format("{}{{{}}} {}\n", name, e->labels, number(value(*e)));
  };
  auto counter = [&](const char* name, const char* help, auto value) {
    header(out, std::string(name) + "_total", "counter", help);
    for (const auto& e : engines_) out += fmt::format("{}_total{{{}}} {}\n", name, e->labels, value(*e));
  };
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
        [](const Engine& e) { return static_cast<double>(e.stats.n_running); });
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
        [](const Engine& e) { return static_cast<double>(e.stats.n_waiting); });
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
        [](const Engine& e) {
          return e.stats.n_blocks > 0
                     ? 1.0 - static_cast<double>(e.stats.n_free_blocks) / e.stats.n_blocks
                     : 0.0;
        });
  counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
          [](const Engine& e) { return e.stats.n_prefix_queried_tokens; });
  counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
          [](const Engine& e) { return e.stats.n_prefix_hit_tokens; });
  counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
          [](const Engine& e) { return e.stats.n_preemptions; });
  counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.",
          [](const Engine& e) { return e.stats.spec.n_drafts; });
  counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
          [](const Engine& e) { return e.stats.spec.n_draft_tokens; });
  counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
          [](const Engine& e) { return e.stats.spec.n_accepted_tokens; });
  header(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Accepted tokens per draft position.");
  for (const auto& e : engines_) {
    const std::vector<int64_t>& per_pos = e->stats.spec.n_accepted_per_pos;
    for (size_t i = 0; i < per_pos.size(); ++i) {
      out += fmt::format("vllm:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n",
                         e->labels, i, per_pos[i]);
    }
  }
  counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
          [](const Engine& e) { return e.prompt_tokens; });
  counter("vllm:generation_tokens", "Number of generation tokens processed.",
          [](const Engine& e) { return e.generation_tokens; });
  header(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (const auto& e : engines_) {
    for (const auto& [reason, n] : e->request_success) {
      out += fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", e->labels,
                         reason, n);
    }
  }
  header(out, "vllm:time_to_first_token_seconds", "histogram",
         "Histogram of time to first token in seconds.");
  for (const auto& e : engines_) e->ttft.render(out, "vllm:time_to_first_token_seconds", e->labels);
  header(out, "vllm:inter_token_latency_seconds", "histogram",
         "Histogram of inter-token latency in seconds.");
  for (const auto& e : engines_) e->itl.render(out, "vllm:inter_token_latency_seconds", e->labels);
  header(out, "vllm:e2e_request_latency_seconds", "histogram",
         "Histogram of e2e request latency in seconds.");
  for (const auto& e : engines_) e->e2e.render(out, "vllm:e2e_request_latency_seconds", e->labels);
  gauge("dserve:engine_alive", "1 while the engine serves; 0 once it failed or was lost.",
        [](const Engine& e) { return e.alive ? 1.0 : 0.0; });
  counter("dserve:engine_losses", "Times the engine failed or was lost (a data-parallel engine's node "
          "stopped answering, or its engine stopped stepping).",
          [](const Engine& e) { return e.losses; });
  header(out, "dserve:engines_alive", "gauge", "Engines serving now, of all data-parallel engines.");
  out += fmt::format("dserve:engines_alive{{{}}} {}\n", model_label_,
                     std::count_if(engines_.begin(), engines_.end(), [](const auto& e) { return e->alive; }));
  header(out, "dserve:http_connections", "gauge", "Open HTTP connections.");
  out += fmt::format("dserve:http_connections{{{}}} {}\n", model_label_, n_connections_.load());
  header(out, "dserve:http_requests_rejected_total", "counter",
         "Requests answered 503 by the HTTP front end's limits.");
  for (Rejection r : {Rejection::kMaxWaitingRequests, Rejection::kMaxConnections,
                      Rejection::kNoWorkerThread}) {
    out += fmt::format("dserve:http_requests_rejected_total{{{},reason=\"{}\"}} {}\n", model_label_,
                       rejection_name(r), n_rejected_[static_cast<int>(r)].load());
  }
  return out;
}

ServerMetrics::Totals ServerMetrics::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  Totals t;
  for (const auto& e : engines_) {
    const EngineStats& s = e->stats;
    t.prompt_tokens += e->prompt_tokens;
    t.generation_tokens += e->generation_tokens;
    t.prefix_queried_tokens += s.n_prefix_queried_tokens;
    t.prefix_hit_tokens += s.n_prefix_hit_tokens;
    t.running += s.n_running;
    t.waiting += s.n_waiting;
    t.blocks += s.n_blocks;
    t.free_blocks += s.n_free_blocks;
    t.spec.n_drafts += s.spec.n_drafts;
    t.spec.n_draft_tokens += s.spec.n_draft_tokens;
    t.spec.n_accepted_tokens += s.spec.n_accepted_tokens;
    std::vector<int64_t>& pos = t.spec.n_accepted_per_pos;
    if (pos.size() < s.spec.n_accepted_per_pos.size()) pos.resize(s.spec.n_accepted_per_pos.size());
    for (size_t i = 0; i < s.spec.n_accepted_per_pos.size(); ++i) pos[i] += s.spec.n_accepted_per_pos[i];
  }
  return t;
}

void ServerMetrics::count_rejected(Rejection why) { ++n_rejected_[static_cast<int>(why)]; }

}  // namespace dserve::server
