// Request parsing: every field accepts its documented types, and any other JSON value
// in any field gives one ApiError (never a crash, never a silent default).
#include "server/openai_protocol.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace dserve::server {
namespace {

using json = nlohmann::ordered_json;

const std::vector<json> kOddValues = {
    nullptr, true, -1, 0, 1e300, -1e300, 3.5, "", "x", json::array(), json::array({1, "a"}),
    json::object(), json::object({{"a", 1}}), 1e9, -2147483649.0, 18446744073709551615ull};

TEST(OpenAiProtocol, ValidRequestsParse) {
  auto c = parse_completion_request({{"model", "m"}, {"prompt", "hi"}, {"max_tokens", 5},
                                     {"temperature", 0.5}, {"n", 2}, {"stop", "x"},
                                     {"logprobs", 2}, {"seed", 3}});
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(c));
  const auto& r = std::get<CompletionRequest>(c);
  EXPECT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.sampling.n, 2);
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.sampling.logprobs, 2);
  auto biased = parse_completion_request(
      {{"prompt", "hi"}, {"logit_bias", {{"7", -100}, {"12", 2.5}, {"0", 100}}},
       {"prompt_logprobs", 0}});
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(biased));
  const SamplingOptions& bs = std::get<CompletionRequest>(biased).sampling;
  EXPECT_EQ(bs.logit_bias, (std::map<int32_t, float>{{0, 100.0f}, {7, -100.0f}, {12, 2.5f}}));
  EXPECT_EQ(bs.prompt_logprobs, 0);
  auto ids = parse_completion_request({{"prompt", {{1, 2}, {3}}}});
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(ids));
  EXPECT_EQ(std::get<CompletionRequest>(ids).prompts.size(), 2u);

  auto chat = parse_chat_request(
      {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_completion_tokens", 7},
       {"logprobs", true}, {"top_logprobs", 3}, {"stream", true},
       {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(std::holds_alternative<ChatRequest>(chat));
  const auto& cr = std::get<ChatRequest>(chat);
  EXPECT_EQ(cr.max_tokens, 7);
  EXPECT_EQ(cr.sampling.logprobs, 3);
  EXPECT_TRUE(cr.include_usage);
}

TEST(OpenAiProtocol, EveryFieldRejectsOrAcceptsEveryValueWithoutCrashing) {
  const json completion = {{"model", "m"}, {"prompt", "hi"}, {"max_tokens", 5}};
  const json chat = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  const std::vector<std::string> fields = {
      "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
      "top_p", "top_k", "min_p", "n", "stream", "stream_options", "stop", "seed", "logprobs",
      "top_logprobs", "echo", "presence_penalty", "frequency_penalty", "repetition_penalty",
      "min_tokens", "ignore_eos", "stop_token_ids", "logit_bias", "prompt_logprobs", "best_of",
      "suffix", "tools",
      "tool_choice", "response_format", "chat_template_kwargs", "unknown_field",
      "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
      "guided_decoding_backend"};
  int n_errors = 0;
  for (const std::string& f : fields) {
    for (const json& v : kOddValues) {
      json a = completion, b = chat;
      a[f] = v;
      b[f] = v;
      auto ra = parse_completion_request(a);
      auto rb = parse_chat_request(b);
      for (const ApiError* e : {std::get_if<ApiError>(&ra), std::get_if<ApiError>(&rb)}) {
        if (!e) continue;
        ++n_errors;
        EXPECT_EQ(e->http_status, 400);
        EXPECT_FALSE(e->message.empty());
      }
    }
  }
  EXPECT_GT(n_errors, 300);
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_completion_request(json::array())));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_chat_request("text")));
}

