// TensorShards: the slices of weight tensors one tensor-parallel rank keeps.
//
// A column-parallel weight (q/k/v, gate/up, lm_head, the embedding) is split by rows,
// which are contiguous in any dtype, so its shard is a view into the mapped file: the
// rank never touches the other ranks' rows. A row-parallel weight (o_proj, down_proj)
// is split along its input dimension, which is strided, so its shard is copied into
// memory the rank owns; for a quantised type the split must fall on block boundaries.
//
// Thread-safety: built at load on one thread; the views are read-only afterwards.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "tensor/tensor_view.h"

namespace dserve {

class TensorShards {
 public:
  TensorShards() = default;
  TensorShards(const TensorShards&) = delete;
  TensorShards& operator=(const TensorShards&) = delete;

  // Rows [begin, end) of t (a 2-D [rows, cols] weight, or elements of a 1-D vector): a
  // view into t's memory. The returned pointer stays valid for this object's life.
  Result<const TensorView*> rows(const TensorView& t, const std::string& name, int64_t begin, int64_t end);
  // Columns [begin, end) of a 2-D t, copied row by row.
  Result<const TensorView*> columns(const TensorView& t, const std::string& name, int64_t begin, int64_t end);

  // Bytes of the copies columns() made (memory on top of the mapped files).
  size_t copied_bytes() const { return copied_bytes_; }

 private:
  std::deque<TensorView> views_;  // deque: pointers to elements stay valid as it grows
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<uint8_t, FreeDeleter>> buffers_;  // 64-byte aligned copies
  size_t copied_bytes_ = 0;
};

}  // namespace dserve
