// FP8 block-quantised weights as DeepSeek ships them: a float8_e4m3fn tensor W
// [n_out, n_in] and, next to it, `<name>_scale_inv` [ceil(n_out / 128),
// ceil(n_in / 128)] (F32 or BF16) such that the real weight is W[i, j] *
// scale_inv[i / 128, j / 128] (quantization_config: {quant_method: fp8,
// weight_block_size: [128, 128]}).
//
// Two ways to hold them (--fp8-weights, ModelFiles::fp8_weights()):
//  - kept (the default): the FP8 bytes stay where the files are mapped, 1 byte per
//    weight, and read_fp8_block_scales() gives their scales in F32 to go beside them
//    (TensorView::block_scales); the kernels convert inside (backend/cpu/kernels.h,
//    MatmulF8Fn). V3/R1: ~0.7 TB.
//  - converted to BF16 once, at load (convert_fp8_weight, convert_fp8_to_bf16): 2 bytes
//    per weight (~1.3 TB), what dserve did before the kernels read FP8. A kept weight
//    that needs a transform (MLA's kv_b_proj, a tensor-parallel cut through a block)
//    is converted this way too.
// The block size is read from config.json's quantization_config and must agree with
// the scale tensor's shape; a missing scale tensor is an error naming the weight.
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

// The block scales of one FP8 weight, in F32, laid out as BlockScales expects (data
// pointing at `values` once the owner has put them where they stay).
struct Fp8Scales {
  std::vector<float> values;  // [ceil(n_out / block_rows), ceil(n_in / block_cols)]
  BlockScales layout;         // data null; stride = ceil(n_in / block_cols)
};

// The checked block scales of the FP8 tensor `weight` named `name` (an HF name ending
// in ".weight") of `files`: `<name>_scale_inv` must exist with the shape the block
// size implies, in F32, BF16 or F16.
Result<Fp8Scales> read_fp8_block_scales(const ModelFiles& files, const std::string& name,
                                        const TensorView& weight);

struct Fp8Converted {
  TensorView view;             // dtype BF16, same shape; data set by the owner
  std::vector<uint8_t> bytes;  // the BF16 values
};

// A 2-D FP8 view with its block scales attached -> BF16 values (round to nearest
// even of fp8 * scale).
Fp8Converted convert_fp8_to_bf16(const TensorView& weight);

// read_fp8_block_scales + convert_fp8_to_bf16.
Result<Fp8Converted> convert_fp8_weight(const ModelFiles& files, const std::string& name,
                                        const TensorView& weight);

}  // namespace dserve
