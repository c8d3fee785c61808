// Exact conversion of storage-only block types into types the kernels read.
//
// GGUF files can hold Q5_0 and Q5_1: llama-quantize writes them on purpose, and as the
// fallback for rows that are not a whole number of 256-element K-quant super-blocks
// (DeepSeek's attn_k_b with 128-element rows in every Q4_K_M file; models with a
// hidden size such as 576). Rather than a sixth family of kernels at every ISA level,
// they are converted once at load, without changing a single value:
//   Q5_0 -> Q8_0: the same f16 scale, q - 16 fits in int8 (34 instead of 22 bytes).
//   Q5_1 -> F32:  d * q + m has no int8 form with one scale; F32 holds exactly what
//                 the reference dequantiser computes (4 bytes per weight instead of
//                 0.75, so the loader reports it).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>

#include "tensor/dtype.h"

namespace dserve {

// The type `t` is converted to at load, or nullopt when kernels read `t` as it is.
std::optional<DType> kernel_dtype_for(DType t);

// Converts `n` elements (whole blocks) from `src` of type `from` into `dst`, of type
// kernel_dtype_for(from) (dtype_bytes(that type, n) bytes). Values are bit-identical
// to dequantize_row(from, ...).
void requantize_row(DType from, const void* src, void* dst, int64_t n);

}  // namespace dserve
