// GgufFile: a reader for GGUF v3 model files (llama.cpp's format), single or split
// into `name-00001-of-0000N.gguf` parts. The header, metadata and tensor table are
// parsed and validated up front (every offset and length checked against the file
// size); tensor data stays in the memory map.
//
// Thread-safety: immutable after open().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/tensor_view.h"

namespace dserve {

// One metadata value. GGUF's integer types all widen to int64_t (uint64 values
// above INT64_MAX are rejected as corrupt), float32/64 to double. Arrays hold
// one element type each.
using GgufArray = std::variant<std::vector<int64_t>, std::vector<double>, std::vector<bool>,
                               std::vector<std::string>>;
using GgufValue = std::variant<int64_t, double, bool, std::string, GgufArray>;

class GgufMetadata {
 public:
  const GgufValue* find(const std::string& key) const;
  bool contains(const std::string& key) const { return find(key) != nullptr; }
  // Typed getters: NotFound if absent, Corrupt if the stored type differs.
  Result<int64_t> get_int(const std::string& key) const;
  Result<double> get_float(const std::string& key) const;  // accepts ints too
  Result<bool> get_bool(const std::string& key) const;
  Result<std::string> get_string(const std::string& key) const;
  Result<const std::vector<std::string>*> get_string_array(const std::string& key) const;
  Result<const std::vector<int64_t>*> get_int_array(const std::string& key) const;
  Result<const std::vector<double>*> get_float_array(const std::string& key) const;

  std::map<std::string, GgufValue>& mutable_values() { return values_; }
  const std::map<std::string, GgufValue>& values() const { return values_; }
  std::string source;  // the file path, for error messages

 private:
  std::map<std::string, GgufValue> values_;
};

class GgufFile {
 public:
  // Opens `path`; if its name is `X-00001-of-0000N.gguf`, opens every part and
  // merges their tensors (metadata comes from the first part).
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);

  const GgufMetadata& metadata() const { return metadata_; }
  // Tensors under their GGUF names ("blk.0.attn_q.weight"), shapes in PyTorch order.
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  // MappedFile::release over the part that holds [p, p + n); 0 where none does.
  size_t release(const void* p, size_t n) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  GgufMetadata metadata_;
  std::map<std::string, TensorView> tensors_;
  std::vector<std::unique_ptr<MappedFile>> maps_;
};

}  // namespace dserve
