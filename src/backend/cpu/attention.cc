// CpuBackend::attention: causal grouped-query attention over a contiguous KV store,
// run as paged_attention over an identity block table (the store is a paged pool
// whose block b holds positions [16 b, 16 b + 16)), so the single-sequence paths
// (generate, perplexity) get the paged kernel's query-group tiles and its split of
// long contexts over threads, and the same bits as the engine's F32 cache at block
// size 16 for the same keys.
// CpuBackend::prompt_attention: the same over the kernel table's attn_prompt_f32
// (AttnPromptArgs, kernels.h), which puts a block of queries in vector lanes and
// broadcasts each key and value element, so that no sum crosses lanes (attention's
// kernel reduces each dot product across lanes, a cost per query and key that a
// prompt of many queries need not pay); attention()'s kernel where the level has none.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "base/check.h"

namespace dserve::cpu {
namespace {

// The checks of attention()'s arguments; fills in k_row and v_row when 0.
void check_contiguous_attention(int64_t n_tokens, const int32_t* positions, int64_t n_kv,
                                int n_heads, int n_kv_heads, int head_dim, int v_dim,
                                int64_t* k_row, int64_t* v_row) {
  DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
  if (*k_row == 0) *k_row = int64_t{n_kv_heads} * head_dim;
  if (*v_row == 0) *v_row = int64_t{n_kv_heads} * v_dim;
  DS_CHECK(*k_row >= int64_t{n_kv_heads} * head_dim && *v_row >= int64_t{n_kv_heads} * v_dim);
  for (int64_t t = 0; t < n_tokens; ++t) {
    DS_CHECK_MSG(positions[t] >= 0 && positions[t] < n_kv,
                 "query position %d has no key (n_kv %lld)", positions[t],
                 static_cast<long long>(n_kv));
  }
}

}  // namespace

void CpuBackend::attention(const float* q, const float* k, const float* v, float* out,
                           int64_t n_tokens, const int32_t* positions, int64_t n_kv, int n_heads,
                           int n_kv_heads, int head_dim, int v_dim, float scale, int64_t k_row,
                           int64_t v_row) {
  check_contiguous_attention(n_tokens, positions, n_kv, n_heads, n_kv_heads, head_dim, v_dim,
                             &k_row, &v_row);
  if (n_tokens == 0) return;
  // The kernel reads only keys at or before each query's position (< n_kv), so the
  // last block may reach past the store.
  constexpr int kBlock = 16;
  const int64_t n_blocks = (n_kv + kBlock - 1) / kBlock;
  auto* table = contiguous_table_.get_as<int32_t>(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>(b);
  auto* seq_of_token = contiguous_seqs_.get_as<int32_t>(static_cast<size_t>(n_tokens));
  for (int64_t t = 0; t < n_tokens; ++t) seq_of_token[t] = 0;
  const int64_t offsets[2] = {0, n_blocks};
  PagedBatch batch;
  batch.n_tokens = n_tokens;
  batch.positions = positions;
  batch.seq_of_token = seq_of_token;
  batch.n_seqs = 1;
  batch.block_tables = table;
  batch.block_table_offsets = offsets;
  batch.block_size = kBlock;
  run_paged_attention(q, DType::kF32, k, v, out, batch, n_heads, n_kv_heads, head_dim, v_dim, k_row,
                      v_row, scale);
}

// One task per (head, block of attn_prompt_queries consecutive tokens), head by head
// so that a head's blocks, one after another, find its keys and values in cache.
void CpuBackend::prompt_attention(const float* q, const float* k, const float* v, float* out,
                                  int64_t n_tokens, const int32_t* positions, int64_t n_kv,
                                  int n_heads, int n_kv_heads, int head_dim, int v_dim,
                                  float scale, int64_t k_row, int64_t v_row) {
  if (kernels_.attn_prompt_f32 == nullptr) {
    attention(q, k, v, out, n_tokens, positions, n_kv, n_heads, n_kv_heads, head_dim, v_dim, scale,
              k_row, v_row);
    return;
  }
  check_contiguous_attention(n_tokens, positions, n_kv, n_heads, n_kv_heads, head_dim, v_dim,
                             &k_row, &v_row);
  if (n_tokens == 0) return;
  const int lanes = kernels_.attn_prompt_queries;
  const int64_t n_blocks = (n_tokens + lanes - 1) / lanes;
  const int group = n_heads / n_kv_heads;
  const int64_t scratch = attn_prompt_scratch_floats(head_dim, v_dim, lanes);
  for (auto& buf : per_thread_) buf.get(scratch * sizeof(float));
  pool_.run(n_heads * n_blocks, [&](int64_t task, int thread) {
    const int64_t h = task / n_blocks, t0 = task % n_blocks * lanes;
    const int64_t kv_head = h / group;
    AttnPromptArgs a{};
    a.q = q + (t0 * n_heads + h) * head_dim;
    a.q_stride = int64_t{n_heads} * head_dim;
    a.positions = positions + t0;
    a.n_q = static_cast<int>(std::min<int64_t>(lanes, n_tokens - t0));
    a.k = k + kv_head * head_dim;
    a.v = v + kv_head * v_dim;
    a.k_stride = k_row;
    a.v_stride = v_row;
    a.head_dim = head_dim;
    a.v_dim = v_dim;
    a.scale = scale;
    a.out = out + (t0 * n_heads + h) * v_dim;
    a.out_stride = int64_t{n_heads} * v_dim;
    a.scratch = per_thread_[thread].get_as<float>(scratch);
    kernels_.attn_prompt_f32(a);
  });
}

}  // namespace dserve::cpu
