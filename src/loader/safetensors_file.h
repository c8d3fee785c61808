// SafetensorsFile: a reader for one `.safetensors` file (Hugging Face's format: an
// 8-byte little-endian header length, a JSON header naming each tensor's dtype,
// shape and [begin, end) byte range, then the raw data). The header is parsed and
// validated up front (lengths, offsets inside the file, no overlaps, byte size =
// elements x dtype size); tensor data stays in the memory map.
//
// Only F32, F16 and BF16 tensors are supported; any other dtype is an Unimplemented
// error naming the tensor. Tensor data is 1-byte aligned in general (the format
// does not promise more), though files written by the safetensors package keep
// each tensor aligned to its element size.
//
// Thread-safety: immutable after open().
#pragma once

#include <map>
#include <memory>
#include <string>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/tensor_view.h"

namespace dserve {

class SafetensorsFile {
 public:
  // Errors name `path` and the problem.
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return map_->path(); }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // The optional "__metadata__" string map (e.g. {"format": "pt"}).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // MappedFile::release over the file's map.
  size_t release(const void* p, size_t n) const { return map_->release(p, n); }

 private:
  SafetensorsFile() = default;
  std::unique_ptr<MappedFile> map_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dserve
