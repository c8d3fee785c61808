// avx512 kernels: kernels_x86_impl.h instantiated with this level's target flags
// (src/backend/CMakeLists.txt). Only called after run-time detection says the CPU
// supports them.
#include "backend/cpu/kernels_x86_impl.h"

namespace dserve::cpu {

const KernelTable& kernels_avx512() {
  static const KernelTable table = make_x86_table(CpuIsa::kAvx512);
  return table;
}

}  // namespace dserve::cpu
