// neon kernels (ARMv8.0 Advanced SIMD): kernels_arm_impl.h instantiated with this
// level's target flags (src/backend/CMakeLists.txt). Every aarch64 CPU has them.
#include "backend/cpu/kernels_arm_impl.h"

#if defined(__ARM_FEATURE_DOTPROD)
#error "kernels_neon.cc must build without dotprod: it is the level for ARMv8.0 cores"
#endif

namespace dserve::cpu {

const KernelTable& kernels_neon() {
  static const KernelTable table = make_arm_table(CpuIsa::kNeon);
  return table;
}

}  // namespace dserve::cpu
