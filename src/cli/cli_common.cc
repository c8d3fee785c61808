#include "cli/cli_common.h"

#include <sys/stat.h>

#include <CLI/CLI.hpp>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "backend/backend_registry.h"
#include "backend/cpu/cpu_isa.h"

namespace dserve::cli {
namespace {

constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string default_model_path() {
  if (std::string m = env_or_empty("DSERVE_MODEL"); !m.empty()) return m;
  std::string cache = env_or_empty("DSERVE_CACHE");
  if (cache.empty()) {
    const std::string home = env_or_empty("HOME");
    cache = (home.empty() ? std::string(".") : home) + "/.cache/dserve";
  }
  return cache + "/models/" + kDefaultModelFile;
}

Result<std::unique_ptr<ModelFiles>> open_model_files(const CommonOptions& options) {
  const bool is_default = options.model.empty();
  const std::string path = is_default ? default_model_path() : options.model;
  if (!path_exists(path)) {
    if (is_default) {
      return not_found("default model " + path +
                       " not found; run `make model` to fetch it, or pass --model PATH");
    }
    return not_found(path + ": no such file or directory");
  }
  return ModelFiles::open(path, options.quantization,
                          options.fp8_weights == "bf16" ? Fp8Weights::kBf16 : Fp8Weights::kFp8);
}

Result<std::unique_ptr<Backend>> make_backend(const CommonOptions& options) {
  if (!options.isa.empty()) DS_RETURN_IF_ERROR(cpu::check_isa(options.isa));
  BackendOptions backend;
  backend.device = options.device;
  backend.cpu.n_threads = options.n_threads;
  backend.cpu.pin_threads = options.pin_threads;
  backend.cpu.isa = options.isa;
  return ::dserve::make_backend(backend);
}

Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  const size_t n = text.size();
  auto is_sep = [](char c) {
    return c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '[' || c == ']';
  };
  while (i < n) {
    if (is_sep(text[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && !is_sep(text[j])) ++j;
    const std::string tok = text.substr(i, j - i);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (end != tok.c_str() + tok.size() || errno != 0 || v < 0 || v > INT32_MAX) {
      return invalid_argument(what + ": '" + tok + "' is not a token id");
    }
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  if (ids.empty()) return invalid_argument(what + ": no token ids");
  return ids;
}

void add_device_option(CLI::App* cmd, std::string* value) {
  cmd->add_option("--device", *value,
                  "cpu or cuda (default: cuda where this binary has the CUDA backend and a GPU "
                  "is found, else cpu; $DSERVE_DEVICE sets the default)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

void add_kv_cache_dtype_option(CLI::App* cmd, std::string* value) {
  cmd->add_option("--kv-cache-dtype", *value,
                  "element type of the paged KV cache: auto (float16 on the CPU), float16, "
                  "float32 or fp8 (fp8_e4m3: float8_e4m3fn, a quarter of float32's bytes); "
                  "attention computes in float32 either way")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "float16", "float32", "fp8", "fp8_e4m3"}));
}

Result<DType> kv_cache_dtype_from_flag(const std::string& value) {
  if (value == "auto" || value == "float16") return DType::kF16;
  if (value == "float32") return DType::kF32;
  if (value == "fp8" || value == "fp8_e4m3") return DType::kF8_E4M3;
  return invalid_argument("--kv-cache-dtype " + value + ": use auto, float16, float32 or fp8");
}

int report_error(const Status& status) {
  std::fprintf(stderr, "dserve: error: %s\n", status.message().c_str());
  std::fflush(stderr);
  return 1;
}

}  // namespace dserve::cli
