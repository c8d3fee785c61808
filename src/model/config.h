// ModelConfig: the hyper-parameters of a decoder-only transformer, read once from a
// Hugging Face config.json (+ generation_config.json) or from GGUF metadata,
// validated, and immutable afterwards. Everything the model code needs about its
// shape comes from here; values derivable from others (kv_dim, ...) are computed by
// accessors rather than stored twice.
//
// Supported architectures: LlamaForCausalLM and Qwen2ForCausalLM (GGUF "llama" and
// "qwen2"). Anything else is an Unimplemented error naming the architecture.
//
// Thread-safety: a plain value; safe to share read-only between threads.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dserve {

class GgufMetadata;
class ModelFiles;

enum class Architecture { kLlama, kQwen2 };
std::string_view architecture_name(Architecture a);  // "LlamaForCausalLM", ...

// How RoPE frequencies are derived from the base ones; mirrors transformers'
// `rope_type` ("default", "linear", "llama3", "yarn").
enum class RopeScalingType { kDefault, kLinear, kLlama3, kYarn };
std::string_view rope_scaling_name(RopeScalingType t);

struct RopeConfig {
  RopeScalingType type = RopeScalingType::kDefault;
  double theta = 10000.0;  // rope_theta / freq_base
  int rotary_dim = 0;      // leading dims of each head that rotate (head_dim unless partial)
  double factor = 1.0;     // linear, llama3, yarn
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and yarn: the context length the model was pre-trained with.
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<double> attention_factor;  // if absent, derived as transformers does
  bool truncate = true;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // n_embd
  int64_t intermediate_size = 0;  // FFN width
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-6f;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  // Which linear layers carry a bias. Qwen2: q, k, v. Llama: attention_bias puts one
  // on q, k, v and o; mlp_bias on gate, up and down.
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  int32_t bos_id = -1;           // -1: none
  std::vector<int32_t> eos_ids;  // every id that ends generation, per the model files

  // Where the values came from, for error messages ("config.json", "x.gguf metadata").
  std::string source;

  int64_t q_dim() const { return int64_t{n_heads} * head_dim; }
  int64_t kv_dim() const { return int64_t{n_kv_heads} * head_dim; }
  int n_heads_per_kv() const { return n_heads / n_kv_heads; }

  // From a parsed config.json; generation_config may be null.
  static Result<ModelConfig> from_hf_json(const nlohmann::json& config,
                                          const nlohmann::json* generation_config,
                                          std::string source = "config.json");
  // From GGUF metadata. `has_output_weight`: whether the file carries a separate
  // output (lm_head) tensor; if not, the embeddings are tied.
  static Result<ModelConfig> from_gguf(const GgufMetadata& metadata, bool has_output_weight);
  static Result<ModelConfig> from_model_files(const ModelFiles& files);

  // One line for logs: "LlamaForCausalLM: 30 layers, hidden 576, ...".
  std::string summary() const;

 private:
  // Checks ranges and consistency (heads divide, rotary_dim even, ...).
  Status validate() const;
};

}  // namespace dserve
