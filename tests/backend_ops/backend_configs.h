// What the backend op tests run on: every instruction set this CPU supports, each with
// 1, 2 and 3 threads (3: uneven splits), as gtest parameters, and random inputs.
// Under emulation (`make test-arm64`, ~10-15x slower) the environment narrows them:
// DSERVE_TEST_ISAS=neon,neon-dotprod and DSERVE_TEST_THREADS=1,3 (comma lists). A level
// named there that this CPU lacks is still listed, so its tests fail instead of
// silently testing nothing.
//
// Thread-safety: test helpers for one test thread.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
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

// The comma-separated items of environment variable `name`; empty when unset.
inline std::vector<std::string> env_list(const char* name) {
  std::vector<std::string> out;
  const char* v = std::getenv(name);
  if (v == nullptr) return out;
  std::string item;
  for (const char* p = v;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!item.empty()) out.push_back(item);
      item.clear();
      if (*p == '\0') break;
    } else {
      item += *p;
    }
  }
  return out;
}

inline std::vector<BackendConfig> all_configs() {
  std::vector<cpu::CpuIsa> isas = cpu::supported_isas();
  if (const std::vector<std::string> names = env_list("DSERVE_TEST_ISAS"); !names.empty()) {
    isas.clear();
    for (const std::string& name : names) {
      const std::optional<cpu::CpuIsa> isa = cpu::parse_isa(name);
      if (!isa) throw std::invalid_argument("DSERVE_TEST_ISAS: unknown level " + name);
      isas.push_back(*isa);
    }
  }
  std::vector<int> threads = {1, 2, 3};
  if (const std::vector<std::string> ns = env_list("DSERVE_TEST_THREADS"); !ns.empty()) {
    threads.clear();
    for (const std::string& n : ns) threads.push_back(std::stoi(n));
  }
  std::vector<BackendConfig> out;
  for (cpu::CpuIsa isa : isas) {
    for (int n : threads) out.push_back({isa, n});
  }
  return out;
}

inline std::unique_ptr<Backend> make_backend(const BackendConfig& c) {
  CpuBackendOptions options;
  options.n_threads = c.n_threads;
  options.isa = std::string(cpu::isa_name(c.isa));
  options.check_memory = false;  // these tests hand the ops host arrays on purpose
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
