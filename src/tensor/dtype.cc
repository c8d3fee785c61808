#include "tensor/dtype.h"

#include <string>

#include "base/check.h"

namespace dserve {

const DTypeInfo& dtype_info(DType t) {
  static const DTypeInfo kF32{"f32", 1, 4};
  static const DTypeInfo kF16{"f16", 1, 2};
  static const DTypeInfo kBF16{"bf16", 1, 2};
  static const DTypeInfo kQ8_0{"q8_0", 32, 34};
  static const DTypeInfo kQ4_0{"q4_0", 32, 18};
  static const DTypeInfo kQ4_1{"q4_1", 32, 20};
  static const DTypeInfo kQ4_K{"q4_k", 256, 144};
  static const DTypeInfo kQ5_K{"q5_k", 256, 176};
  static const DTypeInfo kQ6_K{"q6_k", 256, 210};
  static const DTypeInfo kI8{"i8", 1, 1};
  static const DTypeInfo kF8_E4M3{"f8_e4m3", 1, 1};
  static const DTypeInfo kQ5_0{"q5_0", 32, 22};
  static const DTypeInfo kQ5_1{"q5_1", 32, 24};
  static const DTypeInfo kI32{"i32", 1, 4};
  static const DTypeInfo kI64{"i64", 1, 8};
  switch (t) {
    case DType::kF32: return kF32;
    case DType::kF16: return kF16;
    case DType::kBF16: return kBF16;
    case DType::kQ8_0: return kQ8_0;
    case DType::kQ4_0: return kQ4_0;
    case DType::kQ4_1: return kQ4_1;
    case DType::kQ4_K: return kQ4_K;
    case DType::kQ5_K: return kQ5_K;
    case DType::kQ6_K: return kQ6_K;
    case DType::kI8: return kI8;
    case DType::kF8_E4M3: return kF8_E4M3;
    case DType::kQ5_0: return kQ5_0;
    case DType::kQ5_1: return kQ5_1;
    case DType::kI32: return kI32;
    case DType::kI64: return kI64;
  }
  DS_CHECK_MSG(false, "bad dtype %d", static_cast<int>(t));
  return kF32;
}

size_t dtype_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  DS_CHECK(n % info.block_size == 0);
  return static_cast<size_t>(n / info.block_size) * static_cast<size_t>(info.block_bytes);
}

std::optional<DType> dtype_from_ggml_type(uint32_t ggml_type) {
  switch (ggml_type) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 2: return DType::kQ4_0;
    case 3: return DType::kQ4_1;
    case 6: return DType::kQ5_0;
    case 7: return DType::kQ5_1;
    case 8: return DType::kQ8_0;
    case 12: return DType::kQ4_K;
    case 13: return DType::kQ5_K;
    case 14: return DType::kQ6_K;
    case 30: return DType::kBF16;
    default: return std::nullopt;
  }
}

uint32_t ggml_type_of(DType t) {
  switch (t) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ4_0: return 2;
    case DType::kQ4_1: return 3;
    case DType::kQ5_0: return 6;
    case DType::kQ5_1: return 7;
    case DType::kQ8_0: return 8;
    case DType::kQ4_K: return 12;
    case DType::kQ5_K: return 13;
    case DType::kQ6_K: return 14;
    case DType::kI8:
    case DType::kF8_E4M3:
    case DType::kI32:
    case DType::kI64:
      DS_CHECK_MSG(false, "%s has no ggml type", std::string(dtype_name(t)).c_str());
      return 0;
    case DType::kBF16: return 30;
  }
  return 0;
}

}  // namespace dserve
