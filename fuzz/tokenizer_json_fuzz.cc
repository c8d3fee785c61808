// Fuzz target: tokenizer.json (tokenizer/tokenizer.h, Tokenizer::from_hf_json): the BPE
// model (vocab, merges), normalizer, pre-tokenizer (Oniguruma regexes included),
// decoder, added tokens and post-processor; then the tokenizer at work. The input is
// tokenizer.json, then optionally a NUL and the text to encode.
//
// What a built tokenizer must do: every id encode() gives is one of its vocabulary
// (the engine indexes the embedding with it), and streaming the ids through an
// IncrementalDecoder gives exactly decode()'s text.
#include <algorithm>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "fuzz_support.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dserve::set_log_level("error");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  const std::vector<std::string_view> parts = fuzz::split_parts(fuzz::as_text(data, size), 2);
  const nlohmann::json tj = nlohmann::json::parse(parts[0], nullptr, /*allow_exceptions=*/false);
  if (tj.is_discarded()) return 0;
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_hf_json(tj, nullptr, nullptr, "fuzz");
  if (!tok.ok()) return 0;
  const Tokenizer& t = **tok;
  const std::string_view text =
      parts.size() > 1 ? parts[1] : std::string_view("Hello, world! It's 2024.\n  <|im_end|> \xc3\xa9\xff");
  for (bool add_special : {false, true}) {
    const std::vector<int32_t> ids = t.encode(text, add_special);
    for (int32_t id : ids) {
      if (id < 0 || id >= t.vocab_size()) std::abort();  // not a token of this vocabulary
    }
    for (bool skip_special : {false, true}) {
      IncrementalDecoder stream(t, skip_special);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.add(id);
      streamed += stream.flush();
      if (streamed != t.decode(ids, skip_special)) std::abort();
    }
  }
  for (int32_t id = 0; id < std::min(t.vocab_size(), 512); ++id) {
    (void)t.token_to_id(t.token_bytes(id));
  }
  (void)t.stop_ids();
  return 0;
}
