#include "model/model_batch.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace dserve {

Status resolve_paged_batch(const ModelBatch& batch, int64_t vocab_size, int64_t max_context,
                           int n_cache_blocks, int block_size, std::vector<int64_t>* slots,
                           PagedBatch* paged) {
  const int64_t n = batch.n_tokens();
  const int64_t n_seqs = batch.n_seqs();
  if (n == 0) return invalid_argument("forward_batch: empty batch");
  if (batch.positions.size() != batch.tokens.size() ||
      batch.seq_of_token.size() != batch.tokens.size() || n_seqs < 1) {
    return invalid_argument("forward_batch: tokens, positions and seq_of_token differ in length");
  }
  if (!batch.prompt_lens.empty() && static_cast<int64_t>(batch.prompt_lens.size()) != n_seqs) {
    return invalid_argument("forward_batch: " + std::to_string(batch.prompt_lens.size()) +
                            " prompt lengths for " + std::to_string(n_seqs) + " sequences");
  }
  const int64_t bs = block_size;
  slots->resize(n);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = batch.tokens[t], s = batch.seq_of_token[t], p = batch.positions[t];
    if (id < 0 || id >= vocab_size) {
      return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(vocab_size) + ")");
    }
    if (s < 0 || s >= n_seqs) return invalid_argument("forward_batch: bad sequence index");
    if (p < 0 || p >= max_context) {
      return invalid_argument("forward_batch: position " + std::to_string(p) +
                              " outside the context of " + std::to_string(max_context));
    }
    const int64_t first = batch.block_table_offsets[s];
    if (p / bs >= batch.block_table_offsets[s + 1] - first) {
      return invalid_argument("forward_batch: position " + std::to_string(p) +
                              " beyond its block table");
    }
    const int32_t block = batch.block_tables[first + p / bs];
    if (block < 0 || block >= n_cache_blocks)
      return invalid_argument("forward_batch: block id out of range");
    (*slots)[t] = int64_t{block} * bs + p % bs;
  }
  for (int32_t r : batch.logits_rows) {
    if (r < 0 || r >= n) return invalid_argument("forward_batch: logits row out of range");
  }
  paged->n_tokens = n;
  paged->positions = batch.positions.data();
  paged->seq_of_token = batch.seq_of_token.data();
  paged->n_seqs = n_seqs;
  paged->block_tables = batch.block_tables.data();
  paged->block_table_offsets = batch.block_table_offsets.data();
  paged->block_size = block_size;
  return Status::Ok();
}

void DeviceBatch::bind(Backend& backend) {
  backend_ = &backend;
  for (DeviceArray<int32_t>* a : {&tokens_, &positions_, &seq_of_token_, &block_tables_, &rows_}) {
    a->bind(&backend);
  }
  block_table_offsets_.bind(&backend);
  slots_.bind(&backend);
}

PagedBatch DeviceBatch::upload_paged(const ModelBatch& batch, const PagedBatch& paged,
                                     std::span<const int64_t> slots) {
  const int64_t n = batch.n_tokens();
  PagedBatch dev = paged;
  tokens_.upload(batch.tokens.data(), n);
  dev.positions = positions_.upload(batch.positions.data(), n);
  dev.seq_of_token = seq_of_token_.upload(batch.seq_of_token.data(), n);
  dev.block_tables = block_tables_.upload(batch.block_tables.data(),
                                          static_cast<int64_t>(batch.block_tables.size()));
  dev.block_table_offsets = block_table_offsets_.upload(
      batch.block_table_offsets.data(), static_cast<int64_t>(batch.block_table_offsets.size()));
  slots_.upload(slots.data(), n);
  upload_rows(batch.logits_rows);
  return dev;
}

void DeviceBatch::upload_sequence(std::span<const int32_t> tokens,
                                  std::span<const int32_t> positions) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  tokens_.upload(tokens.data(), n);
  positions_.upload(positions.data(), n);
  host_slots_.assign(positions.begin(), positions.end());
  slots_.upload(host_slots_.data(), n);
}

void DeviceBatch::upload_rows(std::span<const int32_t> rows) {
  rows_.upload(rows.data(), static_cast<int64_t>(rows.size()));
}

int64_t DeviceBatch::keep_logits_rows(float* x, float* tmp, int64_t hidden, int64_t n_out) {
  const int64_t n_keep = std::max<int64_t>(n_out, 1);
  if (n_out == 0) upload_rows(std::vector<int32_t>{0});
  backend_->gather_rows(x, hidden, rows_.get(), n_keep, tmp);
  backend_->copy_strided(x, tmp, {.n0 = n_keep, .len = hidden, .dst_stride0 = hidden,
                                  .src_stride0 = hidden});
  std::vector<int32_t> kept(n_keep);
  std::iota(kept.begin(), kept.end(), 0);
  upload_rows(kept);
  return n_keep;
}

}  // namespace dserve
