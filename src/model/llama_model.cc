#include "model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/check.h"
#include "base/log.h"

namespace dserve {
namespace {

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

LlamaModel::LlamaModel(std::unique_ptr<ModelFiles> files, Backend& backend, ModelConfig config)
    : files_(std::move(files)), backend_(backend), config_(std::move(config)) {
  scratch_.bind(backend);
}

void LlamaModel::Scratch::bind(Backend& backend) {
  for (DeviceArray<float>* a : {&x, &xb, &q, &k, &v, &att, &gate, &up, &rows}) a->bind(&backend);
  batch.bind(backend);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::load(std::unique_ptr<ModelFiles> files,
                                                     Backend& backend, int64_t max_context,
                                                     dist::Communicator* comm) {
  DS_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::from_model_files(*files));
  if (max_context < 0) return invalid_argument("context length must not be negative");
  if (max_context == 0) max_context = config.max_position_embeddings;
  std::unique_ptr<LlamaModel> model(new LlamaModel(std::move(files), backend, std::move(config)));
  model->max_context_ = max_context;
  model->rope_pairs_interleaved_ = model->files_->rope_pairs_interleaved();
  if (comm == nullptr) {
    model->own_comm_ = dist::make_single_rank_communicator();
    comm = model->own_comm_.get();
  }
  model->comm_ = comm;
  model->shard_ = model->config_;
  DS_RETURN_IF_ERROR(model->bind_weights());
  DS_LOG_INFO("{}", model->config_.summary());
  if (comm->size() > 1) {
    DS_LOG_INFO("tensor parallel rank {}/{}: weights {} of {} bytes ({:.1f} of {:.1f} MiB; {:.1f} MiB "
                "copied shards), {} of {} heads, {} of {} KV heads, FFN {} of {}",
                comm->rank(), comm->size(), model->rank_weight_bytes_, model->model_weight_bytes_,
                mib(model->rank_weight_bytes_), mib(model->model_weight_bytes_),
                mib(model->shards_.copied_bytes()), model->shard_.n_heads, model->config_.n_heads,
                model->shard_.n_kv_heads, model->config_.n_kv_heads, model->shard_.intermediate_size,
                model->config_.intermediate_size);
  }
  return model;
}

// Looks up every tensor the architecture needs and checks its shape against the
// config, so that a mismatched checkpoint fails here, by name, and never inside a
// kernel.
Status LlamaModel::bind_weights() {
  const ModelConfig& c = config_;
  const ModelFiles& f = *files_;
  auto bind = [&](const std::string& name, std::vector<int64_t> expected, bool required,
                  bool float_only, const TensorView** out) -> Status {
    const TensorView* t = f.find(name);
    if (t == nullptr) {
      if (!required) return Status::Ok();
      return not_found(f.path() + ": tensor '" + name + "' is missing (required by " +
                       std::string(architecture_name(c.arch)) + ")");
    }
    if (t->shape != expected) {
      return corrupt(f.path() + ": tensor '" + name + "' has shape " + shape_to_string(t->shape) +
                     " but " + c.source + " implies " + shape_to_string(expected));
    }
    if (float_only && !is_float_dtype(t->dtype)) {
      return unimplemented(f.path() + ": tensor '" + name + "' has type " +
                           std::string(dtype_name(t->dtype)) + "; expected f32, f16 or bf16");
    }
    if (t->dtype == DType::kF8_E4M3) {  // the kernels need DeepSeek's block scales beside it
      return unimplemented(f.path() + ": tensor '" + name + "' is FP8 (f8_e4m3); dserve reads FP8 "
                           "weights with block scales in DeepSeek-V2/V3 checkpoints only");
    }
    *out = t;
    return Status::Ok();
  };

  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  DS_RETURN_IF_ERROR(
      bind("model.embed_tokens.weight", {c.vocab_size, hidden}, true, false, &embed_));
  DS_RETURN_IF_ERROR(bind("model.norm.weight", {hidden}, true, true, &final_norm_));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    DS_RETURN_IF_ERROR(bind("lm_head.weight", {c.vocab_size, hidden}, true, false, &lm_head_));
  }

