// Tokenizer::from_hf_json: tokenizer.json (+ tokenizer_config.json,
// generation_config.json) -> TokenizerParts.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "tokenizer/bpe_tokenizer.h"

namespace dserve {

namespace {

using json = nlohmann::json;

bool get_bool(const json& j, const char* key, bool fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// A token given as "text" or as {"content": "text", ...} (AddedToken), or null.
std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return std::string();
}

Result<std::vector<AddedToken>> parse_added_tokens(const json& tj, const std::string& where) {
  std::vector<AddedToken> out;
  const auto it = tj.find("added_tokens");
  if (it == tj.end() || it->is_null()) return out;
  if (!it->is_array()) return corrupt(where + ".added_tokens: expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& a = (*it)[i];
    const std::string w = where + ".added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string()) {
      return corrupt(w + ": expected {\"id\": int, \"content\": string, ...}");
    }
    AddedToken t;
    const int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id >= (1 << 30)) {
      return corrupt(w + ": id " + std::to_string(id) + " out of range");
    }
    t.id = static_cast<int32_t>(id);
    t.content = a["content"].get<std::string>();
    t.special = get_bool(a, "special", false);
    t.lstrip = get_bool(a, "lstrip", false);
    t.rstrip = get_bool(a, "rstrip", false);
    t.single_word = get_bool(a, "single_word", false);
    t.normalized = get_bool(a, "normalized", !t.special);
    out.push_back(std::move(t));
  }
  return out;
}

Result<std::unique_ptr<BpeModel>> parse_model(const json& tj, const std::string& where) {
  const auto it = tj.find("model");
  if (it == tj.end() || !it->is_object()) return corrupt(where + ": no \"model\" object");
  const json& m = *it;
  const std::string mw = where + ".model";
  std::string type = "BPE";  // HF infers BPE when "type" is missing and merges exist
  if (m.contains("type")) {
    if (!m["type"].is_string()) return corrupt(mw + ".type: expected a string");
    type = m["type"].get<std::string>();
  } else if (!m.contains("merges")) {
    return corrupt(mw + ": no \"type\"");
  }
  if (type != "BPE") {
    return unimplemented(mw + ".type: \"" + type + "\" models are not supported (only BPE)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && m[key].is_string() && !m[key].get<std::string>().empty()) {
      return unimplemented(mw + "." + key + " is not supported");
    }
  }
  if (get_bool(m, "byte_fallback", false)) {
    return unimplemented(mw + ".byte_fallback is not supported (byte-level BPE only)");
  }
  const auto vit = m.find("vocab");
  if (vit == m.end() || !vit->is_object()) return corrupt(mw + ".vocab: expected an object");
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vit->size());
  for (auto e = vit->begin(); e != vit->end(); ++e) {
    if (!e.value().is_number_integer()) {
      return corrupt(mw + ".vocab[\"" + e.key() + "\"]: expected an integer id");
    }
    const int64_t id = e.value().get<int64_t>();
    if (id < 0 || id >= (1 << 30)) {
      return corrupt(mw + ".vocab[\"" + e.key() + "\"]: id out of range");
    }
    vocab.emplace_back(e.key(), static_cast<int32_t>(id));
  }
  const auto mit = m.find("merges");
  if (mit == m.end() || !mit->is_array()) return corrupt(mw + ".merges: expected an array");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(mit->size());
  for (size_t i = 0; i < mit->size(); ++i) {
    const json& e = (*mit)[i];
    if (e.is_string()) {  // "a b"
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) {
        return corrupt(mw + ".merges[" + std::to_string(i) + "]: \"" + s + "\" is not \"a b\"");
      }
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      return corrupt(mw + ".merges[" + std::to_string(i) + "]: expected \"a b\" or [\"a\", \"b\"]");
    }
  }
  return BpeModel::build(vocab, merges, get_bool(m, "ignore_merges", false), mw);
}

