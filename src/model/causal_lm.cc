#include "model/causal_lm.h"

#include "model/config.h"
#include "model/deepseek_config.h"
#include "model/deepseek_model.h"
#include "model/kv_cache.h"

namespace dserve {
namespace {

template <typename Cache>
class CacheAdapter final : public SequenceCache {
 public:
  explicit CacheAdapter(std::unique_ptr<Cache> cache) : cache_(std::move(cache)) {}
  int64_t n_tokens() const override { return cache_->n_tokens(); }
  int64_t capacity() const override { return cache_->capacity(); }
  void clear() override { cache_->clear(); }
  size_t bytes_per_token() const override { return cache_->bytes_per_token(); }
  size_t total_bytes() const override { return cache_->total_bytes(); }
  Cache& get() { return *cache_; }

 private:
  std::unique_ptr<Cache> cache_;
};

// What every architecture's adapter shares: Model owns the weights, SeqCache is its
// per-sequence cache, Paged its paged cache.
template <typename Model, typename SeqCache, typename Paged>
class ModelLm : public CausalLm {
 public:
  ModelLm(std::unique_ptr<Model> model, ModelInfo info)
      : model_(std::move(model)), info_(std::move(info)) {}
  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<SequenceCache> new_cache() const override {
    return std::make_unique<CacheAdapter<SeqCache>>(model_->new_kv_cache());
  }
  Status forward(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                 SequenceCache& cache, LogitsFor which, std::vector<float>* logits) override {
    return model_->forward(tokens, positions, static_cast<CacheAdapter<SeqCache>&>(cache).get(),
                           which, logits);
  }
  size_t paged_bytes_per_token(DType dtype) const override {
    return Paged::bytes_per_token(model_->config(), dtype);
  }
  Result<std::unique_ptr<PagedCache>> new_paged_cache(int n_blocks, int block_size,
                                                      DType dtype) const override {
    if (n_blocks < 1 || block_size < 1)
      return invalid_argument("paged cache: n_blocks and block_size must be >= 1");
    if (!is_kv_cache_dtype(dtype)) {
      return invalid_argument("paged cache: KV cache dtype " + std::string(dtype_name(dtype)) +
                              " is not supported (f32 or f16)");
    }
    return std::unique_ptr<PagedCache>(model_->new_paged_cache(n_blocks, block_size, dtype));
  }
  Status forward_batch(const ModelBatch& batch, PagedCache& cache,
                       std::vector<float>* logits) override {
    return model_->forward_batch(batch, static_cast<Paged&>(cache), logits);
  }

 protected:
  std::unique_ptr<Model> model_;
  ModelInfo info_;
};

class LlamaLm final : public ModelLm<LlamaModel, KvCache, PagedKvCache> {
 public:
  using ModelLm::ModelLm;
  size_t weight_bytes_per_token() const override { return model_->weight_bytes_per_token(); }
  std::string stats() const override { return {}; }
  // A rank's cache holds only its KV heads.
  size_t paged_bytes_per_token(DType dtype) const override {
    return PagedKvCache::bytes_per_token(model_->shard_config(), dtype);
  }
};

class DeepseekLm final : public ModelLm<DeepseekModel, MlaKvCache, PagedMlaCache> {
 public:
  using ModelLm::ModelLm;
  size_t weight_bytes_per_token() const override { return model_->active_weight_bytes_per_token(); }
  int64_t released_weight_bytes() const override { return model_->released_weight_bytes(); }
  std::string stats() const override {
    const MoeStats& s = model_->moe_stats();
    if (model_->config().n_routed_experts == 0) return {};
    std::string line = "moe: " + std::to_string(s.routed_slots) + " routed slots, " +
                       std::to_string(s.expert_runs) + " expert runs over " + std::to_string(s.expert_rows) +
                       " rows, " + std::to_string(s.expert_idle) + " idle experts skipped";
    if (const ExpertDispatch* d = model_->expert_dispatch()) {
      const ExpertDispatchStats& e = d->stats();
      line += "; expert parallel: " + std::to_string(e.exchanges) + " exchanges, " + std::to_string(e.rows_sent) +
              " rows sent and " + std::to_string(e.rows_received) + " received from other ranks (" +
              std::to_string(e.bytes_sent) + " / " + std::to_string(e.bytes_received) + " bytes)";
    }
    return line;
  }
  Status forward_idle() override { return model_->forward_idle(); }
  size_t paged_bytes_per_token(DType dtype) const override {
    return PagedMlaCache::bytes_per_token(model_->cache_config(), dtype);
  }
  bool has_mtp_layer() const override { return model_->config().num_nextn_predict_layers > 0; }
  Status enable_mtp() override { return model_->enable_mtp(); }
  Status forward_mtp(const ModelBatch& batch, PagedCache& cache,
                     std::span<const int32_t> prev_rows, bool prev_is_target,
                     std::vector<float>* logits) override {
    return model_->forward_mtp(batch, static_cast<PagedMlaCache&>(cache), prev_rows,
                               prev_is_target, logits);
  }
};

}  // namespace

Result<ModelInfo> read_model_info(const ModelFiles& files) {
  ModelInfo info;
  if (is_deepseek_model(files)) {
    DS_ASSIGN_OR_RETURN(DeepseekConfig c, DeepseekConfig::from_model_files(files));
    info.architecture =
        c.version == DeepseekVersion::kV3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM";
    info.vocab_size = c.vocab_size;
    info.max_position_embeddings = c.max_position_embeddings;
    info.bos_id = c.bos_id;
    info.eos_ids = c.eos_ids;
    return info;
  }
  DS_ASSIGN_OR_RETURN(ModelConfig c, ModelConfig::from_model_files(files));
  info.architecture = std::string(architecture_name(c.arch));
  info.vocab_size = c.vocab_size;
  info.max_position_embeddings = c.max_position_embeddings;
  info.bos_id = c.bos_id;
  info.eos_ids = c.eos_ids;
  return info;
}

Result<std::unique_ptr<CausalLm>> load_causal_lm(std::unique_ptr<ModelFiles> files,
                                                 Backend& backend, int64_t max_context,
                                                 dist::Communicator* comm, bool expert_parallel,
                                                 dist::Communicator* expert_comm, ExpertWire expert_wire) {
  DS_ASSIGN_OR_RETURN(ModelInfo info, read_model_info(*files));
  if (is_deepseek_model(*files)) {
    DS_ASSIGN_OR_RETURN(std::unique_ptr<DeepseekModel> m,
                        DeepseekModel::load(std::move(files), backend, max_context, MlaPath::kAuto, comm,
                                            expert_parallel, expert_comm, expert_wire));
    return std::unique_ptr<CausalLm>(new DeepseekLm(std::move(m), std::move(info)));
  }
  if (expert_comm != nullptr || (expert_parallel && comm != nullptr && comm->size() > 1)) {
    return invalid_argument("--enable-expert-parallel: " + info.architecture + " has no routed experts");
  }
  DS_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> m,
                      LlamaModel::load(std::move(files), backend, max_context, comm));
  return std::unique_ptr<CausalLm>(new LlamaLm(std::move(m), std::move(info)));
}

}  // namespace dserve
