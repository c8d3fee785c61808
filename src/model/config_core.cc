#include "model/config_core.h"

#include <algorithm>

#include "model/json_fields.h"

namespace dserve::config_core {
namespace {

// rope_scaling and rope_parameters merged into one object (either may be absent).
Result<nlohmann::json> rope_params(const nlohmann::json& config, const std::string& source) {
  JsonFields top(config, source);
  nlohmann::json params = nlohmann::json::object();
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!top.has(key)) continue;
    if (!config[key].is_object()) return corrupt(source + ": '" + key + "' must be an object");
    for (const auto& [k, v] : config[key].items()) params[k] = v;
  }
  return params;
}

Result<RopeScalingType> rope_type_named(const std::string& type, const std::string& source) {
  if (type == "default") return RopeScalingType::kDefault;
  if (type == "linear") return RopeScalingType::kLinear;
  if (type == "llama3") return RopeScalingType::kLlama3;
  if (type == "yarn") return RopeScalingType::kYarn;
  return unimplemented(source + ": unsupported rope_type '" + type +
                       "' (supported: default, linear, llama3, yarn)");
}

// YaRN's own parameters (factor and the pre-training context already read).
Status read_hf_yarn(const JsonFields& r, RopeConfig* rope) {
  // transformers: `beta_fast or 32`, so 0 also means the default.
  double beta_fast = 0, beta_slow = 0;
  DS_RETURN_IF_ERROR(r.get_double("beta_fast", &beta_fast, false));
  DS_RETURN_IF_ERROR(r.get_double("beta_slow", &beta_slow, false));
  rope->beta_fast = beta_fast != 0 ? beta_fast : 32.0;
  rope->beta_slow = beta_slow != 0 ? beta_slow : 1.0;
  DS_RETURN_IF_ERROR(r.get_optional_double("mscale", &rope->mscale));
  DS_RETURN_IF_ERROR(r.get_optional_double("mscale_all_dim", &rope->mscale_all_dim));
  DS_RETURN_IF_ERROR(r.get_optional_double("attention_factor", &rope->attention_factor));
  return r.get_bool("truncate", &rope->truncate);
}

}  // namespace

Status read_hf_rope(const nlohmann::json& config, const std::string& source, int64_t max_pos,
                    int head_dim, RopeConfig* rope) {
  JsonFields top(config, source);
  DS_ASSIGN_OR_RETURN(nlohmann::json params, rope_params(config, source));
  JsonFields r(params, source + " rope_parameters");

  rope->theta = 10000.0;
  DS_RETURN_IF_ERROR(top.get_double("rope_theta", &rope->theta, false));
  DS_RETURN_IF_ERROR(r.get_double("rope_theta", &rope->theta, false));
  double partial = 1.0;
  DS_RETURN_IF_ERROR(top.get_double("partial_rotary_factor", &partial, false));
  DS_RETURN_IF_ERROR(r.get_double("partial_rotary_factor", &partial, false));
  rope->rotary_dim = static_cast<int>(head_dim * partial);

  std::string type = "default";
  DS_RETURN_IF_ERROR(r.get_string("type", &type));
  DS_RETURN_IF_ERROR(r.get_string("rope_type", &type));
  DS_ASSIGN_OR_RETURN(rope->type, rope_type_named(type, source));
  if (rope->type == RopeScalingType::kDefault) return Status::Ok();

  const bool yarn = rope->type == RopeScalingType::kYarn;
  // yarn may omit factor: transformers then uses max_position / original_max_position.
  DS_RETURN_IF_ERROR(r.get_double("factor", &rope->factor, !yarn));
  if (rope->type == RopeScalingType::kLinear) return Status::Ok();

  // Pre-training context: a top-level original_max_position_embeddings wins (as in
  // transformers), then the one inside the rope parameters, then max_position.
  rope->original_max_position_embeddings = max_pos;
  DS_RETURN_IF_ERROR(r.get_int("original_max_position_embeddings",
                               &rope->original_max_position_embeddings, false));
  DS_RETURN_IF_ERROR(top.get_int("original_max_position_embeddings",
                                 &rope->original_max_position_embeddings, false));
  if (rope->type == RopeScalingType::kLlama3) {
    DS_RETURN_IF_ERROR(r.get_double("low_freq_factor", &rope->low_freq_factor, true));
    return r.get_double("high_freq_factor", &rope->high_freq_factor, true);
  }
  if (!r.has("factor") && rope->original_max_position_embeddings > 0) {
    rope->factor =
        static_cast<double>(max_pos) / static_cast<double>(rope->original_max_position_embeddings);
  }
  return read_hf_yarn(r, rope);
}