// The ids a template item list adds before and after the sequence $A.
Status parse_post_processor(const json& p, const std::string& where, std::vector<int32_t>* prefix,
                            std::vector<int32_t>* suffix) {
  if (p.is_null()) return Status::Ok();
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
    return corrupt(where + ": expected an object with a string \"type\"");
  }
  const std::string type = p["type"].get<std::string>();
  if (type == "ByteLevel") return Status::Ok();  // offsets only
  if (type == "Sequence") {
    const auto it = p.find("processors");
    if (it == p.end() || !it->is_array()) {
      return corrupt(where + ": Sequence without \"processors\"");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      DS_RETURN_IF_ERROR(parse_post_processor(
          (*it)[i], where + ".processors[" + std::to_string(i) + "]", prefix, suffix));
    }
    return Status::Ok();
  }
  if (type == "TemplateProcessing") {
    const auto single = p.find("single");
    const auto specials = p.find("special_tokens");
    if (single == p.end() || !single->is_array()) {
      return corrupt(where + ".single: expected an array");
    }
    bool seen_sequence = false;
    std::vector<int32_t> before, after;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      const std::string iw = where + ".single[" + std::to_string(i) + "]";
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
          !item["SpecialToken"]["id"].is_string()) {
        return corrupt(iw + ": expected {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}");
      }
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (specials == p.end() || !specials->is_object() || !specials->contains(name) ||
          !(*specials)[name].contains("ids") || !(*specials)[name]["ids"].is_array()) {
        return corrupt(iw + ": special token \"" + name + "\" is not in special_tokens");
      }
      for (const json& id : (*specials)[name]["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 30)) {
          return corrupt(iw + ": id for \"" + name + "\" is not a token id");
        }
        (seen_sequence ? after : before).push_back(id.get<int32_t>());
      }
    }
    prefix->insert(prefix->end(), before.begin(), before.end());
    suffix->insert(suffix->begin(), after.begin(), after.end());
    return Status::Ok();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const auto cls = p.find("cls");
    const auto sep = p.find("sep");
    auto is_id = [](const json& j) {
      return j.is_number_integer() && j.get<int64_t>() >= 0 && j.get<int64_t>() < (1 << 30);
    };
    if (cls == p.end() || sep == p.end() || !cls->is_array() || cls->size() != 2 ||
        !sep->is_array() || sep->size() != 2 || !is_id((*cls)[1]) || !is_id((*sep)[1])) {
      return corrupt(where + ": expected \"cls\" and \"sep\" as [token, id]");
    }
    prefix->push_back((*cls)[1].get<int32_t>());
    suffix->insert(suffix->begin(), (*sep)[1].get<int32_t>());
    return Status::Ok();
  }
  return unimplemented(where + ": post-processor type \"" + type + "\" is not supported");
}

Status check_decoder(const json& d, const std::string& where) {
  if (d.is_null()) return unimplemented(where + ": no decoder; dserve supports ByteLevel only");
  if (!d.is_object() || !d.contains("type") || !d["type"].is_string()) {
    return corrupt(where + ": expected an object with a string \"type\"");
  }
  const std::string type = d["type"].get<std::string>();
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array() &&
      d["decoders"].size() == 1) {
    return check_decoder(d["decoders"][0], where + ".decoders[0]");
  }
  return unimplemented(where + ": decoder type \"" + type + "\" is not supported (only ByteLevel)");
}

int32_t lookup(const TokenizerParts& parts, const std::string& content) {
  if (content.empty()) return -1;
  for (const AddedToken& t : parts.added_tokens) {
    if (t.content == content) return t.id;
  }
  return parts.model->id_of(content);
}

