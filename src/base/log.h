// Logging: a thin layer over spdlog so that modules do not depend on its API.
// Messages go to stderr. Thread-safe (spdlog's default logger is synchronised).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace dserve {

// "debug", "info", "warning", "error"; returns false for an unknown name.
bool set_log_level(std::string_view level);

}  // namespace dserve

#define DS_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define DS_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define DS_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define DS_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
