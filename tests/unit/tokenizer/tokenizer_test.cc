// Unit tests for the tokenizer: a tiny hand-made byte-level BPE, UTF-8 handling,
// incremental decoding, and malformed tokenizer.json files. The agreement with HF
// `tokenizers` on real vocabularies is checked in tests/reference/test_tokenizer.py.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "loader/gguf_file.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace dserve {
namespace {

using json = nlohmann::json;

// Byte b has id b; merges build "he", "ll", "hell", "hello", "Ġw".
json tiny_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::from_bytes(std::string(1, char(b)))] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab["Ġw"] = 260;
  json merges = json::array({"h e", json::array({"l", "l"}), "he ll", "hell o", "Ġ w"});
  return {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       json::array({{{"id", 261}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
                    {{"id", 262}, {"content", "<x>"}, {"special", false}, {"normalized", true}}})},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
  };
}

std::unique_ptr<Tokenizer> tiny(const json& config = json()) {
  auto t = Tokenizer::from_hf_json(tiny_tokenizer_json(), config.is_null() ? nullptr : &config,
                                   nullptr, "tiny");
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

std::vector<int32_t> bytes_of(std::string_view s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(Utf8, RepairReplacesMaximalSubparts) {
  EXPECT_EQ(utf8::repair("abc"), "abc");
  EXPECT_EQ(utf8::repair("a\x80" "b"), "a\xEF\xBF\xBD" "b");
  // E4 B8 is a truncated 3-byte sequence: one U+FFFD, then 'x'.
  EXPECT_EQ(utf8::repair("\xE4\xB8x"), "\xEF\xBF\xBDx");
  // ED A0 80 is a surrogate: ED is a subpart by itself (A0 is not allowed after ED).
  EXPECT_EQ(utf8::repair("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::repair("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_FALSE(utf8::is_valid("\xC0\xAF"));
  EXPECT_TRUE(utf8::is_valid("中文 😀"));
}

TEST(Utf8, IncompleteTail) {
  EXPECT_EQ(utf8::incomplete_tail_length("abc"), 0u);
  EXPECT_EQ(utf8::incomplete_tail_length("a\xE4"), 1u);
  EXPECT_EQ(utf8::incomplete_tail_length("a\xE4\xB8"), 2u);
  EXPECT_EQ(utf8::incomplete_tail_length("a\xE4\xB8\xAD"), 0u);
  EXPECT_EQ(utf8::incomplete_tail_length("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_tail_length("a\x80"), 0u);      // never completable
  EXPECT_EQ(utf8::incomplete_tail_length("a\xE0\x80"), 0u);  // E0 80 is ill-formed
}

TEST(ByteLevel, RoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string spelled = byte_level::from_bytes(all);
  EXPECT_EQ(byte_level::to_bytes(spelled), all);
  EXPECT_EQ(byte_level::from_bytes(" "), "Ġ");
  EXPECT_FALSE(byte_level::to_bytes("<｜User｜>").has_value());
  EXPECT_EQ(byte_level::decode_token("<｜User｜>"), "<｜User｜>");
}

TEST(Tokenizer, EncodesWithMergesAndAddedTokens) {
  auto t = tiny();
  std::vector<int32_t> want = {259, 260};
  for (int32_t id : bytes_of("orld")) want.push_back(id);
  want.push_back(261);
  EXPECT_EQ(t->encode("hello world<|end|>", false), want);
  // The non-special added token is matched too, and splits words around it.
  EXPECT_EQ(t->encode("he<x>ll", false), (std::vector<int32_t>{256, 262, 257}));
  EXPECT_EQ(t->decode(t->encode("hello world<|end|>", false), false), "hello world<|end|>");
  EXPECT_EQ(t->decode(t->encode("hello world<|end|>", false), true), "hello world");
  EXPECT_TRUE(t->is_special(261));
  EXPECT_FALSE(t->is_special(262));
  EXPECT_EQ(t->token_to_id("<|end|>"), 261);
  EXPECT_EQ(t->token_to_id("Ġw"), 260);
  EXPECT_EQ(t->token_to_id("nope"), -1);
  EXPECT_EQ(t->vocab_size(), 263);
}

TEST(Tokenizer, InvalidUtf8InputIsRepairedNotFatal) {
  auto t = tiny();
  const auto ids = t->encode("a\xFF" "b", false);
  EXPECT_EQ(t->decode(ids, false), "a\xEF\xBF\xBD" "b");
}

TEST(Tokenizer, LlamaClassConfigAddsBos) {
  json cfg = {{"tokenizer_class", "LlamaTokenizerFast"},
              {"bos_token", {{"content", "<|end|>"}}},
              {"eos_token", "<|end|>"},
              {"add_bos_token", true},
              {"chat_template", "{{ messages }}"}};
  auto t = tiny(cfg);
  EXPECT_EQ(t->bos_id(), 261);
  EXPECT_EQ(t->eos_id(), 261);
  EXPECT_EQ(t->encode("he", true), (std::vector<int32_t>{261, 256}));
  EXPECT_EQ(t->encode("he", false), (std::vector<int32_t>{256}));
  EXPECT_EQ(t->chat_template(), "{{ messages }}");
  EXPECT_EQ(t->stop_ids(), std::vector<int32_t>{261});
}

TEST(Tokenizer, TemplateProcessingAddsPrefixAndSuffix) {
  json tj = tiny_tokenizer_json();
  tj["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "<x>"}, {"type_id", 0}}}}})},
      {"special_tokens",
       {{"<|end|>", {{"id", "<|end|>"}, {"ids", {261}}, {"tokens", {"<|end|>"}}}},
        {"<x>", {{"id", "<x>"}, {"ids", {262}}, {"tokens", {"<x>"}}}}}}};
  auto t = Tokenizer::from_hf_json(tj, nullptr, nullptr, "tiny");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->encode("he", true), (std::vector<int32_t>{261, 256, 262}));
}

TEST(Tokenizer, SplitBehaviours) {
  // Pre-tokenizer Split on "-" with each behaviour, then ByteLevel without regex; the
  // word boundaries show in whether "he"/"ll" merge across the cut.
  struct Case {
    const char* behavior;
    bool invert;
    std::vector<int32_t> want;
  };
  const int32_t dash = '-';
  const std::vector<Case> cases = {
      {"Isolated", false, {256, dash, 257}},
      {"Removed", false, {256, 257}},
      {"MergedWithPrevious", false, {256, dash, 257}},
      {"MergedWithNext", false, {256, dash, 257}},
      {"Contiguous", false, {256, dash, 257}},
      {"Removed", true, {dash}},
  };
  for (const Case& c : cases) {
    json tj = tiny_tokenizer_json();
    tj["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"String", "-"}}},
                       {"behavior", c.behavior},
                       {"invert", c.invert}},
                      {{"type", "ByteLevel"},
                       {"add_prefix_space", false},
                       {"use_regex", false}}})}};
    auto t = Tokenizer::from_hf_json(tj, nullptr, nullptr, "tiny");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ((*t)->encode("he-ll", false), c.want) << c.behavior << " invert=" << c.invert;
  }
}

TEST(IncrementalDecoder, NeverEmitsHalfACharacter) {
  auto t = tiny();
  const std::string text = "héllo 中文 😀!";
  const std::vector<int32_t> ids = bytes_of(text);  // one token per byte: worst case
  IncrementalDecoder dec(*t);
  std::string joined;
  for (int32_t id : ids) {
    const std::string piece = dec.add(id);
    EXPECT_TRUE(utf8::is_valid(piece)) << "half a character emitted";
    joined += piece;
  }
  joined += dec.flush();
  EXPECT_EQ(joined, text);
  EXPECT_EQ(joined, t->decode(ids, true));
}

TEST(IncrementalDecoder, HoldsPartialCharacterUntilComplete) {
  auto t = tiny();
  IncrementalDecoder dec(*t);
  EXPECT_EQ(dec.add(0xE4), "");
  EXPECT_EQ(dec.add(0xB8), "");
  EXPECT_EQ(dec.add(0xAD), "中");
}

TEST(IncrementalDecoder, InvalidBytesBecomeReplacementCharacters) {
  auto t = tiny();
  const std::vector<int32_t> ids = {'a', 0x80, 0xE4, 'b', 0xF0, 0x9F};
  IncrementalDecoder dec(*t);
  std::string joined;
  for (int32_t id : ids) {
    const std::string piece = dec.add(id);
    EXPECT_TRUE(utf8::is_valid(piece));
    joined += piece;
  }
  const std::string tail = dec.flush();
  EXPECT_EQ(tail, "\xEF\xBF\xBD");  // the truncated F0 9F
  joined += tail;
  EXPECT_EQ(joined, t->decode(ids, false));
  EXPECT_EQ(joined, "a\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

TEST(IncrementalDecoder, SkipsSpecialTokensWhenAsked) {
  auto t = tiny();
  IncrementalDecoder skip(*t, true);
  EXPECT_EQ(skip.add(261), "");
  IncrementalDecoder keep(*t, false);
  EXPECT_EQ(keep.add(261), "<|end|>");
}

// --- malformed input: every case is a clear Status, never a crash --------------------

Status load_error(const json& tj) {
  auto t = Tokenizer::from_hf_json(tj, nullptr, nullptr, "bad/dir");
  EXPECT_FALSE(t.ok());
  return t.ok() ? Status::Ok() : t.status();
}

void expect_error(const json& tj, StatusCode code, const std::string& needle) {
  const Status s = load_error(tj);
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find("bad/dir"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.to_string();
}

TEST(Malformed, MissingModel) {
  json tj = tiny_tokenizer_json();
  tj.erase("model");
  expect_error(tj, StatusCode::kCorrupt, "model");
}

TEST(Malformed, UnsupportedModelTypes) {
  for (const char* type : {"Unigram", "WordPiece", "WordLevel"}) {
    json tj = tiny_tokenizer_json();
    tj["model"]["type"] = type;
    expect_error(tj, StatusCode::kUnimplemented, type);
  }
}

TEST(Malformed, BadRegex) {
  json tj = tiny_tokenizer_json();
  tj["pre_tokenizer"] = {{"type", "Sequence"},
                         {"pretokenizers",
                          json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", "(unclosed"}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       {{"type", "ByteLevel"}}})}};
  expect_error(tj, StatusCode::kInvalidArgument, "pre_tokenizer.pretokenizers[0].pattern");
}

TEST(Malformed, WrongTypes) {
  json tj = tiny_tokenizer_json();
  tj["model"]["vocab"] = json::array();
  expect_error(tj, StatusCode::kCorrupt, "model.vocab");
  tj = tiny_tokenizer_json();
  tj["model"]["vocab"]["he"] = "x";
  expect_error(tj, StatusCode::kCorrupt, "model.vocab");
  tj = tiny_tokenizer_json();
  tj["model"]["merges"] = json::array({42});
  expect_error(tj, StatusCode::kCorrupt, "model.merges[0]");
  tj = tiny_tokenizer_json();
  tj["model"]["merges"] = json::array({"zz qq"});
  expect_error(tj, StatusCode::kCorrupt, "model.merges[0]");
  tj = tiny_tokenizer_json();
  tj["added_tokens"] = json::array({{{"content", 5}}});
  expect_error(tj, StatusCode::kCorrupt, "added_tokens[0]");
  tj = tiny_tokenizer_json();
  tj["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_error(tj, StatusCode::kUnimplemented, "Metaspace");
  tj = tiny_tokenizer_json();
  tj["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}};
  expect_error(tj, StatusCode::kCorrupt, "behavior");
  tj = tiny_tokenizer_json();
  tj["normalizer"] = {{"type", "Lowercase"}};
  expect_error(tj, StatusCode::kUnimplemented, "Lowercase");
  tj = tiny_tokenizer_json();
  tj["decoder"] = {{"type", "WordPiece"}};
  expect_error(tj, StatusCode::kUnimplemented, "decoder");
  tj = tiny_tokenizer_json();
  tj["post_processor"] = {{"type", "TemplateProcessing"},
                          {"single", json::array({{{"SpecialToken", {{"id", "<missing>"}}}}})}};
  expect_error(tj, StatusCode::kCorrupt, "<missing>");
  expect_error(json::array({1, 2}), StatusCode::kCorrupt, "not a JSON object");
}

TEST(Malformed, SparseIdsWouldAskForGigabytes) {
  json tj = tiny_tokenizer_json();
  tj["model"]["vocab"]["he"] = 677777775;
  expect_error(tj, StatusCode::kCorrupt, "implausibly large");
  tj = tiny_tokenizer_json();
  tj["added_tokens"][0]["id"] = 677777775;
  expect_error(tj, StatusCode::kCorrupt, "implausibly large");
  tj = tiny_tokenizer_json();  // gaps within bounds are fine
  tj["added_tokens"][0]["id"] = 100000;
  EXPECT_TRUE(Tokenizer::from_hf_json(tj, nullptr, nullptr, "bad/dir").ok());
}

TEST(Malformed, PostProcessorIdsOutsideTheVocabulary) {
  for (int64_t id : {int64_t{263}, int64_t{99999}, (int64_t{1} << 32) + 261, int64_t{-1}}) {
    json tj = tiny_tokenizer_json();
    tj["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {id}}, {"tokens", {"<s>"}}}}}}};
    expect_error(tj, StatusCode::kCorrupt, "post_processor");
  }
  json tj = tiny_tokenizer_json();
  tj["post_processor"] = {{"type", "BertProcessing"},
                          {"cls", json::array({"<s>", 5000})},
                          {"sep", json::array({"</s>", 1})}};
  expect_error(tj, StatusCode::kCorrupt, "not in the vocabulary");
}

std::filesystem::path temp_dir(const std::string& name) {
  const char* root = std::getenv("DSERVE_TEST_TMPDIR");
  auto dir = std::filesystem::path(root ? root : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(Malformed, UnreadableFiles) {
  auto missing = Tokenizer::from_path("/nonexistent/model/dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  const auto dir = temp_dir("tokenizer_bad_json");
  std::ofstream(dir / "tokenizer.json") << "{\"model\": {\"type\": \"BPE\", \"vocab\": ";
  auto truncated = Tokenizer::from_path(dir.string());
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(truncated.status().message().find("tokenizer.json"), std::string::npos);

  const auto empty_dir = temp_dir("tokenizer_empty_dir");
  auto none = Tokenizer::from_path(empty_dir.string());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("tokenizer.json"), std::string::npos);
}

TEST(FromPath, LoadsDirectoryWithConfig) {
  const auto dir = temp_dir("tokenizer_good_dir");
  std::ofstream(dir / "tokenizer.json") << tiny_tokenizer_json().dump();
  std::ofstream(dir / "tokenizer_config.json")
      << json{{"eos_token", "<|end|>"}, {"chat_template", "T"}}.dump();
  std::ofstream(dir / "generation_config.json") << json{{"eos_token_id", {261, 262}}}.dump();
  auto t = Tokenizer::from_path(dir.string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->eos_id(), 261);
  EXPECT_EQ((*t)->stop_ids(), (std::vector<int32_t>{261, 262}));
  EXPECT_EQ((*t)->chat_template(), "T");
}

// --- GGUF metadata --------------------------------------------------------------------

GgufMetadata tiny_gguf() {
  GgufMetadata md;
  md.source = "tiny.gguf";
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_level::from_bytes(std::string(1, char(b))));
  for (const char* t : {"he", "ll", "hell", "hello", "Ġw", "<|im_end|>", "<think>"}) {
    tokens.push_back(t);
  }
  std::vector<int64_t> types(tokens.size(), 1);
  types[261] = 3;  // control
  types[262] = 4;  // user-defined
  auto& v = md.mutable_values();
  v["tokenizer.ggml.model"] = std::string("gpt2");
  v["tokenizer.ggml.pre"] = std::string("smollm");
  v["tokenizer.ggml.tokens"] = GgufArray(tokens);
  v["tokenizer.ggml.token_type"] = GgufArray(types);
  v["tokenizer.ggml.merges"] =
      GgufArray(std::vector<std::string>{"h e", "l l", "he ll", "hell o", "Ġ w"});
  v["tokenizer.ggml.bos_token_id"] = int64_t{261};
  v["tokenizer.ggml.eos_token_id"] = int64_t{261};
  v["tokenizer.ggml.add_bos_token"] = true;
  v["tokenizer.chat_template"] = std::string("{{ x }}");
  return md;
}

TEST(Gguf, BuildsFromMetadata) {
  auto t = Tokenizer::from_gguf_metadata(tiny_gguf());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  std::vector<int32_t> want = {261, 259, 260};
  for (int32_t id : bytes_of("orld")) want.push_back(id);
  want.push_back(262);
  want.push_back(261);
  EXPECT_EQ((*t)->encode("hello world<think><|im_end|>", true), want);
  EXPECT_TRUE((*t)->is_special(261));
  EXPECT_FALSE((*t)->is_special(262));
  EXPECT_EQ((*t)->decode(want, true), "hello world<think>");
  EXPECT_EQ((*t)->chat_template(), "{{ x }}");
  EXPECT_EQ((*t)->stop_ids(), std::vector<int32_t>{261});
}

TEST(Gguf, UnknownPreTokenizerFallsBackToGpt2) {
  GgufMetadata md = tiny_gguf();
  md.mutable_values()["tokenizer.ggml.pre"] = std::string("no-such-pre");
  auto t = Tokenizer::from_gguf_metadata(md);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->encode("hello", false), std::vector<int32_t>{259});
}

TEST(Gguf, MalformedMetadataIsAStatus) {
  const auto expect_error = [](GgufMetadata md, const std::string& needle) {
    auto t = Tokenizer::from_gguf_metadata(md);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("tiny.gguf"), std::string::npos) << t.status().to_string();
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().to_string();
  };
  GgufMetadata md = tiny_gguf();
  md.mutable_values().erase("tokenizer.ggml.tokens");
  expect_error(md, "tokenizer.ggml.tokens");
  md = tiny_gguf();
  md.mutable_values()["tokenizer.ggml.model"] = std::string("llama");
  expect_error(md, "llama");
  md = tiny_gguf();
  md.mutable_values()["tokenizer.ggml.token_type"] = GgufArray(std::vector<int64_t>{1, 1});
  expect_error(md, "token_type");
  md = tiny_gguf();
  md.mutable_values()["tokenizer.ggml.bos_token_id"] = int64_t{99999};
  expect_error(md, "bos_token_id");
  md = tiny_gguf();
  md.mutable_values()["tokenizer.ggml.merges"] = GgufArray(std::vector<std::string>{"nospace"});
  expect_error(md, "merges[0]");
  md = tiny_gguf();
  md.mutable_values()["tokenizer.ggml.tokens"] = int64_t{5};
  expect_error(md, "tokenizer.ggml.tokens");
}

}  // namespace
}  // namespace dserve
