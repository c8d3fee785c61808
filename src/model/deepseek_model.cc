#include "model/deepseek_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "base/check.h"
#include "base/log.h"
#include "base/memory_limit.h"
#include "model/fp8_weights.h"
#include "tensor/dequantize.h"
#include "tensor/half.h"
#include "tensor/quantize.h"

namespace dserve {
namespace {

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// Rows [first, first + n_rows) of a 2-D (or flattened) weight as its own view.
TensorView row_slice(const TensorView& t, int64_t first, int64_t n_rows) {
  TensorView v;
  v.dtype = t.dtype;
  v.shape = {n_rows, t.row_length()};
  v.data = t.row(first);
  v.n_bytes = static_cast<size_t>(n_rows) * t.row_bytes();
  if (t.row_scales != nullptr) v.row_scales = t.row_scales + first;  // I8: its rows' scales
  if (t.row_bias != nullptr) v.row_bias = t.row_bias + first;
  if (t.block_scales.data != nullptr) v.block_scales = t.block_scales.from_row(first);  // FP8
  v.input_scale = t.input_scale;
  v.input_offset = t.input_offset;
  return v;
}

// dst [cols, rows] = tᵀ in F32, for a 2-D weight t [rows, cols] of any dtype: the
// absorbed form's W_UKᵀ from kv_b_proj, and kv_b_proj's W_UK from a GGUF's W_UKᵀ.
void dequantize_transposed(const TensorView& t, float* dst) {
  const int64_t rows = t.shape[0], cols = t.row_length();
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    dequantize_row(t.dtype, t.row(i), row.data(), cols);
    for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = row[j];
  }
}

}  // namespace

// A weight dserve made at load time (converted FP8, transposed W_UK) and owns, or
// (with no bytes) a slice of a file tensor that needs a stable address.
struct DeepseekModel::OwnedTensor {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;  // an FP8 view's block scales (view.block_scales.data)
  TensorView view;
};

DeepseekModel::DeepseekModel(std::unique_ptr<ModelFiles> files, Backend& backend,
                             DeepseekConfig config)
    : files_(std::move(files)), backend_(backend), config_(std::move(config)) {
  scratch_.bind(backend);
  moe_counters_ = backend_.alloc(kNumMoeCounters * sizeof(int64_t));
  backend_.fill_zero(moe_counters_.data(), moe_counters_.bytes());
}

void DeepseekModel::Scratch::bind(Backend& backend) {
  for (DeviceArray<float>* a : {&x, &xb, &qa, &q, &kva, &att, &c_all, &kvb, &kb_lo, &k, &v, &q_abs,
                                &out_lat, &tmp_in, &tmp_out, &gate, &up, &moe_out, &expert_in,
                                &expert_out, &router, &expert_weights, &rows, &mtp_prev, &mtp_cat,
                                &att_parts, &q_part, &latent_rows}) {
    a->bind(&backend);
  }
  for (DeviceArray<int32_t>* a : {&expert_ids, &mtp_rows, &mla.order_buf, &mla.rows_buf,
                                  &mla.absorbed_buf}) {
    a->bind(&backend);
  }
  mla.slots_buf.bind(&backend);
  batch.bind(backend);
}

MoeStats DeepseekModel::moe_stats() const {
  int64_t counters[kNumMoeCounters];
  backend_.download(counters, moe_counters_.data(), sizeof(counters));
  MoeStats s = moe_stats_;
  s.routed_slots += counters[kMoeRoutedSlots];
  s.expert_runs += counters[kMoeExpertRuns];
  s.expert_rows += counters[kMoeExpertRows];
  s.expert_idle += counters[kMoeExpertIdle];
  return s;
}

void DeepseekModel::reset_moe_stats() {
  moe_stats_ = {};
  backend_.fill_zero(moe_counters_.data(), moe_counters_.bytes());
}

DeepseekModel::~DeepseekModel() = default;

Result<std::unique_ptr<DeepseekModel>> DeepseekModel::load(std::unique_ptr<ModelFiles> files,
                                                           Backend& backend, int64_t max_context,
                                                           MlaPath path, dist::Communicator* comm,
                                                           bool expert_parallel,
                                                           dist::Communicator* expert_comm,
                                                           ExpertWire expert_wire) {
  DS_ASSIGN_OR_RETURN(DeepseekConfig config, DeepseekConfig::from_model_files(*files));
  if (max_context < 0) return invalid_argument("context length must not be negative");
  if (max_context == 0) max_context = config.max_position_embeddings;
  std::unique_ptr<DeepseekModel> model(
      new DeepseekModel(std::move(files), backend, std::move(config)));
  model->max_context_ = max_context;
  model->path_ = path;
  if (comm == nullptr) {
    model->own_comm_ = dist::make_single_rank_communicator();
    comm = model->own_comm_.get();
  }
  model->comm_ = comm;
  model->expert_parallel_ = expert_parallel;
  if (expert_comm != nullptr) {
    const DeepseekConfig& c = model->config_;
    const int n = expert_comm->size();
    // The group spans every tensor-parallel rank of every engine, engine d's rank t
    // at d * T + t (cli/tensor_parallel.h): run_moe_dispatched relies on it.
    if (n % comm->size() != 0 || expert_comm->rank() % comm->size() != comm->rank()) {
      return invalid_argument("expert-parallel rank " + std::to_string(expert_comm->rank()) + " of " +
                              std::to_string(n) + " is not tensor-parallel rank " + std::to_string(comm->rank()) +
                              " of an engine of " + std::to_string(comm->size()) + " ranks");
    }
    if (c.n_routed_experts == 0) {
      return invalid_argument("--enable-expert-parallel: " + c.source + " has no routed experts");
    }
    if (c.n_routed_experts % n != 0) {
      return invalid_argument("--enable-expert-parallel: the expert-parallel group of " + std::to_string(n) +
                              " ranks (--data-parallel-size x --tensor-parallel-size) does not divide the model's " +
                              std::to_string(c.n_routed_experts) + " routed experts (they are dealt out whole)");
    }
    model->expert_parallel_ = true;
    model->dispatch_ = std::make_unique<ExpertDispatch>(*expert_comm, static_cast<int>(c.n_routed_experts),
                                                        c.hidden_size, expert_wire);
  }
  DS_RETURN_IF_ERROR(model->plan_shards());
  DS_RETURN_IF_ERROR(model->bind_weights());
  model->min_expanded_tokens_ = expanded_min_tokens(model->config_, model->keys_expand_in_q8());
  for (const LayerWeights& w : model->layers_) {
    for (const Mlp& m : w.experts) model->n_experts_held_ += m.gate != nullptr ? 1 : 0;
  }
  DS_LOG_INFO("{}", model->config_.summary());
  DS_LOG_INFO("weights: {:.1f} MiB for the model as held ({:.1f} MiB on this rank), {:.1f} MiB of "
              "them in memory dserve made at load (the rest mapped from the files)",
              mib(model->model_weight_bytes_), mib(model->rank_weight_bytes_), mib(model->owned_bytes()));
  if (model->released_weight_bytes_ > 0) {
    DS_LOG_INFO("backend's packed copies: {:.1f} MiB; mapped routed-expert rows they replace, "
                "released: {:.1f} MiB",
                mib(model->backend_.prepared_weight_bytes()), mib(model->released_weight_bytes_));
  }
  if (const Fp8Counts& f = model->fp8_; f.n_kept + f.n_converted > 0) {
    const bool keep = model->files_->fp8_weights() == Fp8Weights::kFp8;
    DS_LOG_INFO("FP8 weights (--fp8-weights {}): {} kept as f8_e4m3, {:.1f} MiB at 1 byte per "
                "weight plus {:.2f} MiB of f32 block scales; {} converted to bf16, {:.1f} MiB at 2 "
                "bytes per weight{}",
                keep ? "fp8" : "bf16", f.n_kept, mib(f.kept_bytes), mib(f.scale_bytes), f.n_converted,
                mib(f.converted_bytes),
                keep ? " (kv_b_proj, split for MLA's absorbed form, and tensor-parallel cuts inside a "
                       "block off a multiple of 16 columns)"
                     : "");
  }
  if (comm->size() > 1) {
    const DeepseekConfig &c = model->config_, &sh = model->shard_;
    DS_LOG_INFO("tensor parallel rank {}/{}: weights {} of {} bytes ({:.1f} of {:.1f} MiB; {:.1f} MiB "
                "copied shards), {} of {} heads, dense FFN {} of {}, expert FFN {} of {}",
                comm->rank(), comm->size(), model->rank_weight_bytes_, model->model_weight_bytes_,
                mib(model->rank_weight_bytes_), mib(model->model_weight_bytes_),
                mib(model->shards_.copied_bytes()), sh.n_heads, c.n_heads, sh.intermediate_size,
                c.intermediate_size, sh.moe_intermediate_size, c.moe_intermediate_size);
    if (model->expert_parallel_ && !model->dispatch_) {
      DS_LOG_INFO("expert parallel rank {}/{}: routed experts {}-{} of {}", comm->rank(), comm->size(),
                  model->expert_begin_, model->expert_end_ - 1, c.n_routed_experts);
    }
  }
  if (model->dispatch_) {
    const DeepseekConfig& c = model->config_;
    int n_moe = 0;
    for (const LayerWeights& w : model->layers_) n_moe += w.moe ? 1 : 0;
    DS_LOG_INFO("expert parallel rank {}/{} (over data-parallel engines): routed experts {}-{} of {}; "
                "holds {} expert weight sets of {} ({} MoE layers); weights {:.1f} of {:.1f} MiB; "
                "rows exchanged as {}",
                expert_comm->rank(), expert_comm->size(), model->expert_begin_, model->expert_end_ - 1,
                c.n_routed_experts, model->n_experts_held_, int64_t{n_moe} * c.n_routed_experts, n_moe,
                mib(model->rank_weight_bytes_), mib(model->model_weight_bytes_),
                expert_wire == ExpertWire::kBf16 ? "bfloat16" : "float32");
  }
  return model;
}

