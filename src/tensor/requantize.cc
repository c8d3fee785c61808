#include "tensor/requantize.h"

#include <string>

#include "base/check.h"
#include "tensor/dequantize.h"
#include "tensor/quant_blocks.h"

namespace dserve {

std::optional<DType> kernel_dtype_for(DType t) {
  switch (t) {
    case DType::kQ5_0: return DType::kQ8_0;
    case DType::kQ5_1: return DType::kF32;
    default: return std::nullopt;
  }
}

void requantize_row(DType from, const void* src, void* dst, int64_t n) {
  switch (from) {
    case DType::kQ5_0: {
      DS_CHECK(n % kQK8 == 0);
      const auto* x = static_cast<const block_q5_0*>(src);
      auto* y = static_cast<block_q8_0*>(dst);
      for (int64_t b = 0; b < n / kQK8; ++b) {
        // Dequantising one element of this block at a time costs a call per value; the
        // bit layout is simple enough to unpack here: low nibbles from qs, the fifth
        // bit from the little-endian word qh.
        const uint32_t h = static_cast<uint32_t>(x[b].qh[0]) |
                           static_cast<uint32_t>(x[b].qh[1]) << 8 |
                           static_cast<uint32_t>(x[b].qh[2]) << 16 |
                           static_cast<uint32_t>(x[b].qh[3]) << 24;
        y[b].d = x[b].d;
        for (int j = 0; j < 16; ++j) {
          const int lo = (x[b].qs[j] & 0xF) | static_cast<int>((h >> j) & 1) << 4;
          const int hi = (x[b].qs[j] >> 4) | static_cast<int>((h >> (j + 16)) & 1) << 4;
          y[b].qs[j] = static_cast<int8_t>(lo - 16);
          y[b].qs[j + 16] = static_cast<int8_t>(hi - 16);
        }
      }
      return;
    }
    case DType::kQ5_1:
      dequantize_row(from, src, static_cast<float*>(dst), n);
      return;
    default:
      DS_CHECK_MSG(false, "requantize_row: %s is read by the kernels as it is",
                   std::string(dtype_name(from)).c_str());
  }
}

}  // namespace dserve
