#include "sampling/sampling_params.h"

#include <gtest/gtest.h>

namespace dserve {
namespace {

// Expects create() to fail with a message naming `field`.
void expect_rejected(const SamplingOptions& o, const std::string& field) {
  Result<SamplingParams> r = SamplingParams::create(o);
  ASSERT_FALSE(r.ok()) << field;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
}

TEST(SamplingParamsTest, DefaultsAreVllms) {
  Result<SamplingParams> r = SamplingParams::create({});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->n(), 1);
  EXPECT_EQ(r->temperature(), 1.0f);
  EXPECT_EQ(r->top_k(), 0);
  EXPECT_EQ(r->max_tokens(), 16);
  EXPECT_FALSE(r->greedy());
  EXPECT_FALSE(r->has_penalties());
  EXPECT_FALSE(r->logprobs().has_value());
}

TEST(SamplingParamsTest, RejectsOutOfRange) {
  expect_rejected({.n = 0}, "n must");
  expect_rejected({.temperature = -0.1f}, "temperature");
  expect_rejected({.temperature = std::numeric_limits<float>::quiet_NaN()}, "temperature");
  expect_rejected({.top_p = 0.0f}, "top_p");
  expect_rejected({.top_p = 1.01f}, "top_p");
  expect_rejected({.top_k = -2}, "top_k");
  expect_rejected({.min_p = -0.1f}, "min_p");
  expect_rejected({.min_p = 1.5f}, "min_p");
  expect_rejected({.repetition_penalty = 0.0f}, "repetition_penalty");
  expect_rejected({.frequency_penalty = 2.5f}, "frequency_penalty");
  expect_rejected({.presence_penalty = -2.5f}, "presence_penalty");
  expect_rejected({.stop = {"ok", ""}}, "stop strings");
  expect_rejected({.stop_token_ids = {-1}}, "stop_token_ids");
  expect_rejected({.max_tokens = 0}, "max_tokens");
  expect_rejected({.max_tokens = 4, .min_tokens = 5}, "min_tokens");
  expect_rejected({.min_tokens = -1}, "min_tokens");
  expect_rejected({.logprobs = -1}, "logprobs");
  expect_rejected({.logprobs = kMaxLogprobs + 1}, "logprobs");
  expect_rejected({.logit_bias = {{5, 100.5f}}}, "logit_bias values");
  expect_rejected({.logit_bias = {{5, -101.0f}}}, "logit_bias values");
  expect_rejected({.logit_bias = {{5, std::numeric_limits<float>::quiet_NaN()}}}, "logit_bias");
  expect_rejected({.logit_bias = {{-1, 1.0f}}}, "logit_bias keys");
}

TEST(SamplingParamsTest, AcceptsBoundaries) {
  for (SamplingOptions o :
       std::vector<SamplingOptions>{{.temperature = 0.0f},
                                    {.top_p = 1.0f},
                                    {.top_k = -1},
                                    {.top_k = 1},
                                    {.min_p = 0.0f},
                                    {.min_p = 1.0f},
                                    {.repetition_penalty = 0.5f},
                                    {.frequency_penalty = -2.0f, .presence_penalty = 2.0f},
                                    {.max_tokens = 3, .min_tokens = 3},
                                    {.logit_bias = {{0, -100.0f}, {7, 100.0f}}},
                                    {.logprobs = 0},
                                    {.logprobs = kMaxLogprobs}}) {
    EXPECT_TRUE(SamplingParams::create(o).ok());
  }
  // -1 and 0 both switch top_k off.
  EXPECT_EQ(SamplingParams::create({.top_k = -1})->top_k(), 0);
  EXPECT_TRUE(SamplingParams::create({.temperature = 0.0f})->greedy());
}

}  // namespace
}  // namespace dserve