size_t DeepseekModel::owned_bytes() const {
  size_t n = 0;
  for (const auto& t : owned_) n += t->bytes.size() + t->scales.size() * sizeof(float);
  return n + shards_.copied_bytes();
}

const TensorView* DeepseekModel::own(TensorView view, std::vector<uint8_t> bytes) {
  auto t = std::make_unique<OwnedTensor>();
  t->bytes = std::move(bytes);
  t->view = std::move(view);
  if (!t->bytes.empty()) {  // else: a view into the files, kept for its address
    t->view.data = t->bytes.data();
    t->view.n_bytes = t->bytes.size();
  }
  owned_.push_back(std::move(t));
  return &owned_.back()->view;
}

Status DeepseekModel::plan_shards() {
  const DeepseekConfig& c = config_;
  const int n = comm_->size(), r = comm_->rank();
  shard_ = c;
  head_begin_ = 0;
  expert_begin_ = 0;
  expert_end_ = c.n_routed_experts;
  shared_inter_ = c.moe_intermediate_size * c.n_shared_experts;
  vocab_.init(backend_, c.vocab_size, r, n);
  if (dispatch_) {  // experts dealt out over the engines' group, not this one
    expert_begin_ = dispatch_->first_expert();
    expert_end_ = expert_begin_ + dispatch_->n_local_experts();
  }
  if (n == 1) return Status::Ok();
  const std::string where = "--tensor-parallel-size " + std::to_string(n) + ": ";
  auto divides = [&](int64_t value, const std::string& what) -> Status {
    if (value % n == 0) return Status::Ok();
    return invalid_argument(where + "does not divide the model's " + std::to_string(value) + " " + what);
  };
  DS_RETURN_IF_ERROR(divides(c.n_heads, "attention heads"));
  DS_RETURN_IF_ERROR(divides(c.intermediate_size, "dense MLP intermediate width"));
  if (c.n_routed_experts > 0) DS_RETURN_IF_ERROR(divides(c.moe_intermediate_size, "expert intermediate width"));
  if (expert_parallel_) {
    if (c.n_routed_experts == 0) {
      return invalid_argument("--enable-expert-parallel: " + c.source + " has no routed experts");
    }
    DS_RETURN_IF_ERROR(divides(c.n_routed_experts, "routed experts (expert parallelism deals them out whole)"));
    if (!dispatch_) {  // else: dealt out over the group of every engine's ranks, above
      expert_begin_ = int64_t{r} * c.n_routed_experts / n;
      expert_end_ = expert_begin_ + c.n_routed_experts / n;
    }
  }
  shard_.n_heads = c.n_heads / n;
  shard_.intermediate_size = c.intermediate_size / n;
  shard_.moe_intermediate_size = expert_parallel_ ? c.moe_intermediate_size : c.moe_intermediate_size / n;
  shared_inter_ = c.moe_intermediate_size * c.n_shared_experts / n;
  head_begin_ = int64_t{r} * shard_.n_heads;
  return Status::Ok();
}

Status DeepseekModel::take_rows(const TensorView** t, const std::string& name, int64_t b, int64_t e) {
  if (comm_->size() == 1 || *t == nullptr) return Status::Ok();
  const size_t full = (*t)->n_bytes;
  DS_ASSIGN_OR_RETURN(*t, shards_.rows(**t, name, b, e));
  rank_weight_bytes_ = rank_weight_bytes_ - full + (*t)->n_bytes;
  return Status::Ok();
}

Status DeepseekModel::take_columns(const TensorView** t, const std::string& name, int64_t b, int64_t e) {
  if (comm_->size() == 1 || *t == nullptr) return Status::Ok();
  const size_t full = (*t)->n_bytes;
  if (const BlockScales& s = (*t)->block_scales; s.data != nullptr) {
    const int64_t n_cols = (*t)->shape[1];
    if ((s.col0 + b) % 16 != 0) {
      // The kernels step through a block 16 columns at a time: a cut elsewhere in a
      // block has this tensor converted to BF16 (whole, then cut).
      DS_LOG_INFO("{}: columns [{}, {}) of [0, {}) cut its FP8 blocks off a multiple of 16; converted "
                  "to bf16", name, b, e, n_cols);
      convert_kept_fp8(t, full);
      return take_columns(t, name, b, e);
    }
  }
  DS_ASSIGN_OR_RETURN(*t, shards_.columns(**t, name, b, e));
  rank_weight_bytes_ = rank_weight_bytes_ - full + (*t)->n_bytes;
  return Status::Ok();
}

// gate/up keep the rank's rows of the intermediate dimension, down its columns.
Status DeepseekModel::shard_mlp(const std::string& prefix, int64_t inter, Mlp* m) {
  const int64_t share = inter / comm_->size(), b = comm_->rank() * share;
  DS_RETURN_IF_ERROR(take_rows(&m->gate, prefix + "gate_proj.weight", b, b + share));
  DS_RETURN_IF_ERROR(take_rows(&m->up, prefix + "up_proj.weight", b, b + share));
  return take_columns(&m->down, prefix + "down_proj.weight", b, b + share);
}

const TensorView* DeepseekModel::own_converted_fp8(const TensorView& t) {
  Fp8Converted converted = convert_fp8_to_bf16(t);
  ++fp8_.n_converted;
  fp8_.converted_bytes += converted.bytes.size();
  return own(std::move(converted.view), std::move(converted.bytes));
}

void DeepseekModel::convert_kept_fp8(const TensorView** t, size_t whole_bytes) {
  const size_t rank_bytes = (*t)->n_bytes;
  const BlockScales& s = (*t)->block_scales;
  fp8_.n_kept -= 1;
  fp8_.kept_bytes -= whole_bytes;
  fp8_.scale_bytes -= static_cast<size_t>((static_cast<int64_t>(whole_bytes) / (*t)->shape[1] + s.block_rows - 1) /
                                          s.block_rows * s.stride) * sizeof(float);
  *t = own_converted_fp8(**t);
  model_weight_bytes_ += whole_bytes;  // as held: 2 bytes per weight instead of 1
  rank_weight_bytes_ += (*t)->n_bytes - rank_bytes;
}

Status DeepseekModel::bind(const std::string& name, const std::vector<int64_t>& expected,
                           bool required, bool float_only, const TensorView** out) {
  const ModelFiles& f = *files_;
  const TensorView* t = f.find(name);
  if (t == nullptr) {
    if (!required) return Status::Ok();
    return not_found(f.path() + ": tensor '" + name + "' is missing (required by " +
                     config_.source + ")");
  }
  if (t->shape != expected) {
    return corrupt(f.path() + ": tensor '" + name + "' has shape " + shape_to_string(t->shape) +
                   " but " + config_.source + " implies " + shape_to_string(expected));
  }
  if (t->dtype == DType::kF8_E4M3) {
    DS_ASSIGN_OR_RETURN(Fp8Scales scales, read_fp8_block_scales(f, name, *t));
    auto kept = std::make_unique<OwnedTensor>();  // a view into the files plus its scales
    kept->scales = std::move(scales.values);
    kept->view = *t;
    kept->view.block_scales = scales.layout;
    kept->view.block_scales.data = kept->scales.data();
    owned_.push_back(std::move(kept));
    t = &owned_.back()->view;
    // The kernels step through a block 16 columns at a time (kernels.h, MatmulF8Fn).
    const bool kernel_reads = t->block_scales.block_cols % 16 == 0;
    if (kernel_reads && f.fp8_weights() == Fp8Weights::kFp8) {
      ++fp8_.n_kept;
      fp8_.kept_bytes += t->n_bytes;
      fp8_.scale_bytes += owned_.back()->scales.size() * sizeof(float);
    } else {
      t = own_converted_fp8(*t);
    }
  }
  if (float_only && !is_float_dtype(t->dtype)) {
    return unimplemented(f.path() + ": tensor '" + name + "' has type " +
                         std::string(dtype_name(t->dtype)) + "; expected f32, f16 or bf16");
  }
  model_weight_bytes_ += t->n_bytes;
  rank_weight_bytes_ += t->n_bytes;  // take_rows / take_columns subtract what the rank drops
  *out = t;
  return Status::Ok();
}

Status DeepseekModel::bind_mlp(const std::string& prefix, int64_t inter, Mlp* out) {
  const int64_t hidden = config_.hidden_size;
  DS_RETURN_IF_ERROR(bind(prefix + "gate_proj.weight", {inter, hidden}, true, false, &out->gate));
  DS_RETURN_IF_ERROR(bind(prefix + "up_proj.weight", {inter, hidden}, true, false, &out->up));
  DS_RETURN_IF_ERROR(bind(prefix + "down_proj.weight", {hidden, inter}, true, false, &out->down));
  return Status::Ok();
}

