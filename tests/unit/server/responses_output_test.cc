// ResponseBuilder: chat chunks in, OpenAI's Responses events and Response object out.
#include "server/responses_output.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dserve::server {
namespace {

using json = nlohmann::ordered_json;

// The "data:" objects of a run of server-sent events, checking each "event:" line names
// the data's type.
std::vector<json> parse_events(const std::string& text) {
  std::vector<json> events;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find("\n\n", pos);
    const std::string block = text.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = block.find('\n');
    const std::string event_line = block.substr(0, nl), data_line = block.substr(nl + 1);
    EXPECT_EQ(event_line.rfind("event: ", 0), 0u) << block;
    EXPECT_EQ(data_line.rfind("data: ", 0), 0u) << block;
    json e = json::parse(data_line.substr(6));
    EXPECT_EQ(event_line.substr(7), e["type"].get<std::string>());
    events.push_back(std::move(e));
  }
  return events;
}

json chunk(json delta, json finish_reason = nullptr) {
  return {{"object", "chat.completion.chunk"},
          {"choices", {{{"index", 0}, {"delta", delta}, {"finish_reason", finish_reason}}}}};
}

const json kEcho = {{"instructions", "Be brief."}, {"tools", json::array()},
                    {"tool_choice", "auto"}, {"text", {{"format", {{"type", "text"}}}}}};

TEST(ResponseBuilder, StreamedTextThenCallInOpenAiOrder) {
  ResponseBuilder b(kEcho, "m");
  std::string text = b.begin();
  text += b.add_chat_chunk(chunk({{"role", "assistant"}, {"content", ""}}));
  text += b.add_chat_chunk(chunk({{"content", "Hel"}}));
  text += b.add_chat_chunk(chunk({{"content", "lo"}}));
  text += b.add_chat_chunk(chunk(
      {{"tool_calls", {{{"index", 0}, {"id", "call_1"}, {"type", "function"},
                        {"function", {{"name", "f"}, {"arguments", "{\"a\""}}}}}}}));
  const json more_arguments = {{"index", 0}, {"function", {{"arguments", ": 1}"}}}};
  text += b.add_chat_chunk(chunk({{"tool_calls", {more_arguments}}}, "tool_calls"));
  const json usage = {{"prompt_tokens", 5}, {"completion_tokens", 4}, {"total_tokens", 9}};
  text += b.add_chat_chunk({{"choices", json::array()}, {"usage", usage}});
  text += b.finish();

  const std::vector<json> events = parse_events(text);
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], i);
    types.push_back(events[i]["type"]);
  }
  EXPECT_EQ(types, (std::vector<std::string>{
                       "response.created", "response.in_progress",
                       "response.output_item.added", "response.content_part.added",
                       "response.output_text.delta", "response.output_text.delta",
                       "response.output_text.done", "response.content_part.done",
                       "response.output_item.done", "response.output_item.added",
                       "response.function_call_arguments.delta",
                       "response.function_call_arguments.delta",
                       "response.function_call_arguments.done", "response.output_item.done",
                       "response.completed"}));
  EXPECT_EQ(events[0]["response"]["status"], "in_progress");
  EXPECT_EQ(events[6]["text"], "Hello");
  EXPECT_EQ(events[12]["arguments"], "{\"a\": 1}");
  const json& r = events.back()["response"];
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["instructions"], "Be brief.");
  EXPECT_EQ(r["output"].size(), 2u);
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Hello");
  EXPECT_EQ(r["output"][1]["call_id"], "call_1");
  EXPECT_EQ(r["output"][1]["status"], "completed");
  EXPECT_EQ(r["usage"]["input_tokens"], 5);
  EXPECT_EQ(r["usage"]["output_tokens"], 4);
  EXPECT_EQ(r["usage"]["total_tokens"], 9);
  EXPECT_EQ(r, b.response());
}

TEST(ResponseBuilder, WholeCompletionWithReasoningCutShort) {
  ResponseBuilder b(kEcho, "m");
  b.add_chat_completion(json::parse(R"({
    "choices": [{"index": 0, "finish_reason": "length",
                 "message": {"role": "assistant", "reasoning_content": "hmm", "content": "It is"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9,
              "completion_tokens_details": {"reasoning_tokens": 2}}})"));
  b.finish();
  const json r = b.response();
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(r["output"].size(), 2u);
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "hmm");
  EXPECT_EQ(r["output"][0]["status"], "completed");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "It is");
  EXPECT_EQ(r["output"][1]["status"], "incomplete");
  EXPECT_EQ(r["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
}

TEST(ResponseBuilder, EmptyOutputIsAnEmptyMessageAndErrorsFail) {
  ResponseBuilder empty(kEcho, "m");
  empty.add_chat_chunk(chunk(json::object(), "stop"));
  empty.finish();
  EXPECT_EQ(empty.response()["output"][0]["content"][0]["text"], "");
  EXPECT_EQ(empty.response()["status"], "completed");

  ResponseBuilder failed(kEcho, "m");
  failed.begin();
  failed.add_chat_chunk({{"error", {{"message", "engine died"}}}});
  const std::vector<json> events = parse_events(failed.finish());
  EXPECT_EQ(events.back()["type"], "response.failed");
  EXPECT_EQ(events.back()["response"]["error"]["message"], "engine died");
}

TEST(ResponseBuilder, LogprobsOfHeldBackTokensGoWithTheNextText) {
  ResponseBuilder b(kEcho, "m");
  const json lp1 = {{"token", "a"}, {"logprob", -1.0}, {"bytes", {97}},
                    {"top_logprobs", json::array()}};
  const json lp2 = {{"token", "b"}, {"logprob", -2.0}, {"bytes", {98}},
                    {"top_logprobs", json::array()}};
  json held = chunk({{"content", ""}});
  held["choices"][0]["logprobs"] = {{"content", {lp1}}};
  json text = chunk({{"content", "ab"}});
  text["choices"][0]["logprobs"] = {{"content", {lp2}}};
  b.add_chat_chunk(held);
  const std::vector<json> events = parse_events(b.add_chat_chunk(text));
  EXPECT_EQ(events.back()["type"], "response.output_text.delta");
  EXPECT_EQ(events.back()["logprobs"], json::array({lp1, lp2}));
  b.finish();
  EXPECT_EQ(b.response()["output"][0]["content"][0]["logprobs"], json::array({lp1, lp2}));
}

}  // namespace
}  // namespace dserve::server
