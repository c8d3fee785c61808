#include "base/log.h"
#include "base/log_format.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>

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

thread_local std::string t_request_id;

// Length of the valid UTF-8 sequence starting at s[i] (1-4), or 0 when invalid.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  }
  // Overlong forms, surrogates and code points past U+10FFFF are not valid UTF-8.
  if (n == 2 && c < 0xC2) return 0;
  if (n == 3 && ((c == 0xE0 && b(i + 1) < 0xA0) || (c == 0xED && b(i + 1) >= 0xA0))) return 0;
  if (n == 4 && ((c == 0xF0 && b(i + 1) < 0x90) || c > 0xF4 || (c == 0xF4 && b(i + 1) >= 0x90)))
    return 0;
  return n;
}

// Appends `s` as the body of a JSON string (quotes not included): control characters
// escaped, bytes that are not valid UTF-8 as U+FFFD, so every line parses as JSON.
void append_json_escaped(std::string_view s, spdlog::memory_buf_t& out) {
  static const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = utf8_length(s, i);
      if (n == 0) {
        out.append(std::string_view("\\ufffd"));
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"': out.append(std::string_view("\\\"")); break;
      case '\\': out.append(std::string_view("\\\\")); break;
      case '\n': out.append(std::string_view("\\n")); break;
      case '\r': out.append(std::string_view("\\r")); break;
      case '\t': out.append(std::string_view("\\t")); break;
      default:
        if (c < 0x20 || c == 0x7F) {
          const char esc[] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
          out.append(std::string_view(esc, sizeof esc));
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
}

// One JSON object per log line: what ELK's and Loki's JSON parsers read without a
// grok pattern.
class JsonFormatter : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using namespace std::chrono;
    const auto t = msg.time.time_since_epoch();
    const auto secs = duration_cast<seconds>(t);
    const auto ms = duration_cast<milliseconds>(t - secs).count();
    const std::time_t tt = static_cast<std::time_t>(secs.count());
    std::tm tm{};
    gmtime_r(&tt, &tm);
    char stamp[40];
    const size_t n = std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    std::snprintf(stamp + n, sizeof stamp - n, ".%03dZ", static_cast<int>(ms));
    dest.append(std::string_view("{\"timestamp\":\""));
    dest.append(std::string_view(stamp));
    dest.append(std::string_view("\",\"level\":\""));
    const auto level = spdlog::level::to_string_view(msg.level);
    dest.append(std::string_view(level.data(), level.size()));
    dest.append(std::string_view("\""));
    if (!t_request_id.empty()) {
      dest.append(std::string_view(",\"request_id\":\""));
      append_json_escaped(t_request_id, dest);
      dest.append(std::string_view("\""));
    }
    dest.append(std::string_view(",\"message\":\""));
    append_json_escaped(std::string_view(msg.payload.data(), msg.payload.size()), dest);
    dest.append(std::string_view("\"}\n"));
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

}  // namespace

LogRequestScope::LogRequestScope(std::string request_id) : previous_(std::move(t_request_id)) {
  t_request_id = std::move(request_id);
}

LogRequestScope::~LogRequestScope() { t_request_id = std::move(previous_); }

bool set_log_format(std::string_view format) {
  ensure_stderr_logger();
  if (format == "text") {
    spdlog::default_logger()->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  } else if (format == "json") {
    spdlog::default_logger()->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    return false;
  }
  return true;
}

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
