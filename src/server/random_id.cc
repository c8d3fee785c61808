#include "server/random_id.h"

#include <random>

namespace dserve::server {

std::string random_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s(prefix);
  for (int i = 0; i < 32; ++i) s += hex[rng() % 16];
  return s;
}

}  // namespace dserve::server
