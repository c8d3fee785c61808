#include "server/responses_protocol.h"

#include <optional>
#include <set>
#include <string>

#include "server/field_reader.h"

namespace dserve::server {

using json = nlohmann::ordered_json;

namespace {

const std::set<std::string> kResponsesFields = {
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_k",
    "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "stream",
    "stream_options", "tools", "tool_choice", "parallel_tool_calls", "text", "include",
    "top_logprobs", "metadata", "user", "safety_identifier", "prompt_cache_key",
    "service_tier", "store", "previous_response_id", "conversation", "background",
    "truncation", "reasoning", "max_tool_calls", "prompt", "prompt_cache_retention",
    "context_management"};

// Fields the chat path reads under the same names; it validates them.
const char* const kChatFields[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed",
                                   "presence_penalty", "frequency_penalty",
                                   "repetition_penalty", "parallel_tool_calls"};

// OpenAI's fields for what this server does not keep or do: each accepted only at its
// "off" value, so a client relying on one learns at once instead of getting something
// else.
void refuse_unsupported(FieldReader& f) {
  bool store = false;
  f.boolean("store", &store);
  if (f.ok() && store) {
    return f.fail("store=true is not supported: this server does not keep responses; omit "
                  "store or send store=false",
                  "store", "unsupported");
  }
  struct Refused {
    const char* name;
    const char* why;
  };
  for (const Refused& r :
       {Refused{"previous_response_id", "this server does not keep responses; send the whole "
                                        "conversation in input"},
        Refused{"conversation", "this server does not keep conversations; send the whole "
                                "conversation in input"},
        Refused{"prompt", "prompt templates are not supported; send instructions and input"},
        Refused{"max_tool_calls", "it is not supported"},
        Refused{"context_management", "it is not supported"},
        Refused{"prompt_cache_retention", "it is not supported"}}) {
    if (f.get(r.name)) {
      return f.fail(std::string(r.name) + " cannot be used: " + r.why, r.name, "unsupported");
    }
  }
  bool background = false;
  f.boolean("background", &background);
  if (f.ok() && background) {
    return f.fail("background=true is not supported", "background", "unsupported");
  }
  std::string truncation = "disabled";
  f.string("truncation", &truncation);
  if (f.ok() && truncation != "disabled") {
    return f.fail("truncation must be \"disabled\" (\"auto\" is not supported)", "truncation",
                  "unsupported");
  }
  if (const json* reasoning = f.get("reasoning")) {
    if (!reasoning->is_object()) return f.fail("reasoning must be an object", "reasoning");
    for (const auto& [key, value] : reasoning->items()) {
      if (!value.is_null()) {
        return f.fail("reasoning." + key + " is not supported: reasoning models think as their "
                      "chat template tells them",
                      "reasoning", "unsupported");
      }
    }
  }
}

// Content given as a string or as a list of text parts, as chat content.
std::optional<std::string> chat_content(const json& content, json* out) {
  if (content.is_string()) {
    *out = content;
    return std::nullopt;
  }
  if (!content.is_array()) return "content must be a string or a list of content parts";
  *out = json::array();
  for (const json& part : content) {
    const std::string type = string_member(part, "type");
    const char* field = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "refusal") {
      return "content part type \"" + type +
             "\" is not supported (only text: input_text, output_text, refusal)";
    }
    if (!part.contains(field) || !part[field].is_string()) {
      return std::string("a ") + type + " part needs a string \"" + field + "\"";
    }
    out->push_back({{"type", "text"}, {"text", part[field]}});
  }
  return std::nullopt;
}

std::optional<std::string> add_message(const json& item, json& messages) {
  if (!item.contains("role") || !item["role"].is_string()) return "a message needs a string role";
  std::string role = item["role"].get<std::string>();
  if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
    return "role must be user, assistant, system or developer, got \"" + role + "\"";
  }
  // Chat templates know system, not OpenAI's newer name for it.
  if (role == "developer") role = "system";
  if (!item.contains("content")) return "a message needs content";
  json content;
  if (auto e = chat_content(item["content"], &content)) return e;
  messages.push_back({{"role", role}, {"content", std::move(content)}});
  return std::nullopt;
}

