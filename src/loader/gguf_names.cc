#include "loader/gguf_names.h"

#include <cstring>
#include <string_view>

namespace dserve {
namespace {

struct NamePair {
  const char* gguf;
  const char* hf;
};

// Whole-model tensors (before the .weight/.bias suffix).
constexpr NamePair kGlobal[] = {
    {"token_embd", "model.embed_tokens"},
    {"output_norm", "model.norm"},
    {"output", "lm_head"},
};

// Per-layer tensors: blk.N.<gguf> -> model.layers.N.<hf>.
constexpr NamePair kLayer[] = {
    {"attn_norm", "input_layernorm"},
    {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"},
    {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},
    {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},
    {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},
    // deepseek2 (DeepSeek-V2 / V3): MLA projections ...
    {"attn_q_a", "self_attn.q_a_proj"},
    {"attn_q_a_norm", "self_attn.q_a_layernorm"},
    {"attn_q_b", "self_attn.q_b_proj"},
    {"attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"},
    {"attn_kv_a_norm", "self_attn.kv_a_layernorm"},
    {"attn_kv_b", "self_attn.kv_b_proj"},
    // ... kv_b_proj as newer llama.cpp files store it, split per head into W_UKᵀ
    // [n_head, kv_lora_rank, qk_nope] and W_UV [n_head, v_head_dim, kv_lora_rank]
    // (names of our own: transformers has no such tensors).
    {"attn_k_b", "self_attn.k_b_proj"},
    {"attn_v_b", "self_attn.v_b_proj"},
    // ... and DeepSeekMoE: router, stacked routed experts [n_expert, ...], shared experts.
    {"ffn_gate_inp", "mlp.gate"},
    {"ffn_gate_exps", "mlp.experts.gate_proj"},
    {"ffn_up_exps", "mlp.experts.up_proj"},
    {"ffn_down_exps", "mlp.experts.down_proj"},
    {"ffn_gate_shexp", "mlp.shared_experts.gate_proj"},
    {"ffn_up_shexp", "mlp.shared_experts.up_proj"},
    {"ffn_down_shexp", "mlp.shared_experts.down_proj"},
};

// Per-layer tensors whose Hugging Face name has no .weight/.bias suffix.
constexpr NamePair kLayerWhole[] = {
    {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},  // noaux_tc routing bias
};

const char* lookup(const NamePair* table, size_t n, std::string_view key) {
  for (size_t i = 0; i < n; ++i) {
    if (key == table[i].gguf) return table[i].hf;
  }
  return nullptr;
}

}  // namespace

std::string gguf_to_hf_name(const std::string& gguf_name) {
  if (std::string_view n = gguf_name; n.substr(0, 4) == "blk.") {
    const size_t dot = n.find('.', 4);
    if (dot != std::string_view::npos && dot > 4) {
      if (const char* hf = lookup(kLayerWhole, std::size(kLayerWhole), n.substr(dot + 1))) {
        return "model.layers." + std::string(n.substr(4, dot - 4)) + "." + hf;
      }
    }
  }
  // Split off the suffix: "blk.3.attn_q" + ".weight".
  std::string_view name = gguf_name;
  std::string_view suffix;
  for (std::string_view s : {".weight", ".bias"}) {
    if (name.size() > s.size() && name.substr(name.size() - s.size()) == s) {
      suffix = s;
      name.remove_suffix(s.size());
      break;
    }
  }
  if (suffix.empty()) return gguf_name;

  if (const char* hf = lookup(kGlobal, std::size(kGlobal), name)) {
    return std::string(hf) + std::string(suffix);
  }
  constexpr std::string_view kBlk = "blk.";
  if (name.substr(0, kBlk.size()) != kBlk) return gguf_name;
  name.remove_prefix(kBlk.size());
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0) return gguf_name;
  std::string_view layer = name.substr(0, dot);
  for (char ch : layer) {
    if (ch < '0' || ch > '9') return gguf_name;
  }
  const char* hf = lookup(kLayer, std::size(kLayer), name.substr(dot + 1));
  if (hf == nullptr) return gguf_name;
  return "model.layers." + std::string(layer) + "." + hf + std::string(suffix);
}

}  // namespace dserve
