// Tokenizer: Hugging Face-compatible byte-level BPE, built either from a
// tokenizer.json (+ tokenizer_config.json) or from GGUF tokenizer metadata.
// encode() gives exactly the ids that HF `tokenizers` gives for the same files
// (tests/reference/test_tokenizer.py checks it on thousands of strings).
//
// add_special_tokens follows the tokenizer.json post-processor, except that for
// tokenizer_class LlamaTokenizer(Fast) the tokenizer_config.json flags add_bos_token /
// add_eos_token decide, as transformers' LlamaTokenizerFast does (this is how the
// DeepSeek models get their BOS). For GGUF, tokenizer.ggml.add_bos_token decides.
//
// Thread-safety: immutable after construction; encode/decode may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace dserve {

class ModelFiles;
class GgufMetadata;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // From a model's files (tokenizer.json for HF directories, metadata for GGUF).
  static Result<std::unique_ptr<Tokenizer>> from_model_files(const ModelFiles& files);
  // From a path without loading weights: a directory holding tokenizer.json (and
  // optionally tokenizer_config.json, generation_config.json), or a .gguf file.
  static Result<std::unique_ptr<Tokenizer>> from_path(const std::string& path);
  // From parsed Hugging Face files; config files may be null. `source` (the directory or
  // file) starts every error message.
  static Result<std::unique_ptr<Tokenizer>> from_hf_json(const nlohmann::json& tokenizer_json,
                                                         const nlohmann::json* tokenizer_config,
                                                         const nlohmann::json* generation_config,
                                                         const std::string& source);
  // From GGUF metadata (tokenizer.ggml.*); errors name metadata.source.
  static Result<std::unique_ptr<Tokenizer>> from_gguf_metadata(const GgufMetadata& metadata);

  // add_special_tokens: prepend BOS (and whatever the post-processor adds) as HF's
  // `tokenizer(text)` does. Special-token strings inside `text` map to their ids.
  // Invalid UTF-8 in `text` is first replaced by U+FFFD.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;

  // Full decode, as HF's `tokenizer.decode(ids, skip_special_tokens=...)`; ids outside
  // the vocabulary are ignored, invalid UTF-8 becomes U+FFFD.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // The raw bytes a token stands for (after byte-level decoding); special tokens give
  // their text. Empty for ids outside the vocabulary.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  // The id of a token given as written in the vocabulary or added tokens
  // ("<|im_end|>", "Ġthe"); -1 if absent.
  virtual int32_t token_to_id(std::string_view token) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;  // -1 if none
  // Every id that ends generation (eos, generation_config's eos ids, and special
  // end-of-turn tokens present in the vocabulary: <|im_end|>, <|eot_id|>,
  // <｜end▁of▁sentence｜>, ...).
  virtual std::vector<int32_t> stop_ids() const = 0;
  // The chat template (Jinja source) if the files carry one, else empty.
  virtual const std::string& chat_template() const = 0;
};

// Turns a stream of token ids into text without ever emitting an incomplete UTF-8
// sequence: bytes of a partial character are held until it completes. The
// concatenation of everything add() and flush() return equals
// tokenizer.decode(all ids, skip_special_tokens).
// Thread-safety: one decoder per stream; not shared between threads.
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
