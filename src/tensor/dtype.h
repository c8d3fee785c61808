// DType: the element types a weight tensor can have, including GGUF's block
// quantisation formats. A quantised type packs `block_size` elements into
// `block_bytes` bytes; rows are always a whole number of blocks.
//
// Thread-safety: constants and pure functions only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dserve {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,  // 32 x int8, one f16 scale
  kQ4_0,  // 32 x 4-bit, one f16 scale, offset -8
  kQ4_1,  // 32 x 4-bit, f16 scale and f16 minimum
  kQ4_K,  // 256-element super-block, 8 sub-blocks with 6-bit scales/mins
  kQ5_K,  // as Q4_K plus a fifth bit per element
  kQ6_K,  // 256-element super-block, 16 sub-blocks with int8 scales
  // Symmetric int8 with one f32 scale per row (W8A8: compressed-tensors int-quantized,
  // per-channel weight_scale): w[r][j] = TensorView::row_scales[r] * q[r][j]. The
  // scales travel beside the data (TensorView), not inside the rows.
  kI8,
  // float8_e4m3fn (safetensors F8_E4M3), as DeepSeek ships its weights with separate
  // 128 x 128 block scales (TensorView::block_scales). Kept as it is by default, the
  // kernels converting inside (backend/cpu/kernels.h, MatmulF8Fn); --fp8-weights bf16
  // converts at load (model/fp8_weights.h).
  kF8_E4M3,
  // GGUF's 5-bit block types, which llama-quantize also writes where a K-quant does not
  // fit (rows not a multiple of 256: Q4_K falls back to Q5_0, Q5_K to Q5_1). Storage
  // only: ModelFiles converts them exactly at load (tensor/requantize.h); no kernel
  // reads them.
  kQ5_0,  // 32 x 5-bit, one f16 scale, offset -16
  kQ5_1,  // 32 x 5-bit, f16 scale and f16 minimum
  // Integer metadata of quantised checkpoints (msModelSlim's quant_bias, and deq_scale
  // where it holds float32 bits in an int64): read by the loader only
  // (loader/ascend_quant.h), never a weight; no kernel reads them.
  kI32,
  kI64,
};

struct DTypeInfo {
  std::string_view name;  // "f32", "q4_k", ...
  int block_size;         // elements per block (1 for plain types)
  int block_bytes;        // bytes per block
};

const DTypeInfo& dtype_info(DType t);
inline std::string_view dtype_name(DType t) { return dtype_info(t).name; }
inline bool is_quantized(DType t) { return dtype_info(t).block_size > 1; }

// Bytes taken by `n` consecutive elements; n must be a multiple of the block size.
size_t dtype_bytes(DType t, int64_t n);

// GGUF's ggml_type numbering (F32=0, F16=1, Q4_0=2, ... BF16=30). nullopt for a
// type dserve does not handle.
std::optional<DType> dtype_from_ggml_type(uint32_t ggml_type);
uint32_t ggml_type_of(DType t);

}  // namespace dserve