std::optional<std::string> string_field(const json& item, const char* name, std::string* out) {
  if (!item.contains(name) || !item[name].is_string()) {
    return std::string("a ") + string_member(item, "type") + " item needs a string " + name;
  }
  *out = item[name].get<std::string>();
  return std::nullopt;
}

// A call the model made earlier: the assistant's tool_calls, joined to the assistant
// message just before it (OpenAI lists a turn's text and its calls as separate items).
std::optional<std::string> add_function_call(const json& item, json& messages) {
  std::string call_id, name, arguments;
  for (auto [field, out] : {std::pair{"call_id", &call_id}, std::pair{"name", &name},
                            std::pair{"arguments", &arguments}}) {
    if (auto e = string_field(item, field, out)) return e;
  }
  json call = {{"id", call_id}, {"type", "function"},
               {"function", {{"name", name}, {"arguments", arguments}}}};
  if (messages.empty() || messages.back()["role"] != "assistant") {
    messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array()}});
  }
  json& turn = messages.back();
  if (!turn.contains("tool_calls")) turn["tool_calls"] = json::array();
  turn["tool_calls"].push_back(std::move(call));
  return std::nullopt;
}

// A tool's answer: a tool message, named after the call it answers (some templates
// show the name).
std::optional<std::string> add_function_call_output(const json& item, json& messages) {
  std::string call_id;
  if (auto e = string_field(item, "call_id", &call_id)) return e;
  if (!item.contains("output")) return "a function_call_output item needs output";
  json parts;
  if (auto e = chat_content(item["output"], &parts)) return "output: " + *e;
  std::string text;
  if (parts.is_string()) {
    text = parts.get<std::string>();
  } else {
    for (const json& p : parts) text += p["text"].get<std::string>();
  }
  json message = {{"role", "tool"}, {"tool_call_id", call_id}, {"content", text}};
  for (auto m = messages.rbegin(); m != messages.rend(); ++m) {
    if (!m->contains("tool_calls")) continue;
    for (const json& c : (*m)["tool_calls"]) {
      if (c["id"] == call_id) message["name"] = c["function"]["name"];
    }
  }
  messages.push_back(std::move(message));
  return std::nullopt;
}

std::optional<std::string> add_item(const json& item, json& messages) {
  if (!item.is_object()) return "must be an object";
  const json type = item.value("type", json(nullptr));
  if (type.is_null()) {
    if (item.contains("role")) return add_message(item, messages);  // EasyInputMessage
    return "needs a type (message, function_call, function_call_output) or a role";
  }
  if (!type.is_string()) return "type must be a string";
  const std::string t = type.get<std::string>();
  if (t == "message") return add_message(item, messages);
  if (t == "function_call") return add_function_call(item, messages);
  if (t == "function_call_output") return add_function_call_output(item, messages);
  // A reasoning model's earlier thinking, handed back: chat templates leave past
  // reasoning out of the prompt.
  if (t == "reasoning") return std::nullopt;
  if (t == "item_reference") {
    return "item_reference needs stored responses, which this server does not keep";
  }
  return "items of type \"" + t +
         "\" are not supported (message, function_call, function_call_output, reasoning)";
}

// instructions and input, as chat messages.
void read_input(FieldReader& f, json& chat) {
  json messages = json::array();
  if (const json* instructions = f.get("instructions")) {
    if (!instructions->is_string()) return f.fail("instructions must be a string", "instructions");
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  }
  const json* input = f.get("input");
  if (!input) return f.fail("input is required", "input");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i) {
      if (auto e = add_item((*input)[i], messages)) {
        return f.fail("input[" + std::to_string(i) + "]: " + *e, "input");
      }
    }
  } else {
    return f.fail("input must be a string or a list of items", "input");
  }
  if (messages.empty()) return f.fail("input must not be empty", "input");
  chat["messages"] = std::move(messages);
}

