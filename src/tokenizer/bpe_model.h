// BpeModel: byte-level byte-pair encoding of one pre-tokenized word, as HF's BPE model
// does it: start from one symbol per byte, repeatedly merge the adjacent pair with the
// lowest merge rank (leftmost first on ties), optionally short-circuit words that are
// whole vocabulary entries (ignore_merges). Words are raw bytes; the vocabulary is kept
// both in its byte-level spelling (for ids <-> tokens) and as raw bytes.
//
// Thread-safety: immutable after build() except for the word cache, which has its own
// mutex; encode_word() may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dserve {

// Ids may leave gaps, but not many: every id up to the largest gets a slot, so a file
// naming id 600000000 in a vocabulary of a few hundred would ask for gigabytes.
inline constexpr int64_t kMaxUnusedTokenIds = int64_t{1} << 20;

class BpeModel {
 public:
  // vocab: (byte-level spelled token, id). merges: pairs of spelled tokens, by rank.
  // Errors name `where` (file and field).
  static Result<std::unique_ptr<BpeModel>> build(
      const std::vector<std::pair<std::string, int32_t>>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
      const std::string& where);

  // Appends the ids of one word (raw bytes).
  void encode_word(std::string_view word, std::vector<int32_t>* ids) const;

  // Largest id + 1 in the vocabulary.
  int32_t size() const { return static_cast<int32_t>(id_to_token_.size()); }
  // The spelled token for `id` ("" for holes in the id range).
  const std::string& token(int32_t id) const { return id_to_token_[id]; }
  // -1 if absent.
  int32_t id_of(std::string_view spelled) const;

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int32_t>* ids) const;

  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int32_t> spelled_to_id_;
  std::unordered_map<std::string, int32_t> bytes_to_id_;  // tokens spelled in the alphabet
  std::unordered_map<uint64_t, MergeInfo> merges_;
  int32_t byte_id_[256];  // the token of each single byte, -1 if the vocabulary lacks it
  bool ignore_merges_ = false;

  // Recently encoded words. Bounded: cleared when it grows past kCacheCapacity.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;  // GUARDED_BY(cache_mutex_)
};

}  // namespace dserve
