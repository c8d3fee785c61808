#include "server/responses_output.h"

#include <chrono>
#include <string_view>

#include "server/random_id.h"
#include "server/serving.h"
#include "server/unix_time.h"

namespace dserve::server {

using json = nlohmann::ordered_json;

namespace {

std::string string_or_empty(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

ResponseBuilder::ResponseBuilder(json echo, std::string model)
    : echo_(std::move(echo)),
      model_(std::move(model)),
      id_(random_id("resp_")),
      created_at_(unix_now()) {}

std::string ResponseBuilder::emit(const char* type, json fields) {
  json event = {{"type", type}};
  for (auto& [key, value] : fields.items()) event[key] = std::move(value);
  event["sequence_number"] = sequence_number_++;
  return std::string("event: ") + type + "\ndata: " +
         event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

json ResponseBuilder::where(bool with_content_index) const {
  json w = {{"item_id", output_.back()["id"]}, {"output_index", output_.size() - 1}};
  if (with_content_index) w["content_index"] = 0;
  return w;
}

std::string ResponseBuilder::begin() {
  std::string events = emit("response.created", {{"response", response()}});
  return events + emit("response.in_progress", {{"response", response()}});
}

std::string ResponseBuilder::open(ItemKind kind, json item) {
  std::string events = close_item();
  output_.push_back(std::move(item));
  open_ = kind;
  events += emit("response.output_item.added",
                 {{"output_index", output_.size() - 1}, {"item", output_.back()}});
  json part;
  if (kind == ItemKind::kMessage) {
    part = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()},
            {"logprobs", json::array()}};
  } else if (kind == ItemKind::kReasoning) {
    part = {{"type", "reasoning_text"}, {"text", ""}};
  } else {
    return events;  // a function call has no content parts
  }
  json fields = where();
  fields["part"] = part;
  events += emit("response.content_part.added", std::move(fields));
  output_.back()["content"].push_back(std::move(part));
  return events;
}

std::string ResponseBuilder::close_item() {
  if (open_ == ItemKind::kNone) return "";
  json& item = output_.back();
  std::string events;
  if (open_ == ItemKind::kFunctionCall) {
    json fields = where(false);
    fields["arguments"] = item["arguments"];
    events += emit("response.function_call_arguments.done", std::move(fields));
  } else {
    const json& part = item["content"][0];
    json fields = where();
    fields["text"] = part["text"];
    if (open_ == ItemKind::kMessage) {
      fields["logprobs"] = part["logprobs"];
      events += emit("response.output_text.done", std::move(fields));
    } else {
      events += emit("response.reasoning_text.done", std::move(fields));
    }
    fields = where();
    fields["part"] = part;
    events += emit("response.content_part.done", std::move(fields));
  }
  // Only the item the output stopped in is cut short.
  item["status"] = status_ == "incomplete" ? "incomplete" : "completed";
  events += emit("response.output_item.done",
                 {{"output_index", output_.size() - 1}, {"item", item}});
  open_ = ItemKind::kNone;
  return events;
}

std::string ResponseBuilder::add_reasoning(const std::string& text) {
  std::string events;
  if (open_ != ItemKind::kReasoning) {
    events += open(ItemKind::kReasoning, {{"id", random_id("rs_")},
                                          {"type", "reasoning"},
                                          {"summary", json::array()},
                                          {"content", json::array()},
                                          {"encrypted_content", nullptr},
                                          {"status", "in_progress"}});
  }
  std::string& so_far = output_.back()["content"][0]["text"].get_ref<std::string&>();
  so_far += text;
  json fields = where();
  fields["delta"] = text;
  return events + emit("response.reasoning_text.delta", std::move(fields));
}

std::string ResponseBuilder::add_text(const std::string& text, const json& logprobs) {
  for (const json& lp : logprobs) pending_logprobs_.push_back(lp);
  if (text.empty()) return "";
  std::string events;
  if (open_ != ItemKind::kMessage) {
    events += open(ItemKind::kMessage, {{"id", random_id("msg_")},
                                        {"type", "message"},
                                        {"status", "in_progress"},
                                        {"content", json::array()},
                                        {"role", "assistant"}});
  }
  json& part = output_.back()["content"][0];
  part["text"].get_ref<std::string&>() += text;
  for (const json& lp : pending_logprobs_) part["logprobs"].push_back(lp);
  json fields = where();
  fields["delta"] = text;
  fields["logprobs"] = std::move(pending_logprobs_);
  pending_logprobs_ = json::array();
  return events + emit("response.output_text.delta", std::move(fields));
}

std::string ResponseBuilder::start_call(const std::string& call_id, const std::string& name) {
  return open(ItemKind::kFunctionCall, {{"id", random_id("fc_")},
                                        {"type", "function_call"},
                                        {"status", "in_progress"},
                                        {"arguments", ""},
                                        {"call_id", call_id},
                                        {"name", name}});
}

std::string ResponseBuilder::add_arguments(const std::string& piece) {
  if (piece.empty() || open_ != ItemKind::kFunctionCall) return "";
  output_.back()["arguments"].get_ref<std::string&>() += piece;
  json fields = where(false);
  fields["delta"] = piece;
  return emit("response.function_call_arguments.delta", std::move(fields));
}

// A chat tool-call delta: the first for a call carries its id and name, later ones more
// of its arguments (the chat path writes one call after another).
std::string ResponseBuilder::add_tool_call_delta(const json& call) {
  const int index = call.value("index", 0);
  const json function = call.value("function", json::object());
  std::string events;
  if (call.contains("id")) {
    events += start_call(string_or_empty(call, "id"), string_or_empty(function, "name"));
    call_items_[index] = output_.size() - 1;
  }
  auto it = call_items_.find(index);
  if (it == call_items_.end() || it->second != output_.size() - 1) return events;
  return events + add_arguments(string_or_empty(function, "arguments"));
}

void ResponseBuilder::set_usage(const json& u) {
  const int64_t input = u.value("prompt_tokens", int64_t{0});
  const int64_t output = u.value("completion_tokens", int64_t{0});
  const json details = u.value("completion_tokens_details", json::object());
  // The engine does not report prefix-cache hits or writes per request: both are 0.
  usage_ = {{"input_tokens", input},
            {"input_tokens_details", {{"cached_tokens", 0}, {"cache_write_tokens", 0}}},
            {"output_tokens", output},
            {"output_tokens_details",
             {{"reasoning_tokens", details.value("reasoning_tokens", int64_t{0})}}},
            {"total_tokens", input + output}};
}

std::string ResponseBuilder::add_chat_chunk(const json& chunk) {
  if (chunk.contains("error") && chunk["error"].is_object()) {
    error_ = string_or_empty(chunk["error"], "message");
    return "";
  }
  if (chunk.contains("usage") && chunk["usage"].is_object()) set_usage(chunk["usage"]);
  const json choices = chunk.value("choices", json::array());
  if (choices.empty()) return "";
  const json& choice = choices[0];
  const json delta = choice.value("delta", json::object());
  std::string events;
  if (const std::string r = string_or_empty(delta, "reasoning_content"); !r.empty()) {
    events += add_reasoning(r);
  }
  json logprobs = json::array();
  if (choice.contains("logprobs") && choice["logprobs"].is_object()) {
    logprobs = choice["logprobs"].value("content", json::array());
  }
  events += add_text(string_or_empty(delta, "content"), logprobs);
  if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
    for (const json& call : delta["tool_calls"]) events += add_tool_call_delta(call);
  }
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
    finish_reason_ = choice["finish_reason"].get<std::string>();
  }
  return events;
}

