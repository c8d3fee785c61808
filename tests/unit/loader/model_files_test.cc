#include "loader/model_files.h"

#include <gtest/gtest.h>

#include "test_files.h"

namespace dserve {
namespace {

using nlohmann::json;
using testing::f32_bytes;
using testing::GgufBuilder;
using testing::safetensors_bytes;
using testing::scratch_dir;
using testing::write_file;

void expect_error(const std::string& path, StatusCode code, const std::string& file,
                  const std::string& needle) {
  auto r = ModelFiles::open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(file), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
}

std::string shard(const std::string& name, float value) {
  json h = {{name, {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}}};
  return safetensors_bytes(h, f32_bytes({value, value}));
}

void write_config(const std::string& dir) {
  write_file(dir + "/config.json", R"({"model_type": "llama", "hidden_size": 2})");
}

TEST(ModelFiles, HfSingleFile) {
  const std::string dir = scratch_dir();
  write_config(dir);
  write_file(dir + "/tokenizer_config.json", R"({"bos_token": "<s>"})");
  write_file(dir + "/model.safetensors", shard("model.norm.weight", 1.5f));
  auto r = ModelFiles::open(dir + "/");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelFiles& m = **r;
  EXPECT_EQ(m.format(), ModelFormat::kHuggingFace);
  EXPECT_EQ(m.path(), dir);
  ASSERT_NE(m.hf_config(), nullptr);
  EXPECT_EQ((*m.hf_config())["hidden_size"], 2);
  EXPECT_EQ(m.generation_config(), nullptr);
  EXPECT_EQ(m.tokenizer_json(), nullptr);
  ASSERT_NE(m.tokenizer_config(), nullptr);
  EXPECT_EQ(m.gguf_metadata(), nullptr);
  EXPECT_FALSE(m.rope_pairs_interleaved());
  auto t = m.get("model.norm.weight");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(static_cast<const float*>((*t)->data)[1], 1.5f);
  EXPECT_EQ(m.total_tensor_bytes(), 8u);
  Status missing = m.get("lm_head.weight").status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("lm_head.weight"), std::string::npos);
}

TEST(ModelFiles, HfSharded) {
  const std::string dir = scratch_dir();
  write_config(dir);
  write_file(dir + "/model-00001-of-00002.safetensors", shard("a", 1));
  write_file(dir + "/model-00002-of-00002.safetensors", shard("b", 2));
  json index = {{"weight_map",
                 {{"a", "model-00001-of-00002.safetensors"},
                  {"b", "model-00002-of-00002.safetensors"}}}};
  write_file(dir + "/model.safetensors.index.json", index.dump());
  auto r = ModelFiles::open(dir);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->tensors().size(), 2u);
  EXPECT_EQ(static_cast<const float*>((*r)->find("b")->data)[0], 2.0f);

  // The index names a tensor its shard lacks.
  index["weight_map"]["c"] = "model-00002-of-00002.safetensors";
  write_file(dir + "/model.safetensors.index.json", index.dump());
  expect_error(dir, StatusCode::kNotFound, "model-00002-of-00002.safetensors", "'c'");

  // The index points at a missing shard.
  index["weight_map"]["c"] = "model-00003-of-00003.safetensors";
  write_file(dir + "/model.safetensors.index.json", index.dump());
  expect_error(dir, StatusCode::kNotFound, dir + "/model-00003-of-00003.safetensors", "missing");

  // Two shards hold the same tensor.
  write_file(dir + "/model-00002-of-00002.safetensors", shard("a", 2));
  index["weight_map"].erase("c");
  write_file(dir + "/model.safetensors.index.json", index.dump());
  expect_error(dir, StatusCode::kCorrupt, "model-00002-of-00002.safetensors", "another shard");

  // Paths outside the model directory.
  index["weight_map"]["a"] = "../elsewhere.safetensors";
  write_file(dir + "/model.safetensors.index.json", index.dump());
  expect_error(dir, StatusCode::kCorrupt, "model.safetensors.index.json", "weight_map['a']");

  write_file(dir + "/model.safetensors.index.json", R"({"weight_map": 3})");
  expect_error(dir, StatusCode::kCorrupt, "model.safetensors.index.json", "weight_map");
}

