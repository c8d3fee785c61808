// ChatTemplate: turns an OpenAI-style message list into the prompt text a model was
// trained on, by running the model's own Jinja chat template. The output is
// byte-identical to transformers' `tokenizer.apply_chat_template(messages,
// tokenize=False, add_generation_prompt=...)` (tests/reference/test_chat_template.py).
//
// The template sees what transformers passes: `messages`, `add_generation_prompt`,
// `tools` and `documents` (None unless given in `extra`), `bos_token` / `eos_token`
// (undefined when empty), and every other key of `extra` (e.g. chat_template_kwargs
// such as `enable_thinking`). Messages are normalised first, as vLLM and transformers
// do: list content ([{"type": "text", "text": ...}, ...]) is joined with "\n", null
// content becomes "", other null fields are dropped, and `reasoning_content` /
// `thinking` / `reasoning` are aliased to each other as transformers does.
//
// JSON is taken as nlohmann::ordered_json so that key order survives: templates that
// print a tool schema with `tojson` must print the client's order, as Python does.
//
// Thread-safety: immutable after create(); render() may run concurrently.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "jinja/template.h"

namespace dserve::chat {

class ChatTemplate {
 public:
  // Compiles `source`; a syntax error is InvalidArgument naming line and column.
  static Result<std::unique_ptr<ChatTemplate>> create(std::string source, std::string bos_token,
                                                      std::string eos_token);
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // `messages`: a JSON array of {"role", "content", ...} objects. `extra`: more
  // template variables (an object). Errors (malformed messages, raise_exception in the
  // template, a type error, a limit) are InvalidArgument with a readable message.
  Result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                             const jinja::RenderLimits& limits = {}) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  ChatTemplate() = default;
  Result<std::string> render_checked(const nlohmann::ordered_json& messages,
                                     bool add_generation_prompt,
                                     const nlohmann::ordered_json& extra,
                                     const jinja::RenderLimits& limits) const;
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  std::unique_ptr<jinja::Template> template_;
};

}  // namespace dserve::chat