  layers_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& w = layers_[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    DS_RETURN_IF_ERROR(bind(p + "input_layernorm.weight", {hidden}, true, true, &w.attn_norm));
    DS_RETURN_IF_ERROR(
        bind(p + "self_attn.q_proj.weight", {c.q_dim(), hidden}, true, false, &w.wq));
    DS_RETURN_IF_ERROR(
        bind(p + "self_attn.k_proj.weight", {c.kv_dim(), hidden}, true, false, &w.wk));
    DS_RETURN_IF_ERROR(
        bind(p + "self_attn.v_proj.weight", {c.kv_dim(), hidden}, true, false, &w.wv));
    DS_RETURN_IF_ERROR(
        bind(p + "self_attn.o_proj.weight", {hidden, c.q_dim()}, true, false, &w.wo));
    DS_RETURN_IF_ERROR(bind(p + "self_attn.q_proj.bias", {c.q_dim()}, c.qkv_bias, true, &w.bq));
    DS_RETURN_IF_ERROR(bind(p + "self_attn.k_proj.bias", {c.kv_dim()}, c.qkv_bias, true, &w.bk));
    DS_RETURN_IF_ERROR(bind(p + "self_attn.v_proj.bias", {c.kv_dim()}, c.qkv_bias, true, &w.bv));
    DS_RETURN_IF_ERROR(bind(p + "self_attn.o_proj.bias", {hidden}, c.o_bias, true, &w.bo));
    DS_RETURN_IF_ERROR(
        bind(p + "post_attention_layernorm.weight", {hidden}, true, true, &w.ffn_norm));
    DS_RETURN_IF_ERROR(bind(p + "mlp.gate_proj.weight", {inter, hidden}, true, false, &w.w_gate));
    DS_RETURN_IF_ERROR(bind(p + "mlp.up_proj.weight", {inter, hidden}, true, false, &w.w_up));
    DS_RETURN_IF_ERROR(bind(p + "mlp.down_proj.weight", {hidden, inter}, true, false, &w.w_down));
    DS_RETURN_IF_ERROR(bind(p + "mlp.gate_proj.bias", {inter}, c.mlp_bias, true, &w.b_gate));
    DS_RETURN_IF_ERROR(bind(p + "mlp.up_proj.bias", {inter}, c.mlp_bias, true, &w.b_up));
    DS_RETURN_IF_ERROR(bind(p + "mlp.down_proj.bias", {hidden}, c.mlp_bias, true, &w.b_down));
  }

  // GGUF files store llama3-style frequency scaling as per-pair divisors.
  std::vector<float> freq_factors;
  const TensorView* rope_freqs = nullptr;
  DS_RETURN_IF_ERROR(bind("rope_freqs.weight", {c.rope.rotary_dim / 2}, false, true, &rope_freqs));
  if (rope_freqs != nullptr) {
    if (rope_freqs->dtype != DType::kF32) {
      return unimplemented(f.path() + ": tensor 'rope_freqs.weight' must be f32");
    }
    const float* data = static_cast<const float*>(rope_freqs->data);
    freq_factors.assign(data, data + rope_freqs->n_elements());
  }
  rope_ = std::make_unique<RopeCache>(c.rope, max_context_, freq_factors);
  rope_table_ = std::make_unique<DeviceRopeTable>(backend_, *rope_);

  auto weight_bytes = [&] {
    size_t bytes = embed_->n_bytes + final_norm_->n_bytes + (lm_head_ != embed_ ? lm_head_->n_bytes : 0);
    for (const LayerWeights& w : layers_) {
      for (const TensorView* t : {w.attn_norm, w.wq, w.wk, w.wv, w.wo, w.bq, w.bk, w.bv, w.bo, w.ffn_norm,
                                  w.w_gate, w.w_up, w.w_down, w.b_gate, w.b_up, w.b_down}) {
        if (t) bytes += t->n_bytes;
      }
    }
    return bytes;
  };
  model_weight_bytes_ = weight_bytes();
  vocab_.init(backend_, c.vocab_size, comm_->rank(), comm_->size());
  if (comm_->size() > 1) DS_RETURN_IF_ERROR(shard_weights());
  rank_weight_bytes_ = weight_bytes();

