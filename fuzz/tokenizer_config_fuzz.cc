// Fuzz target: tokenizer_config.json beside a fixed tokenizer.json, read as `dserve`
// reads a Hugging Face directory: by the tokenizer (bos_token / eos_token as strings or
// AddedToken objects, tokenizer_class with add_bos_token / add_eos_token, chat_template,
// and generation_config.json's eos_token_id) and by find_chat_template (chat_template as
// a string or a list of named templates, special_tokens_map.json as the fallback). The
// input is tokenizer_config.json, then optionally a NUL and generation_config.json, then
// optionally a NUL and special_tokens_map.json.
//
// The fixed tokenizer.json: GPT-2's byte-level alphabet as 256 tokens, two merges, and
// the added tokens <s>, </s>, <|im_start|>, <|im_end|>.
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "chat/chat_template_source.h"
#include "fuzz_support.h"
#include "tokenizer/tokenizer.h"

namespace {

using json = nlohmann::json;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others
// for the code points from U+0100 on, in byte order.
std::string byte_token(int byte) {
  const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                         (byte >= 0xAE && byte <= 0xFF);
  int code_point = byte;
  if (!printable) {
    code_point = 256;
    for (int b = 0; b < byte; ++b) {
      const bool p = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      if (!p) ++code_point;
    }
  }
  std::string utf8;
  if (code_point < 0x80) {
    utf8 += static_cast<char>(code_point);
  } else {
    utf8 += static_cast<char>(0xC0 | (code_point >> 6));
    utf8 += static_cast<char>(0x80 | (code_point & 0x3F));
  }
  return utf8;
}

std::string tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_token(b)] = b;
  vocab["he"] = 256;
  vocab["\xC4\xA0t"] = 257;  // "Ġt": " t"
  json added = json::array();
  int id = 258;
  for (const char* special : {"<s>", "</s>", "<|im_start|>", "<|im_end|>"}) {
    added.push_back({{"id", id++}, {"content", special}, {"special", true}});
  }
  const json tj = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h e", "\xC4\xA0 t"}}}}};
  return tj.dump();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dserve::set_log_level("error");
  dserve::fuzz::write_scratch_file("tokenizer.json", tokenizer_json());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  const std::vector<std::string_view> parts = fuzz::split_parts(fuzz::as_text(data, size), 3);
  std::filesystem::remove(fuzz::scratch_dir() / "generation_config.json");
  std::filesystem::remove(fuzz::scratch_dir() / "special_tokens_map.json");
  fuzz::write_scratch_file("tokenizer_config.json", parts[0]);
  if (parts.size() > 1) fuzz::write_scratch_file("generation_config.json", parts[1]);
  if (parts.size() > 2) fuzz::write_scratch_file("special_tokens_map.json", parts[2]);
  const std::string dir = fuzz::scratch_dir().string();
  if (Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_path(dir); tok.ok()) {
    const Tokenizer& t = **tok;
    for (int32_t id : t.encode("<|im_start|>the hat<|im_end|>", true)) {
      if (id < 0 || id >= t.vocab_size()) std::abort();  // not a token of this vocabulary
    }
    for (int32_t id : t.stop_ids()) {
      if (id < 0 || id >= t.vocab_size()) std::abort();
    }
    (void)t.bos_id();
    (void)t.eos_id();
  }
  (void)chat::find_chat_template(dir);
  return 0;
}
