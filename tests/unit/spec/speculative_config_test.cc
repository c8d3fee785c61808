// --speculative-config: vLLM's keys and defaults, and one clear error for anything else.
#include "spec/speculative_config.h"

#include <gtest/gtest.h>

namespace dserve::spec {
namespace {

TEST(SpeculativeConfigTest, NgramWithVllmDefaults) {
  Result<SpeculativeConfig> c = SpeculativeConfig::parse(
      R"({"method": "ngram", "num_speculative_tokens": 3})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->method, SpeculativeMethod::kNgram);
  EXPECT_EQ(c->num_speculative_tokens, 3);
  EXPECT_EQ(c->prompt_lookup_min, 5);  // neither bound given: both 5
  EXPECT_EQ(c->prompt_lookup_max, 5);
  c = SpeculativeConfig::parse(
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->prompt_lookup_min, 3);  // one bound given: the other equals it
  EXPECT_EQ(c->prompt_lookup_max, 3);
  c = SpeculativeConfig::parse(R"({"method": "ngram", "num_speculative_tokens": 4,
                                   "prompt_lookup_min": 2, "prompt_lookup_max": 6})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->prompt_lookup_min, 2);
  EXPECT_EQ(c->prompt_lookup_max, 6);
}

TEST(SpeculativeConfigTest, MtpUnderBothNames) {
  for (const char* name : {"deepseek_mtp", "mtp"}) {
    Result<SpeculativeConfig> c = SpeculativeConfig::parse(
        std::string(R"({"method": ")") + name + R"(", "num_speculative_tokens": 2})");
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_EQ(c->method, SpeculativeMethod::kMtp);
    EXPECT_EQ(c->num_speculative_tokens, 2);
  }
}

TEST(SpeculativeConfigTest, BadConfigsNameTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"not json", "JSON object"},
      {"[1]", "JSON object"},
      {R"({"num_speculative_tokens": 2})", "method"},
      {R"({"method": "eagle", "num_speculative_tokens": 2})", "unknown method \"eagle\""},
      {R"({"method": "mtp"})", "num_speculative_tokens is required"},
      {R"({"method": "mtp", "num_speculative_tokens": 5})", "outside [1, 4]"},
      {R"({"method": "mtp", "num_speculative_tokens": 0})", "outside [1, 4]"},
      {R"({"method": "ngram", "num_speculative_tokens": "3"})", "must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "model": "x"})", "unknown key \"model\""},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
           "prompt_lookup_max": 2})", "exceeds prompt_lookup_max"},
      {R"({"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_max": 2})",
       "method ngram only"},
  };
  for (const auto& [json, want] : cases) {
    Result<SpeculativeConfig> c = SpeculativeConfig::parse(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(want), std::string::npos)
        << json << " -> " << c.status().message();
    EXPECT_NE(c.status().message().find("--speculative-config"), std::string::npos);
  }
}

}  // namespace
}  // namespace dserve::spec