// Routed experts: one tensor per expert and projection (DeepSeek's and transformers'
// checkpoints), or 3-D stacks [E, ...] per projection (GGUF ffn_*_exps).
Status DeepseekModel::bind_experts(int layer, LayerWeights* w) {
  const DeepseekConfig& c = config_;
  const ModelFiles& f = *files_;
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size, n_exp = c.n_routed_experts;
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  w->experts.resize(n_exp);
  if (f.find(p + "experts.gate_proj.weight") != nullptr) {
    const TensorView *gate = nullptr, *up = nullptr, *down = nullptr;
    DS_RETURN_IF_ERROR(
        bind(p + "experts.gate_proj.weight", {n_exp, inter, hidden}, true, false, &gate));
    DS_RETURN_IF_ERROR(
        bind(p + "experts.up_proj.weight", {n_exp, inter, hidden}, true, false, &up));
    DS_RETURN_IF_ERROR(
        bind(p + "experts.down_proj.weight", {n_exp, hidden, inter}, true, false, &down));
    // Each expert's share: its rows [e inter + b, + share) of gate/up, and its own
    // [hidden, inter] block of down, cut by columns (expert parallel: this rank's
    // experts whole, the others' untouched).
    const int64_t share = shard_.moe_intermediate_size, b = expert_parallel_ ? 0 : comm_->rank() * share;
    for (int64_t e = expert_begin_; e < expert_end_; ++e) {
      w->experts[e].gate = own(row_slice(*gate, e * inter + b, share), {});
      w->experts[e].up = own(row_slice(*up, e * inter + b, share), {});
      w->experts[e].down = own(row_slice(*down, e * hidden, hidden), {});
      if (!expert_parallel_) {
        const std::string name = p + "experts.down_proj.weight[" + std::to_string(e) + "]";
        DS_RETURN_IF_ERROR(take_columns(&w->experts[e].down, name, b, b + share));
      }
    }
    if (comm_->size() > 1 || dispatch_) {  // the stacks were counted whole (down: by take_columns unless EP)
      rank_weight_bytes_ -= gate->n_bytes + up->n_bytes + (expert_parallel_ ? down->n_bytes : 0);
      for (int64_t e = expert_begin_; e < expert_end_; ++e) {
        const Mlp& m = w->experts[e];
        rank_weight_bytes_ += m.gate->n_bytes + m.up->n_bytes + (expert_parallel_ ? m.down->n_bytes : 0);
      }
    }
    return Status::Ok();
  }
  for (int64_t e = 0; e < n_exp; ++e) {
    const std::string prefix = p + "experts." + std::to_string(e) + ".";
    if (e < expert_begin_ || e >= expert_end_) {  // another rank's expert: counted, not read
      for (const char* proj : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
        const TensorView* t = f.find(prefix + proj);
        if (t == nullptr) return not_found(f.path() + ": tensor '" + prefix + proj + "' is missing");
        model_weight_bytes_ += t->n_bytes;
      }
      continue;
    }
    DS_RETURN_IF_ERROR(bind_mlp(prefix, inter, &w->experts[e]));
    if (!expert_parallel_) DS_RETURN_IF_ERROR(shard_mlp(prefix, inter, &w->experts[e]));
  }
  // More experts in the file than the config declares is a contradiction too.
  const std::string extra = p + "experts." + std::to_string(n_exp) + ".gate_proj.weight";
  if (f.find(extra) != nullptr) {
    return corrupt(f.path() + ": tensor '" + extra + "' exists but " + c.source +
                   " declares n_routed_experts " + std::to_string(n_exp));
  }
  return Status::Ok();
}

// The absorbed form needs, per head, W_UKᵀ [r, nope] (to map q_nope into the latent
// space) and W_UV [v, r]. W_UV is a row slice of kv_b_proj; W_UKᵀ is a transposed
// copy, kept in F32 for F32 checkpoints and BF16 otherwise (for V3: 128 heads x 512 x
// 128 x 2 bytes = 16 MiB per layer). GGUF files may store both pre-split (attn_k_b
// [H, r, nope], attn_v_b [H, v, r]), used as they are. Only this rank's heads are
// built (w->kv_b holds their rows already).
Status DeepseekModel::build_absorbed(int layer, LayerWeights* w) {
  const DeepseekConfig& c = config_;
  const int64_t H_all = c.n_heads, H = shard_.n_heads, h0 = head_begin_;
  const int64_t r = c.kv_lora_rank, nope = c.qk_nope_head_dim, vd = c.v_head_dim;
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  const TensorView *k_b = nullptr, *v_b = nullptr;
  DS_RETURN_IF_ERROR(bind(p + "k_b_proj.weight", {H_all, r, nope}, false, false, &k_b));
  DS_RETURN_IF_ERROR(bind(p + "v_b_proj.weight", {H_all, vd, r}, false, false, &v_b));
  if ((k_b == nullptr) != (v_b == nullptr)) {
    return not_found(files_->path() + ": layer " + std::to_string(layer) +
                     " has only one of attn_k_b / attn_v_b; both or kv_b_proj are needed");
  }
  w->w_uk_t.resize(H);
  w->w_uv.resize(H);
  if (k_b != nullptr) {
    for (int64_t h = 0; h < H; ++h) {
      w->w_uk_t[h] = row_slice(*k_b, (h0 + h) * r, r);
      w->w_uv[h] = row_slice(*v_b, (h0 + h) * vd, vd);
    }
    // Counted whole by bind(); the rank reads its heads' share.
    rank_weight_bytes_ -= (k_b->n_bytes + v_b->n_bytes) / H_all * (H_all - H);
    if (w->kv_b == nullptr) return Status::Ok();
  }
  if (w->kv_b == nullptr) {
    return not_found(files_->path() + ": tensor '" + p +
                     "kv_b_proj.weight' is missing (required by " + c.source + ")");
  }
  if (k_b != nullptr) return Status::Ok();
  if (w->kv_b->dtype == DType::kI8 && w->kv_b->row_bias != nullptr) {
    return unimplemented(files_->path() + ": tensor '" + p + "kv_b_proj.weight': static W8A8 with "
                         "activation zero points on kv_b_proj (msModelSlim leaves it in float)");
  }
  if (w->kv_b->dtype == DType::kI8) {
    // W8A8 checkpoints: kv_b_proj is only ever used absorbed, as float matrices (as
    // vLLM's MLA does), so it is dequantised here once, with its row scales.
    const TensorView& q = *w->kv_b;
    TensorView f;
    f.dtype = DType::kF32;
    f.shape = q.shape;
    std::vector<uint8_t> bytes(static_cast<size_t>(q.n_elements()) * 4);
    float* out = reinterpret_cast<float*>(bytes.data());
    for (int64_t i = 0; i < q.shape[0]; ++i) {
      dequantize_row(q.dtype, q.row(i), out + i * r, r);
      for (int64_t j = 0; j < r; ++j) out[i * r + j] *= q.row_scales[i];
    }
    w->kv_b = own(std::move(f), std::move(bytes));
  }
  const TensorView& kv_b = *w->kv_b;  // [H * (nope + v), r]
  const bool f32 = kv_b.dtype == DType::kF32;
  const size_t elem = f32 ? 4 : 2;
  std::vector<uint8_t> bytes(static_cast<size_t>(H * r * nope) * elem);
  std::vector<float> uk_t(static_cast<size_t>(r * nope));  // one head's [r, nope]
  for (int64_t h = 0; h < H; ++h) {
    dequantize_transposed(row_slice(kv_b, h * (nope + vd), nope), uk_t.data());
    uint8_t* head = bytes.data() + static_cast<size_t>(h * r * nope) * elem;
    if (f32) {
      std::memcpy(head, uk_t.data(), uk_t.size() * 4);
    } else {
      for (size_t i = 0; i < uk_t.size(); ++i) {
        const uint16_t b = f32_to_bf16(uk_t[i]);
        std::memcpy(head + i * 2, &b, 2);
      }
    }
    w->w_uv[h] = row_slice(kv_b, h * (nope + vd) + nope, vd);
  }
  TensorView all;
  all.dtype = f32 ? DType::kF32 : DType::kBF16;
  all.shape = {H * r, nope};
  const TensorView* stored = own(std::move(all), std::move(bytes));
  for (int64_t h = 0; h < H; ++h) w->w_uk_t[h] = row_slice(*stored, h * r, r);
  return Status::Ok();
}

