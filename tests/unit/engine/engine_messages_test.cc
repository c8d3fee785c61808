// The data-parallel messages (engine/engine_messages.h): every message survives
// encode -> decode unchanged (floats bit for bit, -inf log-probabilities, unset
// optionals); malformed input (not JSON, wrong types, missing fields, out-of-range
// numbers, unknown types, truncations and byte flips of valid messages) is an
// InvalidArgument and never a crash (run under ASan/UBSan in `make test`).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "engine/engine_messages.h"

namespace dserve::engine_msg {
namespace {

template <typename T>
T round_trip(const T& m) {
  Result<Message> d = decode(encode(m));
  EXPECT_TRUE(d.ok()) << d.status().message();
  if (!d.ok()) return T{};
  EXPECT_TRUE(std::holds_alternative<T>(*d));
  return std::get<T>(*d);
}

TEST(EngineMessages, HelloRoundTrips) {
  Hello h;
  h.node = "node-1:42 (ranks from 1)";
  h.ranks = {1, 2};
  h.config = {"/models/m", 4, 1, false, 128, "auto", 8192};
  Hello g = round_trip(h);
  EXPECT_EQ(g.node, h.node);
  EXPECT_EQ(g.ranks, h.ranks);
  EXPECT_EQ(g.config, h.config);
}

TEST(EngineMessages, AddCarriesEverySamplingOption) {
  Add a;
  a.engine = 3;
  a.ticket = int64_t{1} << 40;
  a.prompt = {0, 5, 2147483647};
  SamplingOptions& o = a.options;
  o.n = 3;
  o.temperature = 0.7f;
  o.top_p = 0.9f;
  o.top_k = 40;
  o.min_p = 0.05f;
  o.repetition_penalty = 1.1f;
  o.frequency_penalty = -0.5f;
  o.presence_penalty = 0.25f;
  o.logit_bias = {{0, -100.0f}, {2147483647, 0.5f}};
  o.seed = std::numeric_limits<uint64_t>::max();
  o.stop = {"\n\n", "stop \xe2\x9c\x93"};
  o.stop_token_ids = {7, 8};
  o.include_stop_str_in_output = true;
  o.ignore_eos = true;
  o.max_tokens = 100;
  o.min_tokens = 2;
  o.logprobs = 5;
  o.prompt_logprobs = 0;
  o.structured_outputs = StructuredOutputs{StructuredOutputs::Kind::kChoice, "", {"y\xc3\xa9s", ""}, {}};
  Add b = round_trip(a);
  EXPECT_EQ(b.engine, 3);
  EXPECT_EQ(b.ticket, a.ticket);
  EXPECT_EQ(b.prompt, a.prompt);
  EXPECT_EQ(b.options.n, 3);
  EXPECT_EQ(b.options.temperature, 0.7f);
  EXPECT_EQ(b.options.top_p, 0.9f);
  EXPECT_EQ(b.options.top_k, 40);
  EXPECT_EQ(b.options.min_p, 0.05f);
  EXPECT_EQ(b.options.repetition_penalty, 1.1f);
  EXPECT_EQ(b.options.frequency_penalty, -0.5f);
  EXPECT_EQ(b.options.presence_penalty, 0.25f);
  EXPECT_EQ(b.options.logit_bias, o.logit_bias);
  EXPECT_EQ(b.options.seed, o.seed);
  EXPECT_EQ(b.options.stop, o.stop);
  EXPECT_EQ(b.options.stop_token_ids, o.stop_token_ids);
  EXPECT_TRUE(b.options.include_stop_str_in_output);
  EXPECT_TRUE(b.options.ignore_eos);
  EXPECT_EQ(b.options.max_tokens, 100);
  EXPECT_EQ(b.options.min_tokens, 2);
  EXPECT_EQ(b.options.logprobs, 5);
  EXPECT_EQ(b.options.prompt_logprobs, 0);
  EXPECT_EQ(b.options.structured_outputs, o.structured_outputs);
  a.options.structured_outputs =
      StructuredOutputs{StructuredOutputs::Kind::kJson, R"({"type": "object"})", {}, {}};
  EXPECT_EQ(round_trip(a).options.structured_outputs, a.options.structured_outputs);
  a.options.structured_outputs = StructuredOutputs{
      StructuredOutputs::Kind::kGrammar, "root ::= args", {}, {{"args", R"({"type": "object"})"}}};
  EXPECT_EQ(round_trip(a).options.structured_outputs, a.options.structured_outputs);

  Add unset;
  Add c = round_trip(unset);
  EXPECT_FALSE(c.options.seed.has_value());
  EXPECT_FALSE(c.options.logprobs.has_value());
  EXPECT_FALSE(c.options.prompt_logprobs.has_value());
  EXPECT_FALSE(c.options.structured_outputs.has_value());
  EXPECT_TRUE(c.options.logit_bias.empty());
}

TEST(EngineMessages, OutputKeepsLogprobsBitForBit) {
  Output o;
  o.engine = 1;
  o.delta.index = 12;
  o.delta.text = "h\xc3\xa9llo";
  o.delta.token_ids = {4, 5};
  SampleResult r;
  r.token = 4;
  r.logprob = -0.123456789f;
  r.rank = 2;
  r.top_logprobs = {{9, -0.01f}, {4, -0.123456789f}, {3, -std::numeric_limits<float>::infinity()}};
  o.delta.logprobs = {r, r};
  o.delta.prompt_logprobs = {r};
  o.delta.finish_reason = "length";
  Output p = round_trip(o);
  EXPECT_EQ(p.engine, 1);
  EXPECT_EQ(p.delta.index, 12);
  EXPECT_EQ(p.delta.text, o.delta.text);
  EXPECT_EQ(p.delta.token_ids, o.delta.token_ids);
  ASSERT_EQ(p.delta.logprobs.size(), 2u);
  EXPECT_EQ(p.delta.logprobs[0].logprob, r.logprob);
  EXPECT_EQ(p.delta.logprobs[0].rank, 2);
  ASSERT_EQ(p.delta.logprobs[0].top_logprobs.size(), 3u);
  EXPECT_EQ(p.delta.logprobs[0].top_logprobs[1].logprob, -0.123456789f);
  EXPECT_TRUE(std::isinf(p.delta.logprobs[0].top_logprobs[2].logprob));
  EXPECT_EQ(p.delta.prompt_logprobs.size(), 1u);
  EXPECT_EQ(p.delta.finish_reason, "length");

  Output unfinished;
  EXPECT_FALSE(round_trip(unfinished).delta.finish_reason.has_value());
}

TEST(EngineMessages, TheRestRoundTrip) {
  Added a{2, 77, "", {10, 11}, StatusCode::kOk};
  Added b = round_trip(a);
  EXPECT_EQ(b.ids, a.ids);
  EXPECT_EQ(b.ticket, 77);
  // The error's kind travels with it: the API server answers as for its own engine.
  Added refused = round_trip(Added{2, 78, "prompt too long", {}, StatusCode::kResourceExhausted});
  EXPECT_EQ(refused.error, "prompt too long");
  EXPECT_EQ(refused.code, StatusCode::kResourceExhausted);
  Abort ab = round_trip(Abort{1, 99});
  EXPECT_EQ(ab.engine, 1);
  EXPECT_EQ(ab.id, 99u);
  Stats s;
  s.engine = 1;
  s.stats.n_running = 3;
  s.stats.n_waiting = 4;
  s.stats.n_preemptions = int64_t{1} << 35;
  s.stats.n_free_blocks = 9;
  Stats t = round_trip(s);
  EXPECT_EQ(t.stats.n_running, 3);
  EXPECT_EQ(t.stats.n_waiting, 4);
  EXPECT_EQ(t.stats.n_preemptions, int64_t{1} << 35);
  EXPECT_EQ(t.stats.n_free_blocks, 9);
  Event e{1, Event::Kind::kFinished, 5, 6, 0.25, "stop", ""};
  Event f = round_trip(e);
  EXPECT_EQ(f.kind, Event::Kind::kFinished);
  EXPECT_EQ(f.n_prompt_tokens, 5);
  EXPECT_EQ(f.n_generated_tokens, 6);
  EXPECT_EQ(f.seconds, 0.25);
  EXPECT_EQ(f.finish_reason, "stop");
  Event lost = round_trip(Event{1, Event::Kind::kLost, 0, 0, 0.0, "", "rank 1 (pid 7) was killed"});
  EXPECT_EQ(lost.kind, Event::Kind::kLost);
  EXPECT_EQ(lost.error, "rank 1 (pid 7) was killed");
  EXPECT_EQ(round_trip(Reject{"no"}).error, "no");
  EXPECT_EQ(round_trip(Shutdown{"rank 2 never came"}).error, "rank 2 never came");
  EXPECT_EQ(round_trip(Shutdown{}).error, "");
  round_trip(Welcome{});
  round_trip(Ping{});
}

TEST(EngineMessages, InvalidUtf8IsReplacedNotThrown) {
  Reject r{"bad \xff\xfe bytes"};
  Result<Message> d = decode(encode(r));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_NE(std::get<Reject>(*d).error.find("bad "), std::string::npos);
}

void expect_bad(std::string_view text, const std::string& mentions) {
  Result<Message> d = decode(text);
  ASSERT_FALSE(d.ok()) << text;
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find(mentions), std::string::npos)
      << text << " -> " << d.status().message();
}

TEST(EngineMessages, MalformedMessagesAreErrors) {
  expect_bad("", "not JSON");
  expect_bad("{\"type\":", "not JSON");
  expect_bad("[1,2]", "not a JSON object");
  expect_bad("{}", "missing field \"type\"");
  expect_bad("{\"type\":7}", "\"type\" is not a string");
  expect_bad("{\"type\":\"launch\"}", "unknown message type");
  expect_bad("{\"type\":\"abort\",\"engine\":1}", "missing field \"id\"");
  expect_bad("{\"type\":\"abort\",\"engine\":1.5,\"id\":1}", "\"engine\" is not an integer");
  expect_bad("{\"type\":\"abort\",\"engine\":\"1\",\"id\":1}", "\"engine\" is not an integer");
  expect_bad("{\"type\":\"abort\",\"engine\":1,\"id\":-1}", "\"id\" is negative");
  expect_bad("{\"type\":\"abort\",\"engine\":4294967296,\"id\":1}", "\"engine\" is out of range");
  expect_bad("{\"type\":\"abort\",\"engine\":18446744073709551615,\"id\":1}", "out of range");
  expect_bad("{\"type\":\"event\",\"engine\":0,\"kind\":\"boom\",\"n_prompt_tokens\":0,"
             "\"n_generated_tokens\":0,\"seconds\":0,\"finish_reason\":\"\"}",
             "unknown event kind");
  // A valid add with one field broken at a time.
  Add a;
  a.prompt = {1, 2};
  std::string good = encode(a);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  expect_bad(with("\"temperature\":1.0", "\"temperature\":1e300"), "\"temperature\" is out of range");
  expect_bad(with("\"temperature\":1.0", "\"temperature\":null"), "\"temperature\" is not a number");
  expect_bad(with("\"prompt\":[1,2]", "\"prompt\":[1,\"x\"]"), "\"prompt\" is not an integer");
  expect_bad(with("\"prompt\":[1,2]", "\"prompt\":{}"), "\"prompt\" is not an array");
  expect_bad(with("\"prompt\":[1,2]", "\"prompt\":[1,3000000000]"), "\"prompt\" is out of range");
  expect_bad(with("\"stop\":[]", "\"stop\":[3]"), "\"stop\" holds a non-string");
  expect_bad(with("\"ignore_eos\":false", "\"ignore_eos\":0"), "\"ignore_eos\" is not a boolean");
  expect_bad(with("\"seed\":null", "\"seed\":-3"), "\"seed\" is negative");
  expect_bad(with("\"options\":{", "\"options\":7,\"x\":{"), "\"options\" is not an object");
  expect_bad(with("\"structured_outputs\":null", "\"structured_outputs\":3"),
             "\"structured_outputs\" is not an object");
  expect_bad(with("\"structured_outputs\":null",
                  "\"structured_outputs\":{\"kind\":9,\"text\":\"\",\"choices\":[]}"),
             "\"structured_outputs.kind\" is out of range");
  expect_bad(with("\"structured_outputs\":null",
                  "\"structured_outputs\":{\"kind\":3,\"text\":\"\",\"choices\":[1]}"),
             "holds a non-string");
  expect_bad(with("\"structured_outputs\":null", "\"structured_outputs\":{\"kind\":0}"),
             "missing field \"text\"");
  expect_bad(with("\"structured_outputs\":null",
                  "\"structured_outputs\":{\"kind\":4,\"text\":\"\",\"choices\":[],"
                  "\"schema_rules\":[[\"a\"]]}"),
             "holds a non-pair");
}

// Truncations and byte flips of valid messages decode or fail cleanly.
TEST(EngineMessages, MangledMessagesNeverCrash) {
  Output o;
  o.delta.text = "abc";
  o.delta.token_ids = {1, 2, 3};
  SampleResult r;
  r.top_logprobs = {{1, -1.0f}};
  o.delta.logprobs = {r};
  o.delta.finish_reason = "stop";
  Add a;
  a.prompt = {5, 6};
  a.options.seed = 3;
  Hello h;
  h.ranks = {1};
  std::mt19937 rng(7);
  for (const std::string& good : {encode(o), encode(a), encode(h), encode(Stats{})}) {
    for (size_t n = 0; n < good.size(); ++n) (void)decode(std::string_view(good).substr(0, n));
    for (int k = 0; k < 2000; ++k) {
      std::string s = good;
      s[rng() % s.size()] = static_cast<char>(rng() % 256);
      Result<Message> d = decode(s);
      if (d.ok()) (void)encode(*d);
    }
  }
}

}  // namespace
}  // namespace dserve::engine_msg
