#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "loader/gguf_file.h"
#include "loader/model_files.h"
#include "model/config_core.h"
#include "model/json_fields.h"

namespace dserve {

std::string_view architecture_name(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
  }
  return "?";
}

std::string_view rope_scaling_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kDefault:
      return "default";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kLlama3:
      return "llama3";
    case RopeScalingType::kYarn:
      return "yarn";
  }
  return "?";
}

namespace {

constexpr std::string_view kSupportedHf = "LlamaForCausalLM, Qwen2ForCausalLM";


std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

}  // namespace

Result<ModelConfig> ModelConfig::from_hf_json(const nlohmann::json& config,
                                              const nlohmann::json* generation_config,
                                              std::string source) {
  if (!config.is_object()) return corrupt(source + ": not a JSON object");
  JsonFields r(config, source);
  ModelConfig c;
  c.source = source;

  std::string arch_name;
  if (r.has("architectures")) {
    const auto& a = config["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string()) {
      return corrupt(source + ": 'architectures' must be a non-empty list of names");
    }
    arch_name = a[0].get<std::string>();
  } else {
    std::string model_type;
    DS_RETURN_IF_ERROR(r.get_string("model_type", &model_type));
    if (model_type == "llama")
      arch_name = "LlamaForCausalLM";
    else if (model_type == "qwen2")
      arch_name = "Qwen2ForCausalLM";
    else
      arch_name = model_type.empty() ? "(none given)" : "model_type " + model_type;
  }
  if (arch_name == "LlamaForCausalLM") {
    c.arch = Architecture::kLlama;
  } else if (arch_name == "Qwen2ForCausalLM") {
    c.arch = Architecture::kQwen2;
  } else {
    return unimplemented(source + ": unsupported architecture '" + arch_name +
                         "' (supported: " + std::string(kSupportedHf) + ")");
  }

  DS_RETURN_IF_ERROR(r.get_int("vocab_size", &c.vocab_size, true));
  DS_RETURN_IF_ERROR(r.get_int("hidden_size", &c.hidden_size, true));
  DS_RETURN_IF_ERROR(r.get_int("intermediate_size", &c.intermediate_size, true));
  DS_RETURN_IF_ERROR(r.get_int("num_hidden_layers", &c.n_layers, true));
  DS_RETURN_IF_ERROR(r.get_int("num_attention_heads", &c.n_heads, true));
  c.n_kv_heads = c.n_heads;
  DS_RETURN_IF_ERROR(r.get_int("num_key_value_heads", &c.n_kv_heads, false));
  if (c.n_heads <= 0) return corrupt(source + ": num_attention_heads must be positive");
  c.head_dim = static_cast<int>(c.hidden_size / c.n_heads);
  DS_RETURN_IF_ERROR(r.get_int("head_dim", &c.head_dim, false));
  double eps = 1e-6;
  DS_RETURN_IF_ERROR(r.get_double("rms_norm_eps", &eps, false));
  c.rms_norm_eps = static_cast<float>(eps);
  c.max_position_embeddings = c.arch == Architecture::kQwen2 ? 32768 : 2048;
  DS_RETURN_IF_ERROR(r.get_int("max_position_embeddings", &c.max_position_embeddings, false));
  DS_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &c.tie_word_embeddings));

  std::string act = "silu";
  DS_RETURN_IF_ERROR(r.get_string("hidden_act", &act));
  if (act != "silu") return unimplemented(source + ": unsupported hidden_act '" + act + "'");
  if (c.arch == Architecture::kQwen2) {
    c.qkv_bias = true;
    bool sliding = false;
    DS_RETURN_IF_ERROR(r.get_bool("use_sliding_window", &sliding));
    if (sliding) return unimplemented(source + ": use_sliding_window is not supported");
  } else {
    bool attention_bias = false;
    DS_RETURN_IF_ERROR(r.get_bool("attention_bias", &attention_bias));
    c.qkv_bias = c.o_bias = attention_bias;
    DS_RETURN_IF_ERROR(r.get_bool("mlp_bias", &c.mlp_bias));
    int64_t tp = 1;
    DS_RETURN_IF_ERROR(r.get_int("pretraining_tp", &tp, false));
  }
  DS_RETURN_IF_ERROR(
      config_core::read_hf_rope(config, source, c.max_position_embeddings, c.head_dim, &c.rope));

  DS_RETURN_IF_ERROR(
      config_core::read_hf_special_ids(config, source, generation_config, &c.bos_id, &c.eos_ids));

  DS_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<ModelConfig> ModelConfig::from_gguf(const GgufMetadata& md, bool has_output_weight) {
  ModelConfig c;
  c.source = md.source + " metadata";
  DS_ASSIGN_OR_RETURN(std::string arch, md.get_string("general.architecture"));
  if (arch == "llama") {
    c.arch = Architecture::kLlama;
  } else if (arch == "qwen2") {
    c.arch = Architecture::kQwen2;
    c.qkv_bias = true;
  } else {
    return unimplemented(md.source + ": unsupported architecture '" + arch +
                         "' (supported: llama, qwen2)");
  }
  const std::string p = arch + ".";
  auto get_int = [&](const std::string& key, auto* out) -> Status {
    Result<int64_t> v = md.get_int(p + key);
    if (!v.ok()) return v.status();
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(*v);
    return Status::Ok();
  };
  DS_RETURN_IF_ERROR(get_int("block_count", &c.n_layers));
  DS_RETURN_IF_ERROR(get_int("embedding_length", &c.hidden_size));
  DS_RETURN_IF_ERROR(get_int("feed_forward_length", &c.intermediate_size));
  DS_RETURN_IF_ERROR(get_int("attention.head_count", &c.n_heads));
  c.n_kv_heads = c.n_heads;
  if (md.contains(p + "attention.head_count_kv")) {
    DS_RETURN_IF_ERROR(get_int("attention.head_count_kv", &c.n_kv_heads));
  }
  DS_RETURN_IF_ERROR(get_int("context_length", &c.max_position_embeddings));
  if (c.n_heads <= 0) return corrupt(c.source + ": attention.head_count must be positive");
  c.head_dim = static_cast<int>(c.hidden_size / c.n_heads);
  if (md.contains(p + "attention.key_length")) {
    DS_RETURN_IF_ERROR(get_int("attention.key_length", &c.head_dim));
  }
  DS_ASSIGN_OR_RETURN(double eps, md.get_float(p + "attention.layer_norm_rms_epsilon"));
  c.rms_norm_eps = static_cast<float>(eps);

  DS_RETURN_IF_ERROR(config_core::read_gguf_vocab_size(md, p, &c.vocab_size));

  RopeConfig& rope = c.rope;
  DS_RETURN_IF_ERROR(config_core::read_gguf_rope_theta(md, p, &rope));
  rope.rotary_dim = c.head_dim;
  if (md.contains(p + "rope.dimension_count")) {
    DS_RETURN_IF_ERROR(get_int("rope.dimension_count", &rope.rotary_dim));
  }
  std::string scaling = "none";
  if (md.contains(p + "rope.scaling.type")) {
    DS_ASSIGN_OR_RETURN(scaling, md.get_string(p + "rope.scaling.type"));
  }
  if (scaling == "linear" || scaling == "yarn") {
    rope.type = scaling == "linear" ? RopeScalingType::kLinear : RopeScalingType::kYarn;
    DS_RETURN_IF_ERROR(config_core::read_gguf_yarn(md, p, c.max_position_embeddings,
                                                   /*original_required=*/false, &rope));
  } else if (scaling != "none") {
    return unimplemented(md.source + ": unsupported rope.scaling.type '" + scaling + "'");
  }
  // (llama3-style scaling in GGUF files is stored as a rope_freqs tensor, not metadata;
  // LlamaModel applies it when present.)

  c.tie_word_embeddings = !has_output_weight;
  DS_RETURN_IF_ERROR(config_core::read_gguf_special_ids(md, &c.bos_id, &c.eos_ids));
  DS_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<ModelConfig> ModelConfig::from_model_files(const ModelFiles& files) {
  return config_core::from_model_files<ModelConfig>(files);
}

Status ModelConfig::validate() const {
  auto bad = [&](const std::string& what) { return corrupt(source + ": " + what); };
  if (vocab_size <= 0) return bad("vocab_size must be positive");
  if (hidden_size <= 0) return bad("hidden_size must be positive");
  if (intermediate_size <= 0) return bad("intermediate_size must be positive");
  if (n_layers <= 0) return bad("num_hidden_layers must be positive");
  if (n_heads <= 0 || n_kv_heads <= 0) return bad("head counts must be positive");
  if (n_heads % n_kv_heads != 0) {
    return bad("num_attention_heads (" + std::to_string(n_heads) +
               ") is not a multiple of num_key_value_heads (" + std::to_string(n_kv_heads) + ")");
  }
  if (head_dim <= 0 || head_dim % 2 != 0) return bad("head_dim must be positive and even");
  if (rope.rotary_dim <= 0 || rope.rotary_dim > head_dim || rope.rotary_dim % 2 != 0) {
    return bad("rotary dimension " + std::to_string(rope.rotary_dim) +
               " must be even and at most head_dim " + std::to_string(head_dim));
  }
  if (!(rms_norm_eps > 0)) return bad("rms_norm_eps must be positive");
  if (max_position_embeddings <= 0) return bad("max_position_embeddings must be positive");
  if (!(rope.theta > 0)) return bad("rope_theta must be positive");
  if (rope.type != RopeScalingType::kDefault && !(rope.factor > 0)) {
    return bad("rope scaling factor must be positive");
  }
  if ((rope.type == RopeScalingType::kLlama3 || rope.type == RopeScalingType::kYarn) &&
      rope.original_max_position_embeddings <= 0) {
    return bad("original_max_position_embeddings must be positive");
  }
  if (rope.type == RopeScalingType::kLlama3 && rope.high_freq_factor == rope.low_freq_factor) {
    return bad("llama3 rope: high_freq_factor must differ from low_freq_factor");
  }
  for (int32_t id : eos_ids) {
    if (id < 0 || id >= vocab_size)
      return bad("eos_token_id " + std::to_string(id) + " outside the vocabulary");
  }
  return Status::Ok();
}

std::string ModelConfig::summary() const {
  std::ostringstream s;
  s << architecture_name(arch) << ": " << n_layers << " layers, hidden " << hidden_size << ", ffn "
    << intermediate_size << ", heads " << n_heads << "/" << n_kv_heads << " x " << head_dim
    << ", vocab " << vocab_size << ", rope " << rope_scaling_name(rope.type) << " theta "
    << rope.theta << (tie_word_embeddings ? ", tied embeddings" : "")
    << (qkv_bias ? ", qkv bias" : "") << ", eos [" << join_ids(eos_ids) << "]";
  return s.str();
}

}  // namespace dserve
