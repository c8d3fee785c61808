// DeepseekConfig: the hyper-parameters of DeepSeek-V2 / V2-Lite / V2.5
// (DeepseekV2ForCausalLM) and DeepSeek-V3 / V3-0324 / R1 / R1-0528
// (DeepseekV3ForCausalLM), read once from config.json or from GGUF metadata of
// architecture "deepseek2", validated, and immutable afterwards.
//
// Every field that changes the math is here: Multi-head Latent Attention (MLA) ranks
// and head dims, the DeepSeekMoE layout and routing, YaRN with DeepSeek's mscale
// (which also changes the softmax scale), and the MTP layer count. Derived values
// (qk_head_dim, the latent width, which layers are MoE, the softmax scale) are
// computed by accessors, never stored twice.
//
// Thread-safety: a plain value; safe to share read-only between threads.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/config.h"

namespace dserve {

class GgufMetadata;
class ModelFiles;

enum class DeepseekVersion { kV2, kV3 };

// How the router picks experts (transformers' / DeepSeek's `topk_method`).
enum class TopkMethod {
  kGreedy,              // top-k over all experts (V2-Lite)
  kGroupLimitedGreedy,  // best topk_group groups by their max score, then top-k (V2)
  kNoauxTc,             // groups by the sum of their top-2 biased scores, then top-k (V3)
};
std::string_view topk_method_name(TopkMethod m);

// How router logits become scores (`scoring_func`).
enum class ScoringFunc { kSoftmax, kSigmoid };
std::string_view scoring_func_name(ScoringFunc s);

struct DeepseekConfig {
  DeepseekVersion version = DeepseekVersion::kV3;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense FFN width (first_k_dense_replace layers)
  int64_t moe_intermediate_size = 0;  // width of one routed expert
  int n_layers = 0;                   // decoder layers, MTP layers excluded
  int n_heads = 0;
  float rms_norm_eps = 1e-6f;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  // MLA. q_lora_rank 0: queries come from one q_proj (V2-Lite), else from
  // q_a_proj -> RMSNorm -> q_b_proj.
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;

  // RoPE over the qk_rope_head_dim dims of each head (rope.rotary_dim ==
  // qk_rope_head_dim). interleaved: rotate adjacent pairs (x[2i], x[2i+1]), as both
  // V2 and V3 (rope_interleave: true) do; otherwise rotate_half.
  RopeConfig rope;
  bool rope_interleaved = true;

  // DeepSeekMoE. n_routed_experts 0: every layer dense.
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int n_experts_per_tok = 0;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  int n_group = 1;
  int topk_group = 1;
  TopkMethod topk_method = TopkMethod::kGreedy;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;

  int num_nextn_predict_layers = 0;  // MTP layers after the decoder (loaded, not run)

  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;
  std::string source;  // "dir/config.json", "x.gguf metadata"

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Floats the latent KV cache keeps per token and layer: the compressed latent and
  // the (shared, rotated) RoPE key.
  int latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  bool is_moe_layer(int layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // The attention softmax scale: qk_head_dim^-0.5, times mscale^2 under YaRN with
  // mscale_all_dim (mscale = 0.1 * mscale_all_dim * ln(factor) + 1), as DeepSeek's
  // reference and transformers compute it.
  float softmax_scale() const;

  static Result<DeepseekConfig> from_hf_json(const nlohmann::json& config,
                                             const nlohmann::json* generation_config,
                                             std::string source = "config.json");
  static Result<DeepseekConfig> from_gguf(const GgufMetadata& metadata, bool has_output_weight);
  static Result<DeepseekConfig> from_model_files(const ModelFiles& files);

  std::string summary() const;

 private:
  Status validate() const;
};

// True if config.json names a DeepSeek-V2/V3 architecture or model_type, or the GGUF
// architecture is "deepseek2".
bool is_deepseek_model(const ModelFiles& files);

}  // namespace dserve
