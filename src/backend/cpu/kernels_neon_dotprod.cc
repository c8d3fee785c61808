// neon-dotprod kernels (ARMv8.2 SDOT: Kunpeng 920, Graviton 2+, Ampere Altra):
// kernels_arm_impl.h instantiated with this level's target flags
// (src/backend/CMakeLists.txt). Only called after run-time detection (HWCAP_ASIMDDP)
// says the CPU has SDOT.
#include "backend/cpu/kernels_arm_impl.h"

#if !defined(__ARM_FEATURE_DOTPROD)
#error "kernels_neon_dotprod.cc needs -march=armv8.2-a+dotprod"
#endif

namespace dserve::cpu {

const KernelTable& kernels_neon_dotprod() {
  static const KernelTable table = make_arm_table(CpuIsa::kNeonDotprod);
  return table;
}

}  // namespace dserve::cpu
