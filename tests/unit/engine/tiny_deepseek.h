// A tiny random F32 DeepSeek-V3 with an MTP layer, written as a Hugging Face directory,
// for the engine's speculative-decoding tests (no tokenizer: prompts are token ids).
// Two layers (the first dense, the second DeepSeekMoE with 4 experts, top-2, sigmoid
// routing with a correction bias, one shared expert), MLA with q_lora, and layer 2 the
// MTP module (enorm, hnorm, eh_proj, a MoE block, shared_head).
#pragma once

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../loader/test_files.h"

namespace dserve::tiny_deepseek {

constexpr int kVocab = 97, kHidden = 32, kHeads = 2, kQLora = 16, kKvLora = 16, kNope = 8,
              kRope = 8, kV = 8, kInter = 48, kMoeInter = 16, kExperts = 4, kLayers = 2,
              kContext = 512;

inline std::string write() {
  const std::string dir = testing::scratch_dir();
  nlohmann::json config = {
      {"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "deepseek_v3"},
      {"vocab_size", kVocab}, {"hidden_size", kHidden}, {"intermediate_size", kInter},
      {"moe_intermediate_size", kMoeInter}, {"num_hidden_layers", kLayers},
      {"num_attention_heads", kHeads}, {"num_key_value_heads", kHeads},
      {"q_lora_rank", kQLora}, {"kv_lora_rank", kKvLora}, {"qk_nope_head_dim", kNope},
      {"qk_rope_head_dim", kRope}, {"v_head_dim", kV}, {"n_routed_experts", kExperts},
      {"num_experts_per_tok", 2}, {"n_shared_experts", 1}, {"n_group", 1}, {"topk_group", 1},
      {"topk_method", "noaux_tc"}, {"scoring_func", "sigmoid"}, {"norm_topk_prob", true},
      {"routed_scaling_factor", 2.5}, {"first_k_dense_replace", 1}, {"moe_layer_freq", 1},
      {"max_position_embeddings", kContext}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0},
      {"tie_word_embeddings", false}, {"num_nextn_predict_layers", 1}};
  testing::write_file(dir + "/config.json", config.dump());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  nlohmann::json header;
  std::string data;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool ones = false) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t begin = data.size();
    for (int64_t i = 0; i < n; ++i) testing::append<float>(&data, ones ? 1.0f : normal(rng));
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
  };
  auto mlp = [&](const std::string& p, int64_t inter) {
    add(p + "gate_proj.weight", {inter, kHidden});
    add(p + "up_proj.weight", {inter, kHidden});
    add(p + "down_proj.weight", {kHidden, inter});
  };
  add("model.embed_tokens.weight", {kVocab, kHidden});
  add("model.norm.weight", {kHidden}, true);
  add("lm_head.weight", {kVocab, kHidden});
  for (int l = 0; l <= kLayers; ++l) {  // layer kLayers: the MTP module
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kHidden}, true);
    add(p + "post_attention_layernorm.weight", {kHidden}, true);
    add(p + "self_attn.q_a_proj.weight", {kQLora, kHidden});
    add(p + "self_attn.q_a_layernorm.weight", {kQLora}, true);
    add(p + "self_attn.q_b_proj.weight", {kHeads * (kNope + kRope), kQLora});
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {kKvLora + kRope, kHidden});
    add(p + "self_attn.kv_a_layernorm.weight", {kKvLora}, true);
    add(p + "self_attn.kv_b_proj.weight", {kHeads * (kNope + kV), kKvLora});
    add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kV});
    if (l == 0) {
      mlp(p + "mlp.", kInter);
      continue;
    }
    add(p + "mlp.gate.weight", {kExperts, kHidden});
    add(p + "mlp.gate.e_score_correction_bias", {kExperts});
    for (int e = 0; e < kExperts; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".", kMoeInter);
    mlp(p + "mlp.shared_experts.", kMoeInter);
  }
  const std::string m = "model.layers." + std::to_string(kLayers) + ".";
  add(m + "enorm.weight", {kHidden}, true);
  add(m + "hnorm.weight", {kHidden}, true);
  add(m + "eh_proj.weight", {kHidden, 2 * kHidden});
  add(m + "shared_head.norm.weight", {kHidden}, true);
  add(m + "shared_head.head.weight", {kVocab, kHidden});
  testing::write_file(dir + "/model.safetensors", testing::safetensors_bytes(header, data));
  return dir;
}

}  // namespace dserve::tiny_deepseek
