#include "model/fp8_weights.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/check.h"
#include "tensor/dequantize.h"
#include "tensor/half.h"

namespace dserve {

namespace {

// weight_block_size from config.json's quantization_config; [128, 128] if absent.
Status block_size(const ModelFiles& files, int64_t* rows, int64_t* cols) {
  *rows = *cols = 128;
  const nlohmann::json* config = files.hf_config();
  if (!config || !config->contains("quantization_config")) return Status::Ok();
  const nlohmann::json& q = (*config)["quantization_config"];
  const std::string where = files.path() + "/config.json: quantization_config";
  if (!q.is_object()) return corrupt(where + " must be an object");
  if (q.contains("quant_method") && q["quant_method"] != "fp8") {
    return unimplemented(where + ": quant_method " + q["quant_method"].dump() +
                         " (dserve reads fp8)");
  }
  if (!q.contains("weight_block_size")) return Status::Ok();
  const nlohmann::json& b = q["weight_block_size"];
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
      b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0) {
    return corrupt(where + ".weight_block_size must be two positive integers, got " + b.dump());
  }
  *rows = b[0].get<int64_t>();
  *cols = b[1].get<int64_t>();
  return Status::Ok();
}

}  // namespace

Result<Fp8Scales> read_fp8_block_scales(const ModelFiles& files, const std::string& name,
                                        const TensorView& weight) {
  if (weight.dtype != DType::kF8_E4M3 || weight.n_dims() != 2) {
    return unimplemented(files.path() + ": tensor '" + name + "' is " +
                         std::string(dtype_name(weight.dtype)) + " of rank " +
                         std::to_string(weight.n_dims()) +
                         "; FP8 weights must be 2-D float8_e4m3fn with block scales");
  }
  int64_t br = 0, bc = 0;
  DS_RETURN_IF_ERROR(block_size(files, &br, &bc));
  const std::string scale_name = name + "_scale_inv";
  const TensorView* scale = files.find(scale_name);
  if (scale == nullptr) {
    return not_found(files.path() + ": FP8 tensor '" + name + "' has no block scales ('" +
                     scale_name + "' is missing)");
  }
  const int64_t n_out = weight.shape[0], n_in = weight.shape[1];
  const std::vector<int64_t> expected = {(n_out + br - 1) / br, (n_in + bc - 1) / bc};
  if (scale->shape != expected) {
    return corrupt(files.path() + ": tensor '" + scale_name + "' has shape " +
                   shape_to_string(scale->shape) + " but " + shape_to_string(weight.shape) +
                   " in blocks of [" + std::to_string(br) + ", " + std::to_string(bc) +
                   "] (quantization_config.weight_block_size) needs " + shape_to_string(expected));
  }
  if (scale->dtype != DType::kF32 && scale->dtype != DType::kBF16 && scale->dtype != DType::kF16) {
    return unimplemented(files.path() + ": tensor '" + scale_name + "' must be f32, bf16 or f16");
  }
  Fp8Scales out;
  out.values.resize(static_cast<size_t>(expected[0] * expected[1]));
  dequantize_row(scale->dtype, scale->data, out.values.data(), static_cast<int64_t>(out.values.size()));
  out.layout = BlockScales{nullptr, expected[1], br, bc, 0};
  return out;
}

Fp8Converted convert_fp8_to_bf16(const TensorView& weight) {
  DS_CHECK(weight.dtype == DType::kF8_E4M3 && weight.n_dims() == 2 && weight.block_scales.data != nullptr);
  const int64_t n_out = weight.shape[0], n_in = weight.shape[1];
  const BlockScales& scales = weight.block_scales;
  Fp8Converted out;
  out.view.dtype = DType::kBF16;
  out.view.shape = weight.shape;
  out.bytes.resize(static_cast<size_t>(n_out * n_in) * 2);
  float lut[256];
  for (int i = 0; i < 256; ++i) lut[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
  uint16_t* dst = reinterpret_cast<uint16_t*>(out.bytes.data());
  auto convert_rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* src = weight.row(i);
      for (int64_t j = 0; j < n_in; ++j) dst[i * n_in + j] = f32_to_bf16(lut[src[j]] * scales.at(i, j));
    }
  };
  // V3/R1 convert ~670 G weights at load: spread big tensors over the cores (each
  // thread owns whole rows; the inputs are read-only).
  const int64_t n_threads = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()),
                                              std::max<int64_t>(1, n_out * n_in / (1 << 20)));
  if (n_threads <= 1) {
    convert_rows(0, n_out);
    return out;
  }
  std::vector<std::thread> threads;
  const int64_t per = (n_out + n_threads - 1) / n_threads;
  for (int64_t t = 0; t < n_threads; ++t) {
    const int64_t begin = t * per, end = std::min(n_out, begin + per);
    if (begin < end) threads.emplace_back(convert_rows, begin, end);
  }
  for (std::thread& t : threads) t.join();
  return out;
}

Result<Fp8Converted> convert_fp8_weight(const ModelFiles& files, const std::string& name,
                                        const TensorView& weight) {
  DS_ASSIGN_OR_RETURN(Fp8Scales scales, read_fp8_block_scales(files, name, weight));
  TensorView w = weight;
  w.block_scales = scales.layout;
  w.block_scales.data = scales.values.data();
  return convert_fp8_to_bf16(w);
}

}  // namespace dserve