  if (comm_->size() > 1) return Status::Ok();  // shard_weights() prepares the shards
  // The backend's own layout of every matmul weight, made once here.
  backend_.prepare_matmul_weight(*lm_head_);
  for (const LayerWeights& w : layers_) {
    for (const TensorView* t : {w.wq, w.wk, w.wv, w.wo, w.w_gate, w.w_up, w.w_down}) {
      backend_.prepare_matmul_weight(*t);
    }
  }
  return Status::Ok();
}

// Tensor parallel: rank r keeps heads [r * n_heads / N, (r + 1) * n_heads / N) with
// their rows of q/k/v and columns of o_proj, the same share of the MLP's intermediate
// dimension, and a 1/N slice of the vocabulary (the last slice shorter when N does not
// divide it). With fewer KV heads than ranks, each rank keeps the one KV head its query
// heads read (replicated across the ranks of its group).
Status LlamaModel::shard_weights() {
  const ModelConfig& c = config_;
  const int n = comm_->size(), r = comm_->rank();
  const std::string where = "--tensor-parallel-size " + std::to_string(n) + ": ";
  if (c.n_heads % n != 0) {
    return invalid_argument(where + "does not divide the model's " + std::to_string(c.n_heads) + " attention heads");
  }
  if (c.n_kv_heads % n != 0 && n % c.n_kv_heads != 0) {
    return invalid_argument(where + "the model's " + std::to_string(c.n_kv_heads) +
                            " KV heads can be neither split nor replicated evenly over the ranks");
  }
  if (c.intermediate_size % n != 0) {
    return invalid_argument(where + "does not divide the MLP's intermediate size " +
                            std::to_string(c.intermediate_size));
  }
  const int heads = c.n_heads / n;
  const int kv_heads = c.n_kv_heads >= n ? c.n_kv_heads / n : 1;
  // The first KV head this rank's query heads read.
  const int kv_first = c.n_kv_heads >= n ? r * kv_heads : (r * heads) / c.n_heads_per_kv();
  const int64_t hd = c.head_dim, inter = c.intermediate_size / n;
  shard_.n_heads = heads;
  shard_.n_kv_heads = kv_heads;
  shard_.intermediate_size = inter;

  auto rows = [&](const TensorView*& t, const std::string& name, int64_t b, int64_t e) -> Status {
    if (t == nullptr) return Status::Ok();
    DS_ASSIGN_OR_RETURN(t, shards_.rows(*t, name, b, e));
    return Status::Ok();
  };
  auto cols = [&](const TensorView*& t, const std::string& name, int64_t b, int64_t e) -> Status {
    DS_ASSIGN_OR_RETURN(t, shards_.columns(*t, name, b, e));
    return Status::Ok();
  };
  const bool tied = lm_head_ == embed_;
  DS_RETURN_IF_ERROR(rows(embed_, "model.embed_tokens.weight", vocab_.begin(), vocab_.end()));
  if (tied) {
    lm_head_ = embed_;
  } else {
    DS_RETURN_IF_ERROR(rows(lm_head_, "lm_head.weight", vocab_.begin(), vocab_.end()));
  }
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& w = layers_[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int64_t q0 = int64_t{r} * heads * hd, q1 = q0 + heads * hd;
    const int64_t k0 = int64_t{kv_first} * hd, k1 = k0 + kv_heads * hd;
    DS_RETURN_IF_ERROR(rows(w.wq, p + "self_attn.q_proj.weight", q0, q1));
    DS_RETURN_IF_ERROR(rows(w.bq, p + "self_attn.q_proj.bias", q0, q1));
    DS_RETURN_IF_ERROR(rows(w.wk, p + "self_attn.k_proj.weight", k0, k1));
    DS_RETURN_IF_ERROR(rows(w.bk, p + "self_attn.k_proj.bias", k0, k1));
    DS_RETURN_IF_ERROR(rows(w.wv, p + "self_attn.v_proj.weight", k0, k1));
    DS_RETURN_IF_ERROR(rows(w.bv, p + "self_attn.v_proj.bias", k0, k1));
    DS_RETURN_IF_ERROR(cols(w.wo, p + "self_attn.o_proj.weight", q0, q1));
    const int64_t f0 = int64_t{r} * inter, f1 = f0 + inter;
    DS_RETURN_IF_ERROR(rows(w.w_gate, p + "mlp.gate_proj.weight", f0, f1));
    DS_RETURN_IF_ERROR(rows(w.b_gate, p + "mlp.gate_proj.bias", f0, f1));
    DS_RETURN_IF_ERROR(rows(w.w_up, p + "mlp.up_proj.weight", f0, f1));
    DS_RETURN_IF_ERROR(rows(w.b_up, p + "mlp.up_proj.bias", f0, f1));
    DS_RETURN_IF_ERROR(cols(w.w_down, p + "mlp.down_proj.weight", f0, f1));
    // The output biases of the row-parallel layers are added once, by rank 0, so the
    // all-reduce sums them exactly once.
    if (r != 0) w.bo = w.b_down = nullptr;
  }
  // The backend packs this rank's shards (done by bind_weights for the full tensors
  // only when there is one rank).
  backend_.prepare_matmul_weight(*lm_head_);
  for (const LayerWeights& w : layers_) {
    for (const TensorView* t : {w.wq, w.wk, w.wv, w.wo, w.w_gate, w.w_up, w.w_down}) {
      backend_.prepare_matmul_weight(*t);
    }
  }
  return Status::Ok();
}

size_t LlamaModel::weight_bytes_per_token() const {
  size_t bytes = lm_head_->n_bytes + final_norm_->n_bytes;
  for (const LayerWeights& w : layers_) {
    for (const TensorView* t :
         {w.attn_norm, w.wq, w.wk, w.wv, w.wo, w.bq, w.bk, w.bv, w.bo, w.ffn_norm, w.w_gate, w.w_up,
          w.w_down, w.b_gate, w.b_up, w.b_down}) {
      if (t) bytes += t->n_bytes;
    }
  }
  return bytes;
}

std::unique_ptr<KvCache> LlamaModel::new_kv_cache() const {
  return std::make_unique<KvCache>(backend_, shard_, max_context_);
}

std::unique_ptr<PagedKvCache> LlamaModel::new_paged_cache(int n_blocks, int block_size,
                                                          DType dtype) const {
  return std::make_unique<PagedKvCache>(backend_, shard_, n_blocks, block_size, dtype);
}

void LlamaModel::attend(int layer, const float* q, const float* k, const float* v, int64_t n,
                        const int32_t* positions, int64_t n_kv, KvCache& kv, float* out) {
  // One sequence's cache slot is its position.
  const int64_t* slots = scratch_.batch.slots();
  backend_.kv_store(DType::kF32, kv.k(layer), shard_.kv_dim(), k, slots, n);
  backend_.kv_store(DType::kF32, kv.v(layer), shard_.kv_dim(), v, slots, n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  backend_.attention(q, kv.k(layer), kv.v(layer), out, n, positions, n_kv, shard_.n_heads,
                     shard_.n_kv_heads, shard_.head_dim, shard_.head_dim, scale);
}

void LlamaModel::attend_paged(int layer, const float* q, const float* k, const float* v,
                              const PagedBatch& batch, const int64_t* slots, PagedKvCache& cache,
                              float* out) {
  const int64_t kv_dim = shard_.kv_dim();
  // Keys and values of the whole step first: a sequence may read, through a shared
  // prefix block, keys another sequence of this step writes.
  const DType dtype = cache.dtype();
  backend_.kv_store(dtype, cache.k(layer), kv_dim, k, slots, batch.n_tokens);
  backend_.kv_store(dtype, cache.v(layer), kv_dim, v, slots, batch.n_tokens);
  const float scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  backend_.paged_attention(q, dtype, cache.k(layer), cache.v(layer), out, batch, shard_.n_heads,
                           shard_.n_kv_heads, shard_.head_dim, shard_.head_dim, scale);
}

Status LlamaModel::check_tokens(std::span<const int32_t> tokens) const {
  for (int32_t id : tokens) {
    if (id < 0 || id >= config_.vocab_size) {
      return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(config_.vocab_size) + ")");
    }
  }
  return Status::Ok();
}

template <typename AttendFn>
Status LlamaModel::run_layers(int64_t n, AttendFn&& attend_layer, int64_t n_out) {
  // The per-rank shapes (heads, FFN width); equal to config_ on one rank.
  const ModelConfig& c = shard_;
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  Scratch& s = scratch_;
  s.x.ensure(n * hidden);
  s.xb.ensure(n * hidden);
  s.q.ensure(n * q_dim);
  s.k.ensure(n * kv_dim);
  s.v.ensure(n * kv_dim);
  s.att.ensure(n * q_dim);
  s.gate.ensure(n * inter);
  s.up.ensure(n * inter);
  const RopeTable& rope = rope_table_->table();
  const int32_t* positions = s.batch.positions();

  // x[n, hidden] = embedding rows of the tokens
  DS_RETURN_IF_ERROR(vocab_.embed(*comm_, *embed_, s.batch.tokens(), n, hidden, s.x.get()));

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[l];

    // --- attention block ---
    // xb[n, hidden] = rms_norm(x)
    backend_.rms_norm(s.x.get(), *w.attn_norm, c.rms_norm_eps, n, hidden, s.xb.get());
    // q[n, n_heads, head_dim], k and v [n, n_kv_heads, head_dim]
    const MatmulTarget qkv[] = {
        {w.wq, w.bq, s.q.get()}, {w.wk, w.bk, s.k.get()}, {w.wv, w.bv, s.v.get()}};
    backend_.matmul_many(s.xb.get(), n, qkv, 3);
    backend_.rope(s.q.get(), n, c.n_heads, c.head_dim, positions, rope,
                  rope_pairs_interleaved_);
    backend_.rope(s.k.get(), n, c.n_kv_heads, c.head_dim, positions, rope,
                  rope_pairs_interleaved_);
    // att[n, n_heads, head_dim] = softmax(q kᵀ / sqrt(head_dim)) v over positions 0..p
    attend_layer(l, s.q.get(), s.k.get(), s.v.get(), s.att.get());
    // xb[n, hidden] = att · Woᵀ (summed over ranks) ; x += xb
    backend_.matmul(*w.wo, w.bo, s.att.get(), n, s.xb.get());
    DS_RETURN_IF_ERROR(backend_.all_reduce_sum(*comm_, s.xb.get(), n * hidden));
    backend_.add_inplace(s.x.get(), s.xb.get(), n * hidden);
    if (l == c.n_layers - 1 && n_out < n) {  // only the logits rows go on
      n = s.batch.keep_logits_rows(s.x.get(), s.xb.get(), hidden, n_out);
    }

    // --- SwiGLU MLP block ---
    // xb[n, hidden] = rms_norm(x)
    backend_.rms_norm(s.x.get(), *w.ffn_norm, c.rms_norm_eps, n, hidden, s.xb.get());
    // gate, up [n, intermediate]; gate = silu(gate) * up
    const MatmulTarget gate_up[] = {{w.w_gate, w.b_gate, s.gate.get()},
                                    {w.w_up, w.b_up, s.up.get()}};
    backend_.matmul_many(s.xb.get(), n, gate_up, 2);
    backend_.silu_mul(s.gate.get(), s.up.get(), n * inter, s.gate.get());
    // xb[n, hidden] = gate · Wdownᵀ (summed over ranks) ; x += xb
    backend_.matmul(*w.w_down, w.b_down, s.gate.get(), n, s.xb.get());
    DS_RETURN_IF_ERROR(backend_.all_reduce_sum(*comm_, s.xb.get(), n * hidden));
    backend_.add_inplace(s.x.get(), s.xb.get(), n * hidden);
  }
  return Status::Ok();
}

