#include "base/log.h"

namespace dserve {

bool set_log_level(std::string_view level) {
  if (level == "debug") spdlog::set_level(spdlog::level::debug);
  else if (level == "info") spdlog::set_level(spdlog::level::info);
  else if (level == "warning" || level == "warn") spdlog::set_level(spdlog::level::warn);
  else if (level == "error") spdlog::set_level(spdlog::level::err);
  else return false;
  return true;
}

}  // namespace dserve
