// MappedFile: a read-only memory map of a whole file. Model weights are used in
// place from the map, so the OS page cache holds the only copy.
//
// Thread-safety: immutable after open(); data() may be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace dserve {

class MappedFile {
 public:
  // Fails with NotFound / IoError naming the path.
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Asks the kernel for transparent huge pages over the map (best effort).
  void advise_huge_pages() const;
  // Drops this process's pages of [p, p + n) when that range lies in the map: the whole
  // pages inside it, so that a copy made of it does not stay resident twice. The data
  // stay readable (a later read faults them in again from the file). Returns the bytes
  // released, 0 for a range outside the map.
  size_t release(const void* p, size_t n) const;

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Allocates `bytes` (rounded up to whole 4 KiB pages) for KV caches and repacked
// weights: 2 MiB aligned, with huge pages advised over the whole 2 MiB spans, when it
// holds one or more; page aligned otherwise. Freed with free_huge().
void* alloc_huge(size_t bytes);
void free_huge(void* p, size_t bytes);

}  // namespace dserve
