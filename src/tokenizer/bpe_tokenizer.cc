#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <string_view>

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace dserve {

namespace {

// Special tokens that end a turn in the chat formats of the supported model families.
constexpr std::string_view kEndOfTurnTokens[] = {
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>",
    "<｜end▁of▁sentence｜>", "<|EOT|>",
};

}  // namespace

BpeTokenizer::BpeTokenizer(TokenizerParts parts) : parts_(std::move(parts)) {
  const Normalizer* normalizer = parts_.normalizer.get();
  added_ = AddedVocabulary(parts_.added_tokens, [normalizer](std::string_view s) {
    return normalizer ? normalizer->normalize(s) : std::string(s);
  });
  int32_t n = parts_.model->size();
  for (const AddedToken& t : parts_.added_tokens) n = std::max(n, t.id + 1);
  token_bytes_.resize(static_cast<size_t>(n));
  special_.assign(static_cast<size_t>(n), false);
  for (int32_t id = 0; id < parts_.model->size(); ++id) {
    token_bytes_[id] = byte_level::decode_token(parts_.model->token(id));
  }
  for (const AddedToken& t : parts_.added_tokens) {
    token_bytes_[t.id] = byte_level::decode_token(t.content);
    if (t.special) special_[t.id] = true;
  }

  const auto add_stop = [this](int32_t id) {
    if (id >= 0 && id < vocab_size() &&
        std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end()) {
      stop_ids_.push_back(id);
    }
  };
  add_stop(parts_.eos_id);
  for (int32_t id : parts_.extra_stop_ids) add_stop(id);
  for (const AddedToken& t : parts_.added_tokens) {
    if (!t.special) continue;
    for (std::string_view name : kEndOfTurnTokens) {
      if (t.content == name) add_stop(t.id);
    }
  }
}

int32_t BpeTokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& t : parts_.added_tokens) {
    if (t.content == token) return t.id;
  }
  return parts_.model->id_of(token);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::repair(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = parts_.prefix_ids;

  std::vector<AddedVocabulary::Segment> raw_segments;
  added_.find(text, /*normalized=*/false, &raw_segments);
  std::vector<AddedVocabulary::Segment> segments;
  for (const auto& seg : raw_segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    if (seg.end == seg.begin) continue;
    const std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    std::string normalized;
    std::string_view norm_view = piece;
    if (parts_.normalizer) {
      normalized = parts_.normalizer->normalize(piece);
      norm_view = normalized;
    }
    segments.clear();
    added_.find(norm_view, /*normalized=*/true, &segments);
    for (const auto& s : segments) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else if (s.end > s.begin) {
        encode_ordinary(norm_view.substr(s.begin, s.end - s.begin), &ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), parts_.suffix_ids.begin(), parts_.suffix_ids.end());
  return ids;
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>* ids) const {
  std::vector<std::string> words;
  parts_.pre_tokenizer->split(text, &words);
  for (const std::string& w : words) parts_.model->encode_word(w, ids);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;  // HF ignores ids it does not know
    if (skip_special_tokens && special_[id]) continue;
    bytes += token_bytes_[id];
  }
  return utf8::is_valid(bytes) ? bytes : utf8::repair(bytes);
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return std::string();
  return token_bytes_[id];
}

bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

}  // namespace dserve
