#include "grammar/token_vocabulary.h"

#include <algorithm>
#include <numeric>

#include "tokenizer/tokenizer.h"

namespace dserve::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes)
    : bytes_(std::move(token_bytes)) {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id) {
    if (!bytes_[id].empty()) order.push_back(id);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  // Walk the sorted strings keeping the open path of nodes; a node's subtree ends when
  // the path is cut above it. Equal strings land on one node, one after the other, so
  // each node's token ids are contiguous.
  std::vector<int32_t> path;  // node index at depth d + 1
  const std::string* prev = nullptr;
  auto close_to = [&](size_t depth) {
    while (path.size() > depth) {
      node_end_[path.back()] = n_nodes();
      path.pop_back();
    }
  };
  for (int32_t id : order) {
    const std::string& s = bytes_[id];
    size_t lcp = 0;
    if (prev) {
      const size_t n = std::min({prev->size(), s.size(), path.size()});
      while (lcp < n && (*prev)[lcp] == s[lcp]) ++lcp;
    }
    close_to(lcp);
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(n_nodes());
      node_byte_.push_back(static_cast<uint8_t>(s[d]));
      node_depth_.push_back(static_cast<int32_t>(d + 1));
      node_end_.push_back(0);
      node_tok_.push_back(static_cast<int32_t>(tokens_.size()));
    }
    tokens_.push_back(id);
    max_depth_ = std::max(max_depth_, static_cast<int32_t>(s.size()));
    prev = &s;
  }
  close_to(0);
  node_tok_.push_back(static_cast<int32_t>(tokens_.size()));
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer,
                                                                       int32_t vocab_size) {
  std::vector<std::string> bytes(static_cast<size_t>(std::max(vocab_size, 0)));
  const int32_t n = std::min(vocab_size, tokenizer.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    if (!tokenizer.is_special(id)) bytes[id] = tokenizer.token_bytes(id);
  }
  return std::make_shared<const TokenVocabulary>(std::move(bytes));
}

}  // namespace dserve::grammar