// Looks up every tensor the architecture needs and checks its shape against the
// config, so a mismatched checkpoint fails here, by name, never inside a kernel.
Status DeepseekModel::bind_layer(int l, LayerWeights* out) {
  const DeepseekConfig& c = config_;
  const int64_t hidden = c.hidden_size, H = c.n_heads;
  const int64_t qk = c.qk_head_dim(), r = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  // This rank's heads [h0, h0 + Hl) (all of them on one rank).
  const int64_t h0 = head_begin_, Hl = shard_.n_heads;
  LayerWeights& w = *out;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const std::string a = p + "self_attn.";
  DS_RETURN_IF_ERROR(bind(p + "input_layernorm.weight", {hidden}, true, true, &w.attn_norm));
  if (c.q_lora_rank > 0) {
    DS_RETURN_IF_ERROR(bind(a + "q_a_proj.weight", {c.q_lora_rank, hidden}, true, false, &w.q_a));
    DS_RETURN_IF_ERROR(
        bind(a + "q_a_layernorm.weight", {c.q_lora_rank}, true, true, &w.q_a_norm));
    DS_RETURN_IF_ERROR(bind(a + "q_b_proj.weight", {H * qk, c.q_lora_rank}, true, false, &w.q_b));
    DS_RETURN_IF_ERROR(take_rows(&w.q_b, a + "q_b_proj.weight", h0 * qk, (h0 + Hl) * qk));
  } else {
    DS_RETURN_IF_ERROR(bind(a + "q_proj.weight", {H * qk, hidden}, true, false, &w.q_proj));
    DS_RETURN_IF_ERROR(take_rows(&w.q_proj, a + "q_proj.weight", h0 * qk, (h0 + Hl) * qk));
  }
  DS_RETURN_IF_ERROR(
      bind(a + "kv_a_proj_with_mqa.weight", {r + rope, hidden}, true, false, &w.kv_a));
  DS_RETURN_IF_ERROR(bind(a + "kv_a_layernorm.weight", {r}, true, true, &w.kv_a_norm));
  const int64_t kvb_rows = c.qk_nope_head_dim + c.v_head_dim;  // per head
  // kv_b_proj is split into W_UK (transposed) and W_UV at load (build_absorbed): an
  // FP8 kv_b_proj is converted to BF16, only this rank's heads' rows of it (counted in
  // the start-up log's FP8 line).
  DS_RETURN_IF_ERROR(bind(a + "kv_b_proj.weight", {H * kvb_rows, r}, false, false, &w.kv_b));
  const size_t kv_b_whole = w.kv_b != nullptr ? w.kv_b->n_bytes : 0;
  DS_RETURN_IF_ERROR(take_rows(&w.kv_b, a + "kv_b_proj.weight", h0 * kvb_rows, (h0 + Hl) * kvb_rows));
  if (w.kv_b != nullptr && w.kv_b->dtype == DType::kF8_E4M3) convert_kept_fp8(&w.kv_b, kv_b_whole);
  DS_RETURN_IF_ERROR(build_absorbed(l, &w));
  DS_RETURN_IF_ERROR(
      bind(a + "o_proj.weight", {hidden, H * c.v_head_dim}, true, false, &w.o_proj));
  DS_RETURN_IF_ERROR(
      take_columns(&w.o_proj, a + "o_proj.weight", h0 * c.v_head_dim, (h0 + Hl) * c.v_head_dim));
  DS_RETURN_IF_ERROR(
      bind(p + "post_attention_layernorm.weight", {hidden}, true, true, &w.ffn_norm));

  w.moe = c.is_moe_layer(l);
  if (!w.moe) {
    DS_RETURN_IF_ERROR(bind_mlp(p + "mlp.", c.intermediate_size, &w.dense));
    return shard_mlp(p + "mlp.", c.intermediate_size, &w.dense);
  }
  const int64_t n_exp = c.n_routed_experts;
  const TensorView* router = files_->find(p + "mlp.gate.weight");
  if (router != nullptr && router->shape.size() == 2 && router->shape[0] != n_exp) {
    return corrupt(files_->path() + ": tensor '" + p + "mlp.gate.weight' routes to " +
                   std::to_string(router->shape[0]) + " experts but " + c.source +
                   " declares n_routed_experts " + std::to_string(n_exp));
  }
  DS_RETURN_IF_ERROR(bind(p + "mlp.gate.weight", {n_exp, hidden}, true, false, &w.router));
  const TensorView* bias = nullptr;
  DS_RETURN_IF_ERROR(bind(p + "mlp.gate.e_score_correction_bias", {n_exp},
                          c.topk_method == TopkMethod::kNoauxTc, true, &bias));
  if (bias != nullptr) {
    std::vector<float> values(n_exp);
    dequantize_row(bias->dtype, bias->data, values.data(), n_exp);
    w.router_bias = backend_.alloc(values.size() * sizeof(float));
    backend_.upload(w.router_bias.data(), values.data(), w.router_bias.bytes());
  }
  DS_RETURN_IF_ERROR(bind_experts(l, &w));
  if (c.n_shared_experts > 0) {
    const int64_t shared_inter = c.moe_intermediate_size * c.n_shared_experts;
    DS_RETURN_IF_ERROR(bind_mlp(p + "mlp.shared_experts.", shared_inter, &w.shared));
    DS_RETURN_IF_ERROR(shard_mlp(p + "mlp.shared_experts.", shared_inter, &w.shared));
  }
  return Status::Ok();
}

Status DeepseekModel::bind_weights() {
  const DeepseekConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  DS_RETURN_IF_ERROR(
      bind("model.embed_tokens.weight", {c.vocab_size, hidden}, true, false, &embed_));
  DS_RETURN_IF_ERROR(take_rows(&embed_, "model.embed_tokens.weight", vocab_.begin(), vocab_.end()));
  DS_RETURN_IF_ERROR(bind("model.norm.weight", {hidden}, true, true, &final_norm_));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    DS_RETURN_IF_ERROR(bind("lm_head.weight", {c.vocab_size, hidden}, true, false, &lm_head_));
    DS_RETURN_IF_ERROR(take_rows(&lm_head_, "lm_head.weight", vocab_.begin(), vocab_.end()));
  }
  layers_.reserve(c.n_layers + 1);  // room for the MTP block (enable_mtp)
  layers_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) DS_RETURN_IF_ERROR(bind_layer(l, &layers_[l]));
  if (c.num_nextn_predict_layers > 0) {
    // The MTP module(s) are layers n_layers..: mapped, bound only by enable_mtp().
    DS_LOG_INFO("{} MTP layer(s) present; run only for speculative decoding (deepseek_mtp)",
                c.num_nextn_predict_layers);
  }
  rope_ = std::make_unique<RopeCache>(c.rope, max_context_);
  rope_table_ = std::make_unique<DeviceRopeTable>(backend_, *rope_);

  // The backend's own layout of every matmul weight, made once here.
  auto prepare = [&](const TensorView* t) {
    if (t != nullptr) backend_.prepare_matmul_weight(*t);
  };
  auto prepare_mlp = [&](const Mlp& m) {
    for (const TensorView* t : {m.gate, m.up, m.down}) prepare(t);  // null: another rank's expert
  };
  prepare(lm_head_);
  pack_experts_ = packs_routed_experts();
  for (const LayerWeights& w : layers_) {
    for (const TensorView* t : {w.q_proj, w.q_a, w.q_b, w.kv_a, w.kv_b, w.o_proj, w.router}) {
      prepare(t);
    }
    for (const TensorView& t : w.w_uk_t) prepare(&t);
    for (const TensorView& t : w.w_uv) prepare(&t);
    prepare_mlp(w.dense);
    prepare_mlp(w.shared);
    if (pack_experts_) {
      for (const Mlp& m : w.experts) pack_expert(m);
    }
  }
  return Status::Ok();
}

// A routed expert's packed copies replace its mapped rows: once the backend reads the
// copy alone, the rows' pages are dropped, so that memory holds the expert once.
void DeepseekModel::pack_expert(const Mlp& m) {
  for (const TensorView* t : {m.gate, m.up, m.down}) {  // null: another rank's expert
    if (t != nullptr && backend_.prepare_matmul_weight(*t)) {
      released_weight_bytes_ += static_cast<int64_t>(files_->release_pages(*t));
    }
  }
}

// The backend's packed copies are what its kernels read where they exist; without one a
// call repacks 16 rows at a time into scratch as it goes (the same bits). For the routed
// experts, nearly all of a DeepSeek model's bytes, that repacking is paid per expert
// and call, and at R1's widths a prompt's experts see ~16 tokens each, so it costs
// about as much as their arithmetic. Copies replace the mapped rows (pack_expert), so
// memory holds the weights once; but they mean reading every expert at start-up
// (DeepSeek-R1: 700 GB, minutes at a disk's speed) where in-place reading starts at
// once and pages experts in as requests use them. So they are made where the limit
// holds the weights with a fifth to spare. DSERVE_PACKED_EXPERTS=always / never
// overrides.
bool DeepseekModel::packs_routed_experts() const {
  const char* env = std::getenv("DSERVE_PACKED_EXPERTS");
  const std::string choice = env != nullptr ? env : "auto";
  const int64_t weights = static_cast<int64_t>(files_->total_tensor_bytes());
  const MemoryLimit limit = read_memory_limit();
  bool pack = weights <= limit.bytes / 5 * 4;
  if (choice == "always" || choice == "never") pack = choice == "always";
  DS_LOG_INFO("routed experts: {} ({}: weights {:.1f} GiB, memory limit {:.1f} GiB, {})",
              pack ? "packed copies made at load" : "read in place, no packed copies",
              env != nullptr ? "DSERVE_PACKED_EXPERTS=" + choice : std::string("auto"),
              static_cast<double>(weights) / (1 << 30),
              static_cast<double>(limit.bytes) / (1 << 30), limit.source);
  return pack;
}

size_t DeepseekModel::active_weight_bytes_per_token() const {
  size_t bytes = lm_head_->n_bytes + final_norm_->n_bytes;
  auto mlp_bytes = [](const Mlp& m) {
    return (m.gate ? m.gate->n_bytes : 0) + (m.up ? m.up->n_bytes : 0) +
           (m.down ? m.down->n_bytes : 0);
  };
  // The main model's layers (not the MTP block, which only drafts).
  for (int l = 0; l < config_.n_layers; ++l) {
    const LayerWeights& w = layers_[l];
    for (const TensorView* t : {w.attn_norm, w.q_proj, w.q_a, w.q_a_norm, w.q_b, w.kv_a,
                                w.kv_a_norm, w.o_proj, w.ffn_norm, w.router}) {
      if (t) bytes += t->n_bytes;
    }
    bytes += w.router_bias.bytes();
    for (const TensorView& t : w.w_uk_t) bytes += t.n_bytes;  // decode: absorbed form
    for (const TensorView& t : w.w_uv) bytes += t.n_bytes;
    if (!w.moe) {
      bytes += mlp_bytes(w.dense);
    } else {
      bytes += mlp_bytes(w.shared);
      if (expert_begin_ < expert_end_) bytes += mlp_bytes(w.experts[expert_begin_]) * config_.n_experts_per_tok;
    }
  }
  return bytes;
}

std::unique_ptr<MlaKvCache> DeepseekModel::new_kv_cache() const {
  return std::make_unique<MlaKvCache>(backend_, config_, max_context_);
}

