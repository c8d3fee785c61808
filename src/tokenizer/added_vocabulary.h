// AddedVocabulary: tokens matched whole in the input before any pre-tokenization
// (tokenizer.json "added_tokens", GGUF control and user-defined tokens), with HF's
// rules: leftmost-longest matching; tokens with normalized=false are found in the raw
// text, those with normalized=true in the normalized pieces between them; lstrip/rstrip
// swallow neighbouring whitespace; single_word requires word boundaries.
//
// Thread-safety: immutable after construction; find() may run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dserve {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

class AddedVocabulary {
 public:
  struct Segment {
    size_t begin, end;  // byte range in the searched text
    int32_t id;         // the added token, or -1 for ordinary text
  };
  using NormalizeFn = std::function<std::string(std::string_view)>;

  AddedVocabulary() = default;
  // `normalize` (may be empty) is applied to the contents of normalized tokens, as HF does.
  AddedVocabulary(std::vector<AddedToken> tokens, const NormalizeFn& normalize);

  // Cuts `text` into ordinary text and added tokens of one kind (normalized or not).
  // Appends segments covering all of `text`, in order.
  void find(std::string_view text, bool normalized, std::vector<Segment>* out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                 // index into tokens_
  };
  using Trie = std::vector<Node>;

  static void insert(Trie* trie, std::string_view key, int32_t token);
  static int32_t child(const Trie& trie, int32_t node, uint8_t byte);

  std::vector<AddedToken> tokens_;
  Trie raw_trie_, normalized_trie_;
};

}  // namespace dserve
