#include "model/deepseek_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "loader/gguf_file.h"
#include "loader/model_files.h"
#include "model/config_core.h"
#include "model/json_fields.h"

namespace dserve {

std::string_view topk_method_name(TopkMethod m) {
  switch (m) {
    case TopkMethod::kGreedy:
      return "greedy";
    case TopkMethod::kGroupLimitedGreedy:
      return "group_limited_greedy";
    case TopkMethod::kNoauxTc:
      return "noaux_tc";
  }
  return "?";
}

std::string_view scoring_func_name(ScoringFunc s) {
  switch (s) {
    case ScoringFunc::kSoftmax:
      return "softmax";
    case ScoringFunc::kSigmoid:
      return "sigmoid";
  }
  return "?";
}

namespace {

// DeepSeek's yarn_get_mscale.
double yarn_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}


// rope_scaling (DeepSeek's own config.json) or rope_parameters (transformers 5), as for
// every architecture; DeepSeek's rotate qk_rope_head_dim values of each head, by
// default or by YaRN.
Status parse_rope(const nlohmann::json& config, const std::string& source, DeepseekConfig* c) {
  DS_RETURN_IF_ERROR(config_core::read_hf_rope(config, source, c->max_position_embeddings,
                                               c->qk_rope_head_dim, &c->rope));
  const RopeScalingType type = c->rope.type;
  if (type != RopeScalingType::kDefault && type != RopeScalingType::kYarn) {
    return unimplemented(source + ": rope type '" + std::string(rope_scaling_name(type)) +
                         "' is not supported for DeepSeek models (default, yarn)");
  }
  return Status::Ok();
}

}  // namespace

float DeepseekConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.type != RopeScalingType::kDefault && rope.mscale_all_dim && *rope.mscale_all_dim != 0) {
    const double m = yarn_mscale(rope.factor, *rope.mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

Result<DeepseekConfig> DeepseekConfig::from_hf_json(const nlohmann::json& config,
                                                    const nlohmann::json* generation_config,
                                                    std::string source) {
  if (!config.is_object()) return corrupt(source + ": not a JSON object");
  JsonFields r(config, source);
  DeepseekConfig c;
  c.source = source;

  std::string arch, model_type;
  if (r.has("architectures") && config["architectures"].is_array() &&
      !config["architectures"].empty() && config["architectures"][0].is_string()) {
    arch = config["architectures"][0].get<std::string>();
  }
  DS_RETURN_IF_ERROR(r.get_string("model_type", &model_type));
  if (arch == "DeepseekV3ForCausalLM" || (arch.empty() && model_type == "deepseek_v3")) {
    c.version = DeepseekVersion::kV3;
  } else if (arch == "DeepseekV2ForCausalLM" || (arch.empty() && model_type == "deepseek_v2")) {
    c.version = DeepseekVersion::kV2;
  } else {
    return unimplemented(source + ": not a DeepSeek-V2/V3 config (architecture '" + arch + "')");
  }
  const bool v3 = c.version == DeepseekVersion::kV3;

  DS_RETURN_IF_ERROR(r.get_int("vocab_size", &c.vocab_size, true));
  DS_RETURN_IF_ERROR(r.get_int("hidden_size", &c.hidden_size, true));
  DS_RETURN_IF_ERROR(r.get_int("intermediate_size", &c.intermediate_size, true));
  DS_RETURN_IF_ERROR(r.get_int("num_hidden_layers", &c.n_layers, true));
  DS_RETURN_IF_ERROR(r.get_int("num_attention_heads", &c.n_heads, true));
  double eps = 1e-6;
  DS_RETURN_IF_ERROR(r.get_double("rms_norm_eps", &eps, false));
  c.rms_norm_eps = static_cast<float>(eps);
  c.max_position_embeddings = v3 ? 4096 : 2048;
  DS_RETURN_IF_ERROR(r.get_int("max_position_embeddings", &c.max_position_embeddings, false));
  DS_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &c.tie_word_embeddings));

  // MLA: every dimension is required; q_lora_rank null means a plain q_proj.
  DS_RETURN_IF_ERROR(r.get_int("q_lora_rank", &c.q_lora_rank, false));
  DS_RETURN_IF_ERROR(r.get_int("kv_lora_rank", &c.kv_lora_rank, true));
  DS_RETURN_IF_ERROR(r.get_int("qk_nope_head_dim", &c.qk_nope_head_dim, true));
  DS_RETURN_IF_ERROR(r.get_int("qk_rope_head_dim", &c.qk_rope_head_dim, true));
  DS_RETURN_IF_ERROR(r.get_int("v_head_dim", &c.v_head_dim, true));
  c.rope_interleaved = true;
  if (v3) DS_RETURN_IF_ERROR(r.get_bool("rope_interleave", &c.rope_interleaved));

  std::string act = "silu";
  DS_RETURN_IF_ERROR(r.get_string("hidden_act", &act));
  if (act != "silu") return unimplemented(source + ": unsupported hidden_act '" + act + "'");
  bool attention_bias = false, mlp_bias = false;
  DS_RETURN_IF_ERROR(r.get_bool("attention_bias", &attention_bias));
  DS_RETURN_IF_ERROR(r.get_bool("mlp_bias", &mlp_bias));
  if (attention_bias || mlp_bias) {
    return unimplemented(source +
                         ": attention_bias / mlp_bias are not supported for DeepSeek models");
  }

  // DeepSeekMoE, with the defaults of transformers' configs where a field is absent.
  c.n_routed_experts = 0;
  DS_RETURN_IF_ERROR(r.get_int("n_routed_experts", &c.n_routed_experts, false));
  c.n_shared_experts = v3 ? 1 : 2;
  DS_RETURN_IF_ERROR(r.get_int("n_shared_experts", &c.n_shared_experts, false));
  DS_RETURN_IF_ERROR(
      r.get_int("num_experts_per_tok", &c.n_experts_per_tok, c.n_routed_experts > 0));
  DS_RETURN_IF_ERROR(
      r.get_int("moe_intermediate_size", &c.moe_intermediate_size, c.n_routed_experts > 0));
  c.first_k_dense_replace = v3 ? 3 : 0;
  DS_RETURN_IF_ERROR(r.get_int("first_k_dense_replace", &c.first_k_dense_replace, false));
  DS_RETURN_IF_ERROR(r.get_int("moe_layer_freq", &c.moe_layer_freq, false));
  c.n_group = v3 ? 8 : 1;
  c.topk_group = v3 ? 4 : 1;
  DS_RETURN_IF_ERROR(r.get_int("n_group", &c.n_group, false));
  DS_RETURN_IF_ERROR(r.get_int("topk_group", &c.topk_group, false));
  std::string method = v3 ? "noaux_tc" : "greedy";
  DS_RETURN_IF_ERROR(r.get_string("topk_method", &method));
  if (method == "greedy")
    c.topk_method = TopkMethod::kGreedy;
  else if (method == "group_limited_greedy")
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  else if (method == "noaux_tc")
    c.topk_method = TopkMethod::kNoauxTc;
  else
    return unimplemented(source + ": unsupported topk_method '" + method +
                         "' (greedy, group_limited_greedy, noaux_tc)");
  std::string scoring = v3 ? "sigmoid" : "softmax";
  DS_RETURN_IF_ERROR(r.get_string("scoring_func", &scoring));
  if (scoring == "softmax")
    c.scoring_func = ScoringFunc::kSoftmax;
  else if (scoring == "sigmoid")
    c.scoring_func = ScoringFunc::kSigmoid;
  else
    return unimplemented(source + ": unsupported scoring_func '" + scoring +
                         "' (softmax, sigmoid)");
  c.norm_topk_prob = v3;
  DS_RETURN_IF_ERROR(r.get_bool("norm_topk_prob", &c.norm_topk_prob));
  double scaling = v3 ? 2.5 : 1.0;
  DS_RETURN_IF_ERROR(r.get_double("routed_scaling_factor", &scaling, false));
  c.routed_scaling_factor = static_cast<float>(scaling);
  DS_RETURN_IF_ERROR(r.get_int("num_nextn_predict_layers", &c.num_nextn_predict_layers, false));

  DS_RETURN_IF_ERROR(parse_rope(config, source, &c));

  DS_RETURN_IF_ERROR(
      config_core::read_hf_special_ids(config, source, generation_config, &c.bos_id, &c.eos_ids));
  DS_RETURN_IF_ERROR(c.validate());
  return c;
}

