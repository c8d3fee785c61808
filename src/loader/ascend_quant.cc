#include "loader/ascend_quant.h"

#include <cmath>
#include <cstring>
#include <set>

#include "tensor/dequantize.h"

namespace dserve {
namespace {

constexpr const char* kTypes[] = {"W8A8_DYNAMIC", "W8A8", "FLOAT"};

bool known_type(const std::string& t) {
  for (const char* k : kTypes) {
    if (t == k) return true;
  }
  return false;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The float values of a tensor of `n` values (shape [n], [n, 1], or [1] / [] for n = 1).
// per_tensor: one value ([1]) may stand for all n (msModelSlim's per-tensor weights).
Result<std::vector<float>> values(const std::string& where, const std::map<std::string, TensorView>& tensors,
                                  const std::string& name, int64_t n, const std::string& owner,
                                  bool per_tensor = false) {
  const auto it = tensors.find(name);
  if (it == tensors.end()) {
    return not_found(where + ": int8 tensor '" + owner + "' has no '" + name + "' (missing)");
  }
  const TensorView& t = it->second;
  if (per_tensor && n > 1 && t.n_elements() == 1 && t.n_dims() <= 2) {
    DS_ASSIGN_OR_RETURN(std::vector<float> one, values(where, tensors, name, 1, owner));
    return std::vector<float>(static_cast<size_t>(n), one[0]);
  }
  const bool shape_ok = t.n_elements() == n &&
                        (t.shape == std::vector<int64_t>{n} || t.shape == std::vector<int64_t>{n, 1} ||
                         (n == 1 && t.n_dims() == 0));
  if (!shape_ok) {
    std::string needs = "[1]";
    if (n != 1) {
      needs = shape_to_string({n, 1}) + " or " + shape_to_string({n});
    }
    return corrupt(where + ": tensor '" + name + "' has shape " + shape_to_string(t.shape) + " but '" + owner +
                   "' needs " + needs);
  }
  std::vector<float> v(static_cast<size_t>(n));
  if (t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16 || t.dtype == DType::kI8 ||
      t.dtype == DType::kI32) {
    dequantize_row(t.dtype, t.data, v.data(), n);
  } else if (t.dtype == DType::kI64 && ends_with(name, ".deq_scale")) {
    // float16 models: each int64 holds the float32 bits of the scale in its low word.
    for (int64_t i = 0; i < n; ++i) {
      int64_t word;
      std::memcpy(&word, static_cast<const uint8_t*>(t.data) + 8 * i, 8);
      const uint32_t bits = static_cast<uint32_t>(word & 0xffffffff);
      std::memcpy(&v[static_cast<size_t>(i)], &bits, 4);
    }
  } else {
    return corrupt(where + ": tensor '" + name + "' is " + std::string(dtype_name(t.dtype)) +
                   ", not a type it can have");
  }
  return v;
}

Status check_scales(const std::string& where, const std::string& name, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i]) || v[i] <= 0.0f) {
      return corrupt(where + ": tensor '" + name + "' has scale " + std::to_string(v[i]) + " at index " +
                     std::to_string(i) + "; scales must be finite and positive");
    }
  }
  return Status::Ok();
}

// Zero points must be whole numbers in int8's range.
Status check_offsets(const std::string& where, const std::string& name, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i]) || v[i] != std::nearbyint(v[i]) || v[i] < -128.0f || v[i] > 127.0f) {
      return corrupt(where + ": tensor '" + name + "' has offset " + std::to_string(v[i]) + " at index " +
                     std::to_string(i) + "; offsets must be integers in [-128, 127]");
    }
  }
  return Status::Ok();
}

}  // namespace

