// Fuzz target: model.safetensors.index.json, read by ModelFiles::open on a Hugging
// Face model directory (loader/model_files.h): its weight_map names the shard of every
// tensor, and each shard must exist inside the directory and hold the tensors listed
// for it. The input is the index file; the directory around it is fixed: an empty
// config.json and two shards,
//   model-00001-of-00002.safetensors   embed (F32 [2, 2]), norm (F16 [2])
//   model-00002-of-00002.safetensors   head (BF16 [2, 2])
#include <cstring>
#include <string>

#include "base/log.h"
#include "fuzz_support.h"
#include "loader/model_files.h"

namespace {

// A safetensors file of the given JSON header and `data_bytes` zero bytes of data.
std::string safetensors(const std::string& header, size_t data_bytes) {
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  return file + header + std::string(data_bytes, '\0');
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using dserve::fuzz::write_scratch_file;
  dserve::set_log_level("error");
  write_scratch_file("config.json", "{}");
  write_scratch_file("model-00001-of-00002.safetensors",
                     safetensors(R"({"embed": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},)"
                                 R"( "norm": {"dtype": "F16", "shape": [2], "data_offsets": [16, 20]}})",
                                 20));
  write_scratch_file("model-00002-of-00002.safetensors",
                     safetensors(R"({"head": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}})", 8));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  fuzz::write_scratch_file("model.safetensors.index.json", fuzz::as_text(data, size));
  (void)ModelFiles::open(fuzz::scratch_dir().string());
  return 0;
}
