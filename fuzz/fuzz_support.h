// What several fuzz targets share: the input as text, splitting it into parts, and a
// scratch directory for readers that take a path.
//
// Thread-safety: libFuzzer runs one input at a time per process; none of this is shared
// between threads.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace dserve::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The input cut at NUL bytes into at most `n` parts (the last keeps any further NULs):
// targets that read several files take them this way, so a seed stays readable text.
inline std::vector<std::string_view> split_parts(std::string_view text, size_t n) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < n) {
    const size_t nul = text.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(text.substr(0, nul));
    text.remove_prefix(nul + 1);
  }
  parts.push_back(text);
  return parts;
}

// A directory of this process's own under $TMPDIR (or /tmp), emptied for each input:
// the readers under test open files by path, as they do in dserve.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
                              ("dserve-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

inline void clear_scratch_dir() {
  for (const auto& entry : std::filesystem::directory_iterator(scratch_dir())) {
    std::filesystem::remove_all(entry.path());
  }
}

inline std::string write_scratch_file(const std::string& name, std::string_view bytes) {
  const std::filesystem::path path = scratch_dir() / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path.string();
}

}  // namespace dserve::fuzz
