// What the backend op tests run on: every instruction set this CPU supports, each with
// 1, 2 and 3 threads (3: uneven splits), as gtest parameters, and random inputs.
//
// Thread-safety: test helpers for one test thread.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_isa.h"

namespace dserve::test {

struct BackendConfig {
  cpu::CpuIsa isa;
  int n_threads;
};

inline std::string config_name(const testing::TestParamInfo<BackendConfig>& info) {
  std::string name(cpu::isa_name(info.param.isa));  // gtest names allow no '-'
  for (char& c : name) c = c == '-' ? '_' : c;
  return name + "_t" + std::to_string(info.param.n_threads);
}

inline std::vector<BackendConfig> all_configs() {
  std::vector<BackendConfig> out;
  for (cpu::CpuIsa isa : cpu::supported_isas()) {
    for (int n : {1, 2, 3}) out.push_back({isa, n});
  }
  return out;
}

inline std::unique_ptr<Backend> make_backend(const BackendConfig& c) {
  CpuBackendOptions options;
  options.n_threads = c.n_threads;
  options.isa = std::string(cpu::isa_name(c.isa));
  return make_cpu_backend(options);
}

// n values from N(0, sigma^2).
inline std::vector<float> random_floats(int64_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace dserve::test
