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
};

const char* lookup(const NamePair* table, size_t n, std::string_view key) {
  for (size_t i = 0; i < n; ++i) {
    if (key == table[i].gguf) return table[i].hf;
  }
  return nullptr;
}

}  // namespace

std::string gguf_to_hf_name(const std::string& gguf_name) {
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
