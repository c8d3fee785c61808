#include "tokenizer/bpe_model.h"

#include <queue>

#include "tokenizer/byte_level.h"

namespace dserve {

Result<std::unique_ptr<BpeModel>> BpeModel::build(
    const std::vector<std::pair<std::string, int32_t>>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
    const std::string& where) {
  auto m = std::unique_ptr<BpeModel>(new BpeModel());
  m->ignore_merges_ = ignore_merges;
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab) {
    if (id < 0) return corrupt(where + ".vocab: negative id for token \"" + tok + "\"");
    max_id = std::max(max_id, id);
  }
  if (max_id >= static_cast<int64_t>(vocab.size()) + kMaxUnusedTokenIds) {
    return corrupt(where + ".vocab: id " + std::to_string(max_id) + " is implausibly large for " +
                   std::to_string(vocab.size()) + " tokens");
  }
  m->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  m->spelled_to_id_.reserve(vocab.size());
  m->bytes_to_id_.reserve(vocab.size());
  for (const auto& [tok, id] : vocab) {
    m->id_to_token_[id] = tok;
    m->spelled_to_id_[tok] = id;
    if (auto bytes = byte_level::to_bytes(tok)) m->bytes_to_id_[*bytes] = id;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = m->bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    m->byte_id_[b] = it == m->bytes_to_id_.end() ? -1 : it->second;
  }
  m->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const int32_t ia = m->id_of(a), ib = m->id_of(b), inew = m->id_of(a + b);
    if (ia < 0 || ib < 0 || inew < 0) {
      return corrupt(where + ".merges[" + std::to_string(rank) + "]: \"" + a + " " + b +
                     "\" uses a token missing from the vocabulary");
    }
    // A repeated pair keeps its last rank, as in HF (a map built in file order).
    m->merges_[pair_key(ia, ib)] = {static_cast<int32_t>(rank), inew};
  }
  return m;
}

int32_t BpeModel::id_of(std::string_view spelled) const {
  const auto it = spelled_to_id_.find(std::string(spelled));
  return it == spelled_to_id_.end() ? -1 : it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const auto it = bytes_to_id_.find(std::string(word));
    if (it != bytes_to_id_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    if (byte_id_[static_cast<uint8_t>(word[0])] >= 0) {
      ids->push_back(byte_id_[static_cast<uint8_t>(word[0])]);
    }
    return;
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  merge_word(word, ids);
  if (cacheable) {
    std::vector<int32_t> result(ids->begin() + static_cast<std::ptrdiff_t>(first), ids->end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(result));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>* ids) const {
  // One symbol per byte, linked in a list; merged-away symbols get id -1.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (char c : word) {
    const int32_t id = byte_id_[static_cast<uint8_t>(c)];
    // A byte missing from the vocabulary is dropped (HF drops it when there is no unk).
    if (id < 0) continue;
    const int32_t n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, n + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push_pair = [&](int32_t left) {
    const int32_t right = sym[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push_pair(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (left.id < 0 || left.next < 0) continue;
    // Stale entry: the pair at this position changed since it was queued.
    const auto it = merges_.find(pair_key(left.id, sym[left.next].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    const int32_t right_pos = left.next;
    Symbol& right = sym[right_pos];
    left.id = top.new_id;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    right.id = -1;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids->push_back(sym[i].id);
}

}  // namespace dserve
