// FP8 block-quantised weights as DeepSeek ships them: a float8_e4m3fn tensor W
// [n_out, n_in] and, next to it, `<name>_scale_inv` [ceil(n_out / 128),
// ceil(n_in / 128)] (F32 or BF16) such that the real weight is W[i, j] *
// scale_inv[i / 128, j / 128] (quantization_config: {quant_method: fp8,
// weight_block_size: [128, 128]}).
//
// dserve converts such weights once, at load, to BF16 in owned memory: 2 bytes per
// weight instead of 1 (V3/R1: ~1.3 TB instead of ~0.7 TB). The block size is read
// from config.json's quantization_config and must agree with the scale tensor's
// shape; a missing scale tensor is an error naming the weight.
//
// Thread-safety: pure functions (a large conversion uses several threads internally).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "loader/model_files.h"
#include "tensor/tensor_view.h"

namespace dserve {

struct Fp8Converted {
  TensorView view;             // dtype BF16, same shape; data set by the owner
  std::vector<uint8_t> bytes;  // the BF16 values
};

// Converts the FP8 tensor `weight` named `name` (HF name ending in ".weight") of
// `files`, with its block scales, to BF16.
Result<Fp8Converted> convert_fp8_weight(const ModelFiles& files, const std::string& name,
                                        const TensorView& weight);

}  // namespace dserve
