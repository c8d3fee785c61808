// The kernels' arguments from the Backend interface's types: DeviceMatrix from a
// TensorView (its pointers still the view's, host memory: CudaBackend copies the bytes
// and scales to the device and points the matrix there; the host-side checks of
// kernels.h use it as is), RoutingArgs from MoeRouting.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "tensor/tensor_view.h"

namespace dserve::cuda {

// The floats of w's block scales that its rows and columns read: whole scale rows up
// to the last block row used, the last of them only up to the block of the last
// column (a view's scales may start inside a bigger tensor's grid).
inline int64_t block_scale_floats(const TensorView& w) {
  const BlockScales& s = w.block_scales;
  const int64_t block_rows_used = (s.row0 + w.n_rows() + s.block_rows - 1) / s.block_rows;
  const int64_t blocks_per_row = (s.col0 + w.row_length() + s.block_cols - 1) / s.block_cols;
  return (block_rows_used - 1) * s.stride + blocks_per_row;
}

inline DeviceMatrix matrix_of(const TensorView& w) {
  DeviceMatrix m;
  m.dtype = w.dtype;
  m.n_rows = w.n_rows();
  m.n_cols = w.row_length();
  m.row_bytes = static_cast<int64_t>(w.row_bytes());
  m.data = static_cast<const uint8_t*>(w.data);
  m.row_scales = w.row_scales;
  m.row_bias = w.row_bias;
  m.input_scale = w.input_scale;
  m.input_offset = w.input_offset;
  if (const BlockScales& s = w.block_scales; s.data != nullptr) {
    m.scales = s.data;
    m.scale_stride = s.stride;
    m.block_rows = s.block_rows;
    m.block_cols = s.block_cols;
    m.row0 = s.row0;
    m.col0 = s.col0;
  }
  return m;
}

// The bias pointer is r's (backend memory for moe_route, host memory for route_on_host).
inline RoutingArgs routing_args_of(const MoeRouting& r) {
  RoutingArgs a;
  a.n_experts = r.n_experts;
  a.top_k = r.top_k;
  a.sigmoid = r.scoring == MoeScoring::kSigmoid;
  switch (r.group_select) {
    case MoeGroupSelect::kNone: a.group_select = 0; break;
    case MoeGroupSelect::kMaxOfGroup: a.group_select = 1; break;
    case MoeGroupSelect::kTopTwoSum: a.group_select = 2; break;
  }
  a.n_groups = r.n_groups;
  a.top_groups = r.top_groups;
  a.normalize = r.normalize;
  a.scaling = r.scaling;
  a.correction_bias = r.correction_bias;
  return a;
}

}  // namespace dserve::cuda
