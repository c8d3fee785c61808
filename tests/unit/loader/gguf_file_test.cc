#include "loader/gguf_file.h"

#include <gtest/gtest.h>

#include <limits>

#include "tensor/half.h"
#include "test_files.h"

namespace dserve {
namespace {

using testing::append;
using testing::append_str;
using testing::GgufBuilder;
using testing::scratch_dir;
using testing::write_file;

constexpr uint32_t kF32 = 0, kQ4_0 = 2, kU8 = 0, kBool = 7, kString = 8, kArray = 9,
                   kU64 = 10, kF64 = 12;

// A small valid file: metadata of several types and two tensors.
GgufBuilder valid_builder() {
  GgufBuilder b;
  b.kv_string("general.architecture", "llama");
  b.kv_u32("llama.block_count", 2);
  std::string arr;
  append<uint32_t>(&arr, kString);
  append<uint64_t>(&arr, 2);
  append_str(&arr, "<s>");
  append_str(&arr, "</s>");
  b.kv_raw("tokenizer.ggml.tokens", kArray, arr);
  std::string f;
  append<double>(&f, 0.5);
  b.kv_raw("x.f64", kF64, f);
  b.kv_raw("x.bool", kBool, std::string(1, '\1'));
  b.f32_tensor("blk.0.attn_q.weight", {4, 3});  // PyTorch shape [3, 4]
  b.f32_tensor("output_norm.weight", {5});
  return b;
}

Status open_bytes(const std::string& bytes, std::string* path_out = nullptr) {
  std::string path = scratch_dir() + "/model.gguf";
  write_file(path, bytes);
  if (path_out) *path_out = path;
  return GgufFile::open(path).status();
}

// The error is not OK, of the expected code, and names the file.
void expect_error(const Status& s, StatusCode code, const std::string& path,
                  const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.to_string();
}

void expect_corrupt(const GgufBuilder& b, const std::string& needle,
                    StatusCode code = StatusCode::kCorrupt) {
  std::string path;
  Status s = open_bytes(b.build(), &path);
  expect_error(s, code, path, needle);
}

TEST(GgufFile, ReadsValidFile) {
  std::string path = scratch_dir() + "/model.gguf";
  write_file(path, valid_builder().build());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->version(), 3u);
  const GgufMetadata& md = (*f)->metadata();
  EXPECT_EQ(*md.get_string("general.architecture"), "llama");
  EXPECT_EQ(*md.get_int("llama.block_count"), 2);
  EXPECT_EQ(*md.get_float("llama.block_count"), 2.0);  // ints widen
  EXPECT_EQ(*md.get_float("x.f64"), 0.5);
  EXPECT_TRUE(*md.get_bool("x.bool"));
  auto tokens = md.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(**tokens, (std::vector<std::string>{"<s>", "</s>"}));
  EXPECT_EQ(md.get_int("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(md.get_int("general.architecture").status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(md.get_int_array("tokenizer.ggml.tokens").status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(md.get_string("x.bool").status().code(), StatusCode::kCorrupt);

  const auto& tensors = (*f)->tensors();
  ASSERT_EQ(tensors.size(), 2u);
  const TensorView& q = tensors.at("blk.0.attn_q.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(q.n_bytes, 48u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q.data) % 32, 0u);
  EXPECT_EQ(static_cast<const float*>(q.data)[11], 11.0f);
  const TensorView& n = tensors.at("output_norm.weight");
  EXPECT_EQ(n.shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(static_cast<const float*>(n.data)[4], 4.0f);
}

TEST(GgufFile, AcceptsVersion2AndCustomAlignment) {
  GgufBuilder b = valid_builder();
  b.version = 2;
  b.alignment = 64;
  b.kv_u32("general.alignment", 64);
  std::string path = scratch_dir() + "/v2.gguf";
  write_file(path, b.build());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->version(), 2u);
  const TensorView& n = (*f)->tensors().at("output_norm.weight");
  EXPECT_EQ(static_cast<const float*>(n.data)[3], 3.0f);
}

TEST(GgufFile, MissingFile) {
  std::string path = scratch_dir() + "/absent.gguf";
  Status s = GgufFile::open(path).status();
  expect_error(s, StatusCode::kNotFound, path, "absent.gguf");
}

TEST(GgufFile, EveryTruncationFails) {
  const std::string bytes = valid_builder().build();
  std::string path = scratch_dir() + "/model.gguf";
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_file(path, bytes.substr(0, n));
    Status s = GgufFile::open(path).status();
    EXPECT_FALSE(s.ok()) << "prefix " << n;
    EXPECT_NE(s.message().find(path), std::string::npos) << s.to_string();
  }
}

// Every single-byte corruption either parses or fails cleanly (ASan/UBSan watch).
TEST(GgufFile, ByteFlipsNeverCrash) {
  const std::string bytes = valid_builder().build();
  std::string path = scratch_dir() + "/model.gguf";
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x7f}}) {
      std::string b = bytes;
      b[i] = static_cast<char>(v);
      write_file(path, b);
      Result<std::unique_ptr<GgufFile>> f = GgufFile::open(path);
      if (!f.ok()) {
        EXPECT_NE(f.status().message().find(path), std::string::npos);
      }
    }
  }
}

