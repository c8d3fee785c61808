#include "server/tool_call_parser.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

namespace dserve::server {

namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kJsonFence = "```json";
constexpr std::string_view kHermesBegin = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

// `text` is a non-empty proper prefix of `tag`: the next piece may complete it.
bool may_become(std::string_view text, std::string_view tag) {
  return text.size() < tag.size() && tag.substr(0, text.size()) == text;
}

// Hermes' call head `{"name": "NAME", "arguments": ` at the start of `text`.
enum class HeadMatch { kMatch, kNeedMore, kNoMatch };
HeadMatch match_hermes_head(std::string_view text, std::string* name, size_t* head_len) {
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < text.size() && is_space(text[i])) ++i;
  };
  // Each literal must follow; at the end of the text the match is undecided.
  auto literal = [&](std::string_view lit) -> HeadMatch {
    skip_ws();
    const std::string_view rest = text.substr(i);
    if (rest.size() < lit.size()) {
      return lit.substr(0, rest.size()) == rest ? HeadMatch::kNeedMore : HeadMatch::kNoMatch;
    }
    if (rest.substr(0, lit.size()) != lit) return HeadMatch::kNoMatch;
    i += lit.size();
    return HeadMatch::kMatch;
  };
  for (std::string_view lit : {std::string_view("{"), std::string_view("\"name\""),
                               std::string_view(":")}) {
    if (HeadMatch m = literal(lit); m != HeadMatch::kMatch) return m;
  }
  skip_ws();
  if (i == text.size()) return HeadMatch::kNeedMore;
  if (text[i] != '"') return HeadMatch::kNoMatch;
  size_t j = i + 1;
  for (; j < text.size() && text[j] != '"'; ++j) {
    if (text[j] == '\\') ++j;
  }
  if (j >= text.size()) return HeadMatch::kNeedMore;
  const nlohmann::json quoted =
      nlohmann::json::parse(text.substr(i, j + 1 - i), nullptr, /*allow_exceptions=*/false);
  if (!quoted.is_string()) return HeadMatch::kNoMatch;
  i = j + 1;
  for (std::string_view lit : {std::string_view(","), std::string_view("\"arguments\""),
                               std::string_view(":")}) {
    if (HeadMatch m = literal(lit); m != HeadMatch::kMatch) return m;
  }
  *name = quoted.get<std::string>();
  *head_len = i;
  return HeadMatch::kMatch;
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format(std::string_view parser_name) {
  // vLLM parses R1's calls with its deepseek_v3 parser; both names are accepted.
  if (parser_name == "deepseek_v3" || parser_name == "deepseek_r1") {
    return ToolCallFormat::kDeepSeekV3;
  }
  if (parser_name == "deepseek_v31") return ToolCallFormat::kDeepSeekV31;
  if (parser_name == "hermes") return ToolCallFormat::kHermes;
  return std::nullopt;
}

std::vector<std::string> tool_call_parser_names() {
  return {"deepseek_v3", "deepseek_r1", "deepseek_v31", "hermes"};
}

ToolCallParser::Delta ToolCallParser::add(std::string_view piece) {
  held_.append(piece);
  Delta out;
  process(/*final=*/false, out);
  return out;
}

ToolCallParser::Delta ToolCallParser::flush() {
  Delta out;
  process(/*final=*/true, out);
  switch (state_) {
    case State::kContent:
    case State::kAfter:
      out.content += held_;
      break;
    case State::kSection:
      if (n_calls_ == 0) valid_ = false;  // the calls began and none came
      break;
    case State::kHeader:
    case State::kArguments:
    case State::kHermesCall:
      valid_ = false;  // the output ended inside a call
      break;
  }
  held_.clear();
  return out;
}

void ToolCallParser::start_call(std::string name, Delta& out) {
  out.calls.push_back({n_calls_, std::move(name), ""});
  ++n_calls_;
  args_emitted_ = 0;
}

void ToolCallParser::stream_arguments(std::string_view args, Delta& out) {
  if (args.size() <= args_emitted_) return;
  std::string piece(args.substr(args_emitted_));
  args_emitted_ = args.size();
  if (!out.calls.empty() && out.calls.back().index == n_calls_ - 1) {
    out.calls.back().arguments += piece;
  } else {
    out.calls.push_back({n_calls_ - 1, "", std::move(piece)});
  }
}