Status read_hf_special_ids(const nlohmann::json& config, const std::string& source,
                           const nlohmann::json* generation_config, int32_t* bos,
                           std::vector<int32_t>* eos_ids) {
  JsonFields r(config, source);
  int64_t id = -1;
  DS_RETURN_IF_ERROR(r.get_int("bos_token_id", &id, false));
  DS_RETURN_IF_ERROR(r.get_id_list("eos_token_id", eos_ids));
  if (generation_config && generation_config->is_object()) {
    JsonFields g(*generation_config, "generation_config.json");
    DS_RETURN_IF_ERROR(g.get_int("bos_token_id", &id, false));
    DS_RETURN_IF_ERROR(g.get_id_list("eos_token_id", eos_ids));
  }
  *bos = static_cast<int32_t>(id);
  return Status::Ok();
}

Status read_gguf_vocab_size(const GgufMetadata& md, const std::string& prefix, int64_t* vocab_size) {
  if (md.contains(prefix + "vocab_size")) {
    DS_ASSIGN_OR_RETURN(*vocab_size, md.get_int(prefix + "vocab_size"));
    return Status::Ok();
  }
  DS_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens,
                      md.get_string_array("tokenizer.ggml.tokens"));
  *vocab_size = static_cast<int64_t>(tokens->size());
  return Status::Ok();
}

Status read_gguf_special_ids(const GgufMetadata& md, int32_t* bos, std::vector<int32_t>* eos_ids) {
  if (md.contains("tokenizer.ggml.bos_token_id")) {
    DS_ASSIGN_OR_RETURN(int64_t id, md.get_int("tokenizer.ggml.bos_token_id"));
    *bos = static_cast<int32_t>(id);
  }
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (!md.contains(key)) continue;
    DS_ASSIGN_OR_RETURN(int64_t id, md.get_int(key));
    if (std::find(eos_ids->begin(), eos_ids->end(), id) == eos_ids->end()) {
      eos_ids->push_back(static_cast<int32_t>(id));
    }
  }
  return Status::Ok();
}

Status read_gguf_rope_theta(const GgufMetadata& md, const std::string& prefix, RopeConfig* rope) {
  if (md.contains(prefix + "rope.freq_base")) {
    DS_ASSIGN_OR_RETURN(rope->theta, md.get_float(prefix + "rope.freq_base"));
  }
  return Status::Ok();
}

Status read_gguf_yarn(const GgufMetadata& md, const std::string& prefix, int64_t max_pos,
                      bool original_required, RopeConfig* rope) {
  DS_ASSIGN_OR_RETURN(rope->factor, md.get_float(prefix + "rope.scaling.factor"));
  const std::string original = prefix + "rope.scaling.original_context_length";
  rope->original_max_position_embeddings = max_pos;
  if (original_required && !md.contains(original)) {
    return corrupt(md.source + ": metadata field '" + original +
                   "' is missing (required for MLA / MoE)");
  }
  if (md.contains(original)) {
    DS_ASSIGN_OR_RETURN(rope->original_max_position_embeddings, md.get_int(original));
  }
  if (md.contains(prefix + "rope.scaling.yarn_beta_fast")) {
    DS_ASSIGN_OR_RETURN(rope->beta_fast, md.get_float(prefix + "rope.scaling.yarn_beta_fast"));
  }
  if (md.contains(prefix + "rope.scaling.yarn_beta_slow")) {
    DS_ASSIGN_OR_RETURN(rope->beta_slow, md.get_float(prefix + "rope.scaling.yarn_beta_slow"));
  }
  return Status::Ok();
}

}  // namespace dserve::config_core
