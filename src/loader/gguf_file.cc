#include "loader/gguf_file.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>
#include <string_view>

#include "base/log.h"

namespace dserve {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxDims = 4;
// Names (keys, tensor names) longer than this are certainly corruption; it keeps a
// bad length from turning into a large allocation.
constexpr uint64_t kMaxNameLength = 1 << 16;

enum GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// Smallest encoded size of one value of each type; used to bound counts read from
// the file before anything is allocated for them.
uint64_t min_encoded_size(uint32_t type) {
  switch (type) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: case kString: return 8;
    case kArray: return 12;
    default: return 0;
  }
}

// ggml type names for the error message when a tensor uses a type dserve lacks.
const char* ggml_type_name(uint32_t t) {
  static const char* kNames[] = {
      "f32", "f16", "q4_0", "q4_1", "q4_2 (removed)", "q4_3 (removed)", "q5_0", "q5_1",
      "q8_0", "q8_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k", "iq2_xxs", "iq2_xs",
      "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64",
      "f64", "iq1_m", "bf16", "q4_0_4_4 (removed)", "q4_0_4_8 (removed)",
      "q4_0_8_8 (removed)", "tq1_0", "tq2_0", "iq4_nl_4_4 (removed)",
      "iq4_nl_4_8 (removed)", "iq4_nl_8_8 (removed)", "mxfp4"};
  return t < std::size(kNames) ? kNames[t] : "unknown";
}

