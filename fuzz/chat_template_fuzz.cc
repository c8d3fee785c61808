// Fuzz target: Jinja chat templates (src/jinja through chat/chat_template.h). A model
// file carries its template, so both its parsing and its rendering see untrusted text.
// The input is the template, then optionally a NUL and the messages as JSON, then
// optionally a NUL and more template variables as a JSON object:
//
//   {% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}\0[{"role": ...}]
//
// Without messages (or when they are not JSON) a conversation with a system prompt,
// tools, an assistant's tool call and its result is rendered.
//
// Limits are much lower than the server's, so each input stays well under a second: a
// render must stop at them whatever the template does.
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "fuzz_support.h"

namespace {

using json = nlohmann::ordered_json;

const json& default_messages() {
  static const json messages = json::parse(R"([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {"role": "assistant", "content": null, "reasoning_content": "Use the tool.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "assistant", "content": "It is 18 C in Paris."}])");
  return messages;
}

const json& default_extra() {
  static const json extra = json::parse(R"({"tools": [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}], "enable_thinking": true})");
  return extra;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> parts =
      dserve::fuzz::split_parts(dserve::fuzz::as_text(data, size), 3);
  auto tmpl = dserve::chat::ChatTemplate::create(std::string(parts[0]), "<s>", "</s>");
  if (!tmpl.ok()) return 0;
  json messages = default_messages();
  if (parts.size() > 1) {
    json given = json::parse(parts[1], nullptr, /*allow_exceptions=*/false);
    if (!given.is_discarded()) messages = std::move(given);
  }
  json extra = default_extra();
  if (parts.size() > 2) {
    json given = json::parse(parts[2], nullptr, /*allow_exceptions=*/false);
    if (!given.is_discarded()) extra = std::move(given);
  }
  dserve::jinja::RenderLimits limits;
  limits.max_output_bytes = 64 << 10;
  limits.max_steps = 20'000;
  limits.max_built_bytes = 2 << 20;
  limits.max_seconds = 0.3;
  (void)(*tmpl)->render(messages, /*add_generation_prompt=*/true, extra, limits);
  return 0;
}
