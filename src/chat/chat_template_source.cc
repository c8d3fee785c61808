#include "chat/chat_template_source.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loader/gguf_file.h"

namespace dserve::chat {
namespace {

namespace fs = std::filesystem;

Result<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path.string() + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(path.string() + ": read failed");
  return ss.str();
}

Result<nlohmann::json> read_json(const fs::path& path) {
  DS_ASSIGN_OR_RETURN(std::string text, read_file(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt(path.string() + ": not valid JSON");
  return j;
}

// A special token as tokenizer_config.json stores it: "text" or {"content": "text", ...}.
std::string token_string(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) {
    const auto c = j.find("content");
    if (c != j.end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

Result<ChatTemplateSource> from_hf_dir(const fs::path& dir) {
  ChatTemplateSource out;
  nlohmann::json config = nlohmann::json::object();
  const fs::path config_path = dir / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    DS_ASSIGN_OR_RETURN(config, read_json(config_path));
    if (!config.is_object()) return corrupt(config_path.string() + ": not a JSON object");
  }
  const fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::exists(jinja_path)) {
    DS_ASSIGN_OR_RETURN(out.source, read_file(jinja_path));
  } else if (const auto ct = config.find("chat_template"); ct != config.end() && !ct->is_null()) {
    if (ct->is_string()) {
      out.source = ct->get<std::string>();
    } else if (ct->is_array()) {
      bool found = false;
      for (const auto& entry : *ct) {
        const auto name = entry.is_object() ? entry.find("name") : entry.end();
        if (name != entry.end() && name->is_string() && name->get<std::string>() == "default" &&
            entry.contains("template") && entry["template"].is_string()) {
          out.source = entry["template"].get<std::string>();
          found = true;
        }
      }
      if (!found) {
        return corrupt(config_path.string() +
                       ": chat_template lists several templates, none named 'default'");
      }
    } else {
      return corrupt(config_path.string() + ": chat_template is neither a string nor a list");
    }
  } else {
    return not_found(dir.string() +
                     ": no chat template (no chat_template.jinja, no chat_template in "
                     "tokenizer_config.json)");
  }
  nlohmann::json special = nlohmann::json::object();
  const fs::path special_path = dir / "special_tokens_map.json";
  if (fs::exists(special_path)) {
    auto s = read_json(special_path);
    if (s.ok() && s->is_object()) special = *s;
  }
  for (const auto& [key, target] :
       {std::pair{"bos_token", &out.bos_token}, {"eos_token", &out.eos_token}}) {
    if (config.contains(key)) *target = token_string(config[key]);
    if (target->empty() && special.contains(key)) *target = token_string(special[key]);
  }
  return out;
}

Result<ChatTemplateSource> from_gguf(const std::string& path) {
  DS_ASSIGN_OR_RETURN(auto gguf, GgufFile::open(path));
  const GgufMetadata& md = gguf->metadata();
  if (!md.contains("tokenizer.chat_template")) {
    return not_found(path + ": no tokenizer.chat_template in the GGUF metadata");
  }
  ChatTemplateSource out;
  DS_ASSIGN_OR_RETURN(out.source, md.get_string("tokenizer.chat_template"));
  if (md.contains("tokenizer.ggml.tokens")) {
    DS_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens,
                        md.get_string_array("tokenizer.ggml.tokens"));
    for (const auto& [key, target] : {std::pair{"tokenizer.ggml.bos_token_id", &out.bos_token},
                                      {"tokenizer.ggml.eos_token_id", &out.eos_token}}) {
      if (!md.contains(key)) continue;
      DS_ASSIGN_OR_RETURN(int64_t id, md.get_int(key));
      if (id < 0 || static_cast<size_t>(id) >= tokens->size()) {
        return corrupt(path + ": " + key + " " + std::to_string(id) + " is outside the vocabulary");
      }
      *target = (*tokens)[id];
    }
  }
  return out;
}

}  // namespace

Result<ChatTemplateSource> find_chat_template(const std::string& model_path) {
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) return from_hf_dir(model_path);
  if (!fs::exists(model_path, ec)) return not_found(model_path + ": no such file or directory");
  return from_gguf(model_path);
}

}  // namespace dserve::chat