// Bounds-checked little-endian reader over one mapped file. Every failure names
// the file and the byte offset.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, size_t size)
      : path_(path), data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status fail(const std::string& what) const {
    return corrupt(path_ + ": " + what + " (at byte " + std::to_string(pos_) + ")");
  }

  template <typename T>
  Status read(T* out, const char* what) {
    if (remaining() < sizeof(T)) {
      return fail(std::string("file truncated while reading ") + what);
    }
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  Status read_string(std::string* out, const char* what, uint64_t max_len) {
    uint64_t len;
    DS_RETURN_IF_ERROR(read(&len, what));
    if (len > remaining()) {
      return fail(std::string(what) + " length " + std::to_string(len) +
                  " runs past the end of the file");
    }
    if (len > max_len) {
      return fail(std::string(what) + " length " + std::to_string(len) + " is implausible");
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

std::string type_name(uint32_t t) {
  static const char* kNames[] = {"uint8", "int8",  "uint16", "int16", "uint32",
                                 "int32", "float32", "bool",  "string", "array",
                                 "uint64", "int64", "float64"};
  return t < std::size(kNames) ? kNames[t] : "type " + std::to_string(t);
}

// Reads a T and widens it to int64_t.
template <typename T>
Status read_widened(Cursor& c, int64_t* out) {
  T v = 0;
  DS_RETURN_IF_ERROR(c.read(&v, "a value"));
  *out = static_cast<int64_t>(v);
  return Status::Ok();
}

Status read_int(Cursor& c, uint32_t type, const std::string& key, int64_t* out) {
  switch (type) {
    case kU8: return read_widened<uint8_t>(c, out);
    case kI8: return read_widened<int8_t>(c, out);
    case kU16: return read_widened<uint16_t>(c, out);
    case kI16: return read_widened<int16_t>(c, out);
    case kU32: return read_widened<uint32_t>(c, out);
    case kI32: return read_widened<int32_t>(c, out);
    case kI64: return read_widened<int64_t>(c, out);
    case kU64: {
      uint64_t v = 0;
      DS_RETURN_IF_ERROR(c.read(&v, "a value"));
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return c.fail("metadata '" + key + "': uint64 value " + std::to_string(v) +
                      " is too large");
      }
      *out = static_cast<int64_t>(v);
      return Status::Ok();
    }
    default: return internal_error("read_int: bad type");
  }
}

Status read_double(Cursor& c, uint32_t type, double* out) {
  if (type == kF32) {
    float v = 0;
    DS_RETURN_IF_ERROR(c.read(&v, "a value"));
    *out = v;
  } else {
    DS_RETURN_IF_ERROR(c.read(out, "a value"));
  }
  return Status::Ok();
}

Status read_bool(Cursor& c, const std::string& key, bool* out) {
  uint8_t v = 0;
  DS_RETURN_IF_ERROR(c.read(&v, "a value"));
  if (v > 1) return c.fail("metadata '" + key + "': bool value " + std::to_string(v));
  *out = v != 0;
  return Status::Ok();
}

bool is_int_type(uint32_t t) {
  return t == kU8 || t == kI8 || t == kU16 || t == kI16 || t == kU32 || t == kI32 ||
         t == kU64 || t == kI64;
}

Status read_array(Cursor& c, const std::string& key, GgufArray* out) {
  uint32_t elem_type;
  uint64_t count;
  DS_RETURN_IF_ERROR(c.read(&elem_type, "an array type"));
  DS_RETURN_IF_ERROR(c.read(&count, "an array length"));
  if (elem_type == kArray) {
    return unimplemented(c.fail("metadata '" + key + "': nested arrays").message());
  }
  const uint64_t min_size = min_encoded_size(elem_type);
  if (min_size == 0) {
    return c.fail("metadata '" + key + "': unknown array element type " +
                  std::to_string(elem_type));
  }
  if (count > c.remaining() / min_size) {
    return c.fail("metadata '" + key + "': array of " + std::to_string(count) + " " +
                  type_name(elem_type) + " runs past the end of the file");
  }
  // Grow as elements are read rather than trusting `count` for one allocation: a
  // corrupt count then fails at the end of the file, not in the allocator.
  const size_t reserve = static_cast<size_t>(std::min<uint64_t>(count, 1 << 20));
  if (is_int_type(elem_type)) {
    std::vector<int64_t> v;
    v.reserve(reserve);
    for (uint64_t i = 0; i < count; ++i) {
      DS_RETURN_IF_ERROR(read_int(c, elem_type, key, &v.emplace_back()));
    }
    *out = std::move(v);
  } else if (elem_type == kF32 || elem_type == kF64) {
    std::vector<double> v;
    v.reserve(reserve);
    for (uint64_t i = 0; i < count; ++i) {
      DS_RETURN_IF_ERROR(read_double(c, elem_type, &v.emplace_back()));
    }
    *out = std::move(v);
  } else if (elem_type == kBool) {
    std::vector<bool> v;
    v.reserve(reserve);
    for (uint64_t i = 0; i < count; ++i) {
      bool b;
      DS_RETURN_IF_ERROR(read_bool(c, key, &b));
      v.push_back(b);
    }
    *out = std::move(v);
  } else {  // kString
    std::vector<std::string> v;
    v.reserve(reserve);
    for (uint64_t i = 0; i < count; ++i) {
      DS_RETURN_IF_ERROR(
          c.read_string(&v.emplace_back(), "a string", std::numeric_limits<uint64_t>::max()));
    }
    *out = std::move(v);
  }
  return Status::Ok();
}

Status read_value(Cursor& c, uint32_t type, const std::string& key, GgufValue* out) {
  if (is_int_type(type)) {
    int64_t v = 0;
    DS_RETURN_IF_ERROR(read_int(c, type, key, &v));
    *out = v;
  } else if (type == kF32 || type == kF64) {
    double v = 0;
    DS_RETURN_IF_ERROR(read_double(c, type, &v));
    *out = v;
  } else if (type == kBool) {
    bool v = false;
    DS_RETURN_IF_ERROR(read_bool(c, key, &v));
    *out = v;
  } else if (type == kString) {
    std::string s;
    DS_RETURN_IF_ERROR(c.read_string(&s, "a string", std::numeric_limits<uint64_t>::max()));
    *out = std::move(s);
  } else if (type == kArray) {
    GgufArray a;
    DS_RETURN_IF_ERROR(read_array(c, key, &a));
    *out = std::move(a);
  } else {
    return c.fail("metadata '" + key + "' has unknown value type " + std::to_string(type));
  }
  return Status::Ok();
}

// One parsed part of a (possibly split) GGUF model.
struct GgufPart {
  std::unique_ptr<MappedFile> map;
  uint32_t version = 0;
  GgufMetadata metadata;
  std::map<std::string, TensorView> tensors;
};

struct RawTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch order
  DType dtype;
  uint64_t offset;             // relative to the data section
  uint64_t n_bytes;
};

Result<GgufPart> parse_part(const std::string& path) {
  GgufPart part;
  DS_ASSIGN_OR_RETURN(part.map, MappedFile::open(path));
  part.map->advise_huge_pages();
  const uint64_t file_size = part.map->size();
  Cursor c(path, part.map->data(), file_size);

  uint32_t magic;
  if (!c.read(&magic, "the magic").ok() || magic != kGgufMagic) {
    return corrupt(path + ": not a GGUF file (bad magic)");
  }
  DS_RETURN_IF_ERROR(c.read(&part.version, "the version"));
  if (part.version == 1) {
    return unimplemented(path + ": GGUF version 1 is not supported (re-convert the model)");
  }
  if (part.version != 2 && part.version != 3) {
    // A big-endian file reads as a huge version number.
    return unimplemented(path + ": unsupported GGUF version " + std::to_string(part.version) +
                         (part.version > 0xffff ? " (big-endian file?)" : ""));
  }
  uint64_t n_tensors, n_kv;
  DS_RETURN_IF_ERROR(c.read(&n_tensors, "the tensor count"));
  DS_RETURN_IF_ERROR(c.read(&n_kv, "the metadata count"));
  // Each key-value takes at least 13 bytes and each tensor info at least 24.
  if (n_kv > c.remaining() / 13) {
    return c.fail("metadata count " + std::to_string(n_kv) + " is larger than the file allows");
  }
  if (n_tensors > c.remaining() / 24) {
    return c.fail("tensor count " + std::to_string(n_tensors) + " is larger than the file allows");
  }

  part.metadata.source = path;
  auto& values = part.metadata.mutable_values();
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    uint32_t type;
    DS_RETURN_IF_ERROR(c.read_string(&key, "a metadata key", kMaxNameLength));
    DS_RETURN_IF_ERROR(c.read(&type, "a metadata type"));
    GgufValue value;
    DS_RETURN_IF_ERROR(read_value(c, type, key, &value));
    if (values.count(key)) return c.fail("duplicate metadata key '" + key + "'");
    values.emplace(std::move(key), std::move(value));
  }

  uint64_t alignment = kDefaultAlignment;
  if (const GgufValue* v = part.metadata.find("general.alignment")) {
    const int64_t* a = std::get_if<int64_t>(v);
    if (a == nullptr || *a <= 0 || (*a & (*a - 1)) != 0) {
      return corrupt(path + ": general.alignment must be a positive power of two");
    }
    alignment = static_cast<uint64_t>(*a);
  }

  std::vector<RawTensorInfo> infos(n_tensors);
  std::set<std::string> names;
  for (auto& info : infos) {
    DS_RETURN_IF_ERROR(c.read_string(&info.name, "a tensor name", kMaxNameLength));
    if (!names.insert(info.name).second) {
      return c.fail("duplicate tensor name '" + info.name + "'");
    }
    uint32_t n_dims;
    DS_RETURN_IF_ERROR(c.read(&n_dims, "a tensor's dimension count"));
    if (n_dims > kMaxDims) {
      return c.fail("tensor '" + info.name + "' has " + std::to_string(n_dims) +
                    " dimensions (at most 4)");
    }
    uint64_t dims[kMaxDims];
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      DS_RETURN_IF_ERROR(c.read(&dims[d], "a tensor dimension"));
      if (dims[d] == 0 || dims[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(n_elements, static_cast<int64_t>(dims[d]), &n_elements)) {
        return c.fail("tensor '" + info.name + "' has invalid dimension " +
                      std::to_string(dims[d]));
      }
    }
    for (uint32_t d = n_dims; d-- > 0;) info.shape.push_back(static_cast<int64_t>(dims[d]));
    uint32_t ggml_type;
    DS_RETURN_IF_ERROR(c.read(&ggml_type, "a tensor type"));
    std::optional<DType> dtype = dtype_from_ggml_type(ggml_type);
    if (!dtype) {
      return unimplemented(path + ": tensor '" + info.name + "' has ggml type " +
                           std::to_string(ggml_type) + " (" + ggml_type_name(ggml_type) +
                           "), which dserve does not support");
    }
    info.dtype = *dtype;
    DS_RETURN_IF_ERROR(c.read(&info.offset, "a tensor offset"));
    const int block = dtype_info(info.dtype).block_size;
    const int64_t row = n_dims == 0 ? 1 : static_cast<int64_t>(dims[0]);
    if (row % block != 0) {
      return c.fail("tensor '" + info.name + "' of type " + std::string(dtype_name(info.dtype)) +
                    " has row length " + std::to_string(row) + ", not a multiple of " +
                    std::to_string(block));
    }
    // n_elements < 2^63 and block_bytes/block_size <= 4, so this cannot overflow
    // once divided first.
    const uint64_t n_blocks = static_cast<uint64_t>(n_elements / block);
    if (n_blocks > file_size / static_cast<uint64_t>(dtype_info(info.dtype).block_bytes)) {
      return c.fail("tensor '" + info.name + "' " + shape_to_string(info.shape) +
                    " is larger than the file");
    }
    info.n_bytes = n_blocks * static_cast<uint64_t>(dtype_info(info.dtype).block_bytes);
    if (info.offset % alignment != 0) {
      return c.fail("tensor '" + info.name + "' offset " + std::to_string(info.offset) +
                    " is not a multiple of the alignment " + std::to_string(alignment));
    }
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  if (n_tensors > 0 && data_start > file_size) {
    return corrupt(path + ": file truncated: the tensor data section would start at byte " +
                   std::to_string(data_start) + " but the file has " +
                   std::to_string(file_size) + " bytes");
  }
  const uint64_t data_size = n_tensors > 0 ? file_size - data_start : 0;

  std::vector<const RawTensorInfo*> by_offset;
  for (const auto& info : infos) {
    if (info.offset > data_size || info.n_bytes > data_size - info.offset) {
      return corrupt(path + ": tensor '" + info.name + "' (" + std::to_string(info.n_bytes) +
                     " bytes at data offset " + std::to_string(info.offset) +
                     ") runs past the end of the file (data section has " +
                     std::to_string(data_size) + " bytes; file truncated?)");
    }
    by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const RawTensorInfo* a, const RawTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const RawTensorInfo* a = by_offset[i - 1];
    const RawTensorInfo* b = by_offset[i];
    if (a->offset + a->n_bytes > b->offset) {
      return corrupt(path + ": tensors '" + a->name + "' and '" + b->name + "' overlap");
    }
  }

  for (auto& info : infos) {
    TensorView view;
    view.dtype = info.dtype;
    view.shape = std::move(info.shape);
    view.data = part.map->data() + data_start + info.offset;
    view.n_bytes = info.n_bytes;
    part.tensors.emplace(std::move(info.name), std::move(view));
  }
  return part;
}

// Recognises llama.cpp's split names `<prefix>-00002-of-00003.gguf`; returns false
// for any other name.
bool parse_split_name(const std::string& path, std::string* prefix, int* index, int* count) {
  constexpr std::string_view kExt = ".gguf";
  constexpr size_t kTail = 15;  // "-00002-of-00003"
  if (path.size() < kExt.size() + kTail ||
      path.compare(path.size() - kExt.size(), kExt.size(), kExt) != 0) {
    return false;
  }
  const std::string tail = path.substr(path.size() - kExt.size() - kTail, kTail);
  auto digits = [&](size_t pos, int* out) {
    *out = 0;
    for (size_t i = pos; i < pos + 5; ++i) {
      if (tail[i] < '0' || tail[i] > '9') return false;
      *out = *out * 10 + (tail[i] - '0');
    }
    return true;
  };
  if (tail[0] != '-' || tail.compare(6, 4, "-of-") != 0 || !digits(1, index) ||
      !digits(10, count)) {
    return false;
  }
  *prefix = path.substr(0, path.size() - kExt.size() - kTail);
  return true;
}

std::string five_digits(int i) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%05d", i);
  return buf;
}

}  // namespace

