// CpuIsa: the instruction-set levels the CPU kernels are compiled for, and run-time
// detection of the best one this machine supports. Each level has its own
// translation unit built with its own target flags (see src/backend/CMakeLists.txt),
// so one binary runs on any CPU of the architecture and picks its kernels at start.
//
// Levels (x86-64):
//   kScalar  plain C++, any CPU; the obviously-right path the others are tested against
//   kAvx2    AVX2 + FMA + F16C (Haswell, Zen 1 and later)
//   kAvx512  AVX-512 F/BW/VL/DQ + VNNI (Ice Lake, Zen 4 and later)
// Levels (aarch64):
//   kNeon         ARMv8.0 Advanced SIMD: every 64-bit ARM server (Cortex-A72 and later)
//   kNeonDotprod  ARMv8.2 with SDOT/UDOT (`asimddp`): Kunpeng 920, Graviton 2+, Ampere
//                 Altra
//
// Thread-safety: pure functions; detection runs once, thread-safely.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dserve::cpu {

enum class CpuIsa {
  kScalar,
  kAvx2,
  kAvx512,
  kNeon,
  kNeonDotprod,
};

// "scalar", "avx2", "avx512", "neon", "neon-dotprod"
std::string_view isa_name(CpuIsa isa);
std::optional<CpuIsa> parse_isa(std::string_view name);

// True when the kernels for `isa` are compiled in and this CPU can run them.
bool isa_supported(CpuIsa isa);

// The best supported level, detected once.
CpuIsa best_isa();

// Every supported level, scalar first.
std::vector<CpuIsa> supported_isas();

// The supported levels' names, comma-separated ("scalar, neon, neon-dotprod").
std::string supported_isas_text();

// OK when `name` is a level this build and CPU can run, else an error naming the levels
// this machine has (for --isa: refused up front, never a SIGILL later).
Status check_isa(std::string_view name);

}  // namespace dserve::cpu
