// CpuIsa: the instruction-set levels the CPU kernels are compiled for, and run-time
// detection of the best one this machine supports. Each level has its own
// translation unit built with its own target flags (see src/backend/CMakeLists.txt),
// so one binary runs on any CPU of the architecture and picks its kernels at start.
//
// Levels (x86-64):
//   kScalar  plain C++, any CPU; the obviously-right path the others are tested against
//   kAvx2    AVX2 + FMA + F16C (Haswell, Zen 1 and later)
//   kAvx512  AVX-512 F/BW/VL/DQ + VNNI (Ice Lake, Zen 4 and later)
// aarch64 has only kScalar for now; NEON (+dotprod) kernels would be a kNeon level
// with a kernels_neon.cc built only on ARM.
//
// Thread-safety: pure functions; detection runs once, thread-safely.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace dserve::cpu {

enum class CpuIsa {
  kScalar,
  kAvx2,
  kAvx512,
};

std::string_view isa_name(CpuIsa isa);  // "scalar", "avx2", "avx512"
std::optional<CpuIsa> parse_isa(std::string_view name);

// True when the kernels for `isa` are compiled in and this CPU can run them.
bool isa_supported(CpuIsa isa);

// The best supported level, detected once.
CpuIsa best_isa();

// Every supported level, scalar first.
std::vector<CpuIsa> supported_isas();

}  // namespace dserve::cpu
