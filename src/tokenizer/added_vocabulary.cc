#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace dserve {

namespace {

// Rust's char::is_whitespace (the Unicode White_Space property).
bool is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// An approximation of HF's word-character test for single_word tokens: ASCII
// alphanumerics, '_' and any non-ASCII, non-whitespace character.
bool is_word_char(uint32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           c == '_';
  }
  return !is_whitespace(c);
}

// The code point that ends just before `pos` (valid UTF-8 assumed).
uint32_t char_before(std::string_view s, size_t pos, size_t* start) {
  size_t i = pos - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  *start = i;
  size_t j = i;
  return utf8::decode(s, &j);
}

}  // namespace

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, const NormalizeFn& normalize)
    : tokens_(std::move(tokens)) {
  raw_trie_.emplace_back();
  normalized_trie_.emplace_back();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.content.empty()) continue;
    if (t.normalized) {
      insert(&normalized_trie_, normalize ? normalize(t.content) : t.content,
             static_cast<int32_t>(i));
    } else {
      insert(&raw_trie_, t.content, static_cast<int32_t>(i));
    }
  }
}

void AddedVocabulary::insert(Trie* trie, std::string_view key, int32_t token) {
  int32_t node = 0;
  for (char c : key) {
    const uint8_t b = static_cast<uint8_t>(c);
    int32_t next = child(*trie, node, b);
    if (next < 0) {
      next = static_cast<int32_t>(trie->size());
      trie->emplace_back();
      auto& kids = (*trie)[node].children;
      kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{-1})),
                  {b, next});
    }
    node = next;
  }
  // A later duplicate wins, as in HF where the last definition of a content counts.
  (*trie)[node].token = token;
}

int32_t AddedVocabulary::child(const Trie& trie, int32_t node, uint8_t byte) {
  const auto& kids = trie[node].children;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t{-1}));
  return it != kids.end() && it->first == byte ? it->second : -1;
}

void AddedVocabulary::find(std::string_view text, bool normalized,
                           std::vector<Segment>* out) const {
  const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
  if (trie.empty() || trie[0].children.empty()) {
    out->push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0;  // end of the previous token
  size_t pos = 0;
  while (pos < text.size()) {
    // Longest token starting at pos.
    int32_t best = -1;
    size_t best_len = 0;
    int32_t node = 0;
    for (size_t k = pos; k < text.size(); ++k) {
      node = child(trie, node, static_cast<uint8_t>(text[k]));
      if (node < 0) break;
      if (trie[node].token >= 0) {
        best = trie[node].token;
        best_len = k + 1 - pos;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[best];
    size_t start = pos;
    size_t stop = pos + best_len;
    if (tok.single_word) {
      size_t unused;
      const bool left_ok = start == 0 || !is_word_char(char_before(text, start, &unused));
      size_t j = stop;
      const bool right_ok = stop == text.size() || !is_word_char(utf8::decode(text, &j));
      if (!left_ok || !right_ok) {
        ++pos;
        continue;
      }
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t prev;
        if (!is_whitespace(char_before(text, s, &prev))) break;
        s = prev;
      }
      start = std::max(s, start_offset);
    }
    if (tok.rstrip) {
      size_t e = stop;
      while (e < text.size()) {
        size_t j = e;
        if (!is_whitespace(utf8::decode(text, &j))) break;
        e = j;
      }
      stop = e;
    }
    if (start_offset < start) out->push_back({start_offset, start, -1});
    out->push_back({start, stop, tok.id});
    start_offset = stop;
    pos = std::max(pos + best_len, stop);
  }
  if (start_offset < text.size()) out->push_back({start_offset, text.size(), -1});
  if (text.empty()) out->push_back({0, 0, -1});
}

}  // namespace dserve
