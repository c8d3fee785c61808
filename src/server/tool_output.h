// ToolOutput: one chat choice's output seen through its request's tool_choice, turned
// into OpenAI's `content` + `tool_calls`, streamed or whole, as vLLM serves them:
//
//   auto      the server's --tool-call-parser finds calls in the text (ToolCallParser)
//   function  (a named tool_choice) the constrained output *is* the arguments JSON
//   required  the constrained output is a JSON list [{"name": N, "parameters": {...}}, ...]
//
// Each call gets an id ("chatcmpl-tool-" + 32 hex digits). Streamed calls come as OpenAI's
// deltas: the first for a call carries id, type and name; later ones more arguments.
//
// Also here, because they belong to the same contract: the JSON schema that required /
// named tool_choice constrains decoding with, and the conversation as chat templates
// expect it (assistant tool_call arguments as objects, not JSON strings).
//
// Thread-safety: ToolOutput is one per choice, used by one thread; the free functions
// are pure.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/openai_protocol.h"
#include "server/tool_call_parser.h"

namespace dserve::server {

class ToolOutput {
 public:
  struct Delta {
    std::string content;
    nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();  // OpenAI delta shape
  };

  // `format`: the server's parser (used for kAuto). The request's choice kNone needs no
  // ToolOutput.
  ToolOutput(ToolChoice choice, std::string function_name, std::optional<ToolCallFormat> format);

  Delta add(std::string_view piece);
  Delta flush();

  // After flush(), for a non-streamed message: the calls found ([] when none or when the
  // text held no valid call) and the content (the whole text when the calls were not
  // valid, as vLLM falls back; null when empty beside calls).
  nlohmann::ordered_json tool_calls() const;
  nlohmann::ordered_json content() const;
  // The choice's finish_reason given the engine's: "tool_calls" once calls were made and
  // the output ended by itself.
  std::string finish_reason(const std::string& engine_reason) const;

 private:
  void take(ToolCallParser::Delta d, Delta& out);

  ToolChoice choice_;
  std::string function_name_;
  std::unique_ptr<ToolCallParser> parser_;  // kAuto
  std::string text_;                        // everything added (the fallback content)
  std::string content_;                     // content outside the calls
  nlohmann::ordered_json calls_ = nlohmann::ordered_json::array();  // whole calls so far
  bool valid_ = true;
};

// The schema constrained decoding enforces for tool_choice "required" (a list of calls,
// one item at most without parallel_tool_calls) or a named function (its parameters).
nlohmann::ordered_json tool_choice_schema(const ChatRequest& r);

// The messages with every assistant tool call's `arguments` JSON string parsed into an
// object, as transformers' chat templates (and vLLM) expect; unchanged when none is.
// Returns whether anything changed.
bool parse_tool_call_arguments(nlohmann::ordered_json& messages);

}  // namespace dserve::server