void ResponseBuilder::add_chat_completion(const json& completion) {
  // The chat path's own output: at() throws (a 500) rather than read a missing key.
  const json& choice = completion.at("choices").at(0);
  const json& message = choice.at("message");
  if (const std::string r = string_or_empty(message, "reasoning_content"); !r.empty()) {
    add_reasoning(r);
  }
  json logprobs = json::array();
  if (choice.contains("logprobs") && choice["logprobs"].is_object()) {
    logprobs = choice["logprobs"].value("content", json::array());
  }
  add_text(string_or_empty(message, "content"), logprobs);
  for (const json& call : message.value("tool_calls", json::array())) {
    const json& function = call.at("function");
    start_call(string_or_empty(call, "id"), string_or_empty(function, "name"));
    add_arguments(string_or_empty(function, "arguments"));
  }
  finish_reason_ = string_or_empty(choice, "finish_reason");
  if (completion.contains("usage")) set_usage(completion["usage"]);
}

std::string ResponseBuilder::finish() {
  std::string events;
  // A response always has a message, if only an empty one (output_text "").
  if (output_.empty() && error_.empty()) {
    events += open(ItemKind::kMessage, {{"id", random_id("msg_")},
                                        {"type", "message"},
                                        {"status", "in_progress"},
                                        {"content", json::array()},
                                        {"role", "assistant"}});
  }
  if (!pending_logprobs_.empty() && open_ == ItemKind::kMessage) {
    for (const json& lp : pending_logprobs_) output_.back()["content"][0]["logprobs"].push_back(lp);
  }
  status_ = !error_.empty()                ? "failed"
            : finish_reason_ == "length"   ? "incomplete"
            : finish_reason_ == "abort"    ? "cancelled"
                                           : "completed";
  events += close_item();
  const char* terminal = status_ == "completed" ? "response.completed"
                         : status_ == "failed"  ? "response.failed"
                                                : "response.incomplete";
  return events + emit(terminal, {{"response", response()}});
}

