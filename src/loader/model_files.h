// ModelFiles: everything dserve reads from disk for one model, whichever format it
// came in, presented one way:
//   - a Hugging Face directory: config.json, generation_config.json (optional),
//     tokenizer.json, tokenizer_config.json, model.safetensors or sharded
//     model-0000k-of-0000n.safetensors with model.safetensors.index.json;
//   - a GGUF file (single or split).
// Tensors are exposed under their Hugging Face names
// ("model.layers.3.self_attn.q_proj.weight") so model code has one naming scheme.
//
// Note on GGUF Llama files: llama.cpp's converter permutes the rows of q_proj and
// k_proj so that RoPE rotates adjacent pairs; rope_pairs_interleaved() says so and
// the model applies RoPE accordingly (no copy of the weights is made).
//
// GGUF's Q5_0 / Q5_1 tensors are converted at open to types the kernels read, with
// every value unchanged (tensor/requantize.h); gguf() still shows them as stored.
//
// Thread-safety: immutable after open().
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/mapped_file.h"
#include "base/status.h"
#include "loader/ascend_quant.h"
#include "loader/gguf_file.h"
#include "tensor/tensor_view.h"

namespace dserve {

class SafetensorsFile;

// How FP8 (float8_e4m3fn, block-scaled) weights are held once loaded
// (model/fp8_weights.h): kept at 1 byte per weight, read by the kernels with their
// block scales (the default), or converted to BF16 at load (--fp8-weights bf16).
enum class Fp8Weights { kFp8, kBf16 };

enum class ModelFormat { kHuggingFace, kGguf };

class ModelFiles {
 public:
  // `path` is a directory (Hugging Face layout) or a .gguf file. Errors name the
  // offending file and what is wrong with it. `quantization` is what the caller
  // expects the weights to be: "compressed-tensors" (W8A8, loader/compressed_tensors.h),
  // "ascend" (msModelSlim's layout: not read yet), or empty to take what the files
  // say; files that say otherwise are an InvalidArgument error.
  // `fp8_weights`: how a model built from these files holds FP8 weights.
  static Result<std::unique_ptr<ModelFiles>> open(const std::string& path,
                                                  const std::string& quantization = "",
                                                  Fp8Weights fp8_weights = Fp8Weights::kFp8);
  ~ModelFiles();
  ModelFiles(const ModelFiles&) = delete;
  ModelFiles& operator=(const ModelFiles&) = delete;

  ModelFormat format() const { return format_; }
  const std::string& path() const { return path_; }

  // Hugging Face only (null for GGUF): parsed JSON files; optional ones may be null.
  const nlohmann::json* hf_config() const { return opt(hf_config_); }
  const nlohmann::json* generation_config() const { return opt(generation_config_); }
  const nlohmann::json* tokenizer_json() const { return opt(tokenizer_json_); }
  const nlohmann::json* tokenizer_config() const { return opt(tokenizer_config_); }

  // GGUF only (null for Hugging Face).
  const GgufMetadata* gguf_metadata() const { return gguf_ ? &gguf_->metadata() : nullptr; }
  // The GGUF file itself, with tensors under their GGUF names (null for Hugging Face).
  const GgufFile* gguf() const { return gguf_.get(); }

  // All tensors under Hugging Face names.
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const TensorView* find(const std::string& hf_name) const;
  // NotFound naming the model path and tensor.
  Result<const TensorView*> get(const std::string& hf_name) const;

  // True for GGUF files of architecture "llama" (see the note above).
  bool rope_pairs_interleaved() const { return rope_pairs_interleaved_; }

  size_t total_tensor_bytes() const;
  // Drops the process's pages of a tensor read in place from the files (a backend made
  // its own copy of it): see MappedFile::release. Returns the bytes released, 0 for a
  // tensor that is not mapped from a file (one converted at load).
  size_t release_pages(const TensorView& t) const;
  // The weights' quantisation format: "compressed-tensors", or empty for none.
  const std::string& quantization() const { return quantization_; }
  Fp8Weights fp8_weights() const { return fp8_weights_; }
  // One line for start-up logs: the weights' formats and bytes ("i8 W8A8 dynamic
  // per-token activations: 1.2 MiB in 14 tensors; f32: ...").
  std::string weights_summary() const;

 private:
  ModelFiles() = default;
  Status open_gguf();
  Status open_hf_dir();
  // Applies the checkpoint's quantisation (scales onto int8 weights), checked against
  // the caller's expectation `expected` (see open()).
  Status apply_quantization(const std::string& expected);
  // Adds the tensors of one safetensors file; `expected` (from the index) must all be in it.
  Status add_safetensors(const std::string& file, const std::set<std::string>* expected);
  static const nlohmann::json* opt(const nlohmann::json& j) { return j.is_null() ? nullptr : &j; }

  ModelFormat format_ = ModelFormat::kHuggingFace;
  std::string path_;
  nlohmann::json hf_config_, generation_config_, tokenizer_json_, tokenizer_config_;
  std::unique_ptr<GgufFile> gguf_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, TensorView> tensors_;
  // Tensors converted at load from storage-only types (tensor/requantize.h); the
  // views in tensors_ point into these (a vector's heap buffer does not move).
  std::vector<std::vector<uint8_t>> converted_;
  bool rope_pairs_interleaved_ = false;
  std::string quantization_;
  Fp8Weights fp8_weights_ = Fp8Weights::kFp8;
  std::vector<std::vector<float>> scales_;  // float copies of int8 weights' scales
  AscendQuantStorage ascend_;               // msModelSlim's scales, biases, folded weights
};

}  // namespace dserve
