#include "loader/safetensors_file.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

namespace dserve {
namespace {

// The safetensors package refuses headers above 100 MB; so do we, which also keeps
// a corrupt length from becoming a huge parse.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::optional<DType> dtype_from_name(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (s == "F8_E4M3") return DType::kF8_E4M3;  // DeepSeek FP8 weights (with block scales)
  if (s == "I8") return DType::kI8;  // W8A8 weights (row scales: loader/compressed_tensors.h)
  if (s == "I32") return DType::kI32;  // msModelSlim's quant_bias (loader/ascend_quant.h)
  if (s == "I64") return DType::kI64;  // msModelSlim's deq_scale of float16 models
  return std::nullopt;
}

bool is_known_dtype(const std::string& s) {
  static const char* kKnown[] = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64",
                                 "I64", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4",
                                 "F6_E2M3", "F6_E3M2", "C64"};
  return std::find(std::begin(kKnown), std::end(kKnown), s) != std::end(kKnown);
}

// Reads a JSON number that must be a non-negative integer.
bool as_u64(const nlohmann::json& j, uint64_t* out) {
  if (!j.is_number_unsigned()) {
    if (!j.is_number_integer()) return false;
    if (j.get<int64_t>() < 0) return false;
  }
  *out = j.get<uint64_t>();
  return true;
}

struct Entry {
  std::string name;
  uint64_t begin, end;
};

}  // namespace

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  DS_ASSIGN_OR_RETURN(file->map_, MappedFile::open(path));
  file->map_->advise_huge_pages();
  const uint8_t* bytes = file->map_->data();
  const uint64_t file_size = file->map_->size();
  auto bad = [&](const std::string& what) { return corrupt(path + ": " + what); };

  if (file_size < 8) return bad("file truncated (" + std::to_string(file_size) + " bytes)");
  uint64_t header_len;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > file_size - 8) {
    return bad("header length " + std::to_string(header_len) + " runs past the end of the file (" +
               std::to_string(file_size) + " bytes)");
  }
  if (header_len > kMaxHeaderBytes) {
    return bad("header length " + std::to_string(header_len) + " exceeds 100 MB");
  }
  const char* header = reinterpret_cast<const char*>(bytes + 8);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header, header + header_len);
  } catch (const nlohmann::json::exception& e) {
    return bad(std::string("invalid JSON header: ") + e.what());
  }
  if (!j.is_object()) return bad("JSON header is not an object");

  const uint8_t* data = bytes + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;
  std::vector<Entry> entries;
  for (auto& [name, info] : j.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) return bad("__metadata__ is not an object");
      for (auto& [k, v] : info.items()) {
        if (!v.is_string()) return bad("__metadata__['" + k + "'] is not a string");
        file->metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!info.is_object()) return bad(where + ": entry is not an object");
    auto dt = info.find("dtype");
    auto sh = info.find("shape");
    auto offs = info.find("data_offsets");
    if (dt == info.end() || !dt->is_string()) return bad(where + ": missing or non-string dtype");
    if (sh == info.end() || !sh->is_array()) return bad(where + ": missing or non-array shape");
    if (offs == info.end() || !offs->is_array() || offs->size() != 2) {
      return bad(where + ": data_offsets must be [begin, end]");
    }
    const std::string dtype_str = dt->get<std::string>();
    std::optional<DType> dtype = dtype_from_name(dtype_str);
    if (!dtype) {
      if (is_known_dtype(dtype_str)) {
        return unimplemented(path + ": " + where + " has dtype " + dtype_str +
                             "; dserve supports F32, F16, BF16, F8_E4M3, I8, I32 and I64");
      }
      return bad(where + " has unknown dtype '" + dtype_str + "'");
    }
    TensorView view;
    view.dtype = *dtype;
    int64_t n_elements = 1;
    for (const auto& d : *sh) {
      uint64_t v;
      if (!as_u64(d, &v) || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(n_elements, static_cast<int64_t>(v), &n_elements)) {
        return bad(where + ": invalid shape " + sh->dump());
      }
      view.shape.push_back(static_cast<int64_t>(v));
    }
    uint64_t begin, end;
    if (!as_u64((*offs)[0], &begin) || !as_u64((*offs)[1], &end) || begin > end) {
      return bad(where + ": invalid data_offsets " + offs->dump());
    }
    if (end > data_size) {
      return bad(where + ": data_offsets " + offs->dump() + " run past the end of the file (" +
                 std::to_string(data_size) + " data bytes; file truncated?)");
    }
    const uint64_t elem = dtype_info(*dtype).block_bytes;
    if (static_cast<uint64_t>(n_elements) > data_size / elem ||
        static_cast<uint64_t>(n_elements) * elem != end - begin) {
      return bad(where + ": shape " + shape_to_string(view.shape) + " of " + dtype_str +
                 " does not match its " + std::to_string(end - begin) + " data bytes");
    }
    view.data = data + begin;
    view.n_bytes = end - begin;
    file->tensors_.emplace(name, std::move(view));
    entries.push_back({name, begin, end});
  }

  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin == e.end) continue;  // empty tensors take no bytes
    if (prev != nullptr && prev->end > e.begin) {
      return bad("tensors '" + prev->name + "' and '" + e.name + "' overlap");
    }
    prev = &e;
  }
  return file;
}

}  // namespace dserve
