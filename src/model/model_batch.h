// ModelBatch and PagedCache: what a serving step hands a model. A ModelBatch is every
// scheduled token of every request of one engine step (a ragged batch); a PagedCache
// holds the keys and values of all requests in fixed-size blocks, addressed through
// the per-sequence block tables of the batch (see sched/scheduler_output.h for the
// contract: block copies first, then every layer stores the step's keys and values
// before its attention reads them).
//
// Thread-safety: ModelBatch is a borrowed view; a PagedCache is owned and driven by
// the engine thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"

namespace dserve {

struct ModelBatch {
  std::span<const int32_t> tokens;        // [n_tokens]
  std::span<const int32_t> positions;     // [n_tokens]
  std::span<const int32_t> seq_of_token;  // [n_tokens], index of the token's sequence
  // Sequence s's block table is block_tables[block_table_offsets[s] ..
  // block_table_offsets[s + 1]); offsets are [n_seqs + 1].
  std::span<const int32_t> block_tables;
  std::span<const int64_t> block_table_offsets;
  // Token indices whose logits forward_batch() returns, in this order.
  std::span<const int32_t> logits_rows;
  // Optional, [n_seqs]: each sequence's prompt length (its first generated token's
  // position). A model may compute prompt tokens differently from generated ones
  // (DeepSeek's MLA: long prompts attend expanded); the choice depends only on a token's
  // position and its prompt's length, never on the batch. Empty: every token as
  // generated.
  std::span<const int32_t> prompt_lens;

  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_seqs() const { return static_cast<int64_t>(block_table_offsets.size()) - 1; }
};

// Checks `batch` against a model (vocabulary, context) and its paged cache (block ids,
// block tables long enough for every position), then resolves each token's cache slot
// into `slots` [n_tokens] and fills `paged`, which points into `batch`.
Status resolve_paged_batch(const ModelBatch& batch, int64_t vocab_size, int64_t max_context,
                           int n_cache_blocks, int block_size, std::vector<int64_t>* slots,
                           PagedBatch* paged);

// A step's inputs in the backend's memory, uploaded once before the first layer: the
// only host-to-backend traffic of a forward (the logits' download is its output).
class DeviceBatch {
 public:
  void bind(Backend& backend);
  // A ragged batch checked and resolved by resolve_paged_batch (host `paged` and
  // `slots`): returns the same PagedBatch over backend copies of its arrays.
  PagedBatch upload_paged(const ModelBatch& batch, const PagedBatch& paged,
                          std::span<const int64_t> slots);
  // One sequence's tokens at `positions` (its cache slot = its position).
  void upload_sequence(std::span<const int32_t> tokens, std::span<const int32_t> positions);
  // The rows whose logits the step returns.
  void upload_rows(std::span<const int32_t> rows);
  // The last layer's output-row selection (llama.cpp's): before that layer's FFN, x
  // [n, hidden] keeps only the n_out uploaded logits rows, as its first rows in their
  // order (tmp: [n_out, hidden] scratch), and the uploaded rows become 0 .. n_out - 1.
  // With none (a prompt chunk before its prompt's end) row 0 is kept, so that every
  // tensor- and expert-parallel rank still joins the FFN's exchanges. Returns the rows
  // kept.
  int64_t keep_logits_rows(float* x, float* tmp, int64_t hidden, int64_t n_out);

  const int32_t* tokens() const { return tokens_.get(); }
  const int32_t* positions() const { return positions_.get(); }
  const int64_t* slots() const { return slots_.get(); }
  const int32_t* rows() const { return rows_.get(); }

 private:
  Backend* backend_ = nullptr;
  DeviceArray<int32_t> tokens_, positions_, seq_of_token_, block_tables_, rows_;
  DeviceArray<int64_t> block_table_offsets_, slots_;
  std::vector<int64_t> host_slots_;
};

// The element types a paged KV cache can hold (Backend::kv_store and paged_attention
// read and write them): F32; F16 for half the memory traffic and twice the tokens; or
// F8_E4M3 (float8_e4m3fn, saturating at +-448, no scale) for a quarter.
inline bool is_kv_cache_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kF8_E4M3;
}
// Bytes of one element of a KV cache dtype.
inline size_t kv_elem_bytes(DType t) {
  return t == DType::kF16 ? 2 : t == DType::kF8_E4M3 ? 1 : 4;
}

// A model's paged KV store (per-layer pools of n_blocks * block_size token slots).
class PagedCache {
 public:
  virtual ~PagedCache() = default;
  virtual int n_blocks() const = 0;
  virtual int block_size() const = 0;
  virtual DType dtype() const = 0;  // of every pool element: F32 or F16
  virtual size_t bytes_per_token() const = 0;  // over all layers
  virtual size_t total_bytes() const = 0;
  // Copies the first n_tokens slots of block src into block dst, in every layer.
  virtual void copy_block(int src, int dst, int n_tokens) = 0;
};

}  // namespace dserve
