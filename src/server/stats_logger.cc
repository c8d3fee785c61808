#include "server/stats_logger.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "base/log.h"

namespace dserve::server {

StatsLogger::StatsLogger(const ServerMetrics& metrics, double interval_s) : metrics_(metrics) {
  if (interval_s > 0) thread_ = std::thread([this, interval_s] { run(interval_s); });
}

StatsLogger::~StatsLogger() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string StatsLogger::lines(const ServerMetrics::Totals& a, const ServerMetrics::Totals& b,
                               double seconds) {
  const int64_t prompt = b.prompt_tokens - a.prompt_tokens;
  const int64_t generated = b.generation_tokens - a.generation_tokens;
  if (prompt == 0 && generated == 0 && b.running == 0 && b.waiting == 0) return "";
  const double dt = std::max(seconds, 1e-9);
  const int64_t queried = b.prefix_queried_tokens - a.prefix_queried_tokens;
  const int64_t hit = b.prefix_hit_tokens - a.prefix_hit_tokens;
  std::string out = fmt::format(
      "Avg prompt throughput: {:.1f} tokens/s, Avg generation throughput: {:.1f} tokens/s, "
      "Running: {} reqs, Waiting: {} reqs, KV cache usage: {:.1f}%, Prefix cache hit rate: "
      "{:.1f}%",
      prompt / dt, generated / dt, b.running, b.waiting,
      b.blocks > 0 ? 100.0 * static_cast<double>(b.blocks - b.free_blocks) / b.blocks : 0.0,
      queried > 0 ? 100.0 * static_cast<double>(hit) / queried : 0.0);
  const int64_t drafts = b.spec.n_drafts - a.spec.n_drafts;
  if (drafts <= 0) return out;
  const int64_t drafted = b.spec.n_draft_tokens - a.spec.n_draft_tokens;
  const int64_t accepted = b.spec.n_accepted_tokens - a.spec.n_accepted_tokens;
  std::string per_pos;
  for (size_t i = 0; i < b.spec.n_accepted_per_pos.size(); ++i) {
    const int64_t before = i < a.spec.n_accepted_per_pos.size() ? a.spec.n_accepted_per_pos[i] : 0;
    per_pos += fmt::format("{}{:.3f}", i == 0 ? "" : ", ",
                           static_cast<double>(b.spec.n_accepted_per_pos[i] - before) / drafts);
  }
  out += fmt::format(
      "\nSpecDecoding metrics: Mean acceptance length: {:.2f}, Accepted throughput: {:.2f} "
      "tokens/s, Drafted throughput: {:.2f} tokens/s, Accepted: {} tokens, Drafted: {} tokens, "
      "Per-position acceptance rate: {}, Avg Draft acceptance rate: {:.1f}%",
      1.0 + static_cast<double>(accepted) / drafts, accepted / dt, drafted / dt, accepted,
      drafted, per_pos, drafted > 0 ? 100.0 * static_cast<double>(accepted) / drafted : 0.0);
  return out;
}

void StatsLogger::run(double interval_s) {
  using Clock = std::chrono::steady_clock;
  ServerMetrics::Totals last = metrics_.totals();
  Clock::time_point last_time = Clock::now();
  const auto interval = std::chrono::duration<double>(interval_s);
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, interval, [this] { return stop_; })) {
    const ServerMetrics::Totals now = metrics_.totals();
    const Clock::time_point t = Clock::now();
    const std::string text = lines(last, now, std::chrono::duration<double>(t - last_time).count());
    size_t start = 0;
    while (start < text.size()) {  // one log record per line
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      DS_LOG_INFO("{}", text.substr(start, end - start));
      start = end + 1;
    }
    last = now;
    last_time = t;
  }
}

}  // namespace dserve::server