void ToolCallParser::end_call(std::string_view final_args, Delta& out) {
  // What was streamed is a prefix of the final arguments (only text that no later piece
  // can strip is ever emitted), so the rest completes them.
  stream_arguments(final_args, out);
  if (!nlohmann::json::accept(final_args)) valid_ = false;
}

bool ToolCallParser::process_header(bool final, Delta& out) {
  const size_t sep = held_.find(kSep);
  if (sep == std::string::npos) {
    if (final) valid_ = false;
    return false;
  }
  if (format_ == ToolCallFormat::kDeepSeekV31) {
    start_call(std::string(trim(std::string_view(held_).substr(0, sep))), out);
    held_.erase(0, sep + kSep.size());
    state_ = State::kArguments;
    return true;
  }
  // DeepSeek-V3: TYPE<sep>NAME\n```json\nARGS; the name ends at its line.
  const size_t name_begin = sep + kSep.size();
  const size_t nl = held_.find('\n', name_begin);
  if (nl == std::string::npos) {
    if (final) valid_ = false;
    return false;
  }
  std::string_view after = std::string_view(held_).substr(nl + 1);
  while (!after.empty() && is_space(after.front())) after.remove_prefix(1);
  if (!final && (after.empty() || may_become(after, kJsonFence))) return false;
  std::string name(trim(std::string_view(held_).substr(name_begin, nl - name_begin)));
  size_t args_begin = held_.size() - after.size();
  if (after.substr(0, kJsonFence.size()) == kJsonFence) args_begin += kJsonFence.size();
  held_.erase(0, args_begin);
  start_call(std::move(name), out);
  state_ = State::kArguments;
  return true;
}

bool ToolCallParser::process_arguments(bool final, Delta& out) {
  if (args_emitted_ == 0) {
    // Leading whitespace (the newline after the fence) is not part of the arguments.
    size_t ws = 0;
    while (ws < held_.size() && is_space(held_[ws])) ++ws;
    held_.erase(0, ws);
  }
  const bool fenced = format_ == ToolCallFormat::kDeepSeekV3;
  const size_t end = held_.find(kCallEnd);
  if (end != std::string::npos) {
    std::string_view args = rtrim(std::string_view(held_).substr(0, end));
    if (fenced && args.size() >= 3 && args.substr(args.size() - 3) == "```") {
      args = rtrim(args.substr(0, args.size() - 3));
    }
    end_call(args, out);
    held_.erase(0, end + kCallEnd.size());
    state_ = State::kSection;
    return true;
  }
  if (final) {
    valid_ = false;
    return false;
  }
  // Hold back what may still be the call's end: a partial marker, and before it
  // whitespace and (fenced) the closing backticks.
  size_t safe = held_.size() - partial_suffix(held_, kCallEnd);
  while (safe > args_emitted_ &&
         (is_space(held_[safe - 1]) || (fenced && held_[safe - 1] == '`'))) {
    --safe;
  }
  stream_arguments(std::string_view(held_).substr(0, safe), out);
  return false;
}

