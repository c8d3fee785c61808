// What the grammar fuzz targets share: a small vocabulary, and a walk of a grammar's
// matcher (grammar/grammar_matcher.h) over it, steered by fuzz input, that checks the
// matcher against its own mask: a token the mask allows is accepted, a token it refuses
// is rejected (unless the automaton cut the mask short) and leaves the state as it was.
//
// Thread-safety: none needed (one input at a time).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar_matcher.h"
#include "grammar/token_vocabulary.h"

namespace dserve::fuzz {

// Every single byte (ids 0-255), then tokens as a JSON-writing, tool-calling model has
// them: several bytes, whole and partial UTF-8 characters, and one empty (special) token.
inline std::shared_ptr<const grammar::TokenVocabulary> small_vocabulary() {
  static const std::shared_ptr<const grammar::TokenVocabulary> vocab = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"{\"", "\": ", "\", \"", "\"}", "true", "false", "null", "[1", ", ",
                          "123", "-0.5e3", "\\u00e9", "\\\"", "ab", "abc", " the", "\n\n",
                          "\xC3\xA9", "\xE2\x82", "\xAC", "\xF0\x9F\x98\x80", "<tool_call>",
                          "</tool_call>", "\"name\"", "\"arguments\""}) {
      tokens.emplace_back(t);
    }
    tokens.emplace_back();  // a special token: no bytes, never allowed
    return std::make_shared<const grammar::TokenVocabulary>(std::move(tokens));
  }();
  return vocab;
}

// Feeds `grammar` tokens chosen by `script`, one step per byte b: below 0xF0, the
// (b mod n)-th of the n tokens the mask allows; from 0xF0 on, the token whose id is
// the next byte plus 256 * (b & 1), allowed or not. Stops when no token is allowed.
inline void walk_matcher(std::shared_ptr<const grammar::Grammar> grammar, std::string_view script) {
  grammar::GrammarMatcher matcher(std::move(grammar), small_vocabulary());
  const int32_t n_tokens = small_vocabulary()->size();
  std::vector<uint64_t> mask((n_tokens + 63) / 64);
  auto allowed = [&](int32_t id) { return (mask[id / 64] >> (id % 64)) & 1; };
  for (size_t i = 0; i < script.size(); ++i) {
    std::fill(mask.begin(), mask.end(), 0);
    matcher.fill_allowed(mask);
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < n_tokens; ++id) {
      if (allowed(id)) ids.push_back(id);
    }
    const auto b = static_cast<uint8_t>(script[i]);
    int32_t token;
    if (b < 0xF0) {
      if (ids.empty()) return;
      token = ids[b % ids.size()];
    } else {
      if (++i == script.size()) return;
      token = static_cast<uint8_t>(script[i]) + 256 * (b & 1);
      if (token >= n_tokens) continue;
    }
    const bool was_complete = matcher.is_complete();
    const bool accepted = matcher.accept(token);
    // A mask cut short by the work budget (GrammarAutomaton::too_complex) may refuse
    // tokens the grammar allows; never the other way round.
    const bool exact = !matcher.automaton().too_complex();
    if (allowed(token) ? !accepted : accepted && exact) std::abort();  // mask and matcher disagree
    if (!accepted && matcher.is_complete() != was_complete) std::abort();  // a refusal moved it
  }
}

}  // namespace dserve::fuzz
