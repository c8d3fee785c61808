// CpuBackend::attention: causal grouped-query attention over a contiguous KV store,
// run as paged_attention over an identity block table (the store is a paged pool
// whose block b holds positions [16 b, 16 b + 16)), so the single-sequence paths
// (generate, perplexity) get the paged kernel's query-group tiles and its split of
// long contexts over threads, and the same bits as the engine's F32 cache at block
// size 16 for the same keys.
#include "backend/cpu/cpu_backend.h"
#include "base/check.h"

namespace dserve::cpu {

void CpuBackend::attention(const float* q, const float* k, const float* v, float* out,
                           int64_t n_tokens, const int32_t* positions, int64_t n_kv, int n_heads,
                           int n_kv_heads, int head_dim, int v_dim, float scale, int64_t k_row,
                           int64_t v_row) {
  DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
  if (k_row == 0) k_row = int64_t{n_kv_heads} * head_dim;
  if (v_row == 0) v_row = int64_t{n_kv_heads} * v_dim;
  DS_CHECK(k_row >= int64_t{n_kv_heads} * head_dim && v_row >= int64_t{n_kv_heads} * v_dim);
  for (int64_t t = 0; t < n_tokens; ++t) {
    DS_CHECK_MSG(positions[t] >= 0 && positions[t] < n_kv,
                 "query position %d has no key (n_kv %lld)", positions[t],
                 static_cast<long long>(n_kv));
  }
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

}  // namespace dserve::cpu
