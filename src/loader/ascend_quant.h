// msModelSlim's W8A8 layout, as vllm-ascend reads it (--quantization ascend): a
// quant_model_description.json beside the safetensors naming every tensor's type,
//   {"model_quant_type": "W8A8_DYNAMIC", "model.layers.0.mlp.up_proj.weight":
//    "W8A8_DYNAMIC", ..., "lm_head.weight": "FLOAT"}
// (keys without a dot are metadata), and per quantised linear layer X the tensors
//   X.weight         I8  [n_out, n_in]  real weights: weight_scale * (q - weight_offset)
//   X.weight_scale   float [n_out, 1], [n_out] or [1]
//   X.weight_offset  float [n_out, 1], [n_out] or [1]  (integer values; 0 for symmetric)
// and, for static "W8A8" (one calibrated activation scale and zero point per tensor):
//   X.input_scale    float [1]   s
//   X.input_offset   I8 or float [1]  o: activations q = clamp(round(x / s) + o)
//   X.quant_bias     I32 [n_out]  qb
//   X.deq_scale      F32 [n_out] or [1] (or I64 holding float32 bits) = s * weight_scale
// where vllm-ascend computes y = deq_scale * (q · w + qb) (npu_quant_matmul; qb
// already holds -o * sum(w) and the layer's float bias over deq_scale). Scales and
// offsets of shape [1] are per tensor (msModelSlim writes them so for per-tensor weights). "W8A8_DYNAMIC"
// quantises activations per token, symmetric (scale max|x| / 127), as dserve's kI8.
//
// attach_ascend_quant() maps both onto dserve's kI8 weights (TensorView row_scales,
// input_scale, row_bias); see the .cc for why each mapping is exact. Any mismatch
// between the description and the files, an unknown type, a missing or misshapen
// tensor, or a zero or non-finite scale is an error naming the tensor.
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

// Storage for what attach_ascend_quant derives: float scales and biases, and int8
// weights rewritten with their offsets folded in. Must outlive the views.
struct AscendQuantStorage {
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<int8_t>> weights;
};

// Checks `description` (quant_model_description.json, `where` names it in errors)
// against `tensors` and attaches scales, zero points and biases to the I8 weights.
// Static layers with a float X.bias get it replaced by the exact folded bias.
Status attach_ascend_quant(const nlohmann::json& description, const std::string& where,
                           std::map<std::string, TensorView>* tensors,
                           AscendQuantStorage* storage);

}  // namespace dserve
