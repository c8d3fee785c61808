// Reference (scalar) dequantisation of every DType to float. This is the obviously
// correct path the fast kernels are tested against, and what embedding lookups use.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dserve {

// Converts `n` consecutive elements starting at `src` (which must be the start of a
// block) to float. n must be a multiple of the type's block size.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

}  // namespace dserve