// W_UK for the expanded form of a GGUF that stores only kv_b_proj's split: attn_k_b
// holds W_UKᵀ per head, blocks along nope, the transpose of what expanding needs, so it
// is rebuilt once, on the first expanded batch. From a float attn_k_b in F32 (exactly
// the stored values): [H * nope, r], this rank's heads x nope x r x 4 bytes per layer.
// From a quantised one, per head as two Q8_0 terms along r (hi, and lo for what hi
// leaves: within ~2^-15 of each block's largest value, where dequantising is exact and
// one Q8_0 term would be within 2^-8), so that the keys expand through the int8
// kernels as the values do (R1: 2 x 8.5 MiB per layer, plus the backend's copies).
const TensorView* DeepseekModel::expanded_uk(int layer) {
  LayerWeights& w = layers_[layer];
  if (w.uk != nullptr || !w.uk_terms.empty()) return w.uk;
  const DeepseekConfig& c = shard_;
  const int64_t H = c.n_heads, r = c.kv_lora_rank, nope = c.qk_nope_head_dim;
  if (!keys_expand_in_q8()) {
    std::vector<uint8_t> bytes(static_cast<size_t>(H * nope * r) * sizeof(float));
    float* out = reinterpret_cast<float*>(bytes.data());
    for (int64_t h = 0; h < H; ++h) {
      dequantize_transposed(w.w_uk_t[h], out + h * nope * r);  // W_UK [nope, r] from W_UKᵀ
    }
    TensorView uk;
    uk.dtype = DType::kF32;
    uk.shape = {H * nope, r};
    w.uk = own(std::move(uk), std::move(bytes));
    return w.uk;
  }
  const size_t head_bytes = dtype_bytes(DType::kQ8_0, nope * r);
  std::vector<uint8_t> bytes(2 * static_cast<size_t>(H) * head_bytes);
  std::vector<float> uk(static_cast<size_t>(nope * r));
  for (int64_t h = 0; h < H; ++h) {
    dequantize_transposed(w.w_uk_t[h], uk.data());
    for (int64_t d = 0; d < nope; ++d) {
      const size_t row = static_cast<size_t>(d) * dtype_bytes(DType::kQ8_0, r);
      quantize_row_q8_0_two_terms(uk.data() + d * r, r, bytes.data() + h * head_bytes + row,
                                  bytes.data() + (H + h) * head_bytes + row);
    }
  }
  TensorView all;
  all.dtype = DType::kQ8_0;
  all.shape = {2 * H * nope, r};
  const TensorView* terms = own(std::move(all), std::move(bytes));
  for (int64_t i = 0; i < 2 * H; ++i) {
    w.uk_terms.push_back(row_slice(*terms, i * nope, nope));
    backend_.prepare_matmul_weight(w.uk_terms.back());
  }
  return nullptr;
}

bool DeepseekModel::keys_expand_in_q8() const {
  if (layers_.empty()) return false;
  const LayerWeights& w = layers_.front();
  return w.kv_b == nullptr && !w.w_uk_t.empty() && is_quantized(w.w_uk_t.front().dtype);
}

// Floats per position of expanded keys or values over `floats` (heads x dims), padded to
// an odd number of cache lines: R1's 128 heads of 192 (or 128) floats are a multiple of
// 4 KiB, which would put one head's keys of every position into one L1 set, so that a
// step's keys evict each other (measured: the padded rows make the expanded prompt
// attention 1.2-1.3x faster, paged_attention_bench mla_prefill on a Zen 4 VM).
static int64_t expanded_row(int64_t floats) {
  constexpr int64_t kLine = 16;  // floats
  return floats % kLine == 0 && floats / kLine % 2 == 0 ? floats + kLine : floats;
}

// Keys and values of heads [h0, h0 + g) over n_kv cached positions:
//   k [n_kv, g, nope + rope] = [c_all · W_UK_hᵀ | the position's k_pe]
//   v [n_kv, g, v] = c_all · W_UV_hᵀ
// latent: the positions' cached rows (k_pe after the first r values); c_all: their
// first r values, contiguous. With the checkpoint's kv_b_proj, one product gives both
// (kvb [n_kv, g, nope + v]); a split GGUF's values come from attn_v_b's own rows (their
// blocks run along r, so a quantised file's go through the integer kernels, the
// latents quantised as any activation is for them, as the absorbed form's W_UV
// products are), its keys from W_UK rebuilt (expanded_uk): in F32, or as two Q8_0
// terms per head whose products are added.
void DeepseekModel::expand_keys_values(int layer, int64_t h0, int64_t g, const float* latent,
                                       const float* c_all, int64_t n_kv, float* k, float* v) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  const LayerWeights& w = layers_[layer];
  const int64_t r = c.kv_lora_rank, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t vd = c.v_head_dim, qk = c.qk_head_dim(), row = c.latent_dim();
  const int64_t k_row = expanded_row(g * qk), v_row = expanded_row(g * vd);
  float* kvb = scratch_.kvb.ensure(n_kv * g * (nope + vd));
  // Where k's nope part and v are in kvb: [position][head][...] strides.
  StridedCopy k_from{.n0 = n_kv, .n1 = g, .len = nope, .dst_stride0 = k_row, .dst_stride1 = qk};
  StridedCopy v_from{.n0 = n_kv, .n1 = g, .len = vd, .dst_stride0 = v_row, .dst_stride1 = vd};
  const float* v_src = kvb;
  if (w.kv_b != nullptr) {
    const int64_t kvb_row = nope + vd;
    backend_.matmul(g == c.n_heads ? *w.kv_b : row_slice(*w.kv_b, h0 * kvb_row, g * kvb_row),
                    nullptr, c_all, n_kv, kvb);
    k_from.src_stride0 = v_from.src_stride0 = g * kvb_row;
    k_from.src_stride1 = v_from.src_stride1 = kvb_row;
    v_src = kvb + nope;
  } else {
    // vb [g, n_kv, v], one product per head's rows of attn_v_b (the backend's prepared
    // copies), the latents quantised once for all of them; keys kb [n_kv, g, nope] from
    // the F32 W_UK, or [g, n_kv, nope] as the sum of the two terms' products.
    const TensorView* uk = expanded_uk(layer);
    float* vb = kvb + n_kv * g * nope;
    std::vector<MatmulTarget>& targets = scratch_.head_targets;
    targets.resize(static_cast<size_t>(g));
    for (int64_t h = 0; h < g; ++h) targets[h] = {&w.w_uv[h0 + h], nullptr, vb + h * n_kv * vd};
    float* kb_lo = nullptr;
    if (uk != nullptr) {
      backend_.matmul(g == c.n_heads ? *uk : row_slice(*uk, h0 * nope, g * nope), nullptr, c_all,
                      n_kv, kvb);
      k_from.src_stride0 = g * nope;
      k_from.src_stride1 = nope;
    } else {
      kb_lo = scratch_.kb_lo.ensure(n_kv * g * nope);
      for (int64_t h = 0; h < g; ++h) {
        targets.push_back({&w.uk_terms[h0 + h], nullptr, kvb + h * n_kv * nope});
        targets.push_back({&w.uk_terms[c.n_heads + h0 + h], nullptr, kb_lo + h * n_kv * nope});
      }
      k_from.src_stride0 = nope;
      k_from.src_stride1 = n_kv * nope;
    }
    backend_.matmul_many(c_all, n_kv, targets.data(), static_cast<int>(targets.size()));
    if (kb_lo != nullptr) backend_.add_inplace(kvb, kb_lo, n_kv * g * nope);
    v_from.src_stride0 = vd;
    v_from.src_stride1 = n_kv * vd;
    v_src = vb;
  }
  // For each (position j, head h): k's nope part and v, k's rope part the position's
  // shared k_pe (a zero head stride repeats it over the heads).
  backend_.copy_strided(k, kvb, k_from);
  backend_.copy_strided(k + nope, latent + r, {.n0 = n_kv, .n1 = g, .len = rope,
                                               .dst_stride0 = k_row, .dst_stride1 = qk,
                                               .src_stride0 = row, .src_stride1 = 0});
  backend_.copy_strided(v, v_src, v_from);
}

// Expanded MLA over every cached position: c_all [n_kv, r] <- the latent rows, the
// keys and values of all heads from them, att [n, H, v] = attention(q [n, H, qk], k, v).
void DeepseekModel::attend_expanded(int layer, int64_t n, const float* latent, int64_t n_kv) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  Scratch& s = scratch_;
  const int64_t H = c.n_heads, r = c.kv_lora_rank, vd = c.v_head_dim, qk = c.qk_head_dim();
  float* c_all = s.c_all.ensure(n_kv * r);
  const int64_t k_row = expanded_row(H * qk), v_row = expanded_row(H * vd);
  float* k = s.k.ensure(n_kv * k_row);
  float* v = s.v.ensure(n_kv * v_row);
  backend_.copy_strided(c_all, latent,
                        {.n0 = n_kv, .len = r, .dst_stride0 = r, .src_stride0 = c.latent_dim()});
  expand_keys_values(layer, 0, H, latent, c_all, n_kv, k, v);
  backend_.prompt_attention(s.q.get(), k, v, s.att.get(), n, s.batch.positions(), n_kv,
                            static_cast<int>(H), static_cast<int>(H), static_cast<int>(qk),
                            static_cast<int>(vd), c.softmax_scale(), k_row, v_row);
}