TEST(GgufFile, BadMagicAndVersion) {
  std::string path;
  expect_error(open_bytes("GGML0000000000000000000000", &path), StatusCode::kCorrupt, path,
               "not a GGUF file");
  GgufBuilder b = valid_builder();
  b.version = 1;
  expect_corrupt(b, "version 1", StatusCode::kUnimplemented);
  b.version = 0x03000000;  // big-endian
  expect_corrupt(b, "big-endian", StatusCode::kUnimplemented);
}

TEST(GgufFile, AbsurdCounts) {
  GgufBuilder b = valid_builder();
  b.n_kv_override = int64_t{1} << 60;
  expect_corrupt(b, "metadata count");
  b = valid_builder();
  b.n_tensors_override = int64_t{1} << 60;
  expect_corrupt(b, "tensor count");
  b = valid_builder();
  b.n_tensors_override = 3;  // one more than present: reads into the padding/data
  std::string path;
  EXPECT_FALSE(open_bytes(b.build(), &path).ok());
}

TEST(GgufFile, AbsurdStringLengths) {
  GgufBuilder b;
  std::string v;
  append<uint64_t>(&v, uint64_t{1} << 62);
  b.kv_raw("x.str", kString, v);
  expect_corrupt(b, "runs past the end");

  // A key length past the end of the file.
  GgufBuilder k;
  k.kv_u32("a", 1);
  std::string bytes = k.build();
  const uint64_t huge = ~uint64_t{0};
  std::memcpy(&bytes[24], &huge, 8);  // the key length follows the 24-byte header
  std::string path;
  expect_error(open_bytes(bytes, &path), StatusCode::kCorrupt, path, "metadata key");
}

TEST(GgufFile, AbsurdArrays) {
  GgufBuilder b;
  std::string v;
  append<uint32_t>(&v, kString);
  append<uint64_t>(&v, uint64_t{1} << 61);
  b.kv_raw("x.arr", kArray, v);
  expect_corrupt(b, "array of");

  GgufBuilder nested;
  std::string n;
  append<uint32_t>(&n, kArray);
  append<uint64_t>(&n, 1);
  nested.kv_raw("x.nested", kArray, n);
  expect_corrupt(nested, "nested arrays", StatusCode::kUnimplemented);

  GgufBuilder unknown;
  std::string u;
  append<uint32_t>(&u, 77);
  append<uint64_t>(&u, 1);
  unknown.kv_raw("x.arr", kArray, u);
  expect_corrupt(unknown, "unknown array element type");
}

TEST(GgufFile, BadValues) {
  GgufBuilder b;
  b.kv_raw("x.weird", 42, "");
  expect_corrupt(b, "unknown value type");

  GgufBuilder big;
  std::string v;
  append<uint64_t>(&v, ~uint64_t{0});
  big.kv_raw("x.u64", kU64, v);
  expect_corrupt(big, "too large");

  GgufBuilder boolean;
  boolean.kv_raw("x.bool", kBool, std::string(1, '\2'));
  expect_corrupt(boolean, "bool value");

  GgufBuilder dup;
  dup.kv_u32("a", 1);
  dup.kv_u32("a", 2);
  expect_corrupt(dup, "duplicate metadata key 'a'");

  GgufBuilder align = valid_builder();
  align.kv_u32("general.alignment", 48);
  expect_corrupt(align, "general.alignment");
  GgufBuilder align_type = valid_builder();
  align_type.kv_string("general.alignment", "32");
  expect_corrupt(align_type, "general.alignment");
  GgufBuilder small_ints;  // u8 is a valid metadata type
  small_ints.kv_raw("x.u8", kU8, std::string(1, '\x7f'));
  std::string path;
  EXPECT_TRUE(open_bytes(small_ints.build(), &path).ok());
}

TEST(GgufFile, BadTensorInfos) {
  GgufBuilder dims = valid_builder();
  dims.tensors[0].dims = {1, 1, 1, 1, 12};
  expect_corrupt(dims, "5 dimensions");

  GgufBuilder zero = valid_builder();
  zero.tensors[0].dims = {4, 0};
  expect_corrupt(zero, "invalid dimension 0");

  GgufBuilder overflow = valid_builder();
  overflow.tensors[0].dims = {uint64_t{1} << 40, uint64_t{1} << 40};
  expect_corrupt(overflow, "invalid dimension");

  GgufBuilder huge = valid_builder();
  huge.tensors[0].dims = {uint64_t{1} << 30, 4};
  expect_corrupt(huge, "larger than the file");

  GgufBuilder dup = valid_builder();
  dup.tensors[1].name = dup.tensors[0].name;
  expect_corrupt(dup, "duplicate tensor name 'blk.0.attn_q.weight'");

  GgufBuilder blocks = valid_builder();  // q4_0 rows must be whole 32-element blocks
  blocks.tensor("bad.weight", {16, 1}, kQ4_0, std::string(18, '\0'));
  expect_corrupt(blocks, "not a multiple of 32");
}

