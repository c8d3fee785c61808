#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loader/gguf_file.h"
#include "loader/model_files.h"

namespace dserve {

namespace {

// Parses a JSON file; NotFound if absent (when optional, a null json instead).
Result<nlohmann::json> read_json(const std::filesystem::path& p, bool optional) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) {
    if (optional) return nlohmann::json();
    return not_found(p.string() + ": no such file");
  }
  std::ifstream in(p, std::ios::binary);
  if (!in) return io_error(p.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt(p.string() + ": not valid JSON");
  return j;
}

const nlohmann::json* opt(const nlohmann::json& j) { return j.is_null() ? nullptr : &j; }

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_model_files(const ModelFiles& files) {
  switch (files.format()) {
    case ModelFormat::kGguf: {
      const GgufMetadata* md = files.gguf_metadata();
      if (md == nullptr) return internal_error(files.path() + ": GGUF file without metadata");
      return from_gguf_metadata(*md);
    }
    case ModelFormat::kHuggingFace: {
      const nlohmann::json* tj = files.tokenizer_json();
      if (tj == nullptr) return not_found(files.path() + ": no tokenizer.json");
      return from_hf_json(*tj, files.tokenizer_config(), files.generation_config(), files.path());
    }
  }
  return internal_error(files.path() + ": unknown model format");
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_path(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p(path);
  if (std::filesystem::is_directory(p, ec)) {
    DS_ASSIGN_OR_RETURN(const nlohmann::json tj, read_json(p / "tokenizer.json", false));
    DS_ASSIGN_OR_RETURN(const nlohmann::json cfg, read_json(p / "tokenizer_config.json", true));
    DS_ASSIGN_OR_RETURN(const nlohmann::json gen, read_json(p / "generation_config.json", true));
    return from_hf_json(tj, opt(cfg), opt(gen), path);
  }
  if (!std::filesystem::exists(p, ec)) return not_found(path + ": no such file or directory");
  if (p.extension() == ".json") {  // a bare tokenizer.json
    DS_ASSIGN_OR_RETURN(const nlohmann::json tj, read_json(p, false));
    return from_hf_json(tj, nullptr, nullptr, path);
  }
  DS_ASSIGN_OR_RETURN(auto gguf, GgufFile::open(path));
  return from_gguf_metadata(gguf->metadata());
}

}  // namespace dserve
