#include "chat/chat_template.h"

#include <utility>
#include <vector>

#include "jinja/json_value.h"

namespace dserve::chat {
namespace {

using jinja::Value;
using ojson = nlohmann::ordered_json;

// Content as a string: list content is the "\n"-joined text of its text parts (vLLM's
// "string" content format), null is "".
Result<std::string> flatten_content(const ojson& content, size_t index) {
  const std::string where = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return invalid_argument(where + " must be a string, null or a list of parts");
  std::string text;
  bool first = true;
  for (const ojson& part : content) {
    if (!part.is_object()) return invalid_argument(where + " parts must be objects");
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      return invalid_argument(where + " part has no string 'type'");
    }
    if (*type != "text") {
      return invalid_argument(where + ": content part type '" + type->get<std::string>() +
                              "' is not supported");
    }
    const auto t = part.find("text");
    if (t == part.end() || !t->is_string())
      return invalid_argument(where + " text part has no string 'text'");
    if (!first) text += "\n";
    first = false;
    text += t->get<std::string>();
  }
  return text;
}

// One message as transformers hands it to the template (see the header).
Result<Value> normalize_message(const ojson& m, size_t index) {
  if (!m.is_object()) {
    return invalid_argument("messages[" + std::to_string(index) + "] must be an object");
  }
  std::vector<std::pair<std::string, Value>> fields;
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (it.key() == "content") {
      DS_ASSIGN_OR_RETURN(std::string content, flatten_content(it.value(), index));
      fields.emplace_back("content", Value::string(std::move(content)));
    } else if (!it.value().is_null()) {
      fields.emplace_back(it.key(), jinja::value_from_json(it.value()));
    }
  }
  // transformers' _alias_reasoning_fields: {"thinking": r, **message, "reasoning_content": r}.
  const Value* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    for (const auto& [k, v] : fields) {
      if (k == key && !v.is_none()) {
        reasoning = &v;
        break;
      }
    }
    if (reasoning) break;
  }
  Value out = Value::dict();
  jinja::DictObj& d = out.dict_obj();
  if (reasoning) {
    const Value r = *reasoning;
    d.set("thinking", r);
    for (const auto& [k, v] : fields) d.set(k, v);
    d.set("reasoning_content", r);
  } else {
    for (const auto& [k, v] : fields) d.set(k, v);
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<ChatTemplate>> ChatTemplate::create(std::string source,
                                                           std::string bos_token,
                                                           std::string eos_token) {
  DS_ASSIGN_OR_RETURN(auto compiled, jinja::Template::parse(source));
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  t->source_ = std::move(source);
  t->bos_token_ = std::move(bos_token);
  t->eos_token_ = std::move(eos_token);
  t->template_ = std::move(compiled);
  return t;
}

Result<std::string> ChatTemplate::render(const ojson& messages, bool add_generation_prompt,
                                         const ojson& extra,
                                         const jinja::RenderLimits& limits) const {
  try {
    return render_checked(messages, add_generation_prompt, extra, limits);
  } catch (const jinja::TemplateError& e) {  // from value_from_json
    return invalid_argument(e.what());
  }
}

Result<std::string> ChatTemplate::render_checked(const ojson& messages, bool add_generation_prompt,
                                                 const ojson& extra,
                                                 const jinja::RenderLimits& limits) const {
  if (!messages.is_array()) return invalid_argument("messages must be a list");
  if (!extra.is_object() && !extra.is_null())
    return invalid_argument("extra template variables must be an object");
  std::vector<Value> msgs;
  msgs.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    DS_ASSIGN_OR_RETURN(Value m, normalize_message(messages[i], i));
    msgs.push_back(std::move(m));
  }
  // Later entries win: special tokens, then extra, then the fixed arguments.
  std::vector<std::pair<std::string, Value>> vars;
  if (!bos_token_.empty()) vars.emplace_back("bos_token", Value::string(bos_token_));
  if (!eos_token_.empty()) vars.emplace_back("eos_token", Value::string(eos_token_));
  Value tools = Value::none();
  Value documents = Value::none();
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      if (it.key() == "tools") {
        tools = jinja::value_from_json(it.value());
      } else if (it.key() == "documents") {
        documents = jinja::value_from_json(it.value());
      } else if (it.key() != "messages" && it.key() != "add_generation_prompt") {
        vars.emplace_back(it.key(), jinja::value_from_json(it.value()));
      }
    }
  }
  vars.emplace_back("messages", Value::list(std::move(msgs)));
  vars.emplace_back("tools", tools);
  vars.emplace_back("documents", documents);
  vars.emplace_back("add_generation_prompt", Value::boolean(add_generation_prompt));
  return template_->render(vars, limits);
}

}  // namespace dserve::chat