// Absorbed MLA, attending in the latent space:
//   q_abs [n, H, r + rope]: q_abs_h = [q_nope_h · W_UK_h | q_pe_h]
//   out_lat [n, H, out_row] = attention(q_abs, latent, latent) with ONE kv head, the
//     values the cached rows' first r elements (out_row r), or the whole rows (out_row
//     r + rope, the rope part then dropped); attend_latent returns out_row
//   att_h [n, v] = out_lat_h[:, :r] · W_UV_hᵀ
template <typename LatentAttendFn>
void DeepseekModel::attend_absorbed(const LayerWeights& w, int64_t n, const float* q, float* att,
                                    LatentAttendFn&& attend_latent) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  Scratch& s = scratch_;
  const int64_t H = c.n_heads, r = c.kv_lora_rank, nope = c.qk_nope_head_dim,
                rope = c.qk_rope_head_dim;
  const int64_t vd = c.v_head_dim, qk = c.qk_head_dim(), row = c.latent_dim();
  float* q_abs = s.q_abs.ensure(n * H * row);
  float* out_lat = s.out_lat.ensure(n * H * row);
  // Every head's product as one grouped matmul (head h: its own input rows and
  // weight), so the backend runs the layer's heads as one job rather than one each.
  float* tmp_in = s.tmp_in.ensure(H * n * std::max(nope, r));
  float* tmp_out = s.tmp_out.ensure(H * n * std::max(r, vd));
  std::vector<MatmulTarget>& targets = s.head_targets;
  std::vector<MatmulGroup>& groups = s.head_groups;
  targets.resize(H);
  groups.resize(H);
  // tmp_in [H, n, nope] = q_nope per head; tmp_out [H, n, r] = tmp_in_h · W_UK_hᵀ
  backend_.copy_strided(tmp_in, q, {.n0 = H, .n1 = n, .len = nope, .dst_stride0 = n * nope,
                                    .dst_stride1 = nope, .src_stride0 = qk, .src_stride1 = H * qk});
  for (int64_t h = 0; h < H; ++h) {
    targets[h] = {&w.w_uk_t[h], nullptr, tmp_out + h * n * r};
    groups[h] = {tmp_in + h * n * nope, n, &targets[h], 1};
  }
  backend_.matmul_grouped(groups.data(), static_cast<int>(H));
  // q_abs [n, H, :r] = tmp_out per head; q_abs [n, H, r:] = q_pe
  backend_.copy_strided(q_abs, tmp_out, {.n0 = H, .n1 = n, .len = r, .dst_stride0 = row,
                                         .dst_stride1 = H * row, .src_stride0 = n * r, .src_stride1 = r});
  backend_.copy_strided(q_abs + r, q + nope,
                        {.n0 = n * H, .len = rope, .dst_stride0 = row, .src_stride0 = qk});
  const int64_t out_row = attend_latent(q_abs, out_lat);
  // tmp_in [H, n, r] = out_lat's latent part per head; tmp_out [H, n, v] = · W_UV_hᵀ
  backend_.copy_strided(tmp_in, out_lat, {.n0 = H, .n1 = n, .len = r, .dst_stride0 = n * r,
                                          .dst_stride1 = r, .src_stride0 = out_row,
                                          .src_stride1 = H * out_row});
  for (int64_t h = 0; h < H; ++h) {
    targets[h] = {&w.w_uv[h], nullptr, tmp_out + h * n * vd};
    groups[h] = {tmp_in + h * n * r, n, &targets[h], 1};
  }
  backend_.matmul_grouped(groups.data(), static_cast<int>(H));
  // att [n, H, v] = tmp_out per head
  backend_.copy_strided(att, tmp_out, {.n0 = H, .n1 = n, .len = vd, .dst_stride0 = vd,
                                               .dst_stride1 = H * vd, .src_stride0 = n * vd,
                                               .src_stride1 = vd});
}

// MLA's projections for one layer: s.xb [n, hidden] (normed) -> q [n, H, qk] with
// q_pe rotated, kva [n, r + rope] = [c normed | k_pe rotated].
void DeepseekModel::project_qkv(int layer, int64_t n) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  const LayerWeights& w = layers_[layer];
  Scratch& s = scratch_;
  const int64_t H = c.n_heads, r = c.kv_lora_rank, row = c.latent_dim(), nope = c.qk_nope_head_dim;
  const RopeTable& rope = rope_table_->table();
  const int32_t* positions = s.batch.positions();
  float* q = s.q.get();
  float* kva = s.kva.get();

  // q [n, H, nope + rope]
  // and kva [n, r + rope] = [c | k_pe] from the same input, in one backend job.
  if (w.q_proj != nullptr) {
    const MatmulTarget q_kva[] = {{w.q_proj, nullptr, q}, {w.kv_a, nullptr, kva}};
    backend_.matmul_many(s.xb.get(), n, q_kva, 2);
  } else {
    float* qa = s.qa.get();
    const MatmulTarget qa_kva[] = {{w.q_a, nullptr, qa}, {w.kv_a, nullptr, kva}};
    backend_.matmul_many(s.xb.get(), n, qa_kva, 2);
    backend_.rms_norm(qa, *w.q_a_norm, c.rms_norm_eps, n, c.q_lora_rank, qa);
    backend_.matmul(*w.q_b, nullptr, qa, n, q);
  }
  // Rotate q_pe: the rope dims of each head start `nope` floats in, so view q from
  // there with the full head stride.
  backend_.rope(q + nope, n, static_cast<int>(H), static_cast<int>(c.qk_head_dim()), positions, rope,
                c.rope_interleaved);

  // kva: c normed, k_pe rotated; rows go to the cache.
  for (int64_t t = 0; t < n; ++t) {
    backend_.rms_norm(kva + t * row, *w.kv_a_norm, c.rms_norm_eps, 1, r, kva + t * row);
  }
  backend_.rope(kva + r, n, 1, static_cast<int>(row), positions, rope, c.rope_interleaved);
}

void DeepseekModel::attention(int layer, int64_t n, int64_t n_kv, MlaKvCache& kv, bool absorbed) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  const LayerWeights& w = layers_[layer];
  const int64_t H = c.n_heads, row = c.latent_dim();
  project_qkv(layer, n);
  float* latent = kv.latent(layer);  // [capacity, r + rope]; a position's slot is itself
  backend_.kv_store(DType::kF32, latent, row, scratch_.kva.get(), scratch_.batch.slots(), n);
  if (absorbed) {
    attend_absorbed(w, n, scratch_.q.get(), scratch_.att.get(), [&](const float* q_abs, float* out_lat) {
      backend_.attention(q_abs, latent, latent, out_lat, n, scratch_.batch.positions(), n_kv,
                         static_cast<int>(H), 1, static_cast<int>(row), static_cast<int>(row),
                         c.softmax_scale());
      return row;
    });
  } else {
    attend_expanded(layer, n, latent, n_kv);
  }
}

Status DeepseekModel::forward(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                              MlaKvCache& kv, LogitsFor which, std::vector<float>* logits) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return invalid_argument("forward: empty batch");
  if (positions.size() != tokens.size()) {
    return invalid_argument("forward: " + std::to_string(tokens.size()) + " tokens but " +
                            std::to_string(positions.size()) + " positions");
  }
  for (int64_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size) {
      return invalid_argument("token id " + std::to_string(tokens[t]) +
                              " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                              ")");
    }
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
  bool absorbed = true;
  switch (path_) {
    case MlaPath::kAuto:
      absorbed = n == 1;
      break;
    case MlaPath::kExpanded:
      absorbed = false;
      break;
    case MlaPath::kAbsorbed:
      absorbed = true;
      break;
  }
  std::vector<int32_t>& rows = scratch_.row_ids;
  rows.clear();
  for (int64_t t = which == LogitsFor::kLast ? n - 1 : 0; t < n; ++t) {
    rows.push_back(static_cast<int32_t>(t));
  }
  scratch_.batch.upload_sequence(tokens, positions);
  scratch_.batch.upload_rows(rows);

  DS_RETURN_IF_ERROR(run_layers(n, [&](int l) { attention(l, n, end, kv, absorbed); },
                                static_cast<int64_t>(rows.size())));
  kv.set_n_tokens(end);
  return compute_logits(static_cast<int64_t>(rows.size()), logits);
}

void DeepseekModel::ensure_scratch(int64_t n) {
  const DeepseekConfig& c = shard_;
  Scratch& s = scratch_;
  s.x.ensure(n * c.hidden_size);
  s.xb.ensure(n * c.hidden_size);
  s.qa.ensure(n * std::max(c.q_lora_rank, 1));
  s.q.ensure(n * c.n_heads * c.qk_head_dim());
  s.kva.ensure(n * c.latent_dim());
  s.att.ensure(n * c.n_heads * c.v_head_dim);
  s.moe_out.ensure(n * c.hidden_size);
}

template <typename AttendFn>
Status DeepseekModel::run_layers(int64_t n, AttendFn&& attend, int64_t n_out) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  ensure_scratch(n);
  // x [n, hidden] = embedding rows (over the vocabulary's ranks)
  DS_RETURN_IF_ERROR(vocab_.embed(*comm_, *embed_, scratch_.batch.tokens(), n, c.hidden_size,
                                  scratch_.x.get()));
  // forward_mtp may read any row's hidden state: with the MTP layer every row goes on.
  const bool select = mtp_ == nullptr && n_out < n;
  const int64_t all = std::numeric_limits<int64_t>::max();
  for (int l = 0; l < c.n_layers; ++l) {
    DS_RETURN_IF_ERROR(run_layer(l, n, attend, select && l == c.n_layers - 1 ? n_out : all));
  }
  last_forward_rows_ = select ? std::max<int64_t>(n_out, 1) : n;  // keep_logits_rows' count
  return Status::Ok();
}

template <typename AttendFn>
Status DeepseekModel::run_layer(int l, int64_t n, AttendFn&& attend, int64_t n_out) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  const int64_t hidden = c.hidden_size;
  Scratch& s = scratch_;
  float* x = s.x.get();
  float* xb = s.xb.get();
  float* moe_out = s.moe_out.get();
  const LayerWeights& w = layers_[l];
  // --- MLA block: x += o_proj(attention(rms_norm(x))) ---
  backend_.rms_norm(x, *w.attn_norm, c.rms_norm_eps, n, hidden, xb);
  attend(l);
  backend_.matmul(*w.o_proj, nullptr, s.att.get(), n, xb);
  DS_RETURN_IF_ERROR(backend_.all_reduce_sum(*comm_, xb, n * hidden));  // the ranks' heads' shares
  backend_.add_inplace(x, xb, n * hidden);
  if (n_out < n) n = s.batch.keep_logits_rows(x, xb, hidden, n_out);  // only those go on

  // --- FFN block: x += mlp(rms_norm(x)) (dense or MoE) ---
  backend_.rms_norm(x, *w.ffn_norm, c.rms_norm_eps, n, hidden, xb);
  if (w.moe) {
    DS_RETURN_IF_ERROR(run_moe(w, n));
  } else {
    run_mlp(w.dense, c.intermediate_size, xb, n, moe_out);
  }
  DS_RETURN_IF_ERROR(backend_.all_reduce_sum(*comm_, moe_out, n * hidden));  // the ranks' FFN shares
  backend_.add_inplace(x, moe_out, n * hidden);
  return Status::Ok();
}