TEST(ModelFiles, HfErrors) {
  const std::string dir = scratch_dir();
  expect_error(dir + "/nothing", StatusCode::kNotFound, dir + "/nothing", "no such file");
  expect_error(dir, StatusCode::kNotFound, dir, "no config.json");

  write_file(dir + "/config.json", "{\"model_type\": ");
  expect_error(dir, StatusCode::kCorrupt, dir + "/config.json", "invalid JSON");
  write_file(dir + "/config.json", "[1]");
  expect_error(dir, StatusCode::kCorrupt, dir + "/config.json", "JSON object");

  write_config(dir);
  expect_error(dir, StatusCode::kNotFound, dir, "no model.safetensors");

  write_file(dir + "/model.safetensors", "short");
  expect_error(dir, StatusCode::kCorrupt, dir + "/model.safetensors", "truncated");

  write_file(dir + "/model.safetensors", shard("x", 1));
  write_file(dir + "/tokenizer.json", "{oops");
  expect_error(dir, StatusCode::kCorrupt, dir + "/tokenizer.json", "invalid JSON");

  write_file(dir + "/weights.bin", "1234");
  expect_error(dir + "/weights.bin", StatusCode::kInvalidArgument, dir + "/weights.bin",
               "expected");
}

TEST(ModelFiles, GgufNamesAreMapped) {
  const std::string dir = scratch_dir();
  GgufBuilder b;
  b.kv_string("general.architecture", "llama");
  for (const char* name :
       {"token_embd.weight", "output_norm.weight", "output.weight", "blk.0.attn_norm.weight",
        "blk.0.attn_q.weight", "blk.0.attn_q.bias", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
        "blk.0.attn_output.weight", "blk.0.ffn_norm.weight", "blk.11.ffn_gate.weight",
        "blk.11.ffn_up.weight", "blk.11.ffn_down.weight", "rope_freqs.weight",
        "blk.0.nextn.eh_proj.weight"}) {
    b.f32_tensor(name, {4});
  }
  write_file(dir + "/m.gguf", b.build());
  auto r = ModelFiles::open(dir + "/m.gguf");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelFiles& m = **r;
  EXPECT_EQ(m.format(), ModelFormat::kGguf);
  EXPECT_TRUE(m.rope_pairs_interleaved());
  EXPECT_EQ(m.hf_config(), nullptr);
  ASSERT_NE(m.gguf_metadata(), nullptr);
  ASSERT_NE(m.gguf(), nullptr);
  std::vector<std::string> names;
  for (const auto& [name, t] : m.tensors()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "blk.0.nextn.eh_proj.weight",
                       "lm_head.weight",
                       "model.embed_tokens.weight",
                       "model.layers.0.input_layernorm.weight",
                       "model.layers.0.post_attention_layernorm.weight",
                       "model.layers.0.self_attn.k_proj.weight",
                       "model.layers.0.self_attn.o_proj.weight",
                       "model.layers.0.self_attn.q_proj.bias",
                       "model.layers.0.self_attn.q_proj.weight",
                       "model.layers.0.self_attn.v_proj.weight",
                       "model.layers.11.mlp.down_proj.weight",
                       "model.layers.11.mlp.gate_proj.weight",
                       "model.layers.11.mlp.up_proj.weight",
                       "model.norm.weight",
                       "rope_freqs.weight",
                   }));
  EXPECT_EQ(m.tensors().at("model.norm.weight").data,
            m.gguf()->tensors().at("output_norm.weight").data);
}

TEST(ModelFiles, GgufNonLlamaAndErrors) {
  const std::string dir = scratch_dir();
  GgufBuilder b;
  b.kv_string("general.architecture", "qwen2");
  b.f32_tensor("blk.0.attn_q.bias", {4});
  write_file(dir + "/q.gguf", b.build());
  auto r = ModelFiles::open(dir + "/q.gguf");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE((*r)->rope_pairs_interleaved());

  write_file(dir + "/bad.gguf", "GGUF\x03");
  expect_error(dir + "/bad.gguf", StatusCode::kCorrupt, dir + "/bad.gguf", "truncated");
  expect_error(dir + "/none.gguf", StatusCode::kNotFound, dir + "/none.gguf", "no such file");
}

}  // namespace
}  // namespace dserve
