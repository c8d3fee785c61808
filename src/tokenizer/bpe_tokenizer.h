// BpeTokenizer: the one Tokenizer implementation, assembled from validated parts by the
// tokenizer.json and GGUF front ends (hf_tokenizer.cc, gguf_tokenizer.cc).
//
// encode: repair invalid UTF-8 -> split out added tokens with normalized=false -> NFC
// etc. -> split out added tokens with normalized=true -> pre-tokenize -> BPE per word,
// then the post-processor's prefix/suffix ids when add_special_tokens.
// decode: the bytes of every kept token, concatenated, invalid UTF-8 -> U+FFFD (HF's
// ByteLevel decoder; clean_up_tokenization_spaces is false in every supported config).
//
// Thread-safety: immutable after construction (the BPE word cache is internally locked).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace dserve {

struct TokenizerParts {
  std::string source;  // the file the tokenizer came from, for messages
  std::unique_ptr<Normalizer> normalizer;  // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::vector<AddedToken> added_tokens;
  std::vector<int32_t> prefix_ids, suffix_ids;  // added around the text by add_special_tokens
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  std::vector<int32_t> extra_stop_ids;  // besides eos and well-known end-of-turn tokens
  std::string chat_template;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(TokenizerParts parts);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  std::string token_bytes(int32_t id) const override;
  bool is_special(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  int32_t bos_id() const override { return parts_.bos_id; }
  int32_t eos_id() const override { return parts_.eos_id; }
  std::vector<int32_t> stop_ids() const override { return stop_ids_; }
  const std::string& chat_template() const override { return parts_.chat_template; }
  int32_t token_to_id(std::string_view token) const override;

 private:
  void encode_ordinary(std::string_view text, std::vector<int32_t>* ids) const;

  TokenizerParts parts_;
  AddedVocabulary added_;
  std::vector<std::string> token_bytes_;  // by id
  std::vector<bool> special_;             // by id
  std::vector<int32_t> stop_ids_;
};

}  // namespace dserve
