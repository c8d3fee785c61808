#include "base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace dserve {
namespace {

// Logs go to stderr: stdout carries generated text and JSON results.
struct StderrLoggerInstaller {
  StderrLoggerInstaller() {
    auto logger = spdlog::stderr_color_mt("dserve");
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
    spdlog::set_default_logger(std::move(logger));
  }
};

void ensure_stderr_logger() { static StderrLoggerInstaller installer; }

// Also installed at start-up for programs that never call set_log_level().
[[maybe_unused]] const bool kInstalled = (ensure_stderr_logger(), true);

}  // namespace

bool set_log_level(std::string_view level) {
  ensure_stderr_logger();
  if (level == "debug") spdlog::set_level(spdlog::level::debug);
  else if (level == "info") spdlog::set_level(spdlog::level::info);
  else if (level == "warning" || level == "warn") spdlog::set_level(spdlog::level::warn);
  else if (level == "error") spdlog::set_level(spdlog::level::err);
  else return false;
  return true;
}

}  // namespace dserve
