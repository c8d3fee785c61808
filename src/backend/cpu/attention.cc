// CpuBackend::attention: causal grouped-query attention over a contiguous KV store,
// two passes per (token, head): scores and their max, then exp / normalise / sum of
// values. Tasks are (token, head) pairs spread over the pool; each thread keeps its
// scores in its own scratch buffer.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "base/check.h"

namespace dserve::cpu {

void CpuBackend::attention(const float* q, const float* k, const float* v, float* out,
                           int64_t n_tokens, const int32_t* positions, int64_t n_kv, int n_heads,
                           int n_kv_heads, int head_dim, int v_dim, float scale) {
  DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    DS_CHECK_MSG(positions[t] >= 0 && positions[t] < n_kv,
                 "query position %d has no key (n_kv %lld)", positions[t],
                 static_cast<long long>(n_kv));
  }
  const int group = n_heads / n_kv_heads;
  const int64_t k_stride = int64_t{n_kv_heads} * head_dim;  // floats between positions
  const int64_t v_stride = int64_t{n_kv_heads} * v_dim;
  for (auto& buf : per_thread_) buf.get(static_cast<size_t>(n_kv) * sizeof(float));

  pool_.run(n_tokens * n_heads, [&](int64_t task, int thread) {
    const int64_t t = task / n_heads;
    const int h = static_cast<int>(task % n_heads);
    const int kvh = h / group;
    const float* qv = q + (t * n_heads + h) * head_dim;     // [head_dim]
    const float* kh = k + int64_t{kvh} * head_dim;          // row j at kh + j * k_stride
    const float* vh = v + int64_t{kvh} * v_dim;             // row j at vh + j * v_stride
    float* o = out + (t * n_heads + h) * v_dim;             // [v_dim]
    float* scores = per_thread_[thread].get_as<float>(n_kv);  // [n_ctx]
    const int64_t n_ctx = int64_t{positions[t]} + 1;

    float max_score = -INFINITY;
    for (int64_t j = 0; j < n_ctx; ++j) {
      scores[j] = kernels_.dot_f32(qv, kh + j * k_stride, head_dim) * scale;
      max_score = std::fmax(max_score, scores[j]);
    }
    const float sum = kernels_.exp_sub_sum_f32(scores, max_score, n_ctx);
    for (int i = 0; i < v_dim; ++i) o[i] = 0.0f;
    for (int64_t j = 0; j < n_ctx; ++j) kernels_.axpy_f32(scores[j], vh + j * v_stride, o, v_dim);
    kernels_.scale_f32(1.0f / sum, o, v_dim);
  });
}

}  // namespace dserve::cpu
