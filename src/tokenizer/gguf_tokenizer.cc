// Tokenizer::from_gguf_metadata: tokenizer.ggml.* -> TokenizerParts.
//
// GGUF stores the vocabulary, merges and special ids but not the pre-tokenizer; it
// names it in tokenizer.ggml.pre. The table below maps those names (llama.cpp's) to the
// pre-tokenizer (and normalizer) of the tokenizer.json the file was converted from, so
// a GGUF model tokenizes exactly like its Hugging Face original.
#include <optional>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "loader/gguf_file.h"
#include "tokenizer/bpe_tokenizer.h"

namespace dserve {

namespace {

using json = nlohmann::json;

json split(std::string_view regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"},
          {"invert", false}};
}
json digits() { return {{"type", "Digits"}, {"individual_digits", true}}; }
json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", use_regex}};
}
json sequence(std::initializer_list<json> steps) {
  return {{"type", "Sequence"}, {"pretokenizers", json::array_t(steps)}};
}

constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kDeepseekV3Words =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kDeepseekLlmLetters =
    R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)";

struct PreTokenizerSpec {
  json normalizer;
  json pre_tokenizer;
};

// nullopt for names not in the table.
std::optional<PreTokenizerSpec> spec_for(const std::string& pre) {
  if (pre == "gpt2" || pre == "default" || pre == "mpt" || pre == "olmo" || pre == "jais") {
    return PreTokenizerSpec{json(), byte_level(true)};
  }
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell" ||
      pre == "command-r" || pre == "exaone" || pre == "minerva-7b") {
    // The original tokenizer.json: Digits(individual_digits) then GPT-2's ByteLevel.
    return PreTokenizerSpec{json(), sequence({digits(), byte_level(true)})};
  }
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "dbrx" ||
      pre == "smaug-bpe" || pre == "falcon3") {
    return PreTokenizerSpec{json(), sequence({split(kLlama3), byte_level(false)})};
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "stablelm2") {
    return PreTokenizerSpec{json{{"type", "NFC"}}, sequence({split(kQwen2), byte_level(false)})};
  }
  // llama.cpp's converter names a tokenizer by a hash of its encodings, so DeepSeek-V3's
  // (which other models reuse) can come out of it under another model's name: the
  // current converter writes "joyai-llm" for it. llama.cpp gives these the same rules.
  if (pre == "deepseek-v3" || pre == "joyai-llm" || pre == "hunyuan-dense" || pre == "hy_v4") {
    return PreTokenizerSpec{
        json(), sequence({split(R"(\p{N}{1,3})"), split("[一-龥぀-ゟ゠-ヿ]+"),
                          split(kDeepseekV3Words), byte_level(false)})};
  }
  if (pre == "deepseek-llm") {
    return PreTokenizerSpec{
        json(), sequence({split(R"([\r\n])"), split(kDeepseekLlmLetters),
                          split("\\s?[!-/:-~！-／：-～‘-‟　-。]+"), split(R"(\s+$)"),
                          split("[一-龥ࠀ-一가-퟿]+"), digits(), byte_level(false)})};
  }
  if (pre == "deepseek-coder") {
    return PreTokenizerSpec{
        json(), sequence({split(R"([\r\n])"), split(R"(\s?\p{L}+)"), split(R"(\s?\p{P}+)"),
                          split("[一-龥ࠀ-一가-퟿]+"), digits(), byte_level(false)})};
  }
  return std::nullopt;
}

bool default_add_bos(const std::string& pre) {
  return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" ||
         pre.rfind("deepseek", 0) == 0;
}