const GgufValue* GgufMetadata::find(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

namespace {

template <typename T>
Result<const T*> get_typed(const GgufMetadata& m, const std::string& key, const char* want) {
  const GgufValue* v = m.find(key);
  if (v == nullptr) return not_found(m.source + ": metadata key '" + key + "' not found");
  if (const T* p = std::get_if<T>(v)) return p;
  return corrupt(m.source + ": metadata key '" + key + "' is not " + want);
}

template <typename T>
Result<const std::vector<T>*> get_array(const GgufMetadata& m, const std::string& key,
                                        const char* want) {
  DS_ASSIGN_OR_RETURN(const GgufArray* a, get_typed<GgufArray>(m, key, want));
  if (const auto* p = std::get_if<std::vector<T>>(a)) return p;
  return corrupt(m.source + ": metadata key '" + key + "' is not " + want);
}

}  // namespace

Result<int64_t> GgufMetadata::get_int(const std::string& key) const {
  DS_ASSIGN_OR_RETURN(const int64_t* v, get_typed<int64_t>(*this, key, "an integer"));
  return *v;
}

Result<double> GgufMetadata::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v != nullptr) {
    if (const int64_t* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  }
  DS_ASSIGN_OR_RETURN(const double* d, get_typed<double>(*this, key, "a number"));
  return *d;
}

