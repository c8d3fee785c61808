// What every architecture's config reader (model/config.h for Llama and Qwen2,
// model/deepseek_config.h for DeepSeek-V2/V3) reads the same way: transformers' RoPE
// parameters and YaRN's, the BOS/EOS ids (config.json, then generation_config.json as
// transformers' generate() does; GGUF's tokenizer.ggml.* ids), the vocabulary size of
// a GGUF file, and the choice between config.json and GGUF metadata.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "loader/gguf_file.h"
#include "loader/model_files.h"
#include "model/config.h"

namespace dserve::config_core {

// transformers' RoPE parameters as standardize_rope_params() gives them: transformers 5
// saves `rope_parameters` (rope_theta inside), older files `rope_scaling` and a
// top-level `rope_theta`. max_pos: max_position_embeddings; head_dim: the rotating
// part's width before partial_rotary_factor. Types: default, linear, llama3, yarn.
Status read_hf_rope(const nlohmann::json& config, const std::string& source, int64_t max_pos,
                    int head_dim, RopeConfig* rope);

// bos_token_id and eos_token_id (one id or a list) from config.json, overridden by
// generation_config.json's when it has them (generation_config may be null). bos: -1
// when none.
Status read_hf_special_ids(const nlohmann::json& config, const std::string& source,
                           const nlohmann::json* generation_config, int32_t* bos,
                           std::vector<int32_t>* eos_ids);

// `<arch>.vocab_size`, or the length of tokenizer.ggml.tokens.
Status read_gguf_vocab_size(const GgufMetadata& md, const std::string& prefix, int64_t* vocab_size);

// tokenizer.ggml.bos_token_id, and the eos and eot ids (each once) as stop ids.
Status read_gguf_special_ids(const GgufMetadata& md, int32_t* bos, std::vector<int32_t>* eos_ids);

// `<arch>.rope.freq_base` when present.
Status read_gguf_rope_theta(const GgufMetadata& md, const std::string& prefix, RopeConfig* rope);

// YaRN in GGUF metadata: rope.scaling.factor, original_context_length (max_pos when
// absent unless `original_required`), yarn_beta_fast / yarn_beta_slow when present.
Status read_gguf_yarn(const GgufMetadata& md, const std::string& prefix, int64_t max_pos,
                      bool original_required, RopeConfig* rope);

// Config::from_hf_json on config.json (+ generation_config.json), or Config::from_gguf
// on the GGUF metadata (embeddings tied when the file has no output tensor).
template <class Config>
Result<Config> from_model_files(const ModelFiles& files) {
  switch (files.format()) {
    case ModelFormat::kHuggingFace: {
      const nlohmann::json* config = files.hf_config();
      if (!config) return not_found(files.path() + ": config.json is missing");
      return Config::from_hf_json(*config, files.generation_config(), files.path() + "/config.json");
    }
    case ModelFormat::kGguf: {
      const GgufMetadata* md = files.gguf_metadata();
      if (!md) return internal_error(files.path() + ": GGUF file without metadata");
      return Config::from_gguf(*md, files.find("lm_head.weight") != nullptr);
    }
  }
  return internal_error("unknown model format");
}

}  // namespace dserve::config_core