// Responses' flat function tools as chat tools; the echo in OpenAI's shape.
void read_tools(FieldReader& f, json& chat, json& echo) {
  const json* tools = f.get("tools");
  echo["tools"] = json::array();
  if (!tools) return;
  if (!tools->is_array()) return f.fail("tools must be a list", "tools");
  json chat_tools = json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string()) {
      return f.fail(where + " must be {\"type\": \"function\", \"name\": ...}", "tools");
    }
    if (t["type"] != "function") {
      return f.fail(where + ": only function tools are supported, not \"" +
                        t["type"].get<std::string>() + "\"",
                    "tools", "unsupported");
    }
    FieldReader tf(t);
    tf.only({"type", "name", "description", "parameters", "strict"});
    std::string name, description;
    tf.string("name", &name);
    tf.string("description", &description);
    bool strict = false;
    tf.boolean("strict", &strict);
    const json* parameters = tf.get("parameters");
    if (tf.ok() && name.empty()) tf.fail("name must be a non-empty string", "name");
    if (tf.ok() && parameters && !parameters->is_object()) {
      tf.fail("parameters must be a JSON schema object", "parameters");
    }
    if (!tf.ok()) return f.fail(where + ": " + tf.error().message, "tools");
    json function = {{"name", name}};
    if (tf.get("description")) function["description"] = description;
    if (parameters) function["parameters"] = *parameters;
    chat_tools.push_back({{"type", "function"}, {"function", function}});
    echo["tools"].push_back({{"type", "function"},
                             {"name", name},
                             {"description", t.value("description", json(nullptr))},
                             {"parameters", parameters ? *parameters : json(nullptr)},
                             {"strict", t.value("strict", json(nullptr))}});
  }
  chat["tools"] = std::move(chat_tools);
}

void read_tool_choice(FieldReader& f, json& chat, json& echo) {
  const json* tc = f.get("tool_choice");
  echo["tool_choice"] = tc ? *tc : json("auto");
  if (!tc) return;
  const char* usage = "tool_choice must be \"none\", \"auto\", \"required\" or "
                      "{\"type\": \"function\", \"name\": NAME}";
  if (tc->is_string()) {
    chat["tool_choice"] = *tc;  // the chat path checks the value
  } else if (tc->is_object() && tc->value("type", json(nullptr)) == "function" &&
             tc->contains("name") && (*tc)["name"].is_string()) {
    chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*tc)["name"]}}}};
  } else {
    f.fail(usage, "tool_choice");
  }
}

// text.format through the structured-output engine, as chat's response_format.
void read_text(FieldReader& f, json& chat, json& echo) {
  echo["text"] = {{"format", {{"type", "text"}}}};
  const json* text = f.get("text");
  if (!text) return;
  if (!text->is_object()) return f.fail("text must be an object", "text");
  for (const auto& [key, value] : text->items()) {
    if (key == "format") continue;
    if (key == "verbosity" && value.is_null()) continue;
    return f.fail("text." + key + " is not supported", "text", "unsupported");
  }
  const json format = text->value("format", json(nullptr));
  if (format.is_null()) return;
  const std::string type = string_member(format, "type");
  if (type == "text") {
    echo["text"]["format"] = format;
  } else if (type == "json_object") {
    echo["text"]["format"] = format;
    chat["response_format"] = {{"type", "json_object"}};
  } else if (type == "json_schema") {
    FieldReader ff(format);
    ff.only({"type", "name", "schema", "strict", "description"});
    std::string name, description;
    ff.string("name", &name);
    ff.string("description", &description);
    bool strict = false;
    ff.boolean("strict", &strict);
    const json* schema = ff.get("schema");
    if (ff.ok() && (!schema || !schema->is_object())) {
      ff.fail("schema must be a JSON schema object", "schema");
    }
    if (!ff.ok()) return f.fail("text.format: " + ff.error().message, "text.format");
    json json_schema = {{"name", name}, {"schema", *schema}};
    if (ff.get("strict")) json_schema["strict"] = strict;
    if (ff.get("description")) json_schema["description"] = description;
    chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(json_schema)}};
    echo["text"]["format"] = format;
  } else {
    f.fail("text.format.type must be \"text\", \"json_object\" or \"json_schema\"", "text.format");
  }
}

