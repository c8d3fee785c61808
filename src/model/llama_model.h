// LlamaModel: the Llama decoder (LlamaForCausalLM) and its close relative Qwen2
// (Qwen2ForCausalLM), which differs only in carrying q/k/v biases and in its config.
// Both are: token embedding -> n_layers x [RMSNorm, GQA self-attention with RoPE,
// residual, RMSNorm, SwiGLU MLP, residual] -> RMSNorm -> lm_head (tied or not).
//
// load() checks every tensor's shape against the config and fails with a message
// naming the tensor, the expected and the actual shape. forward() runs a batch of
// tokens of ONE sequence through the Backend, appending their keys and values to a
// KvCache, and returns logits for the positions asked for. forward_batch() runs a
// ragged batch of tokens of MANY sequences (one engine step) over a PagedKvCache, so
// that each weight matrix is read once per step; both share one layer loop, and each
// token's arithmetic does not depend on the other tokens of its batch.
//
// Tensor parallelism: given a Communicator of N ranks, each rank keeps its share of the
// attention heads (KV heads replicated when there are fewer than N), of the MLP's
// intermediate dimension and of the vocabulary (embedding and lm_head), all-reduces
// after o_proj, after down_proj and after the embedding lookup, and all-gathers the
// logits, so every rank returns the full logits. Every rank must make the same calls
// with the same inputs (see tp_causal_lm.h for the process that keeps them in step).
//
// Thread-safety: forward() uses internal scratch buffers; drive one model from one
// thread (the engine thread). The weights are shared read-only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "dist/communicator.h"
#include "loader/model_files.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/model_batch.h"
#include "model/paged_kv_cache.h"
#include "model/rope.h"
#include "model/tensor_shard.h"
#include "model/vocab_parallel.h"

namespace dserve {

// Which rows of the batch forward() returns logits for.
enum class LogitsFor {
  kLast,  // the batch's last token only (generation)
  kAll,   // every token of the batch (perplexity, scoring)
};

class LlamaModel {
 public:
  // Takes ownership of the files (the weights stay in their memory maps). The
  // backend must outlive the model. max_context: the longest sequence forward() will
  // see (sizes the RoPE table and new KV caches); 0 means max_position_embeddings.
  // comm: this rank's tensor-parallel group (must outlive the model); null = one rank.
  static Result<std::unique_ptr<LlamaModel>> load(std::unique_ptr<ModelFiles> files,
                                                  Backend& backend, int64_t max_context = 0,
                                                  dist::Communicator* comm = nullptr);
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const ModelConfig& config() const { return config_; }
  // This rank's share: config() with n_heads, n_kv_heads and intermediate_size of one
  // rank (equal to config() on one rank). KV caches are sized from it.
  const ModelConfig& shard_config() const { return shard_; }
  // Bytes of weights this rank holds (its shards) and the whole model's.
  size_t rank_weight_bytes() const { return rank_weight_bytes_; }
  size_t model_weight_bytes() const { return model_weight_bytes_; }
  const ModelFiles& files() const { return *files_; }
  int64_t max_context() const { return max_context_; }
  // Bytes of weights one decode step reads (every matrix once, the embedding row aside).
  size_t weight_bytes_per_token() const;

  // A KV cache with room for max_context() positions.
  std::unique_ptr<KvCache> new_kv_cache() const;

  // Runs tokens[n] at positions[n] through the model. The sequence continues the one
  // in `kv`: positions must be kv.n_tokens(), kv.n_tokens() + 1, ..., and below
  // max_context() and kv.capacity(). Writes logits [n_out, vocab_size] into *logits,
  // n_out = 1 (kLast) or n (kAll). InvalidArgument for bad tokens or positions.
  Status forward(std::span<const int32_t> tokens, std::span<const int32_t> positions, KvCache& kv,
                 LogitsFor which, std::vector<float>* logits);

  // A paged cache of n_blocks blocks of block_size tokens of `dtype` (F32 or F16) for
  // forward_batch().
  std::unique_ptr<PagedKvCache> new_paged_cache(int n_blocks, int block_size, DType dtype) const;

  // Runs one engine step: batch.tokens of several sequences at their positions, each
  // sequence's keys and values stored into `cache` through its block table before the
  // attention reads them (a token attends to its sequence's positions 0..its own).
  // Writes logits [batch.logits_rows.size(), vocab_size] into *logits.
  // InvalidArgument for bad tokens, positions beyond max_context() or the block tables.
  Status forward_batch(const ModelBatch& batch, PagedKvCache& cache, std::vector<float>* logits);