Result<bool> GgufMetadata::get_bool(const std::string& key) const {
  DS_ASSIGN_OR_RETURN(const bool* v, get_typed<bool>(*this, key, "a bool"));
  return *v;
}

Result<std::string> GgufMetadata::get_string(const std::string& key) const {
  DS_ASSIGN_OR_RETURN(const std::string* v, get_typed<std::string>(*this, key, "a string"));
  return *v;
}

Result<const std::vector<std::string>*> GgufMetadata::get_string_array(
    const std::string& key) const {
  return get_array<std::string>(*this, key, "an array of strings");
}

Result<const std::vector<int64_t>*> GgufMetadata::get_int_array(const std::string& key) const {
  return get_array<int64_t>(*this, key, "an array of integers");
}

Result<const std::vector<double>*> GgufMetadata::get_float_array(const std::string& key) const {
  return get_array<double>(*this, key, "an array of floats");
}

size_t GgufFile::release(const void* p, size_t n) const {
  for (const auto& map : maps_) {
    if (const size_t released = map->release(p, n); released > 0) return released;
  }
  return 0;
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  std::vector<std::string> part_paths{path};
  std::string prefix;
  int index = 0, count = 0;
  if (parse_split_name(path, &prefix, &index, &count)) {
    if (count < 1 || index < 1 || index > count) {
      return invalid_argument(path + ": split file name has part " + std::to_string(index) +
                              " of " + std::to_string(count));
    }
    part_paths.clear();
    for (int i = 1; i <= count; ++i) {
      part_paths.push_back(prefix + "-" + five_digits(i) + "-of-" + five_digits(count) + ".gguf");
    }
  }

  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->path_ = part_paths[0];
  const int n_parts = static_cast<int>(part_paths.size());
  for (int i = 0; i < n_parts; ++i) {
    const std::string& part_path = part_paths[i];
    Result<GgufPart> part_or = parse_part(part_path);
    if (!part_or.ok()) {
      if (part_or.status().code() == StatusCode::kNotFound && n_parts > 1) {
        return not_found("split GGUF model " + path + ": part " + part_path + " is missing");
      }
      return part_or.status();
    }
    GgufPart& part = *part_or;

    // split.count / split.no (0-based) must agree with the file names.
    const GgufMetadata& md = part.metadata;
    Result<int64_t> count = md.get_int("split.count");
    if (count.ok() && *count != n_parts) {
      if (n_parts == 1 && *count > 1) {
        return invalid_argument(part_path + ": this is one part of a " +
                                std::to_string(*count) +
                                "-part split model but its name is not "
                                "`<name>-0000k-of-0000n.gguf`, so the other parts cannot be found");
      }
      return corrupt(part_path + ": split.count is " + std::to_string(*count) + ", expected " +
                     std::to_string(n_parts));
    }
    Result<int64_t> no = md.get_int("split.no");
    if (n_parts > 1 && no.ok() && *no != i) {
      return corrupt(part_path + ": split.no is " + std::to_string(*no) + ", expected " +
                     std::to_string(i));
    }

    if (i == 0) {
      file->version_ = part.version;
      file->metadata_ = std::move(part.metadata);
    }
    for (auto& [name, view] : part.tensors) {
      if (file->tensors_.count(name)) {
        return corrupt(part_path + ": tensor '" + name + "' also appears in an earlier part");
      }
      file->tensors_.emplace(name, std::move(view));
    }
    file->maps_.push_back(std::move(part.map));
  }
  if (n_parts > 1) {
    Result<int64_t> total = file->metadata_.get_int("split.tensors.count");
    if (total.ok() && *total != static_cast<int64_t>(file->tensors_.size())) {
      return corrupt(file->path_ + ": split.tensors.count is " + std::to_string(*total) +
                     " but the parts hold " + std::to_string(file->tensors_.size()) + " tensors");
    }
  }
  DS_LOG_DEBUG("{}: GGUF v{}, {} parts, {} tensors, {} metadata keys", file->path_,
               file->version_, n_parts, file->tensors_.size(), file->metadata_.values().size());
  return file;
}

}  // namespace dserve