json ResponseBuilder::response() const {
  auto echoed = [&](const char* key) { return echo_.value(key, json(nullptr)); };
  json r = {{"id", id_}, {"object", "response"}, {"created_at", created_at_},
            {"status", status_}, {"background", false}};
  r["error"] = error_.empty() ? json(nullptr) : json{{"code", "server_error"}, {"message", error_}};
  r["incomplete_details"] =
      status_ == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
  r["instructions"] = echoed("instructions");
  r["max_output_tokens"] = echoed("max_output_tokens");
  r["max_tool_calls"] = nullptr;
  r["model"] = model_;
  r["output"] = output_;
  r["parallel_tool_calls"] = echoed("parallel_tool_calls");
  r["previous_response_id"] = nullptr;
  r["prompt_cache_key"] = echoed("prompt_cache_key");
  r["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  r["safety_identifier"] = echoed("safety_identifier");
  r["service_tier"] = echoed("service_tier");
  r["store"] = false;
  r["temperature"] = echoed("temperature");
  r["text"] = echoed("text");
  r["tool_choice"] = echoed("tool_choice");
  r["tools"] = echoed("tools");
  r["top_logprobs"] = echoed("top_logprobs");
  r["top_p"] = echoed("top_p");
  r["truncation"] = "disabled";
  r["usage"] = usage_;
  r["user"] = echoed("user");
  r["metadata"] = echoed("metadata");
  return r;
}

namespace {

// Pulls the chat stream and turns each of its "data: JSON" events into Responses events.
class ResponsesEventStream final : public EventStream {
 public:
  ResponsesEventStream(std::shared_ptr<EventStream> chat, std::unique_ptr<ResponseBuilder> builder)
      : chat_(std::move(chat)), builder_(std::move(builder)) {}

  std::string next(std::chrono::milliseconds timeout) override {
    std::string events;
    if (done_) return events;
    if (!started_) {
      events = builder_->begin();
      started_ = true;
    }
    const std::string chat = chat_->next(events.empty() ? timeout : std::chrono::milliseconds(0));
    // Whole "data: ...\n\n" events; JSON escapes newlines inside strings, so a blank
    // line only ever ends an event.
    size_t pos = 0;
    while (pos < chat.size() && !done_) {
      size_t end = chat.find("\n\n", pos);
      if (end == std::string::npos) end = chat.size();
      std::string_view block(chat.data() + pos, end - pos);
      pos = end + 2;
      constexpr std::string_view kData = "data: ";
      if (block.substr(0, kData.size()) != kData) continue;  // an SSE comment
      block.remove_prefix(kData.size());
      if (block == "[DONE]") {
        events += builder_->finish();
        done_ = true;
        break;
      }
      const json chunk = json::parse(block, nullptr, /*allow_exceptions=*/false);
      if (!chunk.is_discarded()) events += builder_->add_chat_chunk(chunk);
    }
    return events;
  }
  bool done() const override { return done_; }
  void cancel() override { chat_->cancel(); }
  json usage() const override { return chat_->usage(); }

 private:
  std::shared_ptr<EventStream> chat_;
  std::unique_ptr<ResponseBuilder> builder_;
  bool started_ = false;
  bool done_ = false;
};

}  // namespace

std::shared_ptr<EventStream> responses_event_stream(std::shared_ptr<EventStream> chat,
                                                    std::unique_ptr<ResponseBuilder> builder) {
  return std::make_shared<ResponsesEventStream>(std::move(chat), std::move(builder));
}

}  // namespace dserve::server
