// The backend the micro-benchmarks run on, chosen by the environment:
// DSERVE_BENCH_ISA (scalar / avx2 / avx512; default: best available) and
// DSERVE_BENCH_THREADS (default: all cores).
//
// Thread-safety: made once, on first use; driven by the benchmark thread.
#pragma once

#include <cstdlib>
#include <memory>

#include "backend/backend.h"

namespace dserve {

inline Backend& bench_backend() {
  static std::unique_ptr<Backend> b = [] {
    CpuBackendOptions options;
    if (const char* isa = std::getenv("DSERVE_BENCH_ISA")) options.isa = isa;
    if (const char* n = std::getenv("DSERVE_BENCH_THREADS")) options.n_threads = std::atoi(n);
    options.check_memory = false;  // the benchmarks hand the ops host arrays
    return make_cpu_backend(options);
  }();
  return *b;
}

}  // namespace dserve