// include and top_logprobs: token logprobs on the output text, as chat's logprobs.
void read_include(FieldReader& f, json& chat, json& echo) {
  std::optional<int> top;
  f.integer("top_logprobs", &top);
  if (f.ok() && top && (*top < 0 || *top > kMaxLogprobs)) {
    return f.fail("top_logprobs must be between 0 and " + std::to_string(kMaxLogprobs),
                  "top_logprobs");
  }
  echo["top_logprobs"] = top ? json(*top) : json(nullptr);
  const json* include = f.get("include");
  if (!include) return;
  if (!include->is_array()) return f.fail("include must be a list of strings", "include");
  for (const json& x : *include) {
    if (!x.is_string()) return f.fail("include must be a list of strings", "include");
    if (x == "message.output_text.logprobs") {
      chat["logprobs"] = true;
      chat["top_logprobs"] = top.value_or(0);
    } else if (x != "reasoning.encrypted_content") {
      // reasoning.encrypted_content asks for reasoning that can be handed back without
      // stored responses: reasoning items here carry their text in the clear, so there
      // is nothing to encrypt (encrypted_content is null).
      return f.fail("include \"" + x.get<std::string>() + "\" is not supported", "include",
                    "unsupported");
    }
  }
}

// The request fields the Response object repeats, after those read above.
void read_echo(FieldReader& f, json& echo) {
  for (const char* name : {"user", "safety_identifier", "prompt_cache_key", "service_tier"}) {
    std::string value;
    f.string(name, &value);
    echo[name] = f.get(name) ? json(value) : json(nullptr);
  }
  const json* metadata = f.get("metadata");
  if (metadata && !metadata->is_object()) f.fail("metadata must be an object", "metadata");
  echo["metadata"] = metadata ? *metadata : json::object();
  auto given_or = [&](const char* name, json fallback) {
    const json* v = f.get(name);
    return v ? *v : fallback;
  };
  echo["instructions"] = given_or("instructions", nullptr);
  // OpenAI's defaults, which are dserve's too.
  echo["temperature"] = given_or("temperature", 1.0);
  echo["top_p"] = given_or("top_p", 1.0);
  echo["parallel_tool_calls"] = given_or("parallel_tool_calls", true);
}

}  // namespace

Parsed<ResponsesRequest> parse_responses_request(const json& body) {
  if (!body.is_object()) return ApiError::bad_request("the request body must be a JSON object");
  ResponsesRequest r;
  FieldReader f(body);
  f.only(kResponsesFields);
  refuse_unsupported(f);
  json& chat = r.chat_body = json::object();
  for (const char* name : kChatFields) {
    if (f.get(name)) chat[name] = body[name];
  }
  std::optional<int> max_output;
  f.integer("max_output_tokens", &max_output);
  if (f.ok() && max_output && *max_output < 1) {
    f.fail("max_output_tokens must be at least 1, got " + std::to_string(*max_output),
           "max_output_tokens");
  }
  if (max_output) chat["max_completion_tokens"] = *max_output;
  r.echo["max_output_tokens"] = max_output ? json(*max_output) : json(nullptr);
  f.boolean("stream", &r.stream);
  if (r.stream) {
    chat["stream"] = true;
    chat["stream_options"] = {{"include_usage", true}};  // for the final usage
  }
  if (const json* so = f.get("stream_options"); f.ok() && so) {
    // include_obfuscation pads deltas against length side channels on OpenAI's side;
    // it changes no content, so either value is served as is.
    FieldReader sf(*so);
    bool obfuscation = false;
    if (!so->is_object()) {
      f.fail("stream_options must be an object", "stream_options");
    } else {
      sf.only({"include_obfuscation"});
      sf.boolean("include_obfuscation", &obfuscation);
      if (!sf.ok()) f.fail("stream_options: " + sf.error().message, "stream_options");
      if (!r.stream) f.fail("stream_options is only allowed with stream=true", "stream_options");
    }
  }
  if (f.ok()) read_input(f, chat);
  if (f.ok()) read_tools(f, chat, r.echo);
  if (f.ok()) read_tool_choice(f, chat, r.echo);
  if (f.ok()) read_text(f, chat, r.echo);
  if (f.ok()) read_include(f, chat, r.echo);
  if (f.ok()) read_echo(f, r.echo);
  if (!f.ok()) return f.error();
  return r;
}

json responses_error_body(json body) {
  if (!body.contains("error") || !body["error"].is_object()) return body;
  json& param = body["error"]["param"];
  if (!param.is_string()) return body;
  const std::string p = param.get<std::string>();
  if (p == "messages") param = "input";
  if (p == "max_tokens" || p == "max_completion_tokens") param = "max_output_tokens";
  if (p == "response_format") param = "text.format";
  if (p == "logprobs") param = "include";
  return body;
}

}  // namespace dserve::server