Status DeepseekModel::compute_logits(int64_t n_out, std::vector<float>* logits) {
  return compute_logits(n_out, *final_norm_, *lm_head_, logits);
}

Status DeepseekModel::compute_logits(int64_t n_out, const TensorView& norm,
                                     const TensorView& head, std::vector<float>* logits) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  const int64_t hidden = c.hidden_size;
  Scratch& s = scratch_;
  // rows_x [n_out, hidden] = rms_norm(x[rows]); logits [n_out, vocab] = rows_x · headᵀ
  float* rows = s.rows.ensure(n_out * hidden);
  backend_.gather_rows(s.x.get(), hidden, s.batch.rows(), n_out, rows);
  backend_.rms_norm(rows, norm, c.rms_norm_eps, n_out, hidden, rows);
  return vocab_.logits(*comm_, head, rows, n_out, logits);
}

std::unique_ptr<PagedMlaCache> DeepseekModel::new_paged_cache(int n_blocks, int block_size,
                                                              DType dtype) const {
  return std::make_unique<PagedMlaCache>(backend_, cache_config(), n_blocks, block_size, dtype);
}

DeepseekConfig DeepseekModel::cache_config() const {
  DeepseekConfig c = config_;
  if (mtp_) c.n_layers += 1;  // the MTP block's latents sit after the main layers'
  return c;
}

// A paged step's split of its tokens between MLA's two forms. Per query and cached key
// the absorbed form costs H (r + rope + r) MACs and the expanded H (qk + v), plus, once
// per key and step, H (nope + v) r to expand the key: expanding pays once a sequence has
// more than (nope + v) r / (2 r + rope - qk - v) queries in a step (R1: 171; 64 where a
// quantised GGUF's latents expand through the int8 kernels, each of their
// multiply-accumulates counted as a quarter of a float one). Which form
// a token takes must not depend on how the scheduler cut its prompt (a request's
// output is the same alone and in any batch), so it is decided per token from its
// position and its prompt's length: prompt tokens at least that many before the
// prompt's end attend expanded, the prompt's tail and every generated token absorbed.
// A long prompt is then mostly expanded in every chunk, a short one, a prompt's last
// tokens after a long cached prefix, and decode steps absorbed. DSERVE_MLA_PREFILL=
// absorbed (never expand) or expanded (every prompt token) overrides the rule.
int64_t DeepseekModel::expanded_min_tokens(const DeepseekConfig& c, bool integer_expansion) {
  const char* env = std::getenv("DSERVE_MLA_PREFILL");
  const std::string mode = env != nullptr ? env : "";
  if (mode == "absorbed") return std::numeric_limits<int64_t>::max();
  if (mode == "expanded") return 1;
  const int64_t r = c.kv_lora_rank;
  const int64_t saved = 2 * r + c.qk_rope_head_dim - c.qk_head_dim() - c.v_head_dim;
  if (saved <= 0) return std::numeric_limits<int64_t>::max();
  // Through the int8 kernels the keys take two products (expanded_uk's two terms),
  // each int8 multiply-accumulate a quarter of a float one (AVX-512 VNNI's and Arm's
  // dot products: 4 per lane per instruction against one FMA).
  const int64_t expand = integer_expansion ? (2 * c.qk_nope_head_dim + c.v_head_dim) * r / 4
                                           : (c.qk_nope_head_dim + c.v_head_dim) * r;
  return std::max<int64_t>(1, (expand + saved - 1) / saved);
}

void DeepseekModel::plan_paged_mla(const ModelBatch& batch, const PagedBatch& pb) {
  PagedMlaSplit& m = scratch_.mla;
  m.runs.clear();
  m.absorbed_rows.clear();
  m.key_slots.clear();
  m.order.assign(batch.tokens.size(), 0);
  m.absorbed = pb;
  if (batch.prompt_lens.empty()) return;
  const int64_t n = batch.n_tokens(), bs = pb.block_size;
  auto expands = [&](int64_t t) {
    const int64_t len = batch.prompt_lens[batch.seq_of_token[t]];
    return batch.positions[t] < len && len - batch.positions[t] >= min_expanded_tokens_;
  };
  std::vector<int32_t> expanded;  // the batch tokens of the runs, in order
  for (int64_t t = 0; t < n;) {
    if (!expands(t)) {
      m.absorbed_rows.push_back(static_cast<int32_t>(t++));
      continue;
    }
    // A run: consecutive expanded tokens of one sequence, each reading its keys
    // through the run's one expansion of keys 0 .. its last position.
    PagedMlaSplit::Run run{.first = t, .n = 0, .n_kv = 0,
                           .slots_at = static_cast<int64_t>(m.key_slots.size())};
    const int32_t seq = batch.seq_of_token[t];
    for (; t < n && batch.seq_of_token[t] == seq && expands(t); ++t, ++run.n) {
      run.n_kv = std::max<int64_t>(run.n_kv, int64_t{batch.positions[t]} + 1);
      expanded.push_back(static_cast<int32_t>(t));
    }
    const int32_t* table = batch.block_tables.data() + batch.block_table_offsets[seq];
    for (int64_t p = 0; p < run.n_kv; ++p) m.key_slots.push_back(int64_t{table[p / bs]} * bs + p % bs);
    m.runs.push_back(run);
  }
  if (m.runs.empty()) return;
  // Token t's attention row in [absorbed tokens' rows | each run's rows].
  const int64_t n_absorbed = static_cast<int64_t>(m.absorbed_rows.size());
  for (int64_t i = 0; i < n_absorbed; ++i) m.order[m.absorbed_rows[i]] = static_cast<int32_t>(i);
  for (size_t i = 0; i < expanded.size(); ++i) {
    m.order[expanded[i]] = static_cast<int32_t>(n_absorbed + static_cast<int64_t>(i));
  }
  m.dev_order = m.order_buf.upload(m.order.data(), n);
  m.dev_slots = m.slots_buf.upload(m.key_slots.data(), static_cast<int64_t>(m.key_slots.size()));
  m.dev_absorbed_rows = m.rows_buf.upload(m.absorbed_rows.data(), n_absorbed);
  // The absorbed tokens' own batch: their positions and sequences, the step's tables.
  std::vector<int32_t>& host = m.host_positions;
  host.clear();
  for (int32_t t : m.absorbed_rows) host.push_back(batch.positions[t]);
  for (int32_t t : m.absorbed_rows) host.push_back(batch.seq_of_token[t]);
  const int32_t* dev = m.absorbed_buf.upload(host.data(), 2 * n_absorbed);
  m.absorbed.n_tokens = n_absorbed;
  m.absorbed.positions = dev;
  m.absorbed.seq_of_token = dev + n_absorbed;
}

void DeepseekModel::attention_paged(int layer, int64_t n, const PagedBatch& batch,
                                    PagedMlaCache& cache) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  Scratch& s = scratch_;
  const int64_t H = c.n_heads, row = c.latent_dim(), qk = c.qk_head_dim(), vd = c.v_head_dim;
  project_qkv(layer, n);
  void* pool = cache.latent(layer);  // [n_slots, r + rope] of cache.dtype()
  const DType dtype = cache.dtype();
  // The whole step's latents first: a sequence may read, through a shared prefix
  // block, rows another sequence of this step writes.
  backend_.kv_store(dtype, pool, row, s.kva.get(), s.batch.slots(), n);
  auto absorbed = [&](int64_t n_q, const float* q, float* att, const PagedBatch& pb) {
    attend_absorbed(layers_[layer], n_q, q, att, [&](const float* q_abs, float* out_lat) {
      backend_.paged_latent_attention(q_abs, dtype, pool, out_lat, pb, static_cast<int>(H),
                                      static_cast<int>(row), static_cast<int>(c.kv_lora_rank),
                                      c.softmax_scale());
      return c.kv_lora_rank;
    });
  };
  const PagedMlaSplit& m = s.mla;
  if (m.runs.empty()) {
    absorbed(n, s.q.get(), s.att.get(), batch);
    return;
  }
  // Rows of [absorbed | runs], then into the step's order.
  float* parts = s.att_parts.ensure(n * H * vd);
  const int64_t n_absorbed = m.absorbed.n_tokens;
  if (n_absorbed > 0) {
    float* q_absorbed = s.q_part.ensure(n_absorbed * H * qk);
    backend_.gather_rows(s.q.get(), H * qk, m.dev_absorbed_rows, n_absorbed, q_absorbed);
    absorbed(n_absorbed, q_absorbed, parts, m.absorbed);
  }
  int64_t at = n_absorbed;
  for (const PagedMlaSplit::Run& run : m.runs) {
    attend_expanded_run(layer, run, dtype, pool, batch.positions + run.first,
                        parts + at * H * vd);
    at += run.n;
  }
  backend_.gather_rows(parts, H * vd, m.dev_order, n, s.att.get());
}

