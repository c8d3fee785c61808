// TokenVocabulary: the byte string of every token id of one model, arranged as a trie
// for the grammar matcher's mask computation. Built once per tokenizer and shared by
// every constrained request.
//
// The trie is stored in preorder: node i has a byte, a depth (1 for a first byte),
// subtree_end(i) (the first node after its subtree, so a walk can skip it) and the
// token ids whose bytes end at it. Ids with no bytes (special tokens such as <|im_end|>,
// which stand for no text, and padding ids past the tokenizer's vocabulary) are in no
// node, so a grammar never allows them; the sampler adds stop ids itself.
//
// Thread-safety: immutable after construction; share freely.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dserve {
class Tokenizer;
}

namespace dserve::grammar {

class TokenVocabulary {
 public:
  // token_bytes[id]: the bytes token `id` stands for; empty: never allowed.
  explicit TokenVocabulary(std::vector<std::string> token_bytes);
  // vocab_size: the model's logits width (may exceed the tokenizer's vocabulary).
  // Special tokens get no bytes.
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tokenizer,
                                                               int32_t vocab_size);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

  int32_t n_nodes() const { return static_cast<int32_t>(node_byte_.size()); }
  uint8_t node_byte(int32_t i) const { return node_byte_[i]; }
  int32_t node_depth(int32_t i) const { return node_depth_[i]; }
  int32_t subtree_end(int32_t i) const { return node_end_[i]; }
  std::span<const int32_t> node_tokens(int32_t i) const {
    return {tokens_.data() + node_tok_[i], tokens_.data() + node_tok_[i + 1]};
  }
  int32_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<uint8_t> node_byte_;
  std::vector<int32_t> node_depth_;
  std::vector<int32_t> node_end_;
  std::vector<int32_t> node_tok_;  // [n_nodes + 1]: node i's tokens are tokens_[tok[i], tok[i+1])
  std::vector<int32_t> tokens_;
  int32_t max_depth_ = 0;
};

}  // namespace dserve::grammar
