// Tokenizer: Hugging Face-compatible byte-level BPE, built either from a
// tokenizer.json (+ tokenizer_config.json) or from GGUF tokenizer metadata.
// encode() must give exactly the ids that HF `tokenizers` gives.
//
// Thread-safety: immutable after construction; encode/decode may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dserve {

class ModelFiles;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // From a model's files (tokenizer.json for HF directories, metadata for GGUF).
  static Result<std::unique_ptr<Tokenizer>> from_model_files(const ModelFiles& files);

  // add_special_tokens: prepend BOS (and whatever the post-processor adds) as HF's
  // `tokenizer(text)` does. Special-token strings inside `text` map to their ids.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;

  // Full decode, as HF's `tokenizer.decode(ids, skip_special_tokens=...)`.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // The raw bytes a token stands for (after byte-level decoding); special tokens give
  // their text.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;  // -1 if none
  // Every id that ends generation (eos plus, e.g., <|im_end|>/<|eot_id|> from configs).
  virtual std::vector<int32_t> stop_ids() const = 0;
  // The chat template (Jinja source) if the files carry one, else empty.
  virtual const std::string& chat_template() const = 0;
};

// Turns a stream of token ids into text without ever emitting an incomplete UTF-8
// sequence: bytes of a partial character are held until it completes.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}
  // Returns the text that became complete with this token (possibly empty).
  std::string add(int32_t id);
  // Whatever is still held (invalid bytes become U+FFFD), at end of stream.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dserve
