#include "backend/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "base/check.h"

namespace dserve::cpu {

ActFormat act_format_for(DType weight) {
  switch (weight) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8_E4M3:  // converted inside the kernel (MatmulF8Fn)
      return ActFormat::kF32;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
      return ActFormat::kQ8x32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return ActFormat::kQ8x256;
    case DType::kI8:
      return ActFormat::kQ8Token;
    case DType::kQ5_0:     // converted at load (tensor/requantize.h); no kernel
    case DType::kQ5_1:
    case DType::kI32:      // checkpoint metadata (loader/ascend_quant.h); no kernel
    case DType::kI64:
      break;
  }
  DS_CHECK_MSG(false, "bad dtype %d", static_cast<int>(weight));
  return ActFormat::kF32;
}

void quantize_q8_token(const float* x, int64_t k, float static_scale, uint8_t* out,
                       int static_offset) {
  int8_t* qs = reinterpret_cast<int8_t*>(out);
  float d = static_scale;
  float lo = -127.0f;
  if (static_scale == 0.0f) {
    float amax = 0.0f;
    for (int64_t i = 0; i < k; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    d = amax / 127.0f;
    lo = -128.0f;  // never reached: |x * (1 / d)| rounds to at most 127
  }
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const auto offset = static_cast<float>(static_offset);  // 0 for per token
  for (int64_t i = 0; i < k; ++i) {
    qs[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * id) + offset, lo, 127.0f));
  }
  std::memcpy(out + round_up(k, kActAlign), &d, 4);
}

void q8x32_copy_to_tiles(const uint8_t* row, int64_t k, int64_t t, int64_t tile, uint8_t* tiles) {
  const Q8x32Row r = q8x32_row(row, k);
  const int64_t nb = k / 32;
  const int64_t block_bytes = q8x32_tile_block_bytes(tile);
  uint8_t* base = tiles + t / tile * nb * block_bytes + 4 * (t % tile);
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* qs = r.qs + 32 * b;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) sum += qs[i];
    store_q8x32_tile_slot(base + b * block_bytes, tile, qs, r.d[b], r.s[b], sum);
  }
}

void q8x32_widen_tile(const uint8_t* one, int64_t k, int64_t tile, uint8_t* out) {
  constexpr int kWords = static_cast<int>(q8x32_tile_block_bytes(1) / 4);  // per block
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint8_t* from = one + b * q8x32_tile_block_bytes(1);
    uint8_t* to = out + b * q8x32_tile_block_bytes(tile);
    for (int i = 0; i < kWords; ++i) std::memcpy(to + 4 * i * tile, from + 4 * i, 4);
  }
}

void q8x32_quantize_to_tiles_generic(const float* x, int64_t k, int64_t t, int64_t tile,
                                     uint8_t* tiles) {
  // A row on the stack for the usual k; larger rows take the heap (rare: no level
  // without its own fused quantiser has batched kernels).
  constexpr int64_t kStackRow = 4096;
  const int64_t bytes = act_row_bytes(ActFormat::kQ8x32, k);
  alignas(64) uint8_t stack_row[kStackRow];
  std::vector<uint8_t> heap_row(bytes > kStackRow ? bytes : 0);
  uint8_t* row = bytes > kStackRow ? heap_row.data() : stack_row;
  kernels_scalar().quantize_q8x32(x, k, row);
  q8x32_copy_to_tiles(row, k, t, tile, tiles);
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
    case CpuIsa::kNeon:
#if defined(DSERVE_CPU_ARM)
      return kernels_neon();
#else
      break;
#endif
    case CpuIsa::kNeonDotprod:
#if defined(DSERVE_CPU_ARM)
      return kernels_neon_dotprod();
#else
      break;
#endif
  }
  return kernels_scalar();
}

}  // namespace dserve::cpu
