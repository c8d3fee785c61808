// Fuzz target: the OpenAI request bodies through the protocol layer
// (server/openai_protocol.h, server/responses_protocol.h), as the server's handlers use
// it before anything reaches the engine. The input is the endpoint's path on the first
// line, then the body:
//
//   /v1/chat/completions | /v1/completions | /v1/responses | /tokenize
//   {"messages": [...], ...}
//
// The body is refused when nested too deeply and parsed as the server does; a request
// the protocol accepts goes on as in serving.cc: a chat conversation (also a Responses
// request's, and /tokenize's messages) is rendered with a ChatML template that shows the
// tools and the assistant's tool calls, with tool-call arguments parsed into objects;
// tool_choice "required" or a named function compiles its schema into a grammar.
// Anything thrown out of these is a finding: the server would answer 500, not 400.
#include <cstdlib>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "fuzz_support.h"
#include "grammar/structured_output.h"
#include "server/openai_protocol.h"
#include "server/responses_protocol.h"
#include "server/tool_output.h"

namespace {

using json = nlohmann::ordered_json;
using namespace dserve;
using namespace dserve::server;

// As http_server.cc refuses bodies before parsing them: deeper than this is a 400.
constexpr int kMaxJsonDepth = 256;

bool json_too_deep(std::string_view s) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

constexpr const char* kTemplate = R"({%- if tools %}<|im_start|>system
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.content is string %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}
<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>
{%- endfor %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %})";

const chat::ChatTemplate& chat_template() {
  static const std::unique_ptr<chat::ChatTemplate> t = [] {
    Result<std::unique_ptr<chat::ChatTemplate>> r = chat::ChatTemplate::create(kTemplate, "", "");
    if (!r.ok()) std::abort();
    return std::move(r).value();
  }();
  return *t;
}

// serving.cc's chat_prompt: arguments as objects first, as the JSON strings they came as
// when the template refuses objects.
void render_chat(const json& messages, bool add_generation_prompt, const json& kwargs) {
  json with_objects = messages;
  const bool has_arguments = parse_tool_call_arguments(with_objects);
  Result<std::string> text = chat_template().render(with_objects, add_generation_prompt, kwargs);
  if (!text.ok() && has_arguments) text = chat_template().render(messages, add_generation_prompt, kwargs);
}

void chat_completions(const json& body) {
  Parsed<ChatRequest> parsed = parse_chat_request(body);
  ChatRequest* r = std::get_if<ChatRequest>(&parsed);
  if (!r) return;
  if (!r->tools.is_null()) r->template_kwargs["tools"] = r->tools;
  if (r->tool_choice == ToolChoice::kRequired || r->tool_choice == ToolChoice::kFunction) {
    StructuredOutputs spec;
    spec.kind = StructuredOutputs::Kind::kJson;
    spec.text = tool_choice_schema(*r).dump();
    (void)grammar::compile_grammar(spec);
  }
  render_chat(r->messages, r->add_generation_prompt, r->template_kwargs);
}

void responses(const json& body) {
  Parsed<ResponsesRequest> parsed = parse_responses_request(body);
  if (const ApiError* e = std::get_if<ApiError>(&parsed)) {
    (void)responses_error_body(e->to_json());
    return;
  }
  chat_completions(std::get<ResponsesRequest>(parsed).chat_body);
}

// serving.cc's tokenize, as far as it reads the body.
void tokenize(const json& body) {
  if (!body.is_object()) return;
  const auto messages = body.find("messages");
  if (messages == body.end()) return;
  const json chat_body = {{"messages", *messages}};
  if (!std::holds_alternative<ChatRequest>(parse_chat_request(chat_body))) return;
  json kwargs = json::object();
  if (const auto tools = body.find("tools"); tools != body.end() && tools->is_array()) {
    kwargs["tools"] = *tools;
  }
  render_chat(*messages, true, kwargs);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = dserve::fuzz::as_text(data, size);
  const size_t newline = input.find('\n');
  if (newline == std::string_view::npos) return 0;
  const std::string_view path = input.substr(0, newline);
  const std::string_view body_text = input.substr(newline + 1);
  if (json_too_deep(body_text)) return 0;
  const json body = json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;
  if (path == "/v1/completions") {
    (void)parse_completion_request(body);
  } else if (path == "/v1/chat/completions") {
    chat_completions(body);
  } else if (path == "/v1/responses") {
    responses(body);
  } else if (path == "/tokenize") {
    tokenize(body);
  }
  return 0;
}