// One run of expanded queries over their sequence's paged latents:
//   c [n_kv, r + rope] <- the latents of positions 0 .. n_kv - 1 (as floats)
//   per group of heads: kvb = c[:, :r] · kv_b_groupᵀ, keys [nope part | k_pe], values,
//   attention(q of the run's tokens) -> out [run.n, H, v]
// The groups bound the expanded keys' memory (a 32K-token context at R1's widths
// expands to 75 MiB per head).
void DeepseekModel::attend_expanded_run(int layer, const PagedMlaSplit::Run& run, DType dtype,
                                        const void* pool, const int32_t* positions, float* out) {
  const DeepseekConfig& c = shard_;  // this rank's heads and FFN widths
  Scratch& s = scratch_;
  const int64_t H = c.n_heads, r = c.kv_lora_rank, nope = c.qk_nope_head_dim;
  const int64_t vd = c.v_head_dim, qk = c.qk_head_dim(), row = c.latent_dim();
  const int64_t n_kv = run.n_kv, n_q = run.n;
  float* latent = s.latent_rows.ensure(n_kv * row);
  backend_.kv_gather(dtype, pool, row, s.mla.dev_slots + run.slots_at, n_kv, latent);
  float* c_all = s.c_all.ensure(n_kv * r);
  backend_.copy_strided(c_all, latent, {.n0 = n_kv, .len = r, .dst_stride0 = r, .src_stride0 = row});
  constexpr int64_t kExpandedBytes = int64_t{256} << 20;
  // kvb, then k and v; and the keys' second term where they expand in Q8_0 (kb_lo).
  const int64_t keys_lo = keys_expand_in_q8() ? nope : 0;
  const int64_t per_head = n_kv * (nope + vd + qk + vd + keys_lo) * int64_t{sizeof(float)};
  const int64_t group = std::clamp<int64_t>(kExpandedBytes / per_head, 1, H);
  for (int64_t h0 = 0; h0 < H; h0 += group) {
    const int64_t g = std::min(group, H - h0);
    const int64_t k_row = expanded_row(g * qk), v_row = expanded_row(g * vd);
    float* k = s.k.ensure(n_kv * k_row);
    float* v = s.v.ensure(n_kv * v_row);
    float* q = s.q_part.ensure(n_q * g * qk);
    float* o = s.tmp_out.ensure(n_q * g * vd);
    expand_keys_values(layer, h0, g, latent, c_all, n_kv, k, v);
    backend_.copy_strided(q, s.q.get() + (run.first * H + h0) * qk,
                          {.n0 = n_q, .len = g * qk, .dst_stride0 = g * qk, .src_stride0 = H * qk});
    backend_.prompt_attention(q, k, v, o, n_q, positions, n_kv, static_cast<int>(g),
                              static_cast<int>(g), static_cast<int>(qk), static_cast<int>(vd),
                              c.softmax_scale(), k_row, v_row);
    backend_.copy_strided(out + h0 * vd, o, {.n0 = n_q, .len = g * vd, .dst_stride0 = H * vd,
                                             .src_stride0 = g * vd});
  }
}

Status DeepseekModel::forward_batch(const ModelBatch& batch, PagedMlaCache& cache,
                                    std::vector<float>* logits) {
  std::vector<int64_t>& slots = scratch_.slots;
  PagedBatch host;
  DS_RETURN_IF_ERROR(resolve_paged_batch(batch, config_.vocab_size, max_context_,
                                         cache.n_blocks(), cache.block_size(), &slots, &host));
  const int64_t n = batch.n_tokens();
  const PagedBatch pb = scratch_.batch.upload_paged(batch, host, slots);
  plan_paged_mla(batch, pb);
  const int64_t n_out = static_cast<int64_t>(batch.logits_rows.size());
  DS_RETURN_IF_ERROR(run_layers(n, [&](int l) { attention_paged(l, n, pb, cache); }, n_out));
  return compute_logits(n_out, logits);
}

}  // namespace dserve

namespace dserve {

Status DeepseekModel::enable_mtp() {
  if (mtp_) return Status::Ok();
  const DeepseekConfig& c = config_;
  if (c.num_nextn_predict_layers < 1) {
    return invalid_argument(files_->path() + ": " + c.source +
                            " declares no multi-token-prediction layer "
                            "(num_nextn_predict_layers is 0)");
  }
  if (dispatch_) {
    return unimplemented("deepseek_mtp with expert parallelism across data-parallel engines: "
                         "not supported yet (use it with tensor parallelism, or ngram)");
  }
  const int l = c.n_layers;
  const int64_t hidden = c.hidden_size;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  auto mtp = std::make_unique<MtpWeights>();
  Status s = [&]() -> Status {
    DS_RETURN_IF_ERROR(bind(p + "enorm.weight", {hidden}, true, true, &mtp->enorm));
    DS_RETURN_IF_ERROR(bind(p + "hnorm.weight", {hidden}, true, true, &mtp->hnorm));
    DS_RETURN_IF_ERROR(bind(p + "eh_proj.weight", {hidden, 2 * hidden}, true, false, &mtp->eh_proj));
    DS_RETURN_IF_ERROR(
        bind(p + "shared_head.norm.weight", {hidden}, true, true, &mtp->head_norm));
    // DeepSeek's checkpoints repeat the output head in the MTP layer; without it the
    // main model's is shared, as the embedding always is.
    DS_RETURN_IF_ERROR(
        bind(p + "shared_head.head.weight", {c.vocab_size, hidden}, false, false, &mtp->head));
    if (mtp->head != nullptr) {
      DS_RETURN_IF_ERROR(take_rows(&mtp->head, p + "shared_head.head.weight", vocab_.begin(),
                                   vocab_.end()));
    } else {
      mtp->head = lm_head_;
    }
    layers_.emplace_back();
    return bind_layer(l, &layers_.back());
  }();
  if (!s.ok()) {
    if (static_cast<int>(layers_.size()) > c.n_layers) layers_.pop_back();
    return s.with_context("loading the MTP layer (model.layers." + std::to_string(l) + ")");
  }
  auto prepare = [&](const TensorView* t) {
    if (t != nullptr) backend_.prepare_matmul_weight(*t);
  };
  const LayerWeights& w = layers_.back();
  for (const TensorView* t : {mtp->eh_proj, mtp->head, w.q_proj, w.q_a, w.q_b, w.kv_a, w.kv_b,
                              w.o_proj, w.router}) {
    prepare(t);
  }
  for (const TensorView& t : w.w_uk_t) prepare(&t);
  for (const TensorView& t : w.w_uv) prepare(&t);
  for (const Mlp* m : {&w.dense, &w.shared}) {
    for (const TensorView* t : {m->gate, m->up, m->down}) prepare(t);
  }
  if (pack_experts_) {  // as bind_weights decided for the main layers
    for (const Mlp& m : w.experts) pack_expert(m);
  }
  mtp_ = std::move(mtp);
  DS_LOG_INFO("MTP layer {} loaded for speculative decoding", l);
  return Status::Ok();
}

Status DeepseekModel::forward_mtp(const ModelBatch& batch, PagedMlaCache& cache,
                                  std::span<const int32_t> prev_rows, bool prev_is_target,
                                  std::vector<float>* logits) {
  if (!mtp_) return invalid_argument("forward_mtp: the MTP layer is not loaded (enable_mtp)");
  const DeepseekConfig& c = shard_;
  const int64_t n = batch.n_tokens(), hidden = c.hidden_size;
  if (static_cast<int64_t>(prev_rows.size()) != n) {
    return invalid_argument("forward_mtp: " + std::to_string(n) + " tokens but " +
                            std::to_string(prev_rows.size()) + " hidden-state rows");
  }
  for (int32_t r : prev_rows) {
    if (r < 0 || r >= last_forward_rows_) {
      return invalid_argument("forward_mtp: hidden-state row " + std::to_string(r) +
                              " is outside the previous forward's " +
                              std::to_string(last_forward_rows_) + " rows");
    }
  }
  if (cache.n_layers() != c.n_layers + 1) {
    return invalid_argument("forward_mtp: the paged cache has no MTP layer (made before "
                            "enable_mtp)");
  }
  Scratch& s = scratch_;
  // h [n, hidden] = hnorm(the previous pass's hidden state at each row): the main
  // model's output (after its final norm) or the MTP block's own output.
  float* prev = s.mtp_prev.ensure(n * hidden);
  backend_.gather_rows(s.x.get(), hidden, s.mtp_rows.upload(prev_rows.data(), n), n, prev);
  if (prev_is_target) backend_.rms_norm(prev, *final_norm_, c.rms_norm_eps, n, hidden, prev);
  backend_.rms_norm(prev, *mtp_->hnorm, c.rms_norm_eps, n, hidden, prev);

  std::vector<int64_t>& slots = s.slots;
  PagedBatch host;
  DS_RETURN_IF_ERROR(resolve_paged_batch(batch, config_.vocab_size, max_context_,
                                         cache.n_blocks(), cache.block_size(), &slots, &host));
  const PagedBatch pb = s.batch.upload_paged(batch, host, slots);
  plan_paged_mla(batch, pb);
  ensure_scratch(n);
  float* x = s.x.get();
  // e [n, hidden] = enorm(embedding), zero at position 0 (vLLM's deepseek_mtp: nothing
  // precedes it to predict from).
  DS_RETURN_IF_ERROR(vocab_.embed(*comm_, *embed_, s.batch.tokens(), n, hidden, x));
  for (int64_t t = 0; t < n; ++t) {
    if (batch.positions[t] == 0) backend_.fill_zero(x + t * hidden, hidden * sizeof(float));
  }
  backend_.rms_norm(x, *mtp_->enorm, c.rms_norm_eps, n, hidden, x);
  // x = eh_proj([e | h])
  float* cat = s.mtp_cat.ensure(n * 2 * hidden);
  backend_.copy_strided(cat, x, {.n0 = n, .len = hidden, .dst_stride0 = 2 * hidden,
                                 .src_stride0 = hidden});
  backend_.copy_strided(cat + hidden, prev, {.n0 = n, .len = hidden, .dst_stride0 = 2 * hidden,
                                             .src_stride0 = hidden});
  backend_.matmul(*mtp_->eh_proj, nullptr, cat, n, x);
  // The MTP block: one more decoder layer, its latents in the cache's last layer.
  const int l = config_.n_layers;
  DS_RETURN_IF_ERROR(run_layer(l, n, [&](int layer) { attention_paged(layer, n, pb, cache); }));
  last_forward_rows_ = n;
  return compute_logits(static_cast<int64_t>(batch.logits_rows.size()), *mtp_->head_norm,
                        *mtp_->head, logits);
}

}  // namespace dserve
