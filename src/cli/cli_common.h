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

namespace dserve::cli {

// Options every model-running subcommand takes.
struct CommonOptions {
  std::string model;  // empty: the default model
  int n_threads = 0;  // 0: all cores
  bool pin_threads = false;
  std::string log_level = "warning";
  std::string isa;  // force "scalar", "avx2" or "avx512" kernels; empty: best available
};

// $DSERVE_MODEL, else $DSERVE_CACHE (default ~/.cache/dserve)/models/<default gguf>.
std::string default_model_path();

// Resolves options.model (or the default) and opens the files, with a message that
// says `make model` when the default model is missing.
Result<std::unique_ptr<ModelFiles>> open_model_files(const CommonOptions& options);

// InvalidArgument if --isa names an instruction set this CPU or build lacks.
Result<std::unique_ptr<Backend>> make_backend(const CommonOptions& options);

// "1,2,3" or "1 2 3" (commas, spaces, newlines, optional [ ] brackets) -> ids.
Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& what);

// Prints "dserve: error: <message>" on stderr and returns the exit code to use.
int report_error(const Status& status);

}  // namespace dserve::cli
