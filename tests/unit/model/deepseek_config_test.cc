#include "model/deepseek_config.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/mla_kv_cache.h"
#include "tensor/half.h"

namespace dserve {
namespace {

using nlohmann::json;

// The fields of DeepSeek-V3's own config.json (671B), as shipped.
json v3_json() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc",
    "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1,
    "first_k_dense_replace": 3, "norm_topk_prob": true, "scoring_func": "sigmoid",
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "num_nextn_predict_layers": 1, "bos_token_id": 0, "eos_token_id": 1,
    "tie_word_embeddings": false
  })");
}

TEST(DeepseekConfigTest, ParsesV3) {
  Result<DeepseekConfig> r = DeepseekConfig::from_hf_json(v3_json(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const DeepseekConfig& c = *r;
  EXPECT_EQ(c.version, DeepseekVersion::kV3);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.latent_dim(), 576);  // the per-token, per-layer latent cache row
  EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.5f);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_EQ(c.rope.type, RopeScalingType::kYarn);
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  // softmax scale = 192^-0.5 * (0.1 * 1.0 * ln 40 + 1)^2
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.softmax_scale(), m * m / std::sqrt(192.0), 1e-7);
}

TEST(DeepseekConfigTest, LatentKvCacheSize) {
  Result<DeepseekConfig> r = DeepseekConfig::from_hf_json(v3_json(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  CpuBackendOptions options;
  options.n_threads = 1;
  std::unique_ptr<Backend> backend = make_cpu_backend(options);
  MlaKvCache kv(*backend, *r, 16);
  // (kv_lora_rank + qk_rope_head_dim) x layers x sizeof(float): 576 x 61 x 4.
  EXPECT_EQ(kv.bytes_per_token(), size_t{576} * 61 * 4);
  EXPECT_EQ(kv.total_bytes(), kv.bytes_per_token() * 16);
  EXPECT_EQ(kv.row_dim(), 576);
  EXPECT_EQ(kv.latent(1) - kv.latent(0), 16 * 576);
}

TEST(DeepseekConfigTest, ParsesV2LiteWithoutQLora) {
  json j = v3_json();
  j["architectures"] = {"DeepseekV2ForCausalLM"};
  j["model_type"] = "deepseek_v2";
  j["q_lora_rank"] = nullptr;
  j["topk_method"] = "greedy";
  j["scoring_func"] = "softmax";
  j["n_routed_experts"] = 64;
  j["num_experts_per_tok"] = 6;
  j["first_k_dense_replace"] = 1;
  j["norm_topk_prob"] = false;
  j.erase("num_nextn_predict_layers");
  j["rope_scaling"] = {{"type", "default"}};
  Result<DeepseekConfig> r = DeepseekConfig::from_hf_json(j, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->version, DeepseekVersion::kV2);
  EXPECT_EQ(r->q_lora_rank, 0);
  EXPECT_EQ(r->topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(r->scoring_func, ScoringFunc::kSoftmax);
  EXPECT_EQ(r->num_nextn_predict_layers, 0);
  EXPECT_NEAR(r->softmax_scale(), 1.0 / std::sqrt(192.0), 1e-7);  // no YaRN, no mscale
}

TEST(DeepseekConfigTest, MoeLayerFrequency) {
  json j = v3_json();
  j["first_k_dense_replace"] = 1;
  j["moe_layer_freq"] = 2;
  Result<DeepseekConfig> r = DeepseekConfig::from_hf_json(j, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->is_moe_layer(0));
  EXPECT_FALSE(r->is_moe_layer(1));
  EXPECT_TRUE(r->is_moe_layer(2));
  EXPECT_FALSE(r->is_moe_layer(3));
}

TEST(DeepseekConfigTest, RejectsBadFields) {
  struct Case {
    const char* key;
    json value;
    const char* message;
  };
  const Case cases[] = {
      {"kv_lora_rank", nullptr, "'kv_lora_rank' is missing"},
      {"topk_method", "fancy", "unsupported topk_method 'fancy'"},
      {"scoring_func", "tanh", "unsupported scoring_func 'tanh'"},
      {"n_group", 7, "not a multiple of n_group 7"},
      {"topk_group", 9, "topk_group must be in [1, n_group]"},
      {"num_experts_per_tok", 300, "num_experts_per_tok 300"},
      {"qk_rope_head_dim", 63, "qk_rope_head_dim must be positive and even"},
  };
  for (const Case& k : cases) {
    json j = v3_json();
    j[k.key] = k.value;
    Result<DeepseekConfig> r = DeepseekConfig::from_hf_json(j, nullptr, "cfg.json");
    ASSERT_FALSE(r.ok()) << k.key;
    EXPECT_NE(r.status().message().find(k.message), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("cfg.json"), std::string::npos);
  }
}

TEST(DeepseekConfigTest, Fp8E4m3Decoding) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);  // exponent 7 = bias
  EXPECT_EQ(fp8_e4m3_to_f32(0xb8), -1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);        // the largest finite value
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0.001953125f);  // smallest subnormal, 2^-9
  EXPECT_EQ(fp8_e4m3_to_f32(0x3c), 1.5f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
}

}  // namespace
}  // namespace dserve
