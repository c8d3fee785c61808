// tensor_dump: a test-only tool for the Python reference tests. Opens a model with
// ModelFiles (or GgufFile for --gguf-names) and writes tensors dequantised to raw
// little-endian float32 files, printing one JSON line per tensor.
//
//   tensor_dump MODEL list                      all tensors: name, dtype, shape
//   tensor_dump MODEL dump OUT_DIR NAME...      OUT_DIR/<i>.f32 for the i-th NAME
//   tensor_dump MODEL meta                      the GGUF metadata as JSON
// Option --gguf-names (before MODEL): use GgufFile and GGUF tensor names.
// Exit status 1 with the Status on stderr if the model does not open.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "loader/gguf_file.h"
#include "loader/model_files.h"
#include "tensor/dequantize.h"

namespace {

using dserve::TensorView;

nlohmann::json describe(const std::string& name, const TensorView& t) {
  return {{"name", name}, {"dtype", std::string(dserve::dtype_name(t.dtype))},
          {"shape", t.shape}, {"n_bytes", t.n_bytes}};
}

nlohmann::json to_json(const dserve::GgufValue& v) {
  return std::visit(
      [](const auto& x) -> nlohmann::json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, dserve::GgufArray>) {
          return std::visit([](const auto& a) { return nlohmann::json(a); }, x);
        } else {
          return x;
        }
      },
      v);
}

int usage() {
  std::fprintf(stderr, "usage: tensor_dump [--gguf-names] MODEL list|meta|dump OUT_DIR NAME...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Load messages would mix with the JSON on stdout (spdlog's default sink).
  dserve::set_log_level("warning");
  std::vector<std::string> args(argv + 1, argv + argc);
  bool gguf_names = false;
  if (!args.empty() && args[0] == "--gguf-names") {
    gguf_names = true;
    args.erase(args.begin());
  }
  if (args.size() < 2) return usage();
  const std::string& model = args[0];
  const std::string& cmd = args[1];

  std::unique_ptr<dserve::ModelFiles> files;
  std::unique_ptr<dserve::GgufFile> gguf;
  const std::map<std::string, TensorView>* tensors = nullptr;
  const dserve::GgufMetadata* metadata = nullptr;
  if (gguf_names) {
    auto r = dserve::GgufFile::open(model);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
      return 1;
    }
    gguf = std::move(r).value();
    tensors = &gguf->tensors();
    metadata = &gguf->metadata();
  } else {
    auto r = dserve::ModelFiles::open(model);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
      return 1;
    }
    files = std::move(r).value();
    tensors = &files->tensors();
    metadata = files->gguf_metadata();
  }

  if (cmd == "list") {
    for (const auto& [name, t] : *tensors) std::printf("%s\n", describe(name, t).dump().c_str());
    if (files) {
      nlohmann::json extra = {{"rope_pairs_interleaved", files->rope_pairs_interleaved()}};
      std::printf("%s\n", extra.dump().c_str());
    }
    return 0;
  }
  if (cmd == "meta") {
    nlohmann::json out = nlohmann::json::object();
    if (metadata != nullptr) {
      for (const auto& [k, v] : metadata->values()) out[k] = to_json(v);
    }
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  if (cmd != "dump" || args.size() < 3) return usage();
  const std::string& out_dir = args[2];
  for (size_t i = 3; i < args.size(); ++i) {
    auto it = tensors->find(args[i]);
    if (it == tensors->end()) {
      std::fprintf(stderr, "tensor '%s' not found\n", args[i].c_str());
      return 1;
    }
    const TensorView& t = it->second;
    std::vector<float> out(static_cast<size_t>(t.n_elements()));
    const int64_t row = t.row_length();
    for (int64_t r = 0; r < t.n_rows(); ++r) {
      dserve::dequantize_row(t.dtype, t.row(r), out.data() + r * row, row);
    }
    const std::string file = out_dir + "/" + std::to_string(i - 3) + ".f32";
    std::ofstream f(file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(out.data()),
            static_cast<std::streamsize>(out.size() * sizeof(float)));
    if (!f) {
      std::fprintf(stderr, "%s: write failed\n", file.c_str());
      return 1;
    }
    nlohmann::json d = describe(args[i], t);
    d["file"] = file;
    std::printf("%s\n", d.dump().c_str());
  }
  return 0;
}
