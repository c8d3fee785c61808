// CpuBackend construction and its element-wise / row-wise ops. matmul is in
// matmul.cc, attention in attention.cc.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <string>

#include "base/check.h"
#include "base/log.h"
#include "tensor/dequantize.h"

namespace dserve {

bool check_memory_from_environment() {
  const char* check = std::getenv("DSERVE_CHECK_BACKEND_MEMORY");
  return check != nullptr && std::string_view(check) == "1";
}

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  cpu::CpuIsa isa = cpu::best_isa();
  if (!options.isa.empty()) {
    std::optional<cpu::CpuIsa> forced = cpu::parse_isa(options.isa);
    DS_CHECK_MSG(forced.has_value(), "unknown instruction set '%s' (scalar, avx2, avx512)",
                 options.isa.c_str());
    if (cpu::isa_supported(*forced)) {
      isa = *forced;
    } else {
      DS_LOG_WARN("instruction set '{}' is not supported by this CPU; using '{}'", options.isa,
                  cpu::isa_name(isa));
    }
  }
  auto backend = std::make_unique<cpu::CpuBackend>(isa, options.n_threads, options.pin_threads);
  DS_LOG_INFO("CPU kernels: {} (this machine has: {})", backend->name(),
              cpu::supported_isas_text());
  if (options.check_memory) {
    DS_LOG_INFO("checking backend: backend memory is unreadable outside backend operations");
    return make_checking_backend(std::move(backend));
  }
  return backend;
}

namespace cpu {
namespace {

// Below this many values an element-wise op runs on the calling thread: waking the
// pool costs more than the work.
constexpr int64_t kParallelElements = 1 << 15;
// A multiple of every kernel vector width (in floats).
constexpr int64_t kVectorAlign = 64;

}  // namespace

CpuBackend::CpuBackend(CpuIsa isa, int n_threads, bool pin_threads)
    : kernels_(kernels_for(isa)),
      name_("cpu-" + std::string(isa_name(isa))),
      pool_(n_threads, pin_threads) {
  per_thread_.resize(pool_.n_threads());
}

const float* CpuBackend::as_f32(const TensorView& t, ScratchBuffer& buf) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  float* out = buf.get_as<float>(t.n_elements());
  dequantize_row(t.dtype, t.data, out, t.n_elements());
  return out;
}

void CpuBackend::get_rows(const TensorView& table, const int32_t* ids, int64_t n_ids,
                          float* out) {
  const int64_t n_rows = table.n_rows();
  for (int64_t i = 0; i < n_ids; ++i) {
    DS_CHECK_MSG(ids[i] >= 0 && ids[i] < n_rows, "row id %d out of range [0, %lld)", ids[i],
                 static_cast<long long>(n_rows));
  }
  get_rows_shard(table, ids, n_ids, 0, out);
}

void CpuBackend::get_rows_shard(const TensorView& table, const int32_t* ids, int64_t n_ids,
                                int64_t first_id, float* out) {
  const int64_t len = table.row_length();
  const int64_t n_rows = table.n_rows();
  auto rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t id = int64_t{ids[i]} - first_id;
      if (id < 0 || id >= n_rows) {  // another vocabulary shard's row
        std::fill_n(out + i * len, len, 0.0f);
        continue;
      }
      dequantize_row(table.dtype, table.row(id), out + i * len, len);
      if (table.row_scales != nullptr) {  // I8 rows: their values times the row's scale
        for (int64_t j = 0; j < len; ++j) out[i * len + j] *= table.row_scales[id];
      }
      if (table.block_scales.data != nullptr) {  // FP8 rows: times their blocks' scales
        for (int64_t j = 0; j < len; ++j) out[i * len + j] *= table.block_scales.at(id, j);
      }
    }
  };
  if (n_ids * len < kParallelElements) {
    rows(0, n_ids, 0);
  } else {
    pool_.parallel_for(n_ids, 1, rows);
  }
}

void CpuBackend::rms_norm(const float* x, const TensorView& weight, float eps, int64_t n_tokens,
                          int64_t n, float* out) {
  DS_CHECK(weight.n_elements() == n);
  const float* w = as_f32(weight, param_);
  auto rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) kernels_.rms_norm_f32(x + t * n, w, eps, n, out + t * n);
  };
  if (n_tokens * n < kParallelElements) {
    rows(0, n_tokens, 0);
  } else {
    pool_.parallel_for(n_tokens, 1, rows);
  }
}

void CpuBackend::silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  if (n < kParallelElements) {
    kernels_.silu_mul_f32(gate, up, n, out);
    return;
  }
  // Chunks start on multiples of kVectorAlign elements, so that an element takes the
  // kernel's vector path (not its scalar tail, whose exp differs in the last bits)
  // whatever n is: a token's activations do not depend on how many tokens share the
  // batch.
  const int64_t n_vec = (n + kVectorAlign - 1) / kVectorAlign;
  pool_.parallel_for(n_vec, 4096 / kVectorAlign, [&](int64_t begin, int64_t end, int) {
    const int64_t b = begin * kVectorAlign, e = std::min(n, end * kVectorAlign);
    kernels_.silu_mul_f32(gate + b, up + b, e - b, out + b);
  });
}

void CpuBackend::add_inplace(float* x, const float* y, int64_t n) {
  if (n < kParallelElements) {
    kernels_.add_f32(x, y, n);
    return;
  }
  pool_.parallel_for(n, 4096, [&](int64_t begin, int64_t end, int) {
    kernels_.add_f32(x + begin, y + begin, end - begin);
  });
}

void CpuBackend::rope(float* x, int64_t n_tokens, int n_heads, int head_dim,
                      const int32_t* positions, const RopeTable& table, bool pairs_interleaved) {
  const int rot = table.rotary_dim;
  DS_CHECK(rot % 2 == 0 && rot <= head_dim);
  const int half = rot / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    DS_CHECK_MSG(positions[t] >= 0 && positions[t] < table.n_positions,
                 "position %d outside the RoPE table (%lld positions)", positions[t],
                 static_cast<long long>(table.n_positions));
  }
  auto rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = table.cos + static_cast<int64_t>(positions[t]) * half;
      const float* s = table.sin + static_cast<int64_t>(positions[t]) * half;
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * head_dim;
        if (pairs_interleaved) {
          for (int i = 0; i < half; ++i) {
            const float a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = a * c[i] - b * s[i];
            v[2 * i + 1] = a * s[i] + b * c[i];
          }
        } else {
          for (int i = 0; i < half; ++i) {
            const float a = v[i], b = v[i + half];
            v[i] = a * c[i] - b * s[i];
            v[i + half] = a * s[i] + b * c[i];
          }
        }
      }
    }
  };
  if (n_tokens * n_heads * head_dim < kParallelElements) {
    rows(0, n_tokens, 0);
  } else {
    pool_.parallel_for(n_tokens, 1, rows);
  }
}

}  // namespace cpu
}  // namespace dserve
