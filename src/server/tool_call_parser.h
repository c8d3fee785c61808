// ToolCallParser: finds the function calls in a model's output text, as vLLM's
// `--tool-call-parser` does, in the formats the served models were trained on:
//
//   deepseek_v3 / deepseek_r1   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//                               ```json
//                               ARGS
//                               ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   deepseek_v31                <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS
//                               <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   hermes (Qwen2.5, SmolLM)    <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>
//
// Text before the calls (and after them) is content. The DeepSeek markers are special
// tokens, so the request must be detokenized with skip_special_tokens=false.
//
// Streaming: add() takes text as it is decoded and returns what became final: content,
// a call's start (its name) and pieces of its arguments, in the order the OpenAI SDK
// accumulates them (`delta.tool_calls[i].function.arguments` appended). A suffix that
// may still be the start of a marker is held back until the next piece decides it, so
// markers split across tokens never leak, and the argument pieces of a call always
// concatenate to exactly the arguments the whole text holds.
//
// valid() says, after flush(), whether every call was complete with JSON arguments;
// a non-streamed response that is not valid returns the whole text as content and no
// calls (vLLM's behaviour), since a half call is no call.
//
// Thread-safety: not thread-safe; one per choice.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dserve::server {

enum class ToolCallFormat { kDeepSeekV3, kDeepSeekV31, kHermes };

// The format a --tool-call-parser name selects; none for an unknown name.
std::optional<ToolCallFormat> tool_call_format(std::string_view parser_name);
// The names --tool-call-parser accepts, for help and error messages.
std::vector<std::string> tool_call_parser_names();

class ToolCallParser {
 public:
  // One piece of a call: its start (name set, arguments possibly empty) or more of its
  // arguments (name empty).
  struct CallDelta {
    int index = 0;  // the call's position in this output: 0, 1, ...
    std::string name;
    std::string arguments;
  };
  struct Delta {
    std::string content;
    std::vector<CallDelta> calls;
  };

  explicit ToolCallParser(ToolCallFormat format) : format_(format) {}

  Delta add(std::string_view piece);
  // At the end of the output: what was held back.
  Delta flush();
  // After flush(): every call found was complete, with arguments that parse as JSON.
  bool valid() const { return valid_; }
  int n_calls() const { return n_calls_; }

 private:
  enum class State { kContent, kSection, kHeader, kArguments, kHermesCall, kAfter };

  // Consumes what can be decided from held_ (everything when `final`).
  void process(bool final, Delta& out);
  bool process_header(bool final, Delta& out);
  bool process_arguments(bool final, Delta& out);
  bool process_hermes(bool final, Delta& out);
  // Emits arguments text up to `safe_end` of held_ that has not been emitted yet.
  void stream_arguments(std::string_view args, Delta& out);
  void start_call(std::string name, Delta& out);
  void end_call(std::string_view final_args, Delta& out);

  ToolCallFormat format_;
  State state_ = State::kContent;
  std::string held_;        // text not yet decided
  size_t args_emitted_ = 0; // bytes of the current call's arguments already emitted
  std::string args_text_;   // the current call's arguments so far (for the JSON check)
  bool hermes_streaming_ = false;  // the call's name came first: arguments stream
  int n_calls_ = 0;
  bool valid_ = true;
};

}  // namespace dserve::server
