// CausalLm: what a caller (the CLI today, the engine later) needs from any
// decoder-only model, whatever its architecture: its vocabulary and context, a
// per-sequence cache, and forward(). load_causal_lm() picks the architecture from the
// model files (config.json architectures / model_type, or GGUF general.architecture):
// LlamaModel for Llama and Qwen2, DeepseekModel for DeepSeek-V2/V3 (GGUF deepseek2).
//
// Thread-safety: as the wrapped models: drive one CausalLm from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "dist/communicator.h"
#include "loader/model_files.h"
#include "model/expert_dispatch.h"
#include "model/llama_model.h"  // LogitsFor
#include "model/model_batch.h"

namespace dserve {

// The architecture-independent facts about a model, read from its files.
struct ModelInfo {
  std::string architecture;  // "LlamaForCausalLM", "DeepseekV3ForCausalLM", ...
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;
};
Result<ModelInfo> read_model_info(const ModelFiles& files);

// The cached state of one sequence (a KvCache, an MlaKvCache, ...).
class SequenceCache {
 public:
  virtual ~SequenceCache() = default;
  virtual int64_t n_tokens() const = 0;  // positions [0, n_tokens()) are cached
  virtual int64_t capacity() const = 0;
  virtual void clear() = 0;
  virtual size_t bytes_per_token() const = 0;
  virtual size_t total_bytes() const = 0;
};

class CausalLm {
 public:
  virtual ~CausalLm() = default;
  virtual const ModelInfo& info() const = 0;
  // A cache with room for the context the model was loaded with.
  virtual std::unique_ptr<SequenceCache> new_cache() const = 0;
  // As LlamaModel::forward; `cache` must come from this model's new_cache().
  virtual Status forward(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                         SequenceCache& cache, LogitsFor which, std::vector<float>* logits) = 0;

  // --- Paged serving (the engine). Architectures without it keep the defaults. ---
  // Bytes one token takes in a paged cache of `dtype` (F32 or F16) over all layers;
  // 0: no paged support.
  virtual size_t paged_bytes_per_token(DType dtype) const { return 0; }
  // A paged cache of n_blocks blocks of block_size tokens of `dtype` (F32 or F16).
  virtual Result<std::unique_ptr<PagedCache>> new_paged_cache(int n_blocks, int block_size,
                                                              DType dtype) const {
    return unimplemented(info().architecture + ": no paged KV cache yet");
  }
  // One engine step over a ragged batch (see LlamaModel::forward_batch); `cache` must
  // come from this model's new_paged_cache().
  virtual Status forward_batch(const ModelBatch& batch, PagedCache& cache,
                               std::vector<float>* logits) {
    return unimplemented(info().architecture + ": no batched forward yet");
  }

  // --- Multi-token prediction (speculative decoding's deepseek_mtp drafts). ---
  // Whether the model's files hold an MTP layer.
  virtual bool has_mtp_layer() const { return false; }
  // Loads the MTP layer; paged caches made afterwards hold its cache too (and
  // paged_bytes_per_token() counts it).
  virtual Status enable_mtp() {
    return invalid_argument(info().architecture + " has no multi-token-prediction layer");
  }
  // One pass of the MTP layer over `batch` (see DeepseekModel::forward_mtp): token i
  // pairs with row prev_rows[i] of the previous pass's hidden states (forward_batch's
  // when prev_is_target, else the previous forward_mtp's). Logits at batch.logits_rows.
  virtual Status forward_mtp(const ModelBatch& batch, PagedCache& cache,
                             std::span<const int32_t> prev_rows, bool prev_is_target,
                             std::vector<float>* logits) {
    return invalid_argument(info().architecture + " has no multi-token-prediction layer");
  }

  // With expert parallelism over data-parallel engines: this engine's part of one
  // forward's collectives with no tokens of its own, so that the other engines can
  // step (vLLM's dummy batch); no cache is touched. Otherwise nothing.
  virtual Status forward_idle() { return Status::Ok(); }

  // Weight bytes one decode step reads (for MoE: the active experts only).
  virtual size_t weight_bytes_per_token() const = 0;
  // Mapped weight bytes whose pages the model released once the backend held its own
  // copies of them (Backend::prepare_matmul_weight): memory holds the copies instead.
  virtual int64_t released_weight_bytes() const { return 0; }
  // One line of architecture-specific counters for logs (MoE expert use); may be empty.
  virtual std::string stats() const = 0;
};

// max_context: the longest sequence forward() will see; 0 means the model's own.
// comm: the tensor-parallel group this process is one rank of (null: one rank).
// expert_comm: the expert-parallel group over data-parallel engines (null: none;
// DeepSeek models only), see DeepseekModel; expert_wire: its rows' element type.
Result<std::unique_ptr<CausalLm>> load_causal_lm(std::unique_ptr<ModelFiles> files,
                                                 Backend& backend, int64_t max_context,
                                                 dist::Communicator* comm = nullptr,
                                                 bool expert_parallel = false,
                                                 dist::Communicator* expert_comm = nullptr,
                                                 ExpertWire expert_wire = ExpertWire::kF32);

}  // namespace dserve
