// Responses requests: what each becomes as a chat request (which the chat parser must
// then accept), and every field given any JSON value yields a request or one ApiError.
#include "server/responses_protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dserve::server {
namespace {

using json = nlohmann::ordered_json;

const json kWeatherParameters = {{"type", "object"},
                                 {"properties", {{"city", {{"type", "string"}}}}}};

json parse_ok(const json& body) {
  Parsed<ResponsesRequest> p = parse_responses_request(body);
  if (auto* e = std::get_if<ApiError>(&p)) {
    ADD_FAILURE() << body.dump() << ": " << e->message;
    return nullptr;
  }
  const ResponsesRequest& r = std::get<ResponsesRequest>(p);
  Parsed<ChatRequest> chat = parse_chat_request(r.chat_body);
  if (auto* e = std::get_if<ApiError>(&chat)) {
    ADD_FAILURE() << r.chat_body.dump() << ": " << e->message;
  }
  return r.chat_body;
}

std::string error_param(const json& body) {
  Parsed<ResponsesRequest> p = parse_responses_request(body);
  if (auto* e = std::get_if<ApiError>(&p)) return e->param;
  return "(parsed)";
}

TEST(ResponsesProtocol, TextInputIsOneUserMessage) {
  const json chat = parse_ok({{"model", "m"}, {"input", "hi"}, {"max_output_tokens", 7},
                              {"temperature", 0.5}, {"instructions", "Be brief."}});
  EXPECT_EQ(chat["messages"], json::parse(R"([{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "hi"}])"));
  EXPECT_EQ(chat["max_completion_tokens"], 7);
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_EQ(chat["model"], "m");
  EXPECT_FALSE(chat.contains("stream"));
}

TEST(ResponsesProtocol, ItemsBecomeChatMessages) {
  const json input = json::parse(R"([
    {"role": "developer", "content": "Use tools."},
    {"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
    {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather",
     "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
    {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
    {"type": "function_call_output", "call_id": "c2",
     "output": [{"type": "input_text", "text": "Rain"}]}
  ])");
  const json chat = parse_ok({{"input", input}});
  EXPECT_EQ(chat["messages"], json::parse(R"([
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}],
     "tool_calls": [
       {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
       {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "Sunny", "name": "get_weather"},
    {"role": "tool", "tool_call_id": "c2", "content": "Rain", "name": "get_weather"}
  ])"));
}

TEST(ResponsesProtocol, ToolsToolChoiceTextAndLogprobs) {
  const json chat = parse_ok(
      {{"input", "hi"},
       {"tools", {{{"type", "function"}, {"name", "get_weather"}, {"description", "d"},
                   {"parameters", kWeatherParameters}, {"strict", true}}}},
       {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
       {"include", {"message.output_text.logprobs", "reasoning.encrypted_content"}},
       {"top_logprobs", 3},
       {"stream", true},
       {"stream_options", {{"include_obfuscation", false}}}});
  EXPECT_EQ(chat["tools"], json::array({{{"type", "function"},
                                         {"function", {{"name", "get_weather"},
                                                       {"description", "d"},
                                                       {"parameters", kWeatherParameters}}}}}));
  EXPECT_EQ(chat["tool_choice"],
            json::parse(R"({"type": "function", "function": {"name": "get_weather"}})"));
  EXPECT_EQ(chat["logprobs"], true);
  EXPECT_EQ(chat["top_logprobs"], 3);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_EQ(chat["stream_options"], json::parse(R"({"include_usage": true})"));

  const json schema = {{"type", "object"}};
  const json structured = parse_ok(
      {{"input", "hi"},
       {"text", {{"format", {{"type", "json_schema"}, {"name", "x"}, {"schema", schema},
                             {"strict", true}}}}}});
  EXPECT_EQ(structured["response_format"],
            json({{"type", "json_schema"},
                  {"json_schema", {{"name", "x"}, {"schema", schema}, {"strict", true}}}}));
  const json json_object = {{"type", "json_object"}};
  EXPECT_EQ(parse_ok({{"input", "hi"}, {"text", {{"format", json_object}}}})["response_format"],
            json_object);
  EXPECT_FALSE(parse_ok({{"input", "hi"}, {"text", {{"format", {{"type", "text"}}}}}})
                   .contains("response_format"));
}

TEST(ResponsesProtocol, StoredStateAndUnknownFieldsAreRefused) {
  const json ok = {{"input", "hi"}, {"store", false}, {"truncation", "disabled"},
                   {"background", false}, {"reasoning", nullptr}, {"metadata", {{"k", "v"}}},
                   {"user", "u"}, {"service_tier", "auto"}, {"prompt_cache_key", "k"}};
  EXPECT_EQ(error_param(ok), "(parsed)");
  EXPECT_EQ(error_param({{"input", "hi"}, {"store", true}}), "store");
  EXPECT_EQ(error_param({{"input", "hi"}, {"previous_response_id", "resp_1"}}),
            "previous_response_id");
  EXPECT_EQ(error_param({{"input", "hi"}, {"conversation", "c"}}), "conversation");
  EXPECT_EQ(error_param({{"input", "hi"}, {"truncation", "auto"}}), "truncation");
  EXPECT_EQ(error_param({{"input", "hi"}, {"reasoning", {{"effort", "low"}}}}), "reasoning");
  EXPECT_EQ(error_param({{"input", "hi"}, {"messages", json::array()}}), "messages");
  EXPECT_EQ(error_param({{"input", "hi"}, {"tools", {{{"type", "web_search"}}}}}), "tools");
  EXPECT_EQ(error_param({{"input", {{{"type", "item_reference"}, {"id", "x"}}}}}), "input");
  EXPECT_EQ(error_param({{"input", json::array()}}), "input");
  EXPECT_EQ(error_param({{"input", "hi"}, {"stream_options", {{"include_obfuscation", true}}}}),
            "stream_options");
}

TEST(ResponsesProtocol, ChatErrorsNameTheResponsesField) {
  const json e = responses_error_body({{"error", {{"message", "m"}, {"param", "max_tokens"}}}});
  EXPECT_EQ(e["error"]["param"], "max_output_tokens");
  EXPECT_EQ(responses_error_body({{"error", {{"param", "messages"}}}})["error"]["param"], "input");
  EXPECT_EQ(responses_error_body({{"error", {{"param", "response_format"}}}})["error"]["param"],
            "text.format");
  EXPECT_EQ(responses_error_body({{"error", {{"param", "seed"}}}})["error"]["param"], "seed");
}

TEST(ResponsesProtocol, EveryFieldTakesAnyValueWithoutCrashing) {
  const std::vector<json> odd = {
      nullptr, true, -1, 0, 3.5, "", "x", json::array(), json::array({1, "a"}),
      json::array({json::object()}), json::object(), json::object({{"type", "function"}}),
      json::object({{"type", 3}}), json::object({{"format", {{"type", "json_schema"}}}}),
      json::array({{{"type", "function_call"}, {"call_id", 1}}}),
      json::array({{{"role", "user"}, {"content", {{{"type", "input_text"}}}}}}),
      json::array({{{"type", "function_call_output"}, {"call_id", "c"}, {"output", 5}}})};
  const std::vector<std::string> fields = {
      "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "seed",
      "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls", "text",
      "include", "top_logprobs", "metadata", "user", "store", "previous_response_id",
      "background", "truncation", "reasoning", "service_tier", "max_tool_calls"};
  for (const std::string& field : fields) {
    for (const json& v : odd) {
      json body = {{"input", "hi"}};
      body[field] = v;
      Parsed<ResponsesRequest> p = parse_responses_request(body);
      if (auto* r = std::get_if<ResponsesRequest>(&p)) {
        (void)parse_chat_request(r->chat_body);  // the chat parser has the last word
      } else {
        EXPECT_FALSE(std::get<ApiError>(p).message.empty()) << field << " = " << v.dump();
      }
    }
  }
}

}  // namespace
}  // namespace dserve::server