TEST(OpenAiProtocol, StructuredOutputFields) {
  const json chat = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto spec_of = [](const auto& parsed) -> std::optional<StructuredOutputs> {
    if (std::holds_alternative<ApiError>(parsed)) {
      ADD_FAILURE() << std::get<ApiError>(parsed).message;
      return std::nullopt;
    }
    return std::visit([](const auto& r) -> std::optional<StructuredOutputs> {
      if constexpr (std::is_same_v<std::decay_t<decltype(r)>, ApiError>) {
        return std::nullopt;
      } else {
        return r.sampling.structured_outputs;
      }
    }, parsed);
  };
  json a = chat;
  a["response_format"] = {{"type", "json_schema"},
                          {"json_schema", {{"name", "x"}, {"strict", true},
                                           {"schema", {{"type", "integer"}}}}}};
  auto s = spec_of(parse_chat_request(a));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->kind, StructuredOutputs::Kind::kJson);
  EXPECT_EQ(json::parse(s->text), json({{"type", "integer"}}));
  a["response_format"] = {{"type", "text"}};
  EXPECT_FALSE(spec_of(parse_chat_request(a)).has_value());
  a["response_format"] = {{"type", "json_object"}};
  EXPECT_EQ(spec_of(parse_chat_request(a))->kind, StructuredOutputs::Kind::kJsonObject);
  json c = {{"model", "m"}, {"prompt", "hi"}, {"guided_choice", {"a", "b"}}};
  auto cs = spec_of(parse_completion_request(c));
  ASSERT_TRUE(cs.has_value());
  EXPECT_EQ(cs->kind, StructuredOutputs::Kind::kChoice);
  EXPECT_EQ(cs->choices, (std::vector<std::string>{"a", "b"}));
  c.erase("guided_choice");
  c["structured_outputs"] = {{"grammar", "root ::= \"x\""}, {"disable_any_whitespace", true}};
  EXPECT_EQ(spec_of(parse_completion_request(c))->kind, StructuredOutputs::Kind::kGrammar);
  c["guided_regex"] = "x";
  auto both = parse_completion_request(c);
  ASSERT_TRUE(std::holds_alternative<ApiError>(both));
  EXPECT_NE(std::get<ApiError>(both).message.find("only one kind"), std::string::npos);
}

TEST(OpenAiProtocol, BadValuesNameTheirField) {
  struct Case {
    json body;
    std::string param;
  };
  const std::vector<Case> cases = {
      {{{"prompt", "x"}, {"max_tokens", 0}}, "max_tokens"},
      {{{"prompt", "x"}, {"n", 0}}, "n"},
      {{{"prompt", "x"}, {"n", 100000}}, "n"},
      {{{"prompt", "x"}, {"temperature", "hot"}}, "temperature"},
      {{{"prompt", "x"}, {"logit_bias", {{"1", 101}}}}, "logit_bias"},
      {{{"prompt", "x"}, {"logit_bias", {{"1", "2"}}}}, "logit_bias"},
      {{{"prompt", "x"}, {"logit_bias", {{"-1", 2}}}}, "logit_bias"},
      {{{"prompt", "x"}, {"logit_bias", {{"2147483648", 2}}}}, "logit_bias"},
      {{{"prompt", "x"}, {"logit_bias", {1, 2}}}, "logit_bias"},
      {{{"prompt", "x"}, {"prompt_logprobs", 21}}, "prompt_logprobs"},
      {{{"prompt", "x"}, {"prompt_logprobs", -1}}, "prompt_logprobs"},
      {{{"prompt", "x"}, {"prompt_logprobs", 1}, {"stream", true}}, "prompt_logprobs"},
      {{{"prompt", "x"}, {"frobnicate", 1}}, "frobnicate"},
      {{{"prompt", json::array()}}, "prompt"},
      {{{"prompt", {1, -5}}}, "prompt"},
      {{{"prompt", "x"}, {"stop", std::vector<std::string>(17, "s")}}, "stop"},
      {{{"prompt", "x"}, {"stop", std::string(257, 's')}}, "stop"},
      {{{"prompt", "x"}, {"stop_token_ids", std::vector<int>(1025, 1)}}, "stop_token_ids"},
  };
  for (const Case& c : cases) {
    auto r = parse_completion_request(c.body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << c.body;
    EXPECT_EQ(std::get<ApiError>(r).param, c.param) << c.body;
  }
  auto empty = parse_chat_request({{"messages", json::array()}});
  ASSERT_TRUE(std::holds_alternative<ApiError>(empty));
  EXPECT_EQ(std::get<ApiError>(empty).param, "messages");
  // A type tag of another type than string (found by fuzz_openai_request: an uncaught
  // exception) is the part's or tool's error.
  for (const json& type : kOddValues) {
    const json part = {{"type", type}, {"text", "hi"}};
    auto bad_part = parse_chat_request(
        {{"messages", {{{"role", "user"}, {"content", json::array({part})}}}}});
    ASSERT_TRUE(std::holds_alternative<ApiError>(bad_part)) << type;
    EXPECT_EQ(std::get<ApiError>(bad_part).param, "messages") << type;
    auto bad_tool = parse_chat_request({{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                        {"tools", {{{"type", type}, {"function", {{"name", "f"}}}}}}});
    ASSERT_TRUE(std::holds_alternative<ApiError>(bad_tool)) << type;
    EXPECT_EQ(std::get<ApiError>(bad_tool).param, "tools") << type;
  }
}

}  // namespace
}  // namespace dserve::server
