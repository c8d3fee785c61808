#include "loader/model_files.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "base/log.h"
#include "base/progress_bar.h"
#include "loader/ascend_quant.h"
#include "loader/compressed_tensors.h"
#include "loader/gguf_names.h"
#include "loader/safetensors_file.h"
#include "tensor/requantize.h"

namespace dserve {
namespace {

namespace fs = std::filesystem;

// std::filesystem's throwing overloads are avoided: no exceptions leave the loader.
bool path_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

bool is_regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Reads and parses a JSON file. A missing optional file leaves `out` null.
Status read_json(const std::string& path, bool required, nlohmann::json* out) {
  if (!required && !path_exists(path)) return Status::Ok();
  DS_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map, MappedFile::open(path));
  const char* text = reinterpret_cast<const char*>(map->data());
  try {
    *out = nlohmann::json::parse(text, text + map->size());
  } catch (const nlohmann::json::exception& e) {
    return corrupt(path + ": invalid JSON: " + e.what());
  }
  if (!out->is_object()) return corrupt(path + ": expected a JSON object");
  return Status::Ok();
}

// Shard names from an index come from a file; keep them inside the model directory.
bool is_safe_relative_path(const std::string& p) {
  if (p.empty() || p[0] == '/') return false;
  for (const auto& part : fs::path(p)) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

ModelFiles::~ModelFiles() = default;

const TensorView* ModelFiles::find(const std::string& hf_name) const {
  auto it = tensors_.find(hf_name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<const TensorView*> ModelFiles::get(const std::string& hf_name) const {
  const TensorView* t = find(hf_name);
  if (t == nullptr) return not_found(path_ + ": tensor '" + hf_name + "' not found");
  return t;
}

size_t ModelFiles::total_tensor_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.n_bytes;
  return n;
}

size_t ModelFiles::release_pages(const TensorView& t) const {
  if (gguf_ != nullptr) return gguf_->release(t.data, t.n_bytes);
  for (const auto& shard : shards_) {
    if (const size_t n = shard->release(t.data, t.n_bytes); n > 0) return n;
  }
  return 0;
}

Status ModelFiles::open_gguf() {
  format_ = ModelFormat::kGguf;
  DS_ASSIGN_OR_RETURN(gguf_, GgufFile::open(path_));
  ProgressBar progress("validating " + path_, static_cast<int64_t>(gguf_->tensors().size()));
  int64_t done = 0;
  size_t converted_from = 0, converted_to = 0;
  int n_converted = 0;
  for (const auto& [gguf_name, raw] : gguf_->tensors()) {
    std::string hf_name = gguf_to_hf_name(gguf_name);
    TensorView view = raw;
    if (std::optional<DType> to = kernel_dtype_for(raw.dtype)) {
      // Storage-only types (Q5_0, Q5_1): converted once, exactly (tensor/requantize.h).
      view.dtype = *to;
      view.n_bytes = dtype_bytes(*to, raw.n_elements());
      std::vector<uint8_t>& bytes = converted_.emplace_back(view.n_bytes);
      const int64_t n_rows = raw.n_rows(), k = raw.row_length();
      for (int64_t r = 0; r < n_rows; ++r) {
        requantize_row(raw.dtype, static_cast<const uint8_t*>(raw.data) + r * raw.row_bytes(),
                       bytes.data() + r * view.row_bytes(), k);
      }
      view.data = bytes.data();
      converted_from += raw.n_bytes;
      converted_to += view.n_bytes;
      ++n_converted;
    }
    if (!tensors_.emplace(hf_name, view).second) {
      return corrupt(path_ + ": two tensors map to the name '" + hf_name + "'");
    }
    progress.update(++done);
  }
  if (n_converted > 0) {
    DS_LOG_INFO("{}: {} Q5_0/Q5_1 tensors converted at load (Q5_0 to Q8_0, Q5_1 to F32, "
                "values unchanged): {:.1f} MiB in the file, {:.1f} MiB in memory",
                path_, n_converted, static_cast<double>(converted_from) / (1 << 20),
                static_cast<double>(converted_to) / (1 << 20));
  }
  Result<std::string> arch = gguf_->metadata().get_string("general.architecture");
  rope_pairs_interleaved_ = arch.ok() && *arch == "llama";
  return Status::Ok();
}

Status ModelFiles::add_safetensors(const std::string& file, const std::set<std::string>* expected) {
  DS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> st, SafetensorsFile::open(file));
  for (const auto& [name, view] : st->tensors()) {
    if (!tensors_.emplace(name, view).second) {
      return corrupt(file + ": tensor '" + name + "' also appears in another shard");
    }
  }
  if (expected != nullptr) {
    for (const std::string& name : *expected) {
      if (!st->tensors().count(name)) {
        return not_found(file + ": tensor '" + name +
                         "' is listed for this shard in model.safetensors.index.json but "
                         "is not in it");
      }
    }
  }
  shards_.push_back(std::move(st));
  return Status::Ok();
}

Status ModelFiles::open_hf_dir() {
  format_ = ModelFormat::kHuggingFace;
  const std::string dir = path_;
  const std::string config = dir + "/config.json";
  if (!path_exists(config)) {
    return not_found(dir + ": no config.json (not a Hugging Face model directory)");
  }
  DS_RETURN_IF_ERROR(read_json(config, true, &hf_config_));
  DS_RETURN_IF_ERROR(read_json(dir + "/generation_config.json", false, &generation_config_));
  DS_RETURN_IF_ERROR(read_json(dir + "/tokenizer.json", false, &tokenizer_json_));
  DS_RETURN_IF_ERROR(read_json(dir + "/tokenizer_config.json", false, &tokenizer_config_));

  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single = dir + "/model.safetensors";
  if (path_exists(index_path)) {
    nlohmann::json index;
    DS_RETURN_IF_ERROR(read_json(index_path, true, &index));
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) {
      return corrupt(index_path + ": missing \"weight_map\" object");
    }
    std::map<std::string, std::set<std::string>> shards;  // file -> tensor names
    for (auto& [name, file] : wm->items()) {
      if (!file.is_string() || !is_safe_relative_path(file.get<std::string>())) {
        return corrupt(index_path + ": weight_map['" + name + "'] is not a file in " + dir);
      }
      shards[file.get<std::string>()].insert(name);
    }
    if (shards.empty()) return corrupt(index_path + ": weight_map is empty");
    ProgressBar progress("opening " + dir, static_cast<int64_t>(shards.size()));
    int64_t done = 0;
    for (const auto& [file, names] : shards) {
      const std::string shard_path = dir + "/" + file;
      if (!is_regular_file(shard_path)) {
        return not_found(index_path + ": shard " + shard_path + " is missing");
      }
      DS_RETURN_IF_ERROR(add_safetensors(shard_path, &names));
      progress.update(++done);
    }
  } else if (path_exists(single)) {
    DS_RETURN_IF_ERROR(add_safetensors(single, nullptr));
  } else {
    return not_found(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  return Status::Ok();
}

Status ModelFiles::apply_quantization(const std::string& expected) {
  if (!expected.empty() && expected != "compressed-tensors" && expected != "ascend") {
    return invalid_argument("--quantization " + expected +
                            ": unknown (compressed-tensors, ascend, or leave it out)");
  }
  const std::string config = path_ + "/config.json";
  const bool ascend = format_ == ModelFormat::kHuggingFace &&
                      path_exists(path_ + "/quant_model_description.json");
  const bool compressed = format_ == ModelFormat::kHuggingFace && is_compressed_tensors(hf_config_);
  if (compressed && ascend) {
    return invalid_argument(path_ + ": both config.json's quantization_config (compressed-tensors) and "
                            "quant_model_description.json (ascend) are present; which one holds?");
  }
  if (compressed) {
    quantization_ = "compressed-tensors";
  } else if (ascend) {
    quantization_ = "ascend";
  }
  if (!expected.empty() && expected != quantization_) {
    return invalid_argument(
        path_ + ": --quantization " + expected + " but the files are " +
        (quantization_.empty() ? std::string("not quantised that way")
                               : "quantised as " + quantization_) +
        (quantization_ == "compressed-tensors" ? " (config.json quantization_config)" : "") +
        (quantization_ == "ascend" ? " (quant_model_description.json)" : ""));
  }
  if (quantization_ == "ascend") {
    const std::string description_path = path_ + "/quant_model_description.json";
    nlohmann::json description;
    DS_RETURN_IF_ERROR(read_json(description_path, true, &description));
    DS_RETURN_IF_ERROR(attach_ascend_quant(description, description_path, &tensors_, &ascend_));
  }
  if (quantization_ == "compressed-tensors") {
    DS_RETURN_IF_ERROR(attach_compressed_tensors(hf_config_, config + ": quantization_config",
                                                 &tensors_, &scales_));
  }
  for (const auto& [name, t] : tensors_) {  // no int8 weight without its scales
    if (t.dtype == DType::kI8 && t.row_scales == nullptr) {
      return corrupt(path_ + ": int8 tensor '" + name + "' has no scale: neither config.json " +
                     "(quant_method compressed-tensors) nor quant_model_description.json gives it one");
    }
  }
  return Status::Ok();
}

std::string ModelFiles::weights_summary() const {
  struct Count {
    int64_t n_tensors = 0;
    size_t bytes = 0;
  };
  std::map<std::string, Count> by_format;
  for (const auto& [name, t] : tensors_) {
    std::string f(dtype_name(t.dtype));
    if (t.dtype == DType::kI8) {
      f = t.input_scale > 0.0f ? "i8 W8A8 (static activation scale)"
                               : "i8 W8A8 (per-token activations)";
    }
    Count& c = by_format[f];
    ++c.n_tensors;
    c.bytes += t.n_bytes;
  }
  std::string out;
  for (const auto& [f, c] : by_format) {
    if (!out.empty()) out += "; ";
    char buf[64];
    std::snprintf(buf, sizeof buf, ": %.1f MiB in %lld tensors",
                  static_cast<double>(c.bytes) / (1 << 20), static_cast<long long>(c.n_tensors));
    out += f + buf;
  }
  return out;
}

Result<std::unique_ptr<ModelFiles>> ModelFiles::open(const std::string& path,
                                                    const std::string& quantization,
                                                    Fp8Weights fp8_weights) {
  auto files = std::unique_ptr<ModelFiles>(new ModelFiles());
  files->fp8_weights_ = fp8_weights;
  // Trailing slashes would otherwise end up in every error message as "dir//file".
  files->path_ = path;
  while (files->path_.size() > 1 && files->path_.back() == '/') files->path_.pop_back();

  std::error_code ec;
  const fs::file_status st = fs::status(files->path_, ec);
  if (ec || !fs::exists(st)) return not_found(path + ": no such file or directory");
  if (fs::is_directory(st)) {
    DS_RETURN_IF_ERROR(files->open_hf_dir());
  } else if (fs::path(files->path_).extension() == ".gguf") {
    DS_RETURN_IF_ERROR(files->open_gguf());
  } else {
    return invalid_argument(path + ": expected a Hugging Face model directory or a .gguf file");
  }
  DS_RETURN_IF_ERROR(files->apply_quantization(quantization));
  DS_LOG_INFO("{}: {} tensors, {:.1f} MiB", files->path_, files->tensors_.size(),
              static_cast<double>(files->total_tensor_bytes()) / (1 << 20));
  DS_LOG_INFO("{}: weights {}{}", files->path_, files->weights_summary(),
              files->quantization_.empty() ? "" : " (" + files->quantization_ + ")");
  return files;
}

}  // namespace dserve