TEST(GgufFile, UnsupportedGgmlType) {
  GgufBuilder b = valid_builder();
  b.tensors[1].type = 10;  // q2_k
  expect_corrupt(b, "tensor 'output_norm.weight' has ggml type 10 (q2_k)",
                 StatusCode::kUnimplemented);
  b.tensors[1].type = 1234;
  expect_corrupt(b, "ggml type 1234 (unknown)", StatusCode::kUnimplemented);
}

TEST(GgufFile, TensorOffsets) {
  GgufBuilder past = valid_builder();
  past.tensors[1].offset = 4096;
  expect_corrupt(past, "'output_norm.weight'");
  expect_corrupt(past, "runs past the end");

  GgufBuilder overlap = valid_builder();
  overlap.tensors[1].offset = 32;  // the first tensor occupies [0, 48)
  overlap.f32_tensor("pad.weight", {32});  // keeps the file long enough
  expect_corrupt(overlap, "overlap");

  GgufBuilder unaligned = valid_builder();
  unaligned.tensors[1].offset = 48;
  expect_corrupt(unaligned, "not a multiple of the alignment");

  GgufBuilder huge = valid_builder();
  huge.tensors[1].offset = std::numeric_limits<int64_t>::max() / 32 * 32;
  expect_corrupt(huge, "runs past the end");
}

TEST(GgufFile, SplitFiles) {
  const std::string dir = scratch_dir();
  auto part = [](int no, int count, const std::string& tensor) {
    GgufBuilder b;
    if (no == 0) b.kv_string("general.architecture", "llama");
    std::string v;
    append<uint16_t>(&v, static_cast<uint16_t>(no));
    b.kv_raw("split.no", 2, v);
    v.clear();
    append<uint16_t>(&v, static_cast<uint16_t>(count));
    b.kv_raw("split.count", 2, v);
    v.clear();
    append<int32_t>(&v, count);
    b.kv_raw("split.tensors.count", 5, v);
    b.f32_tensor(tensor, {8});
    return b.build();
  };
  write_file(dir + "/m-00001-of-00002.gguf", part(0, 2, "a.weight"));
  write_file(dir + "/m-00002-of-00002.gguf", part(1, 2, "b.weight"));
  auto f = GgufFile::open(dir + "/m-00001-of-00002.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ(*(*f)->metadata().get_string("general.architecture"), "llama");
  EXPECT_EQ(static_cast<const float*>((*f)->tensors().at("b.weight").data)[7], 7.0f);
  // Naming any part opens them all.
  auto f2 = GgufFile::open(dir + "/m-00002-of-00002.gguf");
  ASSERT_TRUE(f2.ok()) << f2.status().to_string();
  EXPECT_EQ((*f2)->tensors().size(), 2u);
  EXPECT_EQ((*f2)->path(), dir + "/m-00001-of-00002.gguf");
  // A one-part "split".
  write_file(dir + "/one-00001-of-00001.gguf", part(0, 1, "a.weight"));
  EXPECT_TRUE(GgufFile::open(dir + "/one-00001-of-00001.gguf").ok());
  expect_error(GgufFile::open(dir + "/m-00003-of-00002.gguf").status(),
               StatusCode::kInvalidArgument, dir + "/m-00003-of-00002.gguf", "part 3 of 2");

  // Wrong split.no in part 2.
  write_file(dir + "/m-00002-of-00002.gguf", part(0, 2, "b.weight"));
  expect_error(GgufFile::open(dir + "/m-00001-of-00002.gguf").status(), StatusCode::kCorrupt,
               dir + "/m-00002-of-00002.gguf", "split.no");
  // The same tensor in both parts.
  write_file(dir + "/m-00002-of-00002.gguf", part(1, 2, "a.weight"));
  expect_error(GgufFile::open(dir + "/m-00001-of-00002.gguf").status(), StatusCode::kCorrupt,
               dir + "/m-00002-of-00002.gguf", "earlier part");
  // A missing part.
  std::filesystem::remove(dir + "/m-00002-of-00002.gguf");
  expect_error(GgufFile::open(dir + "/m-00001-of-00002.gguf").status(), StatusCode::kNotFound,
               dir + "/m-00002-of-00002.gguf", "missing");
  // One part of a split model under a plain name.
  write_file(dir + "/renamed.gguf", part(0, 2, "a.weight"));
  expect_error(GgufFile::open(dir + "/renamed.gguf").status(), StatusCode::kInvalidArgument,
               dir + "/renamed.gguf", "split model");
}

}  // namespace
}  // namespace dserve
