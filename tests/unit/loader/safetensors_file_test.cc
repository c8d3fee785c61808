#include "loader/safetensors_file.h"

#include <gtest/gtest.h>

#include "tensor/half.h"
#include "test_files.h"

namespace dserve {
namespace {

using nlohmann::json;
using testing::f32_bytes;
using testing::safetensors_bytes;
using testing::scratch_dir;
using testing::write_file;

// a: F32 [2, 2] at [0, 16); b: BF16 [3] at [16, 22); empty: F16 [0] at [22, 22).
json valid_header() {
  return {{"__metadata__", {{"format", "pt"}}},
          {"a", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}},
          {"b", {{"dtype", "BF16"}, {"shape", {3}}, {"data_offsets", {16, 22}}}},
          {"empty", {{"dtype", "F16"}, {"shape", {0}}, {"data_offsets", {22, 22}}}}};
}

std::string valid_data() {
  std::string d = f32_bytes({1, 2, 3, 4});
  for (float f : {0.5f, -1.0f, 3.0f}) testing::append<uint16_t>(&d, f32_to_bf16(f));
  return d;
}

Status open_bytes(const std::string& bytes, std::string* path) {
  *path = scratch_dir() + "/model.safetensors";
  write_file(*path, bytes);
  return SafetensorsFile::open(*path).status();
}

void expect_error(const json& header, const std::string& data, const std::string& needle,
                  StatusCode code = StatusCode::kCorrupt) {
  std::string path;
  Status s = open_bytes(safetensors_bytes(header, data), &path);
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.to_string();
}

TEST(SafetensorsFile, ReadsValidFile) {
  std::string path = scratch_dir() + "/model.safetensors";
  write_file(path, safetensors_bytes(valid_header(), valid_data()));
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  const auto& t = (*f)->tensors();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.at("a").dtype, DType::kF32);
  EXPECT_EQ(t.at("a").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(static_cast<const float*>(t.at("a").data)[3], 4.0f);
  EXPECT_EQ(t.at("b").dtype, DType::kBF16);
  EXPECT_EQ(t.at("b").n_bytes, 6u);
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(t.at("b").data) + 2, 2);
  EXPECT_EQ(bf16_to_f32(h), -1.0f);
  EXPECT_EQ(t.at("empty").n_elements(), 0);
}

TEST(SafetensorsFile, MissingFile) {
  std::string path = scratch_dir() + "/absent.safetensors";
  Status s = SafetensorsFile::open(path).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(path), std::string::npos);
}

TEST(SafetensorsFile, EveryTruncationFails) {
  const std::string bytes = safetensors_bytes(valid_header(), valid_data());
  std::string path = scratch_dir() + "/model.safetensors";
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_file(path, bytes.substr(0, n));
    Status s = SafetensorsFile::open(path).status();
    EXPECT_FALSE(s.ok()) << "prefix " << n;
    EXPECT_NE(s.message().find(path), std::string::npos) << s.to_string();
  }
}

TEST(SafetensorsFile, ByteFlipsNeverCrash) {
  const std::string bytes = safetensors_bytes(valid_header(), valid_data());
  std::string path = scratch_dir() + "/model.safetensors";
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (char v : {'\0', '\xff', '9', '-', '"', '['}) {
      std::string b = bytes;
      b[i] = v;
      write_file(path, b);
      auto f = SafetensorsFile::open(path);
      if (!f.ok()) {
        EXPECT_NE(f.status().message().find(path), std::string::npos);
      }
    }
  }
}

TEST(SafetensorsFile, HeaderLength) {
  std::string path;
  std::string bytes = safetensors_bytes(valid_header(), valid_data());
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(&bytes[0], &huge, 8);
  Status s = open_bytes(bytes, &path);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("header length"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find(path), std::string::npos);
  s = open_bytes("\x03\0\0", &path);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.to_string();
}

TEST(SafetensorsFile, BadJson) {
  std::string path;
  std::string header = "{\"a\": [1, 2";
  std::string bytes;
  testing::append<uint64_t>(&bytes, header.size());
  Status s = open_bytes(bytes + header, &path);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("invalid JSON"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find(path), std::string::npos);

  expect_error(json::array({1, 2}), "", "not an object");
  expect_error({{"a", 3}}, "", "tensor 'a': entry is not an object");
  expect_error({{"__metadata__", {{"k", 1}}}}, "", "__metadata__['k']");
}

TEST(SafetensorsFile, BadEntries) {
  const std::string data = valid_data();
  auto with = [](const char* name, json entry) {
    json h = valid_header();
    h[name] = std::move(entry);
    return h;
  };
  expect_error(with("a", {{"shape", {2, 2}}, {"data_offsets", {0, 16}}}), data, "dtype");
  expect_error(with("a", {{"dtype", "F32"}, {"data_offsets", {0, 16}}}), data, "shape");
  expect_error(with("a", {{"dtype", "F32"}, {"shape", {2, 2}}}), data, "data_offsets");
  expect_error(with("a", {{"dtype", "F32"}, {"shape", {2, -2}}, {"data_offsets", {0, 16}}}),
               data, "invalid shape");
  expect_error(with("a", {{"dtype", "F32"}, {"shape", {2, 2.5}}, {"data_offsets", {0, 16}}}),
               data, "invalid shape");
  expect_error(with("a", {{"dtype", "F32"},
                          {"shape", {uint64_t{1} << 40, uint64_t{1} << 40}},
                          {"data_offsets", {0, 16}}}),
               data, "invalid shape");
  expect_error(with("a", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {16, 0}}}),
               data, "invalid data_offsets");
  expect_error(with("a", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 1600}}}),
               data, "run past the end");
  expect_error(with("a", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 16}}}),
               data, "does not match");
  expect_error(with("a", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {8, 24}}}),
               data + "xx", "overlap");
}

TEST(SafetensorsFile, UnsupportedDtype) {
  json h = valid_header();
  h["ids"] = {{"dtype", "F64"}, {"shape", {1}}, {"data_offsets", {24, 32}}};
  expect_error(h, valid_data() + std::string(10, '\0'), "tensor 'ids' has dtype F64",
               StatusCode::kUnimplemented);
  h["ids"]["dtype"] = "Q9";
  expect_error(h, valid_data() + std::string(10, '\0'), "unknown dtype 'Q9'");
}

}  // namespace
}  // namespace dserve
