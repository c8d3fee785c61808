#include "cli/bench_datasets.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace dserve::cli {
namespace {

// One token per word "wN" (N < 100), written " wN"; id 100 is "<s>", a special BOS
// added by add_special_tokens when `bos` is set. Anything else is word 0.
class WordTokenizer final : public Tokenizer {
 public:
  explicit WordTokenizer(bool bos) : bos_(bos) {}
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    if (add_special_tokens && bos_) ids.push_back(kBos);
    std::istringstream in{std::string(text)};
    std::string w;
    while (in >> w) ids.push_back(w.size() > 1 && w[0] == 'w' ? std::atoi(w.c_str() + 1) % 100 : 0);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id == kBos && skip_special) continue;
      s += token_bytes(id);
    }
    return s;
  }
  std::string token_bytes(int32_t id) const override {
    if (id == kBos) return "<s>";
    return id >= 0 && id < kBos ? " w" + std::to_string(id) : std::string();
  }
  bool is_special(int32_t id) const override { return id == kBos; }
  int32_t token_to_id(std::string_view) const override { return -1; }
  int32_t vocab_size() const override { return kBos + 1; }
  int32_t bos_id() const override { return bos_ ? kBos : -1; }
  int32_t eos_id() const override { return -1; }
  std::vector<int32_t> stop_ids() const override { return {}; }
  const std::string& chat_template() const override { return empty_; }

 private:
  static constexpr int32_t kBos = 100;
  bool bos_;
  std::string empty_;
};

std::string words(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? " w" : "w") + std::to_string(i % 100);
  return s;
}

nlohmann::json conv(const std::string& prompt, const std::string& reply) {
  return {{"conversations",
           {{{"from", "human"}, {"value", prompt}}, {{"from", "gpt"}, {"value", reply}}}}};
}

TEST(ShareGpt, ValidityRulesAsVllm) {
  EXPECT_TRUE(sharegpt_pair_is_valid(4, 4, false));
  EXPECT_FALSE(sharegpt_pair_is_valid(3, 4, false));
  EXPECT_FALSE(sharegpt_pair_is_valid(4, 3, false));
  EXPECT_TRUE(sharegpt_pair_is_valid(4, 3, true));  // the output length was given
  EXPECT_TRUE(sharegpt_pair_is_valid(1024, 1024, false));
  EXPECT_FALSE(sharegpt_pair_is_valid(1025, 10, false));
  EXPECT_FALSE(sharegpt_pair_is_valid(1000, 1049, false));
}

TEST(ShareGpt, FiltersShufflesAndCounts) {
  WordTokenizer tok(/*bos=*/false);
  nlohmann::json data = nlohmann::json::array();
  data.push_back(conv(words(4), words(4)));        // ok: 4 + 4
  data.push_back(conv(words(3), words(10)));       // prompt too short
  data.push_back(conv(words(10), words(3)));       // reply too short
  data.push_back(conv(words(1025), words(10)));    // prompt too long
  data.push_back(conv(words(1000), words(1049)));  // total too long
  data.push_back(conv(words(1000), words(1048)));  // ok: exactly 2048
  data.push_back({{"conversations", {{{"from", "human"}, {"value", words(8)}}}}});  // one turn
  data.push_back({{"other", 1}});                                                   // no turns
  data.push_back(conv(words(6), words(7)));                                         // ok
  ShareGptOptions o;
  o.num_prompts = 10;
  o.oversample = false;
  auto r = sample_sharegpt_json(tok, data, o, "test.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::multiset<std::pair<int, int>> got;
  for (const SampleRequest& s : *r) {
    got.emplace(s.prompt_len, s.expected_output_len);
    EXPECT_EQ(static_cast<int>(s.prompt_ids.size()), s.prompt_len);
  }
  EXPECT_EQ(got, (std::multiset<std::pair<int, int>>{{4, 4}, {1000, 1048}, {6, 7}}));

  o.num_prompts = 2;  // the first two of the shuffled order, the same for the same seed
  auto a = sample_sharegpt_json(tok, data, o, "t");
  auto b = sample_sharegpt_json(tok, data, o, "t");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[0].prompt, (*b)[0].prompt);
  EXPECT_EQ((*a)[1].prompt, (*b)[1].prompt);

  o.num_prompts = 7;  // vLLM's oversampling repeats usable ones
  o.oversample = true;
  auto c = sample_sharegpt_json(tok, data, o, "t");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->size(), 7u);

  o.output_len = 2;  // a fixed output length skips the minimum-output check
  o.num_prompts = 10;
  o.oversample = false;
  auto d = sample_sharegpt_json(tok, data, o, "t");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->size(), 5u);  // + the "reply too short" and "total too long" pairs
  for (const SampleRequest& s : *d) EXPECT_EQ(s.expected_output_len, 2);
}

