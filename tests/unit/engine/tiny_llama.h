// A tiny random F32 LlamaForCausalLM written as a Hugging Face directory, for the
// engine's tests (no tokenizer: prompts are token ids).
#pragma once

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../loader/test_files.h"

namespace dserve {

constexpr int kVocab = 97, kHidden = 32, kHeads = 4, kKvHeads = 2, kHeadDim = 8, kLayers = 2,
              kInter = 48, kContext = 512;

// A Hugging Face directory holding a random F32 LlamaForCausalLM.
inline std::string write_tiny_llama() {
  const std::string dir = testing::scratch_dir();
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"vocab_size", kVocab},
                           {"hidden_size", kHidden},
                           {"intermediate_size", kInter},
                           {"num_hidden_layers", kLayers},
                           {"num_attention_heads", kHeads},
                           {"num_key_value_heads", kKvHeads},
                           {"max_position_embeddings", kContext},
                           {"rms_norm_eps", 1e-5},
                           {"rope_theta", 10000.0},
                           {"tie_word_embeddings", true}};
  testing::write_file(dir + "/config.json", config.dump());
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  nlohmann::json header;
  std::string data;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool ones) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t begin = data.size();
    for (int64_t i = 0; i < n; ++i) testing::append<float>(&data, ones ? 1.0f : normal(rng));
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
  };
  add("model.embed_tokens.weight", {kVocab, kHidden}, false);
  add("model.norm.weight", {kHidden}, true);
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kHidden}, true);
    add(p + "post_attention_layernorm.weight", {kHidden}, true);
    add(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden}, false);
    add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden}, false);
    add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden}, false);
    add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim}, false);
    add(p + "mlp.gate_proj.weight", {kInter, kHidden}, false);
    add(p + "mlp.up_proj.weight", {kInter, kHidden}, false);
    add(p + "mlp.down_proj.weight", {kHidden, kInter}, false);
  }
  testing::write_file(dir + "/model.safetensors", testing::safetensors_bytes(header, data));
  return dir;
}

}  // namespace dserve
