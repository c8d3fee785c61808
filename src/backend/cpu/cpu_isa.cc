#include "backend/cpu/cpu_isa.h"

namespace dserve::cpu {
namespace {

bool detect(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
#if defined(DSERVE_CPU_X86)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    case CpuIsa::kAvx512:
#if defined(DSERVE_CPU_X86)
      // __builtin_cpu_supports also checks that the OS saves the zmm state (XCR0).
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
      return false;
#endif
  }
  return false;
}

}  // namespace

std::string_view isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

std::optional<CpuIsa> parse_isa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (isa_name(isa) == name) return isa;
  }
  return std::nullopt;
}

bool isa_supported(CpuIsa isa) {
  static const bool supported[] = {detect(CpuIsa::kScalar), detect(CpuIsa::kAvx2),
                                   detect(CpuIsa::kAvx512)};
  return supported[static_cast<int>(isa)];
}

CpuIsa best_isa() {
  static const CpuIsa best = isa_supported(CpuIsa::kAvx512) ? CpuIsa::kAvx512
                             : isa_supported(CpuIsa::kAvx2) ? CpuIsa::kAvx2
                                                            : CpuIsa::kScalar;
  return best;
}

std::vector<CpuIsa> supported_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

}  // namespace dserve::cpu
