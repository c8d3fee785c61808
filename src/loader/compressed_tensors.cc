#include "loader/compressed_tensors.h"

#include <cmath>

#include "tensor/dequantize.h"

namespace dserve {
namespace {

// A field of a quantization args object, or null when absent.
const nlohmann::json* field(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

// Checks one QuantizationArgs object (weights or input_activations) against what
// dserve runs: 8-bit symmetric int. Sets *dynamic from its "dynamic" field.
Status check_int8_args(const nlohmann::json& args, const std::string& where, bool* dynamic) {
  if (!args.is_object()) return corrupt(where + " must be an object");
  const nlohmann::json* type = field(args, "type");
  const nlohmann::json* bits = field(args, "num_bits");
  if ((type != nullptr && *type != "int") || bits == nullptr || *bits != 8) {
    return unimplemented(where + ": " + (type ? type->dump() : std::string("int")) + " with " +
                         (bits ? bits->dump() : std::string("?")) +
                         " bits (dserve reads 8-bit int, W8A8)");
  }
  const nlohmann::json* symmetric = field(args, "symmetric");
  if (symmetric != nullptr && *symmetric != true) {
    return unimplemented(where + ": asymmetric quantisation (zero points) is not supported yet; "
                         "dserve reads symmetric int8");
  }
  const nlohmann::json* dyn = field(args, "dynamic");
  *dynamic = dyn != nullptr && *dyn == true;
  return Status::Ok();
}

// The config's quantization scheme, reduced to what the tensors cannot tell: whether
// activations are quantised statically (an input_scale must then exist).
struct Scheme {
  bool any_static = false;
};

Result<Scheme> check_config(const nlohmann::json& q, const std::string& where) {
  if (!q.is_object()) return corrupt(where + " must be an object");
  const nlohmann::json* groups = field(q, "config_groups");
  if (groups == nullptr || !groups->is_object() || groups->empty()) {
    return corrupt(where + ".config_groups must be a non-empty object");
  }
  const nlohmann::json* format = field(q, "format");
  Scheme scheme;
  for (const auto& [name, group] : groups->items()) {
    const std::string gw = where + ".config_groups." + name;
    if (!group.is_object()) return corrupt(gw + " must be an object");
    const nlohmann::json* f = field(group, "format");
    if (f == nullptr) f = format;
    if (f != nullptr && *f != "int-quantized") {
      return unimplemented(gw + ": format " + f->dump() +
                           " (dserve reads compressed-tensors \"int-quantized\", W8A8)");
    }
    const nlohmann::json* weights = field(group, "weights");
    if (weights == nullptr) return corrupt(gw + ": no \"weights\" quantization");
    bool weights_dynamic = false;
    DS_RETURN_IF_ERROR(check_int8_args(*weights, gw + ".weights", &weights_dynamic));
    const nlohmann::json* strategy = field(*weights, "strategy");
    if (strategy != nullptr && *strategy != "channel" && *strategy != "tensor") {
      return unimplemented(gw + ".weights: strategy " + strategy->dump() +
                           " (dserve reads per-channel or per-tensor int8 weights)");
    }
    const nlohmann::json* input = field(group, "input_activations");
    if (input == nullptr) {
      return unimplemented(gw + ": weight-only int8 (no input_activations) is not supported; "
                           "dserve runs W8A8");
    }
    bool input_dynamic = false;
    DS_RETURN_IF_ERROR(check_int8_args(*input, gw + ".input_activations", &input_dynamic));
    const nlohmann::json* input_strategy = field(*input, "strategy");
    const std::string want = input_dynamic ? "token" : "tensor";
    if (input_strategy != nullptr && *input_strategy != want) {
      return unimplemented(gw + ".input_activations: " +
                           std::string(input_dynamic ? "dynamic" : "static") + " strategy " +
                           input_strategy->dump() + " (dserve reads dynamic per-token or " +
                           "static per-tensor activation scales)");
    }
    if (!input_dynamic) scheme.any_static = true;
  }
  return scheme;
}

// The float values of a scale tensor, after checking its dtype.
Result<std::vector<float>> scale_values(const std::string& name, const TensorView& t) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return corrupt("tensor '" + name + "' is " + std::string(dtype_name(t.dtype)) +
                   "; a scale must be f32, bf16 or f16");
  }
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  dequantize_row(t.dtype, t.data, v.data(), t.n_elements());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i]) || v[i] <= 0.0f) {
      return corrupt("tensor '" + name + "' has scale " + std::to_string(v[i]) + " at index " +
                     std::to_string(i) + "; scales must be finite and positive");
    }
  }
  return v;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

