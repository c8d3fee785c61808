#include "server/reasoning_parser.h"

#include <algorithm>

namespace dserve::server {

namespace {
constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}
}  // namespace

ReasoningParser::Delta ReasoningParser::emit(std::string text) {
  Delta d;
  (in_content_ ? d.content : d.reasoning) = std::move(text);
  return d;
}

ReasoningParser::Delta ReasoningParser::add(std::string_view piece) {
  held_.append(piece);
  Delta out;
  if (at_start_) {
    // Drop a leading <think>; wait while the text may still become one.
    if (held_.size() < kOpen.size() && kOpen.substr(0, held_.size()) == held_) return out;
    if (held_.compare(0, kOpen.size(), kOpen) == 0) held_.erase(0, kOpen.size());
    at_start_ = false;
  }
  if (in_content_) {
    out.content = std::move(held_);
    held_.clear();
    return out;
  }
  const size_t close = held_.find(kClose);
  if (close != std::string::npos) {
    out.reasoning = held_.substr(0, close);
    out.content = held_.substr(close + kClose.size());
    held_.clear();
    in_content_ = true;
    return out;
  }
  const size_t keep = partial_suffix(held_, kClose);
  out.reasoning = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

ReasoningParser::Delta ReasoningParser::flush() {
  at_start_ = false;
  Delta d = emit(std::move(held_));
  held_.clear();
  return d;
}

bool ReasoningParser::closes_reasoning(std::string_view prompt_tail) {
  const size_t open = prompt_tail.rfind(kOpen), close = prompt_tail.rfind(kClose);
  return close != std::string_view::npos && (open == std::string_view::npos || close > open);
}

ReasoningParser::Delta ReasoningParser::split(std::string_view text) {
  ReasoningParser p;
  Delta a = p.add(text);
  Delta b = p.flush();
  a.reasoning += b.reasoning;
  a.content += b.content;
  return a;
}

}  // namespace dserve::server