 private:
  struct LayerWeights {
    const TensorView* attn_norm = nullptr;  // [hidden]
    const TensorView* wq = nullptr;         // [n_heads * head_dim, hidden]
    const TensorView* wk = nullptr;         // [n_kv_heads * head_dim, hidden]
    const TensorView* wv = nullptr;         // [n_kv_heads * head_dim, hidden]
    const TensorView* wo = nullptr;         // [hidden, n_heads * head_dim]
    const TensorView* bq = nullptr;         // [n_heads * head_dim] or null
    const TensorView* bk = nullptr;         // [n_kv_heads * head_dim] or null
    const TensorView* bv = nullptr;         // [n_kv_heads * head_dim] or null
    const TensorView* bo = nullptr;         // [hidden] or null
    const TensorView* ffn_norm = nullptr;   // [hidden]
    const TensorView* w_gate = nullptr;     // [intermediate, hidden]
    const TensorView* w_up = nullptr;       // [intermediate, hidden]
    const TensorView* w_down = nullptr;     // [hidden, intermediate]
    const TensorView* b_gate = nullptr;     // [intermediate] or null
    const TensorView* b_up = nullptr;       // [intermediate] or null
    const TensorView* b_down = nullptr;     // [hidden] or null
  };

  // Activations for one batch in the backend's memory, reused across calls (grown on
  // demand), and the step's inputs there.
  struct Scratch {
    void bind(Backend& backend);
    DeviceArray<float> x;          // [n, hidden]       the residual stream
    DeviceArray<float> xb;         // [n, hidden]       normed input / block output
    DeviceArray<float> q;          // [n, n_heads * head_dim]
    DeviceArray<float> k;          // [n, n_kv_heads * head_dim]
    DeviceArray<float> v;          // [n, n_kv_heads * head_dim]
    DeviceArray<float> att;        // [n, n_heads * head_dim]
    DeviceArray<float> gate;       // [n, intermediate]
    DeviceArray<float> up;         // [n, intermediate]
    DeviceArray<float> rows;       // [n_out, hidden]  rows selected for logits
    DeviceBatch batch;             // tokens, positions, slots, block tables, logits rows
    std::vector<int64_t> slots;    // [n] host: paged cache slots of the batch's tokens
    std::vector<int32_t> row_ids;  // [n_out] host
  };

  LlamaModel(std::unique_ptr<ModelFiles> files, Backend& backend, ModelConfig config);
  Status bind_weights();
  // Replaces the bound full tensors by this rank's shards (tensor parallel).
  Status shard_weights();

  // The attention seam: stores this batch's keys and values for `layer` and attends
  // q over every position so far. The only code that knows the KV layout.
  //   q   [n, n_heads * head_dim] (rotated)   k, v [n, n_kv_heads * head_dim] (k rotated)
  //   out [n, n_heads * head_dim]
  // Everything is in backend memory: the uploaded positions and slots of the step.
  void attend(int layer, const float* q, const float* k, const float* v, int64_t n,
              const int32_t* positions, int64_t n_kv, KvCache& kv, float* out);
  // The same seam over a paged cache: slots [n] are where the batch's keys go.
  void attend_paged(int layer, const float* q, const float* k, const float* v,
                    const PagedBatch& batch, const int64_t* slots, PagedKvCache& cache, float* out);

  // The layer stack shared by forward() and forward_batch(): embeds the uploaded
  // tokens [n] (at the uploaded positions) into scratch_.x [n, hidden] and runs every
  // layer, calling attend_layer(layer, q, k, v, out) for the attention. n_out: how
  // many logits rows (uploaded) the caller reads; where that is fewer than n, the last
  // layer's MLP runs on those rows only, left first in scratch_.x with the uploaded
  // rows renumbered 0 .. n_out - 1.
  template <typename AttendFn>
  Status run_layers(int64_t n, AttendFn&& attend_layer, int64_t n_out);
  // logits [n_out, vocab] (host) from scratch_.x at the uploaded rows (final norm,
  // lm_head).
  Status compute_logits(int64_t n_out, std::vector<float>* logits);
  Status check_tokens(std::span<const int32_t> tokens) const;

  std::unique_ptr<ModelFiles> files_;
  Backend& backend_;
  const ModelConfig config_;
  ModelConfig shard_;  // this rank's share of config_
  std::unique_ptr<dist::Communicator> own_comm_;  // the single-rank group when none is given
  dist::Communicator* comm_ = nullptr;            // never null after load()
  VocabParallel vocab_;  // this rank's slice of the embedding and lm_head
  TensorShards shards_;
  size_t rank_weight_bytes_ = 0, model_weight_bytes_ = 0;
  int64_t max_context_ = 0;
  bool rope_pairs_interleaved_ = false;
  std::unique_ptr<RopeCache> rope_;
  std::unique_ptr<DeviceRopeTable> rope_table_;  // rope_'s table in backend memory

  const TensorView* embed_ = nullptr;       // [vocab, hidden]
  const TensorView* final_norm_ = nullptr;  // [hidden]
  const TensorView* lm_head_ = nullptr;     // [vocab, hidden] (the embedding when tied)
  std::vector<LayerWeights> layers_;

  Scratch scratch_;
};

}  // namespace dserve
