// compressed-tensors W8A8 checkpoints, as llmcompressor writes them and vLLM reads
// them: config.json's quantization_config {quant_method: "compressed-tensors",
// format: "int-quantized", config_groups: {...: {weights: int8 symmetric per
// channel, input_activations: int8 symmetric, per token at run time (dynamic) or
// one calibrated scale per tensor (static)}}, ignore: [...]}, and per quantised
// linear layer X the tensors
//   X.weight        I8  [n_out, n_in]
//   X.weight_scale  F32/BF16/F16 [n_out, 1] (strategy "channel") or [1] ("tensor")
//   X.input_scale   F32/BF16/F16 [1] or []   (static activations only)
// Layers on the ignore list (lm_head, say) are simply stored in float.
//
// attach_compressed_tensors() checks the config and gives every I8 weight view its
// row scales (and static input scale) as TensorView::row_scales / input_scale, so
// model code and the backend see one DType::kI8 weight whatever the file format.
// Formats and options dserve does not run (asymmetric zero points, other bit widths,
// packed or float formats, weight-only int8) are Unimplemented errors that say so;
// a missing or misshapen scale, or a zero or non-finite one, is an error naming the
// tensor.
//
// Thread-safety: a pure function of its arguments.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tensor/tensor_view.h"

namespace dserve {

// True if `config` (config.json) declares quant_method "compressed-tensors".
bool is_compressed_tensors(const nlohmann::json& config);

// Checks config.json's quantization_config (`where` names it in errors) and attaches
// the scales to the I8 weights in `tensors`; the float copies of the scales go to
// `scale_storage`, which must outlive the views.
Status attach_compressed_tensors(const nlohmann::json& config, const std::string& where,
                                 std::map<std::string, TensorView>* tensors,
                                 std::vector<std::vector<float>>* scale_storage);

}  // namespace dserve