// GGUF "deepseek2" (llama.cpp's name for V2 and V3). Newer llama.cpp files that store
// attn_kv_b split into attn_k_b / attn_v_b describe the MLA head dims in
// key_length_mla / value_length_mla (key_length / value_length then describe the
// latent); older ones in key_length / value_length.
Result<DeepseekConfig> DeepseekConfig::from_gguf(const GgufMetadata& md, bool has_output_weight) {
  DeepseekConfig c;
  c.source = md.source + " metadata";
  DS_ASSIGN_OR_RETURN(std::string arch, md.get_string("general.architecture"));
  if (arch != "deepseek2")
    return unimplemented(md.source + ": not a deepseek2 GGUF (architecture '" + arch + "')");
  const std::string p = "deepseek2.";
  auto need = [&](const std::string& key) -> Result<int64_t> {
    if (!md.contains(p + key)) {
      return corrupt(md.source + ": metadata field '" + p + key +
                     "' is missing (required for MLA / MoE)");
    }
    return md.get_int(p + key);
  };
  auto opt = [&](const std::string& key, int64_t fallback) -> Result<int64_t> {
    if (!md.contains(p + key)) return fallback;
    return md.get_int(p + key);
  };
  DS_ASSIGN_OR_RETURN(int64_t n_layers, need("block_count"));
  DS_ASSIGN_OR_RETURN(c.hidden_size, need("embedding_length"));
  DS_ASSIGN_OR_RETURN(c.intermediate_size, need("feed_forward_length"));
  DS_ASSIGN_OR_RETURN(int64_t n_heads, need("attention.head_count"));
  DS_ASSIGN_OR_RETURN(c.max_position_embeddings, need("context_length"));
  DS_ASSIGN_OR_RETURN(double eps, md.get_float(p + "attention.layer_norm_rms_epsilon"));
  c.rms_norm_eps = static_cast<float>(eps);
  DS_ASSIGN_OR_RETURN(int64_t q_lora, opt("attention.q_lora_rank", 0));
  DS_ASSIGN_OR_RETURN(int64_t kv_lora, need("attention.kv_lora_rank"));
  DS_ASSIGN_OR_RETURN(int64_t rope_dim, need("rope.dimension_count"));
  int64_t key_len = 0, value_len = 0;
  if (md.contains(p + "attention.key_length_mla")) {
    DS_ASSIGN_OR_RETURN(key_len, need("attention.key_length_mla"));
    DS_ASSIGN_OR_RETURN(value_len, need("attention.value_length_mla"));
  } else {
    DS_ASSIGN_OR_RETURN(key_len, need("attention.key_length"));
    DS_ASSIGN_OR_RETURN(value_len, need("attention.value_length"));
  }
  c.n_layers = static_cast<int>(n_layers);
  c.n_heads = static_cast<int>(n_heads);
  c.q_lora_rank = static_cast<int>(q_lora);
  c.kv_lora_rank = static_cast<int>(kv_lora);
  c.qk_rope_head_dim = static_cast<int>(rope_dim);
  c.qk_nope_head_dim = static_cast<int>(key_len - rope_dim);
  c.v_head_dim = static_cast<int>(value_len);

  DS_ASSIGN_OR_RETURN(int64_t n_experts, opt("expert_count", 0));
  c.n_routed_experts = static_cast<int>(n_experts);
  if (n_experts > 0) {
    DS_ASSIGN_OR_RETURN(int64_t used, need("expert_used_count"));
    DS_ASSIGN_OR_RETURN(int64_t shared, opt("expert_shared_count", 0));
    DS_ASSIGN_OR_RETURN(c.moe_intermediate_size, need("expert_feed_forward_length"));
    DS_ASSIGN_OR_RETURN(int64_t dense, opt("leading_dense_block_count", 0));
    DS_ASSIGN_OR_RETURN(int64_t groups, opt("expert_group_count", 1));
    DS_ASSIGN_OR_RETURN(int64_t groups_used, opt("expert_group_used_count", 1));
    DS_ASSIGN_OR_RETURN(int64_t gating, opt("expert_gating_func", 1));  // 1 softmax, 2 sigmoid
    c.n_experts_per_tok = static_cast<int>(used);
    c.n_shared_experts = static_cast<int>(shared);
    c.first_k_dense_replace = static_cast<int>(dense);
    c.n_group = static_cast<int>(groups);
    c.topk_group = static_cast<int>(groups_used);
    if (gating == 2) {
      c.scoring_func = ScoringFunc::kSigmoid;
      c.topk_method = TopkMethod::kNoauxTc;
    } else if (gating == 1) {
      c.scoring_func = ScoringFunc::kSoftmax;
      c.topk_method = groups > 1 ? TopkMethod::kGroupLimitedGreedy : TopkMethod::kGreedy;
    } else {
      return unimplemented(md.source + ": unsupported deepseek2.expert_gating_func " +
                           std::to_string(gating));
    }
    c.version = gating == 2 ? DeepseekVersion::kV3 : DeepseekVersion::kV2;
    if (md.contains(p + "expert_weights_scale")) {
      DS_ASSIGN_OR_RETURN(double s, md.get_float(p + "expert_weights_scale"));
      c.routed_scaling_factor = static_cast<float>(s);
    }
    if (md.contains(p + "expert_weights_norm")) {
      DS_ASSIGN_OR_RETURN(c.norm_topk_prob, md.get_bool(p + "expert_weights_norm"));
    }
  }
  DS_ASSIGN_OR_RETURN(int64_t nextn, opt("nextn_predict_layers", 0));
  c.num_nextn_predict_layers = static_cast<int>(nextn);
  // llama.cpp counts the MTP layers in block_count.
  c.n_layers -= c.num_nextn_predict_layers;

  DS_RETURN_IF_ERROR(config_core::read_gguf_vocab_size(md, p, &c.vocab_size));
  RopeConfig& rope = c.rope;
  rope.rotary_dim = c.qk_rope_head_dim;
  DS_RETURN_IF_ERROR(config_core::read_gguf_rope_theta(md, p, &rope));
  std::string scaling = "none";
  if (md.contains(p + "rope.scaling.type")) {
    DS_ASSIGN_OR_RETURN(scaling, md.get_string(p + "rope.scaling.type"));
  }
  if (scaling == "yarn") {
    rope.type = RopeScalingType::kYarn;
    DS_RETURN_IF_ERROR(config_core::read_gguf_yarn(md, p, c.max_position_embeddings,
                                                   /*original_required=*/true, &rope));
    // llama.cpp stores 0.1 * mscale_all_dim; DeepSeek's checkpoints all have
    // mscale == mscale_all_dim, so the RoPE attention factor is 1.
    double log_mul = 0.0;
    if (md.contains(p + "rope.scaling.yarn_log_multiplier")) {
      DS_ASSIGN_OR_RETURN(log_mul, md.get_float(p + "rope.scaling.yarn_log_multiplier"));
    }
    if (log_mul != 0.0) {
      rope.mscale_all_dim = log_mul / 0.1;
      rope.mscale = rope.mscale_all_dim;
    }
  } else if (scaling != "none") {
    return unimplemented(md.source + ": unsupported rope.scaling.type '" + scaling +
                         "' for deepseek2");
  }
  c.rope_interleaved = true;
  c.tie_word_embeddings = !has_output_weight;
  DS_RETURN_IF_ERROR(config_core::read_gguf_special_ids(md, &c.bos_id, &c.eos_ids));
  DS_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<DeepseekConfig> DeepseekConfig::from_model_files(const ModelFiles& files) {
  return config_core::from_model_files<DeepseekConfig>(files);
}

bool is_deepseek_model(const ModelFiles& files) {
  switch (files.format()) {
    case ModelFormat::kHuggingFace: {
      const nlohmann::json* config = files.hf_config();
      if (!config || !config->is_object()) return false;
      if (config->contains("architectures") && (*config)["architectures"].is_array() &&
          !(*config)["architectures"].empty() && (*config)["architectures"][0].is_string()) {
        const std::string a = (*config)["architectures"][0].get<std::string>();
        return a == "DeepseekV2ForCausalLM" || a == "DeepseekV3ForCausalLM";
      }
      if (config->contains("model_type") && (*config)["model_type"].is_string()) {
        const std::string t = (*config)["model_type"].get<std::string>();
        return t == "deepseek_v2" || t == "deepseek_v3";
      }
      return false;
    }
    case ModelFormat::kGguf: {
      const GgufMetadata* md = files.gguf_metadata();
      if (!md) return false;
      Result<std::string> arch = md->get_string("general.architecture");
      return arch.ok() && *arch == "deepseek2";
    }
  }
  return false;
}

Status DeepseekConfig::validate() const {
  auto bad = [&](const std::string& what) { return corrupt(source + ": " + what); };
  if (vocab_size <= 0) return bad("vocab_size must be positive");
  if (hidden_size <= 0) return bad("hidden_size must be positive");
  if (n_layers <= 0) return bad("num_hidden_layers must be positive");
  if (n_heads <= 0) return bad("num_attention_heads must be positive");
  if (q_lora_rank < 0) return bad("q_lora_rank must not be negative");
  if (kv_lora_rank <= 0) return bad("kv_lora_rank must be positive");
  if (qk_nope_head_dim <= 0) return bad("qk_nope_head_dim must be positive");
  if (qk_rope_head_dim <= 0 || qk_rope_head_dim % 2 != 0)
    return bad("qk_rope_head_dim must be positive and even");
  if (v_head_dim <= 0) return bad("v_head_dim must be positive");
  if (!(rms_norm_eps > 0)) return bad("rms_norm_eps must be positive");
  if (max_position_embeddings <= 0) return bad("max_position_embeddings must be positive");
  if (!(rope.theta > 0)) return bad("rope_theta must be positive");
  if (rope.type == RopeScalingType::kYarn &&
      (!(rope.factor > 0) || rope.original_max_position_embeddings <= 0)) {
    return bad("yarn rope needs a positive factor and original_max_position_embeddings");
  }
  if (n_routed_experts < 0) return bad("n_routed_experts must not be negative");
  if (n_routed_experts > 0) {
    if (intermediate_size <= 0 && first_k_dense_replace > 0)
      return bad("intermediate_size must be positive");
    if (moe_intermediate_size <= 0) return bad("moe_intermediate_size must be positive");
    if (n_experts_per_tok <= 0 || n_experts_per_tok > n_routed_experts) {
      return bad("num_experts_per_tok " + std::to_string(n_experts_per_tok) +
                 " must be in [1, n_routed_experts " + std::to_string(n_routed_experts) + "]");
    }
    if (n_shared_experts < 0) return bad("n_shared_experts must not be negative");
    if (moe_layer_freq <= 0) return bad("moe_layer_freq must be positive");
    if (first_k_dense_replace < 0) return bad("first_k_dense_replace must not be negative");
    if (topk_method != TopkMethod::kGreedy) {
      if (n_group <= 0 || n_routed_experts % n_group != 0) {
        return bad("n_routed_experts " + std::to_string(n_routed_experts) +
                   " is not a multiple of n_group " + std::to_string(n_group));
      }
      if (topk_group <= 0 || topk_group > n_group) return bad("topk_group must be in [1, n_group]");
      if (static_cast<int64_t>(topk_group) * (n_routed_experts / n_group) < n_experts_per_tok) {
        return bad("topk_group groups hold fewer experts than num_experts_per_tok");
      }
      if (topk_method == TopkMethod::kNoauxTc && n_routed_experts / n_group < 2) {
        return bad("noaux_tc routing needs at least 2 experts per group");
      }
    }
  } else if (intermediate_size <= 0) {
    return bad("intermediate_size must be positive");
  }
  if (num_nextn_predict_layers < 0) return bad("num_nextn_predict_layers must not be negative");
  for (int32_t id : eos_ids) {
    if (id < 0 || id >= vocab_size)
      return bad("eos_token_id " + std::to_string(id) + " outside the vocabulary");
  }
  return Status::Ok();
}

std::string DeepseekConfig::summary() const {
  std::ostringstream s;
  s << (version == DeepseekVersion::kV3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM") << ": "
    << n_layers << " layers, hidden " << hidden_size << ", heads " << n_heads << ", MLA q_lora "
    << q_lora_rank << " kv_lora " << kv_lora_rank << " qk " << qk_nope_head_dim << "+"
    << qk_rope_head_dim << " v " << v_head_dim << ", ";
  if (n_routed_experts > 0) {
    s << "MoE " << n_routed_experts << " experts top-" << n_experts_per_tok << " + "
      << n_shared_experts << " shared (" << topk_method_name(topk_method) << ", "
      << scoring_func_name(scoring_func) << ", groups " << topk_group << "/" << n_group
      << "), first " << first_k_dense_replace << " dense, ";
  }
  s << "rope " << rope_scaling_name(rope.type) << ", vocab " << vocab_size;
  if (num_nextn_predict_layers > 0)
    s << ", " << num_nextn_predict_layers << " MTP layer(s) not run";
  return s.str();
}

}  // namespace dserve
