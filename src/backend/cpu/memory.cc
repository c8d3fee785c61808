// CpuBackend's memory: host memory from alloc_huge (huge pages advised over its whole
// 2 MiB spans), so uploads, downloads and copies are memcpy.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "base/check.h"
#include "base/mapped_file.h"

namespace dserve::cpu {

BackendBuffer CpuBackend::alloc(size_t bytes) {
  if (bytes == 0) return {};
  void* data = alloc_huge(bytes);
  DS_CHECK_MSG(data != nullptr, "out of memory allocating %zu bytes", bytes);
  return BackendBuffer(this, data, bytes);
}

void CpuBackend::release(void* data, size_t bytes) { free_huge(data, bytes); }

void CpuBackend::upload(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::download(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void CpuBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes > 0) std::memset(dst, 0, bytes);
}

void CpuBackend::copy_strided(float* dst, const float* src, const StridedCopy& c) {
  const size_t run = static_cast<size_t>(c.len) * sizeof(float);
  for (int64_t i = 0; i < c.n0; ++i) {
    for (int64_t j = 0; j < c.n1; ++j) {
      std::memcpy(dst + i * c.dst_stride0 + j * c.dst_stride1,
                  src + i * c.src_stride0 + j * c.src_stride1, run);
    }
  }
}

void CpuBackend::gather_rows(const float* x, int64_t row_length, const int32_t* rows, int64_t n,
                             float* out) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * row_length, x + int64_t{rows[i]} * row_length,
                static_cast<size_t>(row_length) * sizeof(float));
  }
}

}  // namespace dserve::cpu
