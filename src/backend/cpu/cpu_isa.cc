#include "backend/cpu/cpu_isa.h"

#if defined(DSERVE_CPU_ARM)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

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
    case CpuIsa::kNeon:
#if defined(DSERVE_CPU_ARM)
      return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
      return false;
#endif
    case CpuIsa::kNeonDotprod:
#if defined(DSERVE_CPU_ARM)
      return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0 && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
      return false;
#endif
  }
  return false;
}

constexpr CpuIsa kAllIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kNeon,
                               CpuIsa::kNeonDotprod};

}  // namespace

std::string_view isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kNeon: return "neon";
    case CpuIsa::kNeonDotprod: return "neon-dotprod";
  }
  return "?";
}

std::optional<CpuIsa> parse_isa(std::string_view name) {
  for (CpuIsa isa : kAllIsas) {
    if (isa_name(isa) == name) return isa;
  }
  return std::nullopt;
}

bool isa_supported(CpuIsa isa) {
  static const bool supported[] = {detect(CpuIsa::kScalar), detect(CpuIsa::kAvx2),
                                   detect(CpuIsa::kAvx512), detect(CpuIsa::kNeon),
                                   detect(CpuIsa::kNeonDotprod)};
  return supported[static_cast<int>(isa)];
}

CpuIsa best_isa() {
  static const CpuIsa best = isa_supported(CpuIsa::kAvx512)        ? CpuIsa::kAvx512
                             : isa_supported(CpuIsa::kAvx2)        ? CpuIsa::kAvx2
                             : isa_supported(CpuIsa::kNeonDotprod) ? CpuIsa::kNeonDotprod
                             : isa_supported(CpuIsa::kNeon)        ? CpuIsa::kNeon
                                                                   : CpuIsa::kScalar;
  return best;
}

std::vector<CpuIsa> supported_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : kAllIsas) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

std::string supported_isas_text() {
  std::string out;
  for (CpuIsa isa : supported_isas()) {
    if (!out.empty()) out += ", ";
    out += isa_name(isa);
  }
  return out;
}

}  // namespace dserve::cpu

namespace dserve::cpu {

Status check_isa(std::string_view name) {
  const std::optional<CpuIsa> isa = parse_isa(name);
  if (isa && isa_supported(*isa)) return Status();
  return invalid_argument("--isa " + std::string(name) + ": " +
                          (isa ? "not supported by this CPU" : "unknown instruction set") +
                          "; this machine has: " + supported_isas_text());
}

}  // namespace dserve::cpu