Result<std::unique_ptr<Tokenizer>> build(const json& tj, const json* config, const json* gen,
                                         const std::string& source) {
  if (!tj.is_object()) return corrupt(source + ": tokenizer.json is not a JSON object");
  const std::string where = source + ": tokenizer.json";
  TokenizerParts parts;
  parts.source = source;
  DS_ASSIGN_OR_RETURN(parts.model, parse_model(tj, where));
  DS_ASSIGN_OR_RETURN(parts.normalizer,
                      Normalizer::from_json(tj.value("normalizer", json()), where + ".normalizer"));
  DS_ASSIGN_OR_RETURN(parts.pre_tokenizer,
                      PreTokenizer::from_json(tj.value("pre_tokenizer", json()),
                                              where + ".pre_tokenizer"));
  DS_RETURN_IF_ERROR(check_decoder(tj.value("decoder", json()), where + ".decoder"));
  DS_ASSIGN_OR_RETURN(parts.added_tokens, parse_added_tokens(tj, where));
  const int64_t n_tokens = parts.model->size() + static_cast<int64_t>(parts.added_tokens.size());
  for (const AddedToken& t : parts.added_tokens) {
    if (t.id >= n_tokens + kMaxUnusedTokenIds) {
      return corrupt(where + ".added_tokens: id " + std::to_string(t.id) +
                     " is implausibly large for " + std::to_string(n_tokens) + " tokens");
    }
  }
  DS_RETURN_IF_ERROR(parse_post_processor(tj.value("post_processor", json()),
                                          where + ".post_processor", &parts.prefix_ids,
                                          &parts.suffix_ids));

  const json empty = json::object();
  const json& cfg = config && config->is_object() ? *config : empty;
  const std::string cw = source + ": tokenizer_config.json";
  const std::string bos = token_content(cfg.value("bos_token", json()));
  const std::string eos = token_content(cfg.value("eos_token", json()));
  parts.bos_id = lookup(parts, bos);
  parts.eos_id = lookup(parts, eos);
  if (!bos.empty() && parts.bos_id < 0) {
    DS_LOG_WARN("{}: bos_token \"{}\" is not in the vocabulary", cw, bos);
  }
  if (!eos.empty() && parts.eos_id < 0) {
    DS_LOG_WARN("{}: eos_token \"{}\" is not in the vocabulary", cw, eos);
  }

  // transformers' LlamaTokenizerFast rebuilds the post-processor from these flags.
  const std::string cls = cfg.value("tokenizer_class", std::string());
  if (cls == "LlamaTokenizerFast" || cls == "LlamaTokenizer" || cls == "CodeLlamaTokenizerFast" ||
      cls == "CodeLlamaTokenizer") {
    parts.prefix_ids.clear();
    parts.suffix_ids.clear();
    if (get_bool(cfg, "add_bos_token", true)) {
      if (parts.bos_id < 0) return corrupt(cw + ": add_bos_token is set but there is no bos_token");
      parts.prefix_ids.push_back(parts.bos_id);
    }
    if (get_bool(cfg, "add_eos_token", false)) {
      if (parts.eos_id < 0) return corrupt(cw + ": add_eos_token is set but there is no eos_token");
      parts.suffix_ids.push_back(parts.eos_id);
    }
  }

  if (const auto ct = cfg.find("chat_template"); ct != cfg.end()) {
    if (ct->is_string()) {
      parts.chat_template = ct->get<std::string>();
    } else if (ct->is_array()) {  // [{"name": ..., "template": ...}]: take "default"
      for (const json& t : *ct) {
        if (t.is_object() && t.value("name", std::string()) == "default" &&
            t.contains("template") && t["template"].is_string()) {
          parts.chat_template = t["template"].get<std::string>();
        }
      }
    }
  }
  if (gen && gen->is_object() && gen->contains("eos_token_id")) {
    const json& e = (*gen)["eos_token_id"];
    if (e.is_number_integer()) parts.extra_stop_ids.push_back(e.get<int32_t>());
    if (e.is_array()) {
      for (const json& x : e) {
        if (x.is_number_integer()) parts.extra_stop_ids.push_back(x.get<int32_t>());
      }
    }
  }
  // What encode() adds must be tokens of this vocabulary (the engine indexes with them).
  int32_t n_ids = parts.model->size();
  for (const AddedToken& t : parts.added_tokens) n_ids = std::max(n_ids, t.id + 1);
  for (const std::vector<int32_t>* ids : {&parts.prefix_ids, &parts.suffix_ids}) {
    for (int32_t id : *ids) {
      if (id < 0 || id >= n_ids) {
        return corrupt(where + ".post_processor: token id " + std::to_string(id) +
                       " is not in the vocabulary");
      }
    }
  }
  return std::unique_ptr<Tokenizer>(new BpeTokenizer(std::move(parts)));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_json(const json& tokenizer_json,
                                                           const json* tokenizer_config,
                                                           const json* generation_config,
                                                           const std::string& source) {
  // Every field is type-checked above; this only turns a missed case into a Status.
  try {
    return build(tokenizer_json, tokenizer_config, generation_config, source);
  } catch (const json::exception& e) {
    return corrupt(source + ": tokenizer.json: " + e.what());
  }
}

}  // namespace dserve
