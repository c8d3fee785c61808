// ScratchBuffer: a growable, 64-byte-aligned (huge-page-advised) byte buffer that
// kernels reuse across calls, so the hot path never allocates once warm.
//
// Thread-safety: none; each buffer belongs to one thread (or to the engine thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/check.h"
#include "base/mapped_file.h"

namespace dserve::cpu {

class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ~ScratchBuffer() {
    if (data_ != nullptr) free_huge(data_, size_);
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ScratchBuffer(ScratchBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }

  // Returns at least `bytes` bytes; previous contents are not kept.
  uint8_t* get(size_t bytes) {
    if (bytes > size_) {
      if (data_ != nullptr) free_huge(data_, size_);
      size_ = bytes + bytes / 2;  // grow geometrically
      data_ = static_cast<uint8_t*>(alloc_huge(size_));
      DS_CHECK_MSG(data_ != nullptr, "out of memory allocating %zu scratch bytes", size_);
    }
    return data_;
  }
  template <typename T>
  T* get_as(size_t n) {
    return reinterpret_cast<T*>(get(n * sizeof(T)));
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dserve::cpu
