#include "server/tool_output.h"

#include "server/random_id.h"

namespace dserve::server {

using json = nlohmann::ordered_json;

namespace {

// A call's first streamed delta: id, type and name (arguments follow).
json call_start(int index, const std::string& id, const std::string& name, std::string args) {
  return {{"index", index},
          {"id", id},
          {"type", "function"},
          {"function", {{"name", name}, {"arguments", std::move(args)}}}};
}

json call_more(int index, std::string args) {
  return {{"index", index}, {"function", {{"arguments", std::move(args)}}}};
}

}  // namespace

ToolOutput::ToolOutput(ToolChoice choice, std::string function_name,
                       std::optional<ToolCallFormat> format)
    : choice_(choice), function_name_(std::move(function_name)) {
  if (choice_ == ToolChoice::kAuto && format) parser_ = std::make_unique<ToolCallParser>(*format);
}

void ToolOutput::take(ToolCallParser::Delta d, Delta& out) {
  content_ += d.content;
  out.content += d.content;
  for (ToolCallParser::CallDelta& c : d.calls) {
    if (c.index == static_cast<int>(calls_.size())) {
      const std::string id = random_id("chatcmpl-tool-");
      calls_.push_back({{"id", id},
                        {"type", "function"},
                        {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      out.tool_calls.push_back(call_start(c.index, id, c.name, c.arguments));
    } else {
      json& args = calls_[c.index]["function"]["arguments"];
      args = args.get<std::string>() + c.arguments;
      out.tool_calls.push_back(call_more(c.index, c.arguments));
    }
  }
}

ToolOutput::Delta ToolOutput::add(std::string_view piece) {
  text_.append(piece);
  Delta out;
  switch (choice_) {
    case ToolChoice::kAuto:
      if (parser_) {
        take(parser_->add(piece), out);
      } else {
        content_.append(piece);
        out.content = std::string(piece);
      }
      break;
    case ToolChoice::kFunction:
      // The whole output is the named function's arguments.
      if (piece.empty()) break;
      take({"", {{0, calls_.empty() ? function_name_ : "", std::string(piece)}}}, out);
      break;
    case ToolChoice::kRequired:
      break;  // a list of calls: parsed whole at the end
    case ToolChoice::kNone:
      content_.append(piece);
      out.content = std::string(piece);
      break;
  }
  return out;
}

ToolOutput::Delta ToolOutput::flush() {
  Delta out;
  if (choice_ == ToolChoice::kAuto && parser_) {
    take(parser_->flush(), out);
    valid_ = parser_->valid();
  } else if (choice_ == ToolChoice::kFunction) {
    if (calls_.empty()) take({"", {{0, function_name_, ""}}}, out);
    valid_ = json::accept(text_);
  } else if (choice_ == ToolChoice::kRequired) {
    const json list = json::parse(text_, nullptr, /*allow_exceptions=*/false);
    valid_ = list.is_array() && !list.empty();
    for (size_t i = 0; valid_ && i < list.size(); ++i) {
      const json& c = list[i];
      valid_ = c.is_object() && c.contains("name") && c["name"].is_string();
    }
    if (valid_) {
      ToolCallParser::Delta d;
      for (size_t i = 0; i < list.size(); ++i) {
        const json params = list[i].value("parameters", json::object());
        d.calls.push_back({static_cast<int>(i), list[i]["name"].get<std::string>(),
                           params.dump(-1, ' ', false, json::error_handler_t::replace)});
      }
      take(std::move(d), out);
    } else {
      out.content = text_;  // not a list of calls (cut by max_tokens): show the text
    }
  }
  return out;
}

json ToolOutput::tool_calls() const { return valid_ ? calls_ : json::array(); }

json ToolOutput::content() const {
  if (!valid_) return text_;
  if (choice_ == ToolChoice::kFunction || choice_ == ToolChoice::kRequired) return "";
  if (content_.empty() && !calls_.empty()) return nullptr;
  return content_;
}

std::string ToolOutput::finish_reason(const std::string& engine_reason) const {
  if (engine_reason != "stop" || calls_.empty() || !valid_) return engine_reason;
  // OpenAI answers a named tool_choice with "stop"; calls the model chose, "tool_calls".
  return choice_ == ToolChoice::kFunction ? engine_reason : "tool_calls";
}

json tool_choice_schema(const ChatRequest& r) {
  auto parameters = [](const json& fn) {
    const json p = fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"]
                                                                              : json::object();
    return p.empty() ? json{{"type", "object"}} : p;
  };
  if (r.tool_choice == ToolChoice::kFunction) {
    for (const json& t : r.tools) {
      if (t["function"]["name"] == r.tool_choice_function) return parameters(t["function"]);
    }
    return json{{"type", "object"}};
  }
  // vLLM's schema for "required": a non-empty list, each item one of the tools.
  json any_of = json::array();
  for (const json& t : r.tools) {
    const json& fn = t["function"];
    any_of.push_back({{"type", "object"},
                      {"properties",
                       {{"name", {{"type", "string"}, {"enum", json::array({fn["name"]})}}},
                        {"parameters", parameters(fn)}}},
                      {"required", json::array({"name", "parameters"})}});
  }
  json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", any_of}}}};
  if (!r.parallel_tool_calls) schema["maxItems"] = 1;
  return schema;
}

bool parse_tool_call_arguments(json& messages) {
  bool changed = false;
  for (json& m : messages) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (json& c : m["tool_calls"]) {
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) continue;
      json& args = c["function"]["arguments"];
      if (!args.is_string()) continue;
      json parsed = json::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) continue;
      args = std::move(parsed);
      changed = true;
    }
  }
  return changed;
}

}  // namespace dserve::server
