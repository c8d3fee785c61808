// unix_now(): the wall clock in whole seconds since 1970, as OpenAI's `created` and
// `created_at` fields carry it.
//
// Thread-safety: safe from any thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace dserve::server {

inline int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace dserve::server
