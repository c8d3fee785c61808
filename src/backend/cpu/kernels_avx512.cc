// avx512 kernels: kernels_x86_impl.h instantiated with this level's target flags
// (src/backend/CMakeLists.txt). Only called after run-time detection says the CPU
// supports them.
#include <cstdlib>
#include <string_view>

#include "backend/cpu/kernels_x86_impl.h"
// AVX-512-only batched matmul kernels, added to the shared table below.
#include "backend/cpu/kernels_avx512_gemm.h"
// AVX-512 K-quant (Q4_K, Q5_K, Q6_K) packed panels.
#include "backend/cpu/kernels_avx512_kquant.h"
// W8A8 (int8 x int8) kernels, shared by both x86 levels.
#include "backend/cpu/kernels_x86_w8a8.h"
// FP8 E4M3 kernels (converted in registers), shared by both x86 levels.
#include "backend/cpu/kernels_x86_fp8.h"

namespace dserve::cpu {

const KernelTable& kernels_avx512() {
  static const KernelTable table = [] {
    KernelTable t = make_x86_table(CpuIsa::kAvx512);
    add_avx512_batched(t);
    add_avx512_kquant(t);
    add_x86_w8a8(t);
    add_x86_fp8(t);
    // DSERVE_MLA_BF16=0 keeps the exact float step for FP8 latents (comparisons).
    const char* bf16 = std::getenv("DSERVE_MLA_BF16");
    if (__builtin_cpu_supports("avx512bf16") && !(bf16 && std::string_view(bf16) == "0")) {
      add_avx512_bf16(t);
    }
    return t;
  }();
  return table;
}

}  // namespace dserve::cpu
