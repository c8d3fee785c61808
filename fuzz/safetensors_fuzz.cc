// Fuzz target: one .safetensors file (loader/safetensors_file.h): its 8-byte header
// length, the JSON header (dtypes, shapes, byte ranges, __metadata__) and the checks of
// every range against the data. Two input forms:
//
//   {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}\0<tensor data>
//       an input starting with '{' is the JSON header, optionally followed by a NUL
//       and the data; the length prefix is written for it (so mutations of the JSON
//       keep a well-framed file);
//   anything else is the whole file, length prefix included.
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz_support.h"
#include "loader/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  const std::string_view input = fuzz::as_text(data, size);
  std::string file;
  if (!input.empty() && input[0] == '{') {
    const std::vector<std::string_view> parts = fuzz::split_parts(input, 2);
    const uint64_t header_len = parts[0].size();
    file.resize(8);
    std::memcpy(file.data(), &header_len, 8);
    file += parts[0];
    if (parts.size() > 1) file += parts[1];
  } else {
    file = input;
  }
  const std::string path = fuzz::write_scratch_file("model.safetensors", file);
  Result<std::unique_ptr<SafetensorsFile>> st = SafetensorsFile::open(path);
  if (!st.ok()) return 0;
  // What the header promised: each view's bytes are its elements' and, the ranges not
  // overlapping, all of them fit in the data after the header.
  size_t total = 0;
  for (const auto& [name, view] : (*st)->tensors()) {
    if (view.n_bytes != dtype_bytes(view.dtype, view.n_elements())) std::abort();
    total += view.n_bytes;
  }
  if (total > file.size()) std::abort();
  return 0;
}