Status attach_ascend_quant(const nlohmann::json& description, const std::string& where,
                           std::map<std::string, TensorView>* tensors, AscendQuantStorage* storage) {
  if (!description.is_object()) return corrupt(where + " must be a JSON object");
  std::map<std::string, std::string> type_of;
  for (const auto& [key, value] : description.items()) {
    const bool is_tensor = key.find('.') != std::string::npos;
    if (!is_tensor) {  // metadata ("model_quant_type", "version", ...)
      if (key == "model_quant_type" && (!value.is_string() || !known_type(value.get<std::string>()))) {
        return unimplemented(where + ": model_quant_type " + value.dump() +
                             " (dserve reads W8A8_DYNAMIC, W8A8 and FLOAT)");
      }
      continue;
    }
    if (!value.is_string() || !known_type(value.get<std::string>())) {
      return unimplemented(where + ": tensor '" + key + "' has quant type " + value.dump() +
                           " (dserve reads W8A8_DYNAMIC, W8A8 and FLOAT)");
    }
    if (tensors->find(key) == tensors->end()) {
      return corrupt(where + " names tensor '" + key + "', which is not in the safetensors files");
    }
    type_of[key] = value.get<std::string>();
  }
  for (const auto& [name, t] : *tensors) {
    if (type_of.find(name) == type_of.end()) {
      return corrupt(where + " does not describe tensor '" + name + "' (every tensor must be listed)");
    }
  }

  std::set<std::string> consumed;  // metadata tensors, dropped once applied
  for (auto& [name, view] : *tensors) {
    const std::string& type = type_of[name];
    if (!ends_with(name, ".weight")) continue;
    const bool quantised = type != "FLOAT";
    if (quantised != (view.dtype == DType::kI8)) {
      return corrupt(where + ": tensor '" + name + "' is described as " + type + " but is " +
                     std::string(dtype_name(view.dtype)));
    }
    if (!quantised) continue;
    if (view.n_dims() != 2) {
      return corrupt(where + ": int8 tensor '" + name + "' of shape " + shape_to_string(view.shape) +
                     " is not a linear layer's 2-D weight");
    }
    const std::string base = name.substr(0, name.size() - std::string(".weight").size());
    const int64_t n_out = view.shape[0], n_in = view.shape[1];
    DS_ASSIGN_OR_RETURN(std::vector<float> scale, values(where, *tensors, base + ".weight_scale", n_out, name, true));
    DS_RETURN_IF_ERROR(check_scales(where, base + ".weight_scale", scale));
    DS_ASSIGN_OR_RETURN(std::vector<float> offset, values(where, *tensors, base + ".weight_offset", n_out, name, true));
    DS_RETURN_IF_ERROR(check_offsets(where, base + ".weight_offset", offset));
    bool any_offset = false;
    for (float o : offset) any_offset |= o != 0.0f;

    if (any_offset) {
      if (type == "W8A8") {  // vllm-ascend's static path multiplies by deq_scale and ignores it
        return unimplemented(where + ": tensor '" + base + ".weight_offset' is not zero; static W8A8 "
                             "with asymmetric weights is not supported");
      }
      // Real weights are scale * (q - offset). With offsets that are whole numbers,
      // q - offset is again an integer; where it stays in int8's range the rewritten
      // weight q' = q - offset has exactly the same real values, with offset 0.
      std::vector<int8_t> folded(static_cast<size_t>(n_out * n_in));
      const auto* q = static_cast<const int8_t*>(view.data);
      for (int64_t r = 0; r < n_out; ++r) {
        for (int64_t k = 0; k < n_in; ++k) {
          const int v = q[r * n_in + k] - static_cast<int>(offset[static_cast<size_t>(r)]);
          if (v < -128 || v > 127) {
            return unimplemented(where + ": tensor '" + name + "' row " + std::to_string(r) +
                                 " minus its weight_offset leaves int8's range; asymmetric weights that "
                                 "do not fold into symmetric int8 are not supported");
          }
          folded[static_cast<size_t>(r * n_in + k)] = static_cast<int8_t>(v);
        }
      }
      storage->weights.push_back(std::move(folded));
      view.data = storage->weights.back().data();
    }
    consumed.insert(base + ".weight_offset");

    if (type == "W8A8_DYNAMIC") {  // per-token activations: exactly dserve's kI8
      storage->floats.push_back(std::move(scale));
      view.row_scales = storage->floats.back().data();
      continue;
    }
    // Static W8A8. The format's activations are q = clamp(round(x / s) + o, -128, 127),
    // dserve's static quantisation with input_offset o (which clamps to [-127, 127]:
    // the two differ where the format gives -128, the calibrated range's lowest step),
    // and deq * (q . w + qb) = (deq / s) * s * (q . w) + deq * qb: dserve's kI8 product
    // with row scales deq / s, plus a per-row constant.
    DS_ASSIGN_OR_RETURN(std::vector<float> in_scale, values(where, *tensors, base + ".input_scale", 1, name));
    DS_RETURN_IF_ERROR(check_scales(where, base + ".input_scale", in_scale));
    DS_ASSIGN_OR_RETURN(std::vector<float> in_offset, values(where, *tensors, base + ".input_offset", 1, name));
    DS_RETURN_IF_ERROR(check_offsets(where, base + ".input_offset", in_offset));
    DS_ASSIGN_OR_RETURN(std::vector<float> deq, values(where, *tensors, base + ".deq_scale", n_out, name, true));
    DS_RETURN_IF_ERROR(check_scales(where, base + ".deq_scale", deq));
    const auto qb_it = tensors->find(base + ".quant_bias");
    if (qb_it != tensors->end() && qb_it->second.dtype != DType::kI32) {
      return corrupt(where + ": tensor '" + base + ".quant_bias' is " +
                     std::string(dtype_name(qb_it->second.dtype)) + "; quant_bias is int32");
    }
    DS_ASSIGN_OR_RETURN(std::vector<float> qb_shape_checked,
                        values(where, *tensors, base + ".quant_bias", n_out, name));
    // A safetensors tensor's data need not be 4-byte aligned: read each int32 by memcpy.
    const auto* qb = static_cast<const uint8_t*>(tensors->at(base + ".quant_bias").data);
    const float s = in_scale[0];
    std::vector<float> row_scales(static_cast<size_t>(n_out)), bias(static_cast<size_t>(n_out));
    for (int64_t r = 0; r < n_out; ++r) {
      const float d = deq[static_cast<size_t>(r)];
      // deq_scale is input_scale * weight_scale; a contradiction means a broken file.
      const float expect = s * scale[static_cast<size_t>(r)];
      if (std::fabs(d - expect) > 1e-3f * expect) {
        return corrupt(where + ": tensor '" + base + ".deq_scale' is " + std::to_string(d) + " at row " +
                       std::to_string(r) + " but input_scale * weight_scale is " + std::to_string(expect));
      }
      row_scales[static_cast<size_t>(r)] = d / s;
      int32_t quant_bias;
      std::memcpy(&quant_bias, qb + 4 * r, 4);
      bias[static_cast<size_t>(r)] = static_cast<float>(static_cast<double>(d) * static_cast<double>(quant_bias));
    }
    storage->floats.push_back(std::move(row_scales));
    view.row_scales = storage->floats.back().data();
    view.input_scale = s;
    view.input_offset = static_cast<int>(in_offset[0]);
    storage->floats.push_back(std::move(bias));
    const float* folded_bias = storage->floats.back().data();
    // vllm-ascend's static path adds quant_bias, not the layer's float bias (folded into
    // quant_bias by msModelSlim): a float X.bias is replaced by the exact sum, which the
    // model adds; without one the weight carries it.
    const auto b = tensors->find(base + ".bias");
    if (b != tensors->end()) {
      TensorView& bv = b->second;
      bv.dtype = DType::kF32;
      bv.shape = {n_out};
      bv.data = folded_bias;
      bv.n_bytes = static_cast<size_t>(n_out) * 4;
    } else {
      view.row_bias = folded_bias;
    }
    for (const char* m : {".input_scale", ".input_offset", ".deq_scale", ".quant_bias"}) consumed.insert(base + m);
  }
  for (const auto& name : consumed) tensors->erase(name);
  return Status::Ok();
}

}  // namespace dserve
