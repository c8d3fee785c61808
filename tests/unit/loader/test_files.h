// Helpers for the loader tests: a scratch directory per test, whole-file writes,
// and builders for small GGUF and safetensors files that tests then corrupt.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dserve::testing {

// A fresh directory for the current test under $DSERVE_TEST_TMPDIR (set by ctest)
// or the system temp dir.
inline std::string scratch_dir() {
  const char* root = std::getenv("DSERVE_TEST_TMPDIR");
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::path(root ? root : ::testing::TempDir()) /
                              "loader_scratch" /
                              (std::string(t->test_suite_name()) + "." + t->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

template <typename T>
void append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

inline void append_str(std::string* out, const std::string& s) {
  append<uint64_t>(out, s.size());
  out->append(s);
}

// Builds a GGUF file. Metadata values are appended pre-encoded so tests can write
// anything, including nonsense; tensor offsets are computed unless given.
class GgufBuilder {
 public:
  uint32_t version = 3;
  uint64_t alignment = 32;  // used for padding; write general.alignment yourself
  int64_t n_kv_override = -1, n_tensors_override = -1;

  // Encoded "key, type, value".
  void kv_raw(const std::string& key, uint32_t type, const std::string& value) {
    append_str(&kv_, key);
    append<uint32_t>(&kv_, type);
    kv_ += value;
    ++n_kv_;
  }
  void kv_u32(const std::string& key, uint32_t v) {
    std::string b;
    append(&b, v);
    kv_raw(key, 4, b);
  }
  void kv_string(const std::string& key, const std::string& v) {
    std::string b;
    append_str(&b, v);
    kv_raw(key, 8, b);
  }

  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;  // ggml order: innermost first
    uint32_t type;
    std::string data;
    int64_t offset = -1;         // -1: next aligned position
  };
  std::vector<Tensor> tensors;

  void tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
              std::string data, int64_t offset = -1) {
    tensors.push_back({name, std::move(dims), type, std::move(data), offset});
  }
  // An f32 tensor of the given ggml dims filled with 0, 1, 2, ...
  void f32_tensor(const std::string& name, std::vector<uint64_t> dims) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    std::string data;
    for (uint64_t i = 0; i < n; ++i) append<float>(&data, static_cast<float>(i));
    tensor(name, std::move(dims), 0, std::move(data));
  }

  std::string build() const {
    std::string out = "GGUF";
    append<uint32_t>(&out, version);
    append<uint64_t>(&out, n_tensors_override >= 0 ? n_tensors_override : tensors.size());
    append<uint64_t>(&out, n_kv_override >= 0 ? n_kv_override : n_kv_);
    out += kv_;
    std::string data;
    for (const Tensor& t : tensors) {
      append_str(&out, t.name);
      append<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) append<uint64_t>(&out, d);
      append<uint32_t>(&out, t.type);
      uint64_t offset = t.offset;
      if (t.offset < 0) {
        data.resize((data.size() + alignment - 1) / alignment * alignment, '\0');
        offset = data.size();
        data += t.data;
      }
      append<uint64_t>(&out, offset);
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    return out + data;
  }

 private:
  std::string kv_;
  uint64_t n_kv_ = 0;
};

// Builds a safetensors file from a JSON header and raw data.
inline std::string safetensors_bytes(const nlohmann::json& header, const std::string& data) {
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::string out;
  append<uint64_t>(&out, h.size());
  return out + h + data;
}

inline std::string f32_bytes(std::initializer_list<float> v) {
  std::string out;
  for (float f : v) append(&out, f);
  return out;
}

}  // namespace dserve::testing