TEST(ShareGpt, SpecialTokensCountAsVllmCountsThem) {
  WordTokenizer tok(/*bos=*/true);  // tokenizer(text).input_ids: BOS + words
  nlohmann::json data = nlohmann::json::array({conv(words(3), words(3))});
  ShareGptOptions o;
  o.num_prompts = 1;
  auto r = sample_sharegpt_json(tok, data, o, "t");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].prompt_len, 4);
  EXPECT_EQ((*r)[0].expected_output_len, 4);
}

TEST(ShareGpt, BadInputIsAnError) {
  WordTokenizer tok(false);
  ShareGptOptions o;
  EXPECT_FALSE(sample_sharegpt_json(tok, nlohmann::json::object(), o, "t").ok());
  EXPECT_FALSE(sample_sharegpt_json(tok, nlohmann::json::array({conv("a", "b")}), o, "t").ok());
  nlohmann::json odd = nlohmann::json::array(
      {{{"conversations", {1, 2}}}, {{"conversations", {{{"value", 3}}, {{"value", "x"}}}}}});
  EXPECT_FALSE(sample_sharegpt_json(tok, odd, o, "t").ok());  // skipped, none usable
  o.path = "/nonexistent/sharegpt.json";
  EXPECT_EQ(sample_sharegpt(tok, o).status().code(), StatusCode::kNotFound);
}

TEST(Random, ExactLengthsRangeAndSharedPrefix) {
  WordTokenizer tok(/*bos=*/true);
  RandomDatasetOptions o;
  o.num_prompts = 50;
  o.input_len = 32;
  o.output_len = 16;
  auto r = sample_random(tok, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 50u);
  for (const SampleRequest& s : *r) {
    EXPECT_EQ(s.prompt_len, 32);  // BOS included, as vLLM counts --random-input-len
    EXPECT_EQ(s.expected_output_len, 16);
    EXPECT_EQ(tok.encode(s.prompt, true), s.prompt_ids);
  }

  o.range_ratio = 0.5;
  o.prefix_len = 10;
  auto q = sample_random(tok, o);
  ASSERT_TRUE(q.ok());
  std::set<int> in_lens;
  const std::vector<int32_t> p0((*q)[0].prompt_ids.begin(), (*q)[0].prompt_ids.begin() + 11);
  for (const SampleRequest& s : *q) {
    // 31 non-special tokens * [0.5, 1.5] -> [15, 46], plus BOS and the prefix.
    EXPECT_GE(s.prompt_len, 1 + 10 + 15);
    EXPECT_LE(s.prompt_len, 1 + 10 + 46);
    EXPECT_GE(s.expected_output_len, 8);
    EXPECT_LE(s.expected_output_len, 24);
    EXPECT_EQ(std::vector<int32_t>(s.prompt_ids.begin(), s.prompt_ids.begin() + 11), p0);
    in_lens.insert(s.prompt_len);
  }
  EXPECT_GT(in_lens.size(), 5u);

  o.range_ratio = 1.0;
  EXPECT_FALSE(sample_random(tok, o).ok());
  o.range_ratio = 0;
  o.output_len = 0;
  EXPECT_FALSE(sample_random(tok, o).ok());
}

TEST(Random, WithoutTokenizerRawIds) {
  RandomDatasetOptions o;
  o.num_prompts = 3;
  o.input_len = 7;
  o.output_len = 5;
  auto r = sample_random_ids(50, o);
  ASSERT_TRUE(r.ok());
  for (const SampleRequest& s : *r) {
    EXPECT_EQ(s.prompt_len, 7);
    EXPECT_TRUE(s.prompt.empty());
    for (int32_t id : s.prompt_ids) EXPECT_LT(id, 50);
  }
}

TEST(PrefixRepetition, PrefixesSharedEvenly) {
  WordTokenizer tok(/*bos=*/false);
  PrefixRepetitionOptions o;
  o.num_prompts = 23;  // rounds down to 5 prefixes x 4
  o.num_prefixes = 5;
  o.prefix_len = 12;
  o.suffix_len = 6;
  o.output_len = 9;
  auto r = sample_prefix_repetition(tok, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 20u);
  std::map<std::vector<int32_t>, int> per_prefix;
  for (const SampleRequest& s : *r) {
    EXPECT_EQ(s.prompt_len, 18);
    EXPECT_EQ(s.expected_output_len, 9);
    ++per_prefix[std::vector<int32_t>(s.prompt_ids.begin(), s.prompt_ids.begin() + 12)];
  }
  EXPECT_EQ(per_prefix.size(), 5u);
  for (auto& [p, n] : per_prefix) EXPECT_EQ(n, 4);
  o.num_prompts = 4;  // fewer prompts than prefixes
  EXPECT_FALSE(sample_prefix_repetition(tok, o).ok());
}

}  // namespace
}  // namespace dserve::cli
