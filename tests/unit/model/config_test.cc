#include "model/config.h"

#include <gtest/gtest.h>

#include "loader/gguf_file.h"

namespace dserve {
namespace {

using nlohmann::json;

json llama_json() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 1024,
    "tie_word_embeddings": true, "rope_theta": 50000.0, "bos_token_id": 1, "eos_token_id": 2
  })");
}

TEST(ConfigTest, ParsesLlama) {
  Result<ModelConfig> r = ModelConfig::from_hf_json(llama_json(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.kv_dim(), 64);
  EXPECT_EQ(c.n_heads_per_kv(), 2);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.rope.type, RopeScalingType::kDefault);
  EXPECT_EQ(c.rope.theta, 50000.0);
  EXPECT_EQ(c.rope.rotary_dim, 32);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, std::vector<int32_t>{2});
}

TEST(ConfigTest, GenerationConfigOverridesEos) {
  json gen = json::parse(R"({"eos_token_id": [2, 7]})");
  Result<ModelConfig> r = ModelConfig::from_hf_json(llama_json(), &gen);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->eos_ids, (std::vector<int32_t>{2, 7}));
}

TEST(ConfigTest, Qwen2HasQkvBias) {
  json j = llama_json();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["head_dim"] = 16;
  Result<ModelConfig> r = ModelConfig::from_hf_json(j, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->arch, Architecture::kQwen2);
  EXPECT_TRUE(r->qkv_bias);
  EXPECT_FALSE(r->o_bias);
  EXPECT_EQ(r->head_dim, 16);
  EXPECT_EQ(r->q_dim(), 64);
}

TEST(ConfigTest, LlamaAttentionBias) {
  json j = llama_json();
  j["attention_bias"] = true;
  Result<ModelConfig> r = ModelConfig::from_hf_json(j, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->qkv_bias);
  EXPECT_TRUE(r->o_bias);
}

TEST(ConfigTest, UnsupportedArchitectureIsNamed) {
  json j = llama_json();
  j["architectures"] = {"GPT2LMHeadModel"};
  Result<ModelConfig> r = ModelConfig::from_hf_json(j, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("GPT2LMHeadModel"), std::string::npos)
      << r.status().message();
}

TEST(ConfigTest, MissingAndMistypedFields) {
  json j = llama_json();
  j.erase("hidden_size");
  Result<ModelConfig> r = ModelConfig::from_hf_json(j, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("hidden_size"), std::string::npos);

  j = llama_json();
  j["num_attention_heads"] = "four";
  r = ModelConfig::from_hf_json(j, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_attention_heads"), std::string::npos);

  j = llama_json();
  j["num_key_value_heads"] = 3;  // does not divide 4
  r = ModelConfig::from_hf_json(j, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_key_value_heads"), std::string::npos);

  r = ModelConfig::from_hf_json(json::array(), nullptr);
  EXPECT_FALSE(r.ok());
}

TEST(ConfigTest, LegacyRopeScalingLlama3) {
  json j = llama_json();
  j["rope_scaling"] = json::parse(R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 256})");
  Result<ModelConfig> r = ModelConfig::from_hf_json(j, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->rope.type, RopeScalingType::kLlama3);
  EXPECT_EQ(r->rope.factor, 8.0);
  EXPECT_EQ(r->rope.high_freq_factor, 4.0);
  EXPECT_EQ(r->rope.original_max_position_embeddings, 256);
  EXPECT_EQ(r->rope.theta, 50000.0);
}

TEST(ConfigTest, RopeParametersYarn) {
  // transformers 5 layout: theta inside rope_parameters; yarn without
  // original_max_position_embeddings falls back to max_position_embeddings.
  json j = llama_json();
  j.erase("rope_theta");
  j["rope_parameters"] = json::parse(R"({"rope_type": "yarn", "factor": 4.0, "rope_theta": 20000.0,
    "beta_fast": 16, "mscale": 0.707, "mscale_all_dim": 1.0})");
  Result<ModelConfig> r = ModelConfig::from_hf_json(j, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->rope.type, RopeScalingType::kYarn);
  EXPECT_EQ(r->rope.theta, 20000.0);
  EXPECT_EQ(r->rope.beta_fast, 16.0);
  EXPECT_EQ(r->rope.beta_slow, 1.0);
  EXPECT_EQ(r->rope.original_max_position_embeddings, 1024);
  ASSERT_TRUE(r->rope.mscale.has_value());
  EXPECT_DOUBLE_EQ(*r->rope.mscale, 0.707);
  EXPECT_FALSE(r->rope.attention_factor.has_value());
}

TEST(ConfigTest, UnknownRopeTypeIsUnimplemented) {
  json j = llama_json();
  j["rope_scaling"] = json::parse(R"({"type": "longrope", "factor": 2.0})");
  Result<ModelConfig> r = ModelConfig::from_hf_json(j, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("longrope"), std::string::npos);
}

GgufMetadata smollm_metadata() {
  GgufMetadata md;
  md.source = "test.gguf";
  auto& v = md.mutable_values();
  v["general.architecture"] = std::string("llama");
  v["llama.block_count"] = int64_t{30};
  v["llama.context_length"] = int64_t{8192};
  v["llama.embedding_length"] = int64_t{576};
  v["llama.feed_forward_length"] = int64_t{1536};
  v["llama.attention.head_count"] = int64_t{9};
  v["llama.attention.head_count_kv"] = int64_t{3};
  v["llama.rope.freq_base"] = 100000.0;
  v["llama.attention.layer_norm_rms_epsilon"] = 1e-5;
  v["llama.vocab_size"] = int64_t{49152};
  v["llama.rope.dimension_count"] = int64_t{64};
  v["tokenizer.ggml.bos_token_id"] = int64_t{1};
  v["tokenizer.ggml.eos_token_id"] = int64_t{2};
  return md;
}

TEST(ConfigTest, ParsesGgufLlama) {
  Result<ModelConfig> r = ModelConfig::from_gguf(smollm_metadata(), /*has_output_weight=*/false);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->n_layers, 30);
  EXPECT_EQ(r->hidden_size, 576);
  EXPECT_EQ(r->n_heads, 9);
  EXPECT_EQ(r->n_kv_heads, 3);
  EXPECT_EQ(r->head_dim, 64);
  EXPECT_EQ(r->rope.rotary_dim, 64);
  EXPECT_EQ(r->rope.theta, 100000.0);
  EXPECT_EQ(r->max_position_embeddings, 8192);
  EXPECT_TRUE(r->tie_word_embeddings);
  EXPECT_EQ(r->eos_ids, std::vector<int32_t>{2});
}

TEST(ConfigTest, GgufUnsupportedArchitecture) {
  GgufMetadata md = smollm_metadata();
  md.mutable_values()["general.architecture"] = std::string("gpt2");
  Result<ModelConfig> r = ModelConfig::from_gguf(md, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gpt2"), std::string::npos);
}

TEST(ConfigTest, GgufMissingKeyFails) {
  GgufMetadata md = smollm_metadata();
  md.mutable_values().erase("llama.block_count");
  Result<ModelConfig> r = ModelConfig::from_gguf(md, true);
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace dserve