bool is_compressed_tensors(const nlohmann::json& config) {
  auto q = config.find("quantization_config");
  if (q == config.end() || !q->is_object()) return false;
  auto m = q->find("quant_method");
  return m != q->end() && *m == "compressed-tensors";
}

Status attach_compressed_tensors(const nlohmann::json& config, const std::string& where,
                                 std::map<std::string, TensorView>* tensors,
                                 std::vector<std::vector<float>>* scale_storage) {
  DS_ASSIGN_OR_RETURN(Scheme scheme, check_config(config["quantization_config"], where));
  for (auto& [name, view] : *tensors) {
    const bool is_scale = ends_with(name, ".weight_scale") || ends_with(name, ".input_scale");
    if (ends_with(name, "_zero_point")) {
      return unimplemented(where + ": tensor '" + name +
                           "': asymmetric quantisation (zero points) is not supported yet");
    }
    if (is_scale) {  // every scale must belong to an int8 weight
      const std::string base = name.substr(0, name.rfind('.'));
      const auto w = tensors->find(base + ".weight");
      if (w == tensors->end() || w->second.dtype != DType::kI8) {
        return corrupt(where + ": tensor '" + name + "' scales no int8 weight ('" + base +
                       ".weight' is " +
                       (w == tensors->end() ? std::string("missing")
                                            : std::string(dtype_name(w->second.dtype))) +
                       ")");
      }
      continue;
    }
    if (view.dtype != DType::kI8) continue;
    if (!ends_with(name, ".weight") || view.n_dims() != 2) {
      return corrupt(where + ": int8 tensor '" + name + "' of shape " +
                     shape_to_string(view.shape) + " is not a linear layer's 2-D weight");
    }
    const std::string base = name.substr(0, name.size() - std::string(".weight").size());
    const std::string scale_name = base + ".weight_scale";
    const auto scale = tensors->find(scale_name);
    if (scale == tensors->end()) {
      return not_found(where + ": int8 tensor '" + name + "' has no scale ('" + scale_name +
                       "' is missing)");
    }
    const int64_t n_out = view.shape[0];
    const TensorView& s = scale->second;
    const bool per_channel = s.shape == std::vector<int64_t>{n_out, 1};
    const bool per_tensor = s.n_elements() == 1 && s.n_dims() <= 2;
    if (!per_channel && !per_tensor) {
      return corrupt(where + ": tensor '" + scale_name + "' has shape " +
                     shape_to_string(s.shape) + " but '" + name + "' " +
                     shape_to_string(view.shape) + " needs [" + std::to_string(n_out) +
                     ", 1] (per channel) or [1] (per tensor)");
    }
    DS_ASSIGN_OR_RETURN(std::vector<float> values, scale_values(scale_name, s));
    values.resize(static_cast<size_t>(n_out), values[0]);  // per tensor: one for every row
    scale_storage->push_back(std::move(values));
    view.row_scales = scale_storage->back().data();

    const std::string input_name = base + ".input_scale";
    const auto input = tensors->find(input_name);
    if (input != tensors->end()) {
      if (input->second.n_elements() != 1 || input->second.n_dims() > 2) {
        return corrupt(where + ": tensor '" + input_name + "' has shape " +
                       shape_to_string(input->second.shape) +
                       "; a static activation scale is one value ([1])");
      }
      DS_ASSIGN_OR_RETURN(std::vector<float> in, scale_values(input_name, input->second));
      view.input_scale = in[0];
    } else if (scheme.any_static) {
      return not_found(where + ": int8 tensor '" + name + "' has no static activation scale ('" +
                       input_name + "' is missing; the config's input_activations are "
                       "not dynamic)");
    }
  }
  return Status::Ok();
}

}  // namespace dserve
