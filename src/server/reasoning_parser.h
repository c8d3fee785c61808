// ReasoningParser: splits DeepSeek-R1's output into reasoning and answer, as vLLM's
// `--reasoning-parser deepseek_r1` does. R1 thinks between <think> and </think>; its
// chat template already opens <think> in the prompt, so the output usually starts
// inside the reasoning and only closes it. Everything before </think> is reasoning
// (a leading <think> is dropped), everything after it is the answer. Output that never
// closes the tag is all reasoning -- unless the prompt already closed it (DeepSeek-V3.1's
// non-thinking mode ends the prompt with </think>): then the output is all answer.
//
// Streaming: add() takes text pieces as they are decoded and returns what is final
// in each part; a suffix that may be the start of a tag is held back until the next
// piece decides it, so a tag split across tokens never leaks into either part.
//
// Thread-safety: not thread-safe; one per choice.
#pragma once

#include <string>
#include <string_view>

namespace dserve::server {

class ReasoningParser {
 public:
  // `prompt_closed_reasoning`: the prompt's last think tag is </think>.
  explicit ReasoningParser(bool prompt_closed_reasoning = false)
      : in_content_(prompt_closed_reasoning), at_start_(!prompt_closed_reasoning) {}

  struct Delta {
    std::string reasoning;
    std::string content;
  };

  Delta add(std::string_view piece);
  // At the end of the output: whatever was held back.
  Delta flush();

  // Whether text added now would still be reasoning (</think> not yet seen).
  bool in_reasoning() const { return !in_content_; }

  // A whole output at once (non-streamed responses).
  static Delta split(std::string_view text);
  // Whether a prompt ending with `prompt_tail` closed the reasoning already: its last
  // think tag is </think>.
  static bool closes_reasoning(std::string_view prompt_tail);

 private:
  Delta emit(std::string text);

  bool in_content_;  // </think> seen (or closed by the prompt)
  bool at_start_;    // nothing emitted yet: a leading <think> is dropped
  std::string held_;         // text not yet decided
};

}  // namespace dserve::server