// GGUF token types (llama.cpp's llama_token_type).
constexpr int64_t kTypeControl = 3;
constexpr int64_t kTypeUserDefined = 4;

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf_metadata(const GgufMetadata& md) {
  const std::string where = md.source + ": tokenizer.ggml";
  DS_ASSIGN_OR_RETURN(const std::string model, md.get_string("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return unimplemented(where + ".model: \"" + model +
                         "\" tokenizers are not supported (only byte-level BPE, \"gpt2\")");
  }
  DS_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens,
                      md.get_string_array("tokenizer.ggml.tokens"));
  DS_ASSIGN_OR_RETURN(const std::vector<std::string>* merge_strings,
                      md.get_string_array("tokenizer.ggml.merges"));
  const std::vector<int64_t>* types = nullptr;
  if (md.contains("tokenizer.ggml.token_type")) {
    DS_ASSIGN_OR_RETURN(types, md.get_int_array("tokenizer.ggml.token_type"));
    if (types->size() != tokens->size()) {
      return corrupt(where + ".token_type: " + std::to_string(types->size()) + " entries for " +
                     std::to_string(tokens->size()) + " tokens");
    }
  }
  if (tokens->size() >= (1u << 30)) return corrupt(where + ".tokens: implausibly many tokens");

  std::string pre = "default";
  if (md.contains("tokenizer.ggml.pre")) {
    DS_ASSIGN_OR_RETURN(pre, md.get_string("tokenizer.ggml.pre"));
  }
  std::optional<PreTokenizerSpec> spec = spec_for(pre);
  if (!spec) {
    DS_LOG_WARN("{}.pre: unknown pre-tokenizer \"{}\"; using GPT-2's (encodings may differ from "
                "the original model's)", where, pre);
    spec = spec_for("gpt2");
  }

  TokenizerParts parts;
  parts.source = md.source;
  DS_ASSIGN_OR_RETURN(parts.normalizer, Normalizer::from_json(spec->normalizer, where + ".pre"));
  DS_ASSIGN_OR_RETURN(parts.pre_tokenizer,
                      PreTokenizer::from_json(spec->pre_tokenizer, where + ".pre"));

  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i) {
    vocab.emplace_back((*tokens)[i], static_cast<int32_t>(i));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merge_strings->size());
  for (size_t i = 0; i < merge_strings->size(); ++i) {
    const std::string& s = (*merge_strings)[i];
    const size_t sp = s.find(' ', 1);
    if (sp == std::string::npos) {
      return corrupt(where + ".merges[" + std::to_string(i) + "]: \"" + s + "\" is not \"a b\"");
    }
    merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
  }
  DS_ASSIGN_OR_RETURN(parts.model, BpeModel::build(vocab, merges, /*ignore_merges=*/false, where));

  if (types) {
    for (size_t i = 0; i < tokens->size(); ++i) {
      const int64_t t = (*types)[i];
      if (t != kTypeControl && t != kTypeUserDefined) continue;
      AddedToken a;
      a.id = static_cast<int32_t>(i);
      a.content = (*tokens)[i];
      a.special = t == kTypeControl;
      parts.added_tokens.push_back(std::move(a));
    }
  }

  const auto get_id = [&](const char* key) -> Result<int32_t> {
    if (!md.contains(key)) return -1;
    DS_ASSIGN_OR_RETURN(const int64_t id, md.get_int(key));
    if (id < 0 || id >= static_cast<int64_t>(tokens->size())) {
      return corrupt(md.source + ": " + key + " = " + std::to_string(id) +
                     " is outside the vocabulary");
    }
    return static_cast<int32_t>(id);
  };
  DS_ASSIGN_OR_RETURN(parts.bos_id, get_id("tokenizer.ggml.bos_token_id"));
  DS_ASSIGN_OR_RETURN(parts.eos_id, get_id("tokenizer.ggml.eos_token_id"));
  if (md.contains("tokenizer.ggml.eot_token_id")) {
    DS_ASSIGN_OR_RETURN(const int32_t eot, get_id("tokenizer.ggml.eot_token_id"));
    parts.extra_stop_ids.push_back(eot);
  }
  bool add_bos = default_add_bos(pre);
  if (md.contains("tokenizer.ggml.add_bos_token")) {
    DS_ASSIGN_OR_RETURN(add_bos, md.get_bool("tokenizer.ggml.add_bos_token"));
  }
  bool add_eos = false;
  if (md.contains("tokenizer.ggml.add_eos_token")) {
    DS_ASSIGN_OR_RETURN(add_eos, md.get_bool("tokenizer.ggml.add_eos_token"));
  }
  if (add_bos && parts.bos_id >= 0) parts.prefix_ids.push_back(parts.bos_id);
  if (add_eos && parts.eos_id >= 0) parts.suffix_ids.push_back(parts.eos_id);
  if (md.contains("tokenizer.chat_template")) {
    DS_ASSIGN_OR_RETURN(parts.chat_template, md.get_string("tokenizer.chat_template"));
  }
  return std::unique_ptr<Tokenizer>(new BpeTokenizer(std::move(parts)));
}

}  // namespace dserve
