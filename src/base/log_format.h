// Log line formats and per-request context for the logs of base/log.h (apart from it
// so that the many files including log.h do not see this).
//
// Thread-safety: set_log_format() at start-up, before other threads log;
// LogRequestScope is per thread.
#pragma once

#include <string>
#include <string_view>

namespace dserve {

// "text" (the default: `2026-01-01T12:00:00.000 info message`) or "json": one JSON
// object per line, {"timestamp", "level", "message"} and "request_id" while the
// logging thread serves a request (LogRequestScope), for log shippers such as ELK.
// Returns false for an unknown name.
bool set_log_format(std::string_view format);

// While alive, log lines from this thread carry `request_id` (json format).
class LogRequestScope {
 public:
  explicit LogRequestScope(std::string request_id);
  ~LogRequestScope();
  LogRequestScope(const LogRequestScope&) = delete;
  LogRequestScope& operator=(const LogRequestScope&) = delete;

 private:
  std::string previous_;
};

}  // namespace dserve
