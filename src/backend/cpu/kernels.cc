#include "backend/cpu/kernels.h"

#include <string>

#include "base/check.h"

namespace dserve::cpu {

ActFormat act_format_for(DType weight) {
  switch (weight) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return ActFormat::kF32;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
      return ActFormat::kQ8x32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return ActFormat::kQ8x256;
    case DType::kF8_E4M3:  // converted at load (model/fp8_weights.h); no kernel
      break;
  }
  DS_CHECK_MSG(false, "bad dtype %d", static_cast<int>(weight));
  return ActFormat::kF32;
}

const KernelTable& kernels_for(CpuIsa isa) {
  DS_CHECK_MSG(isa_supported(isa), "instruction set %s not supported here",
               std::string(isa_name(isa)).c_str());
  switch (isa) {
    case CpuIsa::kScalar:
      return kernels_scalar();
    case CpuIsa::kAvx2:
#if defined(DSERVE_CPU_X86)
      return kernels_avx2();
#else
      break;
#endif
    case CpuIsa::kAvx512:
#if defined(DSERVE_CPU_X86)
      return kernels_avx512();
#else
      break;
#endif
  }
  return kernels_scalar();
}

}  // namespace dserve::cpu
