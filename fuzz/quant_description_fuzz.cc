// Fuzz target: msModelSlim's quant_model_description.json (loader/ascend_quant.h), read
// by ModelFiles::open(dir, "ascend") against the tensors of the model.safetensors
// beside it: every tensor described, types known, scales and offsets of the right
// shapes, dtypes and values, static layers' deq_scale agreeing with their scales.
//
// The input is the description, then optionally a NUL, model.safetensors' JSON header,
// a NUL and its data. Without them the model is a fixed one:
//   model.layers.0.mlp.up_proj           W8A8_DYNAMIC: weight I8 [2, 4], weight_scale
//                                        F32 [2, 1], weight_offset F32 [2, 1] (0, 1)
//   model.layers.0.self_attn.q_proj      W8A8: weight I8 [2, 4], weight_scale F32 [2],
//                                        weight_offset F32 [2], input_scale F32 [1],
//                                        input_offset I8 [1], deq_scale F32 [2],
//                                        quant_bias I32 [2], bias F32 [2]
//   lm_head.weight F32 [2, 4], model.norm.weight BF16 [4]   FLOAT
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "fuzz_support.h"
#include "loader/model_files.h"

namespace {

// The fixed model's safetensors file.
std::string fixed_safetensors() {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string bytes;
  auto add = [&](const std::string& name, const char* dtype, std::vector<int64_t> shape,
                 const void* values, size_t n_bytes) {
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {bytes.size(), bytes.size() + n_bytes}}};
    bytes.append(static_cast<const char*>(values), n_bytes);
  };
  const int8_t weight[8] = {1, -2, 3, -4, 5, -6, 7, -8};
  const float scale[2] = {0.5f, 0.25f}, up_offset[2] = {0.0f, 1.0f}, zero[2] = {0.0f, 0.0f};
  const float input_scale = 2.0f, deq[2] = {1.0f, 0.5f}, bias[2] = {0.1f, -0.1f};
  const int8_t input_offset = 3;
  const int32_t quant_bias[2] = {10, -10};
  const float head[8] = {};
  const uint16_t norm[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
  const std::string up = "model.layers.0.mlp.up_proj", q = "model.layers.0.self_attn.q_proj";
  add(up + ".weight", "I8", {2, 4}, weight, 8);
  add(up + ".weight_scale", "F32", {2, 1}, scale, 8);
  add(up + ".weight_offset", "F32", {2, 1}, up_offset, 8);
  add(q + ".weight", "I8", {2, 4}, weight, 8);
  add(q + ".weight_scale", "F32", {2}, scale, 8);
  add(q + ".weight_offset", "F32", {2}, zero, 8);
  add(q + ".input_scale", "F32", {1}, &input_scale, 4);
  add(q + ".input_offset", "I8", {1}, &input_offset, 1);
  add(q + ".deq_scale", "F32", {2}, deq, 8);
  add(q + ".quant_bias", "I32", {2}, quant_bias, 8);
  add(q + ".bias", "F32", {2}, bias, 8);
  add("lm_head.weight", "F32", {2, 4}, head, 32);
  add("model.norm.weight", "BF16", {4}, norm, 8);
  return header.dump() + std::string(1, '\0') + bytes;
}

// A safetensors file from its JSON header and data.
std::string safetensors(std::string_view header, std::string_view data) {
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file += header;
  file += data;
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dserve::set_log_level("error");
  dserve::fuzz::write_scratch_file("config.json", "{}");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  static const std::string fixed = fixed_safetensors();
  std::vector<std::string_view> parts = fuzz::split_parts(fuzz::as_text(data, size), 3);
  if (parts.size() < 3) {
    const std::vector<std::string_view> model = fuzz::split_parts(fixed, 2);
    parts.resize(1);
    parts.insert(parts.end(), model.begin(), model.end());
  }
  fuzz::write_scratch_file("quant_model_description.json", parts[0]);
  fuzz::write_scratch_file("model.safetensors", safetensors(parts[1], parts[2]));
  (void)ModelFiles::open(fuzz::scratch_dir().string(), "ascend");
  return 0;
}