bool ToolCallParser::process_hermes(bool final, Delta& out) {
  if (!hermes_streaming_ && args_emitted_ == 0) {
    std::string name;
    size_t head_len = 0;
    // The call ends at the first end marker, even inside what looks like the name's JSON
    // string (as vLLM's <tool_call>(.*?)</tool_call>): so the head must come before it,
    // whether the text arrives whole or in pieces.
    const std::string_view before_end = std::string_view(held_).substr(0, held_.find(kHermesEnd));
    switch (match_hermes_head(before_end, &name, &head_len)) {
      case HeadMatch::kMatch:
        // The name comes first: start the call and stream its arguments.
        start_call(std::move(name), out);
        hermes_streaming_ = true;
        held_.erase(0, head_len);
        break;
      case HeadMatch::kNeedMore:
        if (!final && held_.find(kHermesEnd) == std::string::npos) return false;
        break;
      case HeadMatch::kNoMatch:
        break;
    }
  }
  if (hermes_streaming_ && args_emitted_ == 0) {
    // Whitespace after "arguments": is not part of them (it may arrive piece by piece).
    size_t ws = 0;
    while (ws < held_.size() && is_space(held_[ws])) ++ws;
    held_.erase(0, ws);
  }
  const size_t end = held_.find(kHermesEnd);
  if (end == std::string::npos) {
    if (final) {
      valid_ = false;
      return false;
    }
    if (hermes_streaming_) {
      // The arguments end before the object's closing brace: hold back whitespace and
      // braces that may be it, and a partial end marker.
      size_t safe = held_.size() - partial_suffix(held_, kHermesEnd);
      while (safe > args_emitted_ && (is_space(held_[safe - 1]) || held_[safe - 1] == '}')) --safe;
      stream_arguments(std::string_view(held_).substr(0, safe), out);
    }
    return false;
  }
  std::string_view body = rtrim(std::string_view(held_).substr(0, end));
  if (hermes_streaming_) {
    if (!body.empty() && body.back() == '}') body = rtrim(body.substr(0, body.size() - 1));
    end_call(body, out);
  } else {
    // The arguments came before the name (or the head is unusual): one delta at the end.
    const nlohmann::json call = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (call.is_object() && call.contains("name") && call["name"].is_string()) {
      start_call(call["name"].get<std::string>(), out);
      const nlohmann::json args = call.value("arguments", nlohmann::json::object());
      end_call(args.is_string() ? args.get<std::string>() : args.dump(), out);
    } else {
      start_call("", out);
      valid_ = false;
    }
  }
  held_.erase(0, end + kHermesEnd.size());
  hermes_streaming_ = false;
  args_emitted_ = 0;
  state_ = State::kSection;
  return true;
}

void ToolCallParser::process(bool final, Delta& out) {
  const bool hermes = format_ == ToolCallFormat::kHermes;
  for (;;) {
    switch (state_) {
      case State::kContent: {
        const std::string_view begin = hermes ? kHermesBegin : kCallsBegin;
        const size_t pos = held_.find(begin);
        if (pos != std::string::npos) {
          // Content right before the calls ends with the model's separator; keep it
          // as the model wrote it, as vLLM does.
          out.content += held_.substr(0, pos);
          held_.erase(0, pos + begin.size());
          state_ = hermes ? State::kHermesCall : State::kSection;
          continue;
        }
        const size_t keep = final ? 0 : partial_suffix(held_, begin);
        out.content += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return;
      }
      case State::kSection: {
        // Between calls: whitespace, the next call, or the end of the calls.
        size_t ws = 0;
        while (ws < held_.size() && is_space(held_[ws])) ++ws;
        const std::string_view rest = std::string_view(held_).substr(ws);
        const std::string_view next_call = hermes ? kHermesBegin : kCallBegin;
        if (rest.substr(0, next_call.size()) == next_call) {
          held_.erase(0, ws + next_call.size());
          state_ = hermes ? State::kHermesCall : State::kHeader;
          continue;
        }
        if (!hermes && rest.substr(0, kCallsEnd.size()) == kCallsEnd) {
          held_.erase(0, ws + kCallsEnd.size());
          state_ = State::kAfter;
          continue;
        }
        if (rest.empty() || (!final && (may_become(rest, next_call) ||
                                        (!hermes && may_become(rest, kCallsEnd))))) {
          if (final) held_.clear();
          return;
        }
        // Anything else ends the calls; what follows is content. A section that
        // began and held no call is not a call.
        if (n_calls_ == 0) valid_ = false;
        held_.erase(0, ws);
        state_ = hermes ? State::kContent : State::kAfter;
        continue;
      }
      case State::kHeader:
        if (!process_header(final, out)) return;
        continue;
      case State::kArguments:
        if (!process_arguments(final, out)) return;
        continue;
      case State::kHermesCall:
        if (!process_hermes(final, out)) return;
        continue;
      case State::kAfter:
        out.content += held_;
        held_.clear();
        return;
    }
  }
}

}  // namespace dserve::server
