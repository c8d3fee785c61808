// BackendBuffer: one region of a Backend's memory (device memory on an accelerator;
// on the CPU, host memory that only the backend's operations touch). The model and
// the engine hold their activations, KV pools, RoPE tables and per-step inputs in
// these buffers and never read or write them directly: data enters through
// Backend::upload and leaves through Backend::download.
//
// DeviceArray<T> is a typed, growable buffer for scratch activations: ensure(n) keeps
// at least n elements (contents are lost when it grows), get() is the backend pointer.
//
// Thread-safety: as the Backend that made it (one driving thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace dserve {

class Backend;

class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(Backend* owner, void* data, size_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
  ~BackendBuffer() { reset(); }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  BackendBuffer(BackendBuffer&& o) noexcept
      : owner_(std::exchange(o.owner_, nullptr)),
        data_(std::exchange(o.data_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      owner_ = std::exchange(o.owner_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  // A pointer in the backend's memory, valid for the backend's operations only.
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void reset();  // frees the memory (backend.cc)

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(Backend* backend) : backend_(backend) {}
  void bind(Backend* backend) { backend_ = backend; }
  // At least n elements (n may be 0); previous contents are lost when it grows.
  T* ensure(int64_t n);
  // ensure(n), then host[0, n) uploaded into it; returns the backend pointer.
  T* upload(const T* host, int64_t n);
  T* get() const { return buf_.as<T>(); }
  int64_t size() const { return static_cast<int64_t>(buf_.bytes() / sizeof(T)); }

 private:
  Backend* backend_ = nullptr;
  BackendBuffer buf_;
};

}  // namespace dserve