Status LlamaModel::compute_logits(int64_t n_out, std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  Scratch& s = scratch_;
  // Only the rows whose logits were asked for go through the final norm and lm_head.
  // rows_x[n_out, hidden] = rms_norm(x[rows])
  s.rows.ensure(n_out * hidden);
  backend_.gather_rows(s.x.get(), hidden, s.batch.rows(), n_out, s.rows.get());
  backend_.rms_norm(s.rows.get(), *final_norm_, c.rms_norm_eps, n_out, hidden, s.rows.get());
  // logits[n_out, vocab] = rows_x · lm_headᵀ (gathered over the vocabulary's ranks)
  return vocab_.logits(*comm_, *lm_head_, s.rows.get(), n_out, logits);
}

Status LlamaModel::forward(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                           KvCache& kv, LogitsFor which, std::vector<float>* logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return invalid_argument("forward: empty batch");
  if (positions.size() != tokens.size()) {
    return invalid_argument("forward: " + std::to_string(tokens.size()) + " tokens but " +
                            std::to_string(positions.size()) + " positions");
  }
  DS_RETURN_IF_ERROR(check_tokens(tokens));
  for (int64_t t = 0; t < n; ++t) {
    if (positions[t] != kv.n_tokens() + t) {
      return invalid_argument("forward: positions must continue the sequence at " +
                              std::to_string(kv.n_tokens()));
    }
  }
  const int64_t end = kv.n_tokens() + n;
  if (end > max_context_ || end > kv.capacity()) {
    return invalid_argument("sequence of " + std::to_string(end) +
                            " tokens exceeds the context of " +
                            std::to_string(std::min(max_context_, kv.capacity())) + " tokens");
  }
  std::vector<int32_t>& rows = scratch_.row_ids;
  rows.clear();
  for (int64_t t = which == LogitsFor::kLast ? n - 1 : 0; t < n; ++t) {
    rows.push_back(static_cast<int32_t>(t));
  }
  DeviceBatch& in = scratch_.batch;
  in.upload_sequence(tokens, positions);
  in.upload_rows(rows);

  DS_RETURN_IF_ERROR(run_layers(n, [&](int l, const float* q, const float* k, const float* v, float* out) {
    attend(l, q, k, v, n, in.positions(), end, kv, out);
  }, static_cast<int64_t>(rows.size())));
  kv.set_n_tokens(end);
  return compute_logits(static_cast<int64_t>(rows.size()), logits);
}

Status LlamaModel::forward_batch(const ModelBatch& batch, PagedKvCache& cache,
                                 std::vector<float>* logits) {
  std::vector<int64_t>& slots = scratch_.slots;
  PagedBatch host;
  DS_RETURN_IF_ERROR(resolve_paged_batch(batch, config_.vocab_size, max_context_,
                                         cache.n_blocks(), cache.block_size(), &slots, &host));
  DeviceBatch& in = scratch_.batch;
  const PagedBatch pb = in.upload_paged(batch, host, slots);
  DS_RETURN_IF_ERROR(run_layers(batch.n_tokens(),
                                [&](int l, const float* q, const float* k, const float* v, float* out) {
                                  attend_paged(l, q, k, v, pb, in.slots(), cache, out);
                                },
                                static_cast<int64_t>(batch.logits_rows.size())));
  return compute_logits(static_cast<int64_t>(batch.logits_rows.size()), logits);
}

}  // namespace dserve
