#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <utility>

namespace dserve {

namespace {

// The regex HF's ByteLevel pre-tokenizer applies when use_regex is true (GPT-2's).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Piece {
  size_t begin, end;
  bool is_match;
};

// Cuts `text` by `regex` and applies `behavior` as HF's NormalizedString::split does.
void split_piece(std::string_view text, const Regex& regex, SplitBehavior behavior, bool invert,
                 std::vector<std::string>* out) {
  std::vector<Regex::Match> matches;
  regex.find_all(text, &matches);
  std::vector<Piece> pieces;
  pieces.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const Regex::Match& m : matches) {
    if (prev != m.begin) pieces.push_back({prev, m.begin, invert});
    pieces.push_back({m.begin, m.end, !invert});
    prev = m.end;
  }
  if (prev != text.size()) pieces.push_back({prev, text.size(), invert});

  // (begin, end, keep) after applying the behavior.
  std::vector<Piece> kept;  // is_match reused as "remove"
  kept.reserve(pieces.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Piece& p : pieces) kept.push_back({p.begin, p.end, false});
      break;
    case SplitBehavior::kRemoved:
      kept = pieces;
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Piece& p : pieces) {
        if (p.is_match == previous_match && !kept.empty()) {
          kept.back().end = p.end;
        } else {
          kept.push_back({p.begin, p.end, false});
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Piece& p : pieces) {
        if (p.is_match && !previous_match && !kept.empty()) {
          kept.back().end = p.end;
        } else {
          kept.push_back({p.begin, p.end, false});
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const Piece& p : kept) {
    if (!p.is_match && p.end > p.begin) out->emplace_back(text.substr(p.begin, p.end - p.begin));
  }
}

Result<SplitBehavior> parse_behavior(const nlohmann::json& j, const std::string& where) {
  if (!j.is_string()) return corrupt(where + ".behavior: expected a string");
  const std::string b = j.get<std::string>();
  // HF accepts the serde names; lower-case spellings appear in files written by hand.
  if (b == "Removed" || b == "removed") return SplitBehavior::kRemoved;
  if (b == "Isolated" || b == "isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious" || b == "merged_with_previous") {
    return SplitBehavior::kMergedWithPrevious;
  }
  if (b == "MergedWithNext" || b == "merged_with_next") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous" || b == "contiguous") return SplitBehavior::kContiguous;
  return corrupt(where + ".behavior: unknown value \"" + b + "\"");
}

bool get_bool(const nlohmann::json& j, const char* key, bool fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::from_json(const nlohmann::json& j,
                                                              const std::string& where) {
  auto pre = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  if (j.is_null()) {
    return unimplemented(where + ": no pre-tokenizer; dserve supports byte-level BPE only");
  }
  DS_RETURN_IF_ERROR(pre->add_step(j, where));
  if (pre->steps_.empty() || pre->steps_.back().kind != Step::Kind::kByteLevel) {
    return unimplemented(where +
                         ": the pipeline does not end with ByteLevel; dserve supports "
                         "byte-level BPE only");
  }
  for (size_t i = 0; i + 1 < pre->steps_.size(); ++i) {
    if (pre->steps_[i].kind == Step::Kind::kByteLevel) {
      return unimplemented(where + ": ByteLevel must be the last pre-tokenizer");
    }
  }
  return pre;
}

Status PreTokenizer::add_step(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return corrupt(where + ": expected an object with a string \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return corrupt(where + ": Sequence without a \"pretokenizers\" array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      DS_RETURN_IF_ERROR(add_step((*it)[i], where + ".pretokenizers[" + std::to_string(i) + "]"));
    }
    return Status::Ok();
  }
  Step step;
  if (type == "Split") {
    const auto pat = j.find("pattern");
    std::string pattern;
    if (pat != j.end() && pat->is_object() && pat->contains("Regex") &&
        (*pat)["Regex"].is_string()) {
      pattern = (*pat)["Regex"].get<std::string>();
    } else if (pat != j.end() && pat->is_object() && pat->contains("String") &&
               (*pat)["String"].is_string()) {
      pattern = Regex::escape((*pat)["String"].get<std::string>());
    } else {
      return corrupt(where + ".pattern: expected {\"Regex\": ...} or {\"String\": ...}");
    }
    auto regex = Regex::compile(pattern);
    if (!regex.ok()) return regex.status().with_context(where + ".pattern");
    step.regex = std::move(regex).value();
    if (!j.contains("behavior")) return corrupt(where + ": Split without \"behavior\"");
    DS_ASSIGN_OR_RETURN(step.behavior, parse_behavior(j["behavior"], where));
    step.invert = get_bool(j, "invert", false);
  } else if (type == "Digits") {
    // HF's Digits tests char::is_numeric, i.e. general category N.
    DS_ASSIGN_OR_RETURN(step.regex, Regex::compile(R"(\p{N})"));
    step.behavior = get_bool(j, "individual_digits", false) ? SplitBehavior::kIsolated
                                                            : SplitBehavior::kContiguous;
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    step.add_prefix_space = get_bool(j, "add_prefix_space", true);
    if (get_bool(j, "use_regex", true)) {
      DS_ASSIGN_OR_RETURN(step.regex, Regex::compile(kGpt2Pattern));
    }
  } else {
    return unimplemented(where + ": pre-tokenizer type \"" + type + "\" is not supported");
  }
  steps_.push_back(std::move(step));
  return Status::Ok();
}

void PreTokenizer::split(std::string_view text, std::vector<std::string>* words) const {
  std::vector<std::string> current;
  current.emplace_back(text);
  std::vector<std::string> next;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string& piece : current) {
      if (step.kind == Step::Kind::kByteLevel) {
        if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece = " " + piece;
        if (step.regex) {
          split_piece(piece, *step.regex, SplitBehavior::kIsolated, false, &next);
        } else if (!piece.empty()) {
          next.push_back(std::move(piece));
        }
      } else {
        split_piece(piece, *step.regex, step.behavior, step.invert, &next);
      }
    }
    std::swap(current, next);
  }
  for (std::string& w : current) words->push_back(std::move(w));
}

}  // namespace dserve
