// Helpers shared by the dserve subcommands: where the default model lives, loading a
// model with its backend, parsing id lists, and the one-line error convention.
//
// Thread-safety: called from main's thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "loader/model_files.h"

namespace CLI {
class App;
}

namespace dserve::cli {

// Options every model-running subcommand takes.
struct CommonOptions {
  std::string model;  // empty: the default model
  int n_threads = 0;  // 0: all cores
  bool pin_threads = false;
  std::string log_level = "warning";
  std::string isa;  // force "scalar", "avx2" or "avx512" kernels; empty: best available
  // "cpu" or "cuda"; empty: cuda where this binary has it and a GPU is found, else cpu.
  std::string device;
  // The weights' quantisation the user expects ("compressed-tensors", "ascend");
  // empty: whatever the files say (ModelFiles::open).
  std::string quantization;
  // How FP8 checkpoints' weights are held: "fp8" (1 byte per weight, the kernels
  // convert) or "bf16" (converted at load). See loader/model_files.h, Fp8Weights.
  std::string fp8_weights = "fp8";
};

// CLI11 check and help text shared by every subcommand that takes --fp8-weights.
inline constexpr const char* kFp8WeightsHelp =
    "FP8 checkpoints (DeepSeek-V3/R1): fp8 keeps the weights in FP8, 1 byte per weight, "
    "converted inside the kernels (default); bf16 converts them at load (2 bytes per weight)";

// $DSERVE_MODEL, else $DSERVE_CACHE (default ~/.cache/dserve)/models/<default gguf>.
std::string default_model_path();

// Resolves options.model (or the default) and opens the files, with a message that
// says `make model` when the default model is missing.
Result<std::unique_ptr<ModelFiles>> open_model_files(const CommonOptions& options);

// The backend --device names (backend/backend_registry.h). InvalidArgument if --isa
// names an instruction set this CPU or build lacks.
Result<std::unique_ptr<Backend>> make_backend(const CommonOptions& options);

// "1,2,3" or "1 2 3" (commas, spaces, newlines, optional [ ] brackets) -> ids.
Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& what);

// --device on `cmd`, stored in *value: "cpu" or "cuda" (any other value is a parse
// error that names the choices); unset leaves the choice to make_backend.
void add_device_option(CLI::App* cmd, std::string* value);

// --kv-cache-dtype (vLLM's flag) on `cmd`, stored in *value: "auto" (the default:
// float16 on the CPU), "float16" or "float32"; any other value is a parse error that
// names the choices.
void add_kv_cache_dtype_option(CLI::App* cmd, std::string* value);
// The paged KV cache's element type for a --kv-cache-dtype value.
Result<DType> kv_cache_dtype_from_flag(const std::string& value);

// Prints "dserve: error: <message>" on stderr and returns the exit code to use.
int report_error(const Status& status);

}  // namespace dserve::cli
