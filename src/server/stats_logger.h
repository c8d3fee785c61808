// StatsLogger: the periodic log line of a serving process, as vLLM's LoggingStatLogger
// writes it: every interval, throughput since the last line, running and waiting
// requests, KV cache usage and the prefix cache's hit rate; with speculative decoding,
// a second line with the mean acceptance length, accepted and drafted throughput and
// the per-position acceptance rate. Quiet while nothing runs and nothing moved.
//
// Thread-safety: owns one thread, which reads ServerMetrics::totals(); the destructor
// stops and joins it.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "server/metrics.h"

namespace dserve::server {

class StatsLogger {
 public:
  // interval_s <= 0: no thread, no lines. metrics must outlive the logger.
  StatsLogger(const ServerMetrics& metrics, double interval_s);
  ~StatsLogger();
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;

  // The lines for a change from `before` to `now` over `seconds` ("" when quiet).
  static std::string lines(const ServerMetrics::Totals& before, const ServerMetrics::Totals& now,
                           double seconds);

 private:
  void run(double interval_s);

  const ServerMetrics& metrics_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace dserve::server
