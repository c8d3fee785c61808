// PreTokenizer: the `pre_tokenizer` section of tokenizer.json, cutting normalized text
// into the words that BPE then encodes one by one. Supported, with HF's semantics:
//   Split {pattern: {Regex|String}, behavior: Removed|Isolated|MergedWithPrevious|
//          MergedWithNext|Contiguous, invert}
//   Digits {individual_digits}
//   ByteLevel {add_prefix_space, use_regex}   (must come last: it switches the text to
//                                              bytes, which is what BPE consumes here)
//   Sequence of those.
// Only byte-level pipelines are accepted (a ByteLevel step is required), since dserve
// implements byte-level BPE.
//
// Thread-safety: immutable after from_json(); split() may run concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/regex.h"

namespace dserve {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // `where` names the file and field for error messages.
  static Result<std::unique_ptr<PreTokenizer>> from_json(const nlohmann::json& j,
                                                         const std::string& where);

  // Appends the words of `text` (raw UTF-8 bytes, before byte-level spelling).
  void split(std::string_view text, std::vector<std::string>* words) const;

 private:
  struct Step {
    enum class Kind { kSplit, kByteLevel };
    Kind kind = Kind::kSplit;
    std::unique_ptr<Regex> regex;  // kSplit; for kByteLevel the GPT-2 regex if use_regex
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // kByteLevel
  };

  Status add_step(const nlohmann::json& j, const std::string& where);

  std::vector<Step> steps_;
};

}  // namespace dserve
