// DeepseekModel: DeepSeek-V2 / V2-Lite / V2.5 and DeepSeek-V3 / R1. The decoder is
// token embedding -> n_layers x [RMSNorm, Multi-head Latent Attention, residual,
// RMSNorm, dense SwiGLU MLP or DeepSeekMoE, residual] -> RMSNorm -> lm_head.
//
// MLA (per layer):
//   q       = q_b_proj(rms_norm(q_a_proj(x)))  or  q_proj(x)      [n, H, nope + rope]
//   [c, kp] = kv_a_proj_with_mqa(x); c = kv_a_layernorm(c)         c [n, r], kp [n, rope]
//   q_pe, kp rotated by RoPE (interleaved pairs); [c | kp] goes to the MlaKvCache.
//   kv_b_proj [H * (nope + v), r] holds per head W_UK [nope, r] and W_UV [v, r].
// Two ways to attend, numerically the same:
//   expanded (prefill): k_h = [W_UK_h c | kp], v_h = W_UV_h c for every cached
//     position, then ordinary attention (a GGUF with only attn_k_b / attn_v_b gets
//     W_UK rebuilt from attn_k_b in F32 on first use; W_UV is attn_v_b's rows);
//   absorbed (decode):  q'_h = [W_UK_hᵀ q_nope_h | q_pe_h] attends directly over the
//     cached rows [c | kp] (one shared KV head of width r + rope), and the result's
//     first r values go through W_UV_h. Nothing per head is ever cached.
// The softmax scale is qk_head_dim^-0.5 times YaRN's mscale(mscale_all_dim)^2.
//
// DeepSeekMoE (layers >= first_k_dense_replace, every moe_layer_freq-th): a router
// scores the experts (softmax or sigmoid), picks num_experts_per_tok of them
// (greedy, group_limited_greedy or noaux_tc with e_score_correction_bias), optionally
// renormalises and scales by routed_scaling_factor; shared experts see every token.
// The batch's tokens are grouped by expert and each expert that received tokens runs
// once over them; experts with no tokens are not touched (see moe_stats()).
//
// Weights: per-expert tensors as DeepSeek and transformers write them
// (mlp.experts.E.gate_proj.weight) or stacked 3-D ones (mlp.experts.gate_proj.weight
// [E, ...], from GGUF). FP8 (float8_e4m3fn with weight_scale_inv per 128 x 128
// block) is converted once at load to BF16 in owned buffers.
// MTP layers (num_nextn_predict_layers, stored as layers n_layers...) stay mapped and
// unbound unless speculative decoding asks for them (enable_mtp, forward_mtp).
//
// Tensor parallel (a Communicator of N > 1 ranks): rank r keeps heads
// [r H/N, (r+1) H/N) -- their rows of q_proj / q_b_proj and kv_b_proj (so W_UK, W_UV)
// and their columns of o_proj --, the same share of every MLP's intermediate
// dimension (dense layers, each routed expert, the shared experts), and a 1/N slice of
// the vocabulary (VocabParallel). q_a, kv_a, their norms and the router are
// replicated: every rank caches the whole latent [c | k_pe], which has no head
// dimension, and routes every token itself (all ranks see the same x, so they choose
// the same experts). One all-reduce after o_proj and one after the MLP/MoE.
// With expert parallelism (vLLM's --enable-expert-parallel) the routed experts are
// not cut but dealt out whole: rank r keeps experts [r E/N, (r+1) E/N) at full width
// and computes them for every token routed to them (every rank has every token, so
// no token moves); the MoE's all-reduce adds the ranks' experts together. Shared
// experts stay split by width.
// Expert parallelism across data-parallel engines (an expert-parallel group spanning
// every engine, `expert_comm`): each engine keeps its own tokens, attention, dense
// layers and shared experts; the routed experts are dealt out whole over the group's
// ranks, and each MoE layer sends every (token, expert) slot to the expert's owner
// and back (ExpertDispatch), weighing and summing each token's slots itself in
// increasing expert order, as run_moe does on one rank. Every engine of the group
// must run the same MoE exchanges in the same order: forward_idle() runs them with no
// tokens of its own (vLLM's dummy batch) when its engine has nothing to do.
// Engines that are themselves tensor-parallel (T ranks each): the group holds every
// rank of every engine (engine d's rank t is d T + t) and the experts are dealt out
// over all of them. An engine's T ranks hold the same tokens (x is whole after each
// all-reduce); rank t sends only the slots whose expert lives on a rank t of some
// engine, so every slot travels once, and sums those slots' outputs with its width
// share of the shared experts: the MoE's tensor-parallel all-reduce adds the ranks'
// sums, as in the tensor-parallel-only case above.
//
// Thread-safety: forward() uses internal scratch buffers; drive one model from one
// thread. The weights are shared read-only.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "dist/communicator.h"
#include "loader/model_files.h"
#include "model/deepseek_config.h"
#include "model/expert_dispatch.h"
#include "model/llama_model.h"  // LogitsFor
#include "model/mla_kv_cache.h"
#include "model/rope.h"
#include "model/tensor_shard.h"
#include "model/vocab_parallel.h"

namespace dserve {

// Which MLA formulation forward() uses.
enum class MlaPath {
  kAuto,      // expanded for batches of several tokens, absorbed for single-token decode
  kExpanded,  // always expand the latents into per-head keys and values
  kAbsorbed,  // always attend in the latent space
};

// Counters of routed-expert work since load (or reset_moe_stats()).
struct MoeStats {
  int64_t routed_slots = 0;  // token x chosen-expert pairs the routers produced
  int64_t expert_runs = 0;   // (layer, expert) pairs computed: each expert once per batch
  int64_t expert_rows = 0;   // token rows those runs processed (== routed_slots)
  int64_t expert_idle = 0;   // (layer, expert) pairs skipped because no token chose them
};

class DeepseekModel {
 public:
  // Takes ownership of the files. The backend must outlive the model. max_context:
  // the longest sequence forward() will see; 0 means max_position_embeddings. comm:
  // the tensor-parallel group this rank belongs to (null: one rank); must outlive the
  // model. expert_comm (null: none): the expert-parallel group over data-parallel
  // engines (see the header comment); must outlive the model. With comm of T > 1
  // ranks it spans every rank of every engine: this rank is expert_comm rank d T + t
  // for engine d's tensor-parallel rank t.
  static Result<std::unique_ptr<DeepseekModel>> load(std::unique_ptr<ModelFiles> files,
                                                     Backend& backend, int64_t max_context = 0,
                                                     MlaPath path = MlaPath::kAuto,
                                                     dist::Communicator* comm = nullptr,
                                                     bool expert_parallel = false,
                                                     dist::Communicator* expert_comm = nullptr,
                                                     ExpertWire expert_wire = ExpertWire::kF32);
  ~DeepseekModel();
  DeepseekModel(const DeepseekModel&) = delete;
  DeepseekModel& operator=(const DeepseekModel&) = delete;

  const DeepseekConfig& config() const { return config_; }
  // This rank's share of config(): n_heads and the MLPs' intermediate sizes divided by
  // the tensor-parallel size (moe_intermediate_size: whole under expert parallelism);
  // equal to config() on one rank.
  const DeepseekConfig& shard_config() const { return shard_; }
  const ModelFiles& files() const { return *files_; }
  int64_t max_context() const { return max_context_; }
  // Bytes of weights one decode step reads: attention, dense MLPs, shared experts,
  // routers and num_experts_per_tok routed experts per MoE layer, final norm, lm_head.
  size_t active_weight_bytes_per_token() const;
  // Mapped weight bytes whose pages were dropped because the backend holds packed
  // copies of them (routed experts, pack_expert): memory counts the copies instead.
  int64_t released_weight_bytes() const { return released_weight_bytes_; }

  std::unique_ptr<MlaKvCache> new_kv_cache() const;

  // As LlamaModel::forward: tokens[n] at positions kv.n_tokens() ... continue the
  // sequence in `kv`; logits [n_out, vocab_size] for the last or every token.
  Status forward(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                 MlaKvCache& kv, LogitsFor which, std::vector<float>* logits);

  // A paged latent cache of n_blocks blocks of block_size tokens of `dtype` (F32 or
  // F16) for forward_batch().
  std::unique_ptr<PagedMlaCache> new_paged_cache(int n_blocks, int block_size, DType dtype) const;
  // One engine step over a ragged batch of several sequences (see
  // LlamaModel::forward_batch): each layer stores the step's latents into `cache`
  // through the block tables, then attends in the latent space (absorbed MLA) with
  // paged_attention. Logits [batch.logits_rows.size(), vocab_size].
  Status forward_batch(const ModelBatch& batch, PagedMlaCache& cache, std::vector<float>* logits);

  // With an expert-parallel group: this engine's part of one forward's MoE exchanges,
  // with no tokens of its own, so that the group's other engines can step. Touches no
  // cache. Without a group: nothing.
  Status forward_idle();
  // The exchanges' counters; null without an expert-parallel group.
  const ExpertDispatch* expert_dispatch() const { return dispatch_.get(); }
  // (layer, routed expert) weight sets this rank holds.
  int64_t n_experts_held() const { return n_experts_held_; }

  // (Reads the backend's counters: call between forwards.)
  MoeStats moe_stats() const;
  void reset_moe_stats();

  // --- Multi-token prediction (DeepSeek-V3's MTP module, as vLLM's deepseek_mtp) ---
  // Binds the MTP layer (model.layers.<n_layers>: enorm, hnorm, eh_proj, a full MLA +
  // MoE block, shared_head.norm and shared_head.head, the embedding shared with the
  // main model). Paged caches made afterwards hold its latents as one more layer.
  // InvalidArgument without one; Unimplemented under expert parallelism across engines.
  Status enable_mtp();
  bool mtp_enabled() const { return mtp_ != nullptr; }
  // The configuration paged caches are sized for (n_layers + 1 with the MTP layer).
  DeepseekConfig cache_config() const;
  // One MTP pass over a ragged batch: token i (the token after position
  // batch.positions[i] of its sequence) pairs with prev_rows[i], a row of the previous
  // forward's hidden states: forward_batch's (the main model's output, final-normed
  // here) when prev_is_target, else the previous forward_mtp's (its block's output).
  //   x = eh_proj([enorm(embed(token)) | hnorm(h)]); x = block(x) at that position;
  //   logits = shared_head.head(shared_head.norm(x)) at batch.logits_rows
  // The block's latents go to the cache's MTP layer at the batch's slots.
  Status forward_mtp(const ModelBatch& batch, PagedMlaCache& cache,
                     std::span<const int32_t> prev_rows, bool prev_is_target,
                     std::vector<float>* logits);

 private:
  using Mlp = SwigluWeights;  // down(silu(gate x) * up x): gate, up [inter, hidden], down [hidden, inter]
  struct LayerWeights {
    const TensorView* attn_norm = nullptr;  // [hidden]
    const TensorView* q_proj = nullptr;     // [H * qk, hidden]      (q_lora_rank == 0)
    const TensorView* q_a = nullptr;        // [q_lora, hidden]
    const TensorView* q_a_norm = nullptr;   // [q_lora]
    const TensorView* q_b = nullptr;        // [H * qk, q_lora]
    const TensorView* kv_a = nullptr;       // [r + rope, hidden]
    const TensorView* kv_a_norm = nullptr;  // [r]
    const TensorView* kv_b = nullptr;       // [H * (nope + v), r]   (null: split-only GGUF)
    const TensorView* uk = nullptr;         // split-only float GGUF: [H * nope, r] built on
                                            // first use (expanded_uk)
    std::vector<TensorView> uk_terms;       // split-only quantised GGUF: per head [nope, r]
                                            // as two Q8_0 terms, h and H + h (expanded_uk)
    std::vector<TensorView> w_uk_t;         // per head [r, nope]: maps q_nope to latent space
    std::vector<TensorView> w_uv;           // per head [v, r]
    const TensorView* o_proj = nullptr;     // [hidden, H * v]
    const TensorView* ffn_norm = nullptr;   // [hidden]
    bool moe = false;
    Mlp dense;                           // !moe
    const TensorView* router = nullptr;  // [E, hidden]           (moe)
    BackendBuffer router_bias;           // [E] e_score_correction_bias (backend memory), or empty
    std::vector<Mlp> experts;            // [E]                   (moe)
    Mlp shared;                          // n_shared_experts > 0  (moe)
  };
  // Activations in the backend's memory (grown on demand) and the step's inputs there;
  // host vectors only for what the host itself plans (matmul groups, batch checks, the
  // expert-parallel exchange).
  // How a paged step's tokens attend (plan_paged_mla): runs of consecutive prompt
  // tokens of one sequence expanded, the rest absorbed over their own PagedBatch.
  struct PagedMlaSplit {
    struct Run {
      int64_t first = 0;     // its first batch token
      int64_t n = 0;         // tokens
      int64_t n_kv = 0;      // keys: its sequence's positions 0 .. n_kv - 1
      int64_t slots_at = 0;  // where its keys' slots start in key_slots
    };
    std::vector<Run> runs;
    std::vector<int32_t> absorbed_rows;   // batch tokens attending absorbed
    std::vector<int32_t> order;           // [n] token t's row in [absorbed | runs]
    std::vector<int64_t> key_slots;       // the runs' keys' cache slots
    std::vector<int32_t> host_positions;  // upload staging
    PagedBatch absorbed;                  // over absorbed_rows (backend memory)
    const int32_t* dev_order = nullptr;
    const int32_t* dev_absorbed_rows = nullptr;
    const int64_t* dev_slots = nullptr;
    DeviceArray<int32_t> order_buf, rows_buf, absorbed_buf;
    DeviceArray<int64_t> slots_buf;
  };
  struct Scratch {
    void bind(Backend& backend);
    DeviceArray<float> x, xb;                  // [n, hidden]
    DeviceArray<float> qa;                     // [n, q_lora]
    DeviceArray<float> q;                      // [n, H, qk]
    DeviceArray<float> kva;                    // [n, r + rope]
    DeviceArray<float> att;                    // [n, H * v]
    DeviceArray<float> c_all;                  // [n_kv, r]              expanded
    DeviceArray<float> kvb;                    // [n_kv, H * (nope + v)] expanded
    DeviceArray<float> kb_lo;                  // [H, n_kv, nope] keys' second Q8_0 term
    DeviceArray<float> k, v;                   // [n_kv, H, qk], [n_kv, H, v] expanded
    DeviceArray<float> q_abs;                  // [n, H, r + rope]       absorbed
    DeviceArray<float> out_lat;                // [n, H, r + rope]       absorbed
    DeviceArray<float> tmp_in, tmp_out;        // [H, n, ...] per-head gathers
    std::vector<MatmulTarget> head_targets;    // per-head products (absorbed MLA, expanding)
    std::vector<MatmulGroup> head_groups;      // [H]
    DeviceArray<float> gate, up;               // [rows, inter]
    DeviceArray<float> moe_out;                // [n, hidden]
    DeviceArray<float> expert_in, expert_out;  // [rows, hidden]
    DeviceArray<float> router;                 // [n, E] router logits
    DeviceArray<int32_t> expert_ids;           // [n, k] the router's choices
    DeviceArray<float> expert_weights;         // [n, k] and their weights
    DeviceArray<float> rows;                   // [n_out, hidden] rows for logits
    DeviceBatch batch;                         // tokens, positions, slots, tables, rows
    std::vector<int32_t> row_ids;              // [n_out] host
    std::vector<int64_t> slots;                // [n] host: paged cache slots
    // The expert-parallel exchange's host side (ExpertDispatch works on host memory).
    std::vector<float> host_xb, host_expert_out, host_moe_out, slot_out;
    std::vector<int32_t> host_ids;
    std::vector<float> host_weights;
    // The MTP pass: the previous pass's rows it reads, [e | h] before eh_proj.
    DeviceArray<int32_t> mtp_rows;             // [n]
    DeviceArray<float> mtp_prev;               // [n, hidden]
    DeviceArray<float> mtp_cat;                // [n, 2 hidden]
    // A paged step's MLA forms (plan_paged_mla) and the expanded runs' buffers.
    PagedMlaSplit mla;
    DeviceArray<float> att_parts;              // [n, H * v] [absorbed | runs]
    DeviceArray<float> q_part;                 // [n, H, qk] gathered queries
    DeviceArray<float> latent_rows;            // [n_kv, r + rope] a run's latents
  };
  // The MTP module's own weights; its decoder block is layers_[n_layers].
  struct MtpWeights {
    const TensorView* enorm = nullptr;      // [hidden]
    const TensorView* hnorm = nullptr;      // [hidden]
    const TensorView* eh_proj = nullptr;    // [hidden, 2 hidden]
    const TensorView* head_norm = nullptr;  // [hidden] shared_head.norm
    const TensorView* head = nullptr;       // [vocab, hidden] shared_head.head (or lm_head)
  };
  struct OwnedTensor;

  DeepseekModel(std::unique_ptr<ModelFiles> files, Backend& backend, DeepseekConfig config);
  // The per-rank shapes (shard_) for comm_'s size; an error naming what N does not divide.
  Status plan_shards();
  Status bind_weights();
  // Replace *t (a bound full tensor, or null) by this rank's rows [b, e) or columns
  // [b, e); no-ops on one rank.
  Status take_rows(const TensorView** t, const std::string& name, int64_t b, int64_t e);
  Status take_columns(const TensorView** t, const std::string& name, int64_t b, int64_t e);
  // An Mlp of intermediate size `inter` (full) cut to this rank's share.
  Status shard_mlp(const std::string& prefix, int64_t inter, Mlp* m);
  // The tensor `name` with the expected shape; null and OK when absent and not
  // required. FP8 weights come with their block scales attached (1 byte per weight),
  // or converted to BF16 when the files say --fp8-weights bf16.
  Status bind(const std::string& name, const std::vector<int64_t>& expected, bool required,
              bool float_only, const TensorView** out);
  // An FP8 view (with block scales) converted to BF16 in owned memory, counted in fp8_.
  const TensorView* own_converted_fp8(const TensorView& t);
  // *t, a kept FP8 weight (whole_bytes before any tensor-parallel cut, which may already
  // have been taken), replaced by its BF16 conversion; fp8_ and the weight bytes follow.
  void convert_kept_fp8(const TensorView** t, size_t whole_bytes);
  Status bind_mlp(const std::string& prefix, int64_t inter, Mlp* out);
  // Layer l's weights (model.layers.l.*): attention, norms, dense MLP or MoE.
  Status bind_layer(int l, LayerWeights* out);
  Status bind_experts(int layer, LayerWeights* w);
  Status build_absorbed(int layer, LayerWeights* w);
  const TensorView* own(TensorView view, std::vector<uint8_t> bytes);
  // Bytes of weights held in memory made at load (conversions, copies, block scales).
  size_t owned_bytes() const;

  // positions [n] (and slots) are the step's, in backend memory; n_kv: the sequence's
  // length after this step.
  void attention(int layer, int64_t n, int64_t n_kv, MlaKvCache& kv, bool absorbed);
  // q (rotated q_pe) into s.q [n, H, qk] and the latent rows into s.kva [n, r + rope].
  void project_qkv(int layer, int64_t n);
  // The paged seam: stores s.kva at the step's slots in layer's pool, then absorbed
  // attention.
  void attention_paged(int layer, int64_t n, const PagedBatch& batch, PagedMlaCache& cache);
  // The layer stack shared by forward() and forward_batch() over the uploaded tokens;
  // attend(layer) turns s.xb [n, hidden] into s.att [n, H * v]. n_out: how many
  // logits rows (uploaded) the caller reads after it. Where that is fewer than n and
  // nothing else reads the hidden states (no MTP layer), the last layer's FFN runs
  // only on those rows (llama.cpp's output-row selection): s.x keeps them first, in
  // order, and the uploaded rows become 0 .. n_out - 1.
  template <typename AttendFn>
  Status run_layers(int64_t n, AttendFn&& attend, int64_t n_out);
  // One decoder layer over s.x [n, hidden] in place; with n_out < n, its FFN half runs
  // on the n_out uploaded logits rows only (DeviceBatch::keep_logits_rows).
  template <typename AttendFn>
  Status run_layer(int l, int64_t n, AttendFn&& attend,
                   int64_t n_out = std::numeric_limits<int64_t>::max());
  // The activations of a pass over n tokens.
  void ensure_scratch(int64_t n);
  // logits [n_out, vocab] (host) from s.x at the uploaded rows (final norm, lm_head;
  // or the given norm and head).
  Status compute_logits(int64_t n_out, std::vector<float>* logits);
  Status compute_logits(int64_t n_out, const TensorView& norm, const TensorView& head,
                        std::vector<float>* logits);
  // Keys k [n_kv, g, qk] and values v [n_kv, g, v] of heads [h0, h0 + g) from cached
  // latent rows (c_all: their first kv_lora_rank values, contiguous); a position's keys
  // (values) expanded_row(g qk) (expanded_row(g v)) floats after the one before.
  void expand_keys_values(int layer, int64_t h0, int64_t g, const float* latent,
                          const float* c_all, int64_t n_kv, float* k, float* v);
  void attend_expanded(int layer, int64_t n, const float* latent, int64_t n_kv);
  // W_UK for expanding the keys of a split GGUF: F32 [H * nope, r] where attn_k_b is a
  // float type, else null with the layer's uk_terms made.
  const TensorView* expanded_uk(int layer);
  // Whether a split GGUF's keys expand through the Q8_0 kernels (attn_k_b quantised).
  bool keys_expand_in_q8() const;
  // Whether the routed experts get the backend's packed copies (decided once, by
  // bind_weights, into pack_experts_; logged).
  bool packs_routed_experts() const;
  // The backend's packed copies of one routed expert, its mapped rows released.
  void pack_expert(const Mlp& m);
  // attend_latent(q_abs [n, H, r + rope], out_lat [n, H, out_row]) runs the latent
  // attention (contiguous or paged) and returns out_row: r + rope or r (values only
  // the latent part).
  template <typename LatentAttendFn>
  void attend_absorbed(const LayerWeights& w, int64_t n, const float* q, float* att,
                       LatentAttendFn&& attend_latent);
  // Prompt tokens at least this many before their prompt's end attend expanded in a
  // paged step (see plan_paged_mla); DSERVE_MLA_PREFILL overrides. integer_expansion:
  // the latents expand through the int8 kernels (keys_expand_in_q8).
  static int64_t expanded_min_tokens(const DeepseekConfig& c, bool integer_expansion);
  // Splits a paged step's tokens between the two forms into scratch_.mla.
  void plan_paged_mla(const ModelBatch& batch, const PagedBatch& pb);
  // One expanded run's attention -> out [run.n, H * v].
  void attend_expanded_run(int layer, const PagedMlaSplit::Run& run, DType dtype,
                           const void* pool, const int32_t* positions, float* out);
  // out[rows, hidden] = mlp(in[rows, hidden]).
  void run_mlp(const Mlp& mlp, int64_t inter, const float* in, int64_t rows, float* out);
  // s.xb[n, hidden] -> s.moe_out[n, hidden] (routed + shared experts).
  Status run_moe(const LayerWeights& w, int64_t n);
  // run_moe over the expert-parallel group: the slots travel to their experts' owners.
  Status run_moe_dispatched(const LayerWeights& w, int64_t n);
  // This rank's experts over the rows dispatch_ received -> s.expert_out [rows, hidden].
  void run_received_experts(const LayerWeights& w);
  // Router: for each token, n_experts_per_tok (expert, weight) pairs into
  // s.expert_ids / s.expert_weights [n, k].
  void route(const LayerWeights& w, int64_t n);

  std::unique_ptr<ModelFiles> files_;
  Backend& backend_;
  const DeepseekConfig config_;
  DeepseekConfig shard_;  // this rank's share of config_ (see shard_config())
  std::unique_ptr<dist::Communicator> own_comm_;  // the single-rank group when none is given
  dist::Communicator* comm_ = nullptr;            // never null after load()
  int64_t head_begin_ = 0;                        // this rank's first attention head
  bool expert_parallel_ = false;
  bool pack_experts_ = false;  // routed experts get packed copies (bind_weights)
  int64_t released_weight_bytes_ = 0;  // mapped bytes dropped after packing (pack_expert)
  std::unique_ptr<ExpertDispatch> dispatch_;       // with an expert-parallel group over engines
  int64_t n_experts_held_ = 0;
  int64_t expert_begin_ = 0, expert_end_ = 0;      // this rank's routed experts
  int64_t shared_inter_ = 0;                       // its width of the shared experts
  VocabParallel vocab_;                           // its slice of embedding and lm_head
  TensorShards shards_;                           // its views and copies of split tensors
  // Weight bytes of the whole model as bound, and of this rank's share of them.
  size_t model_weight_bytes_ = 0, rank_weight_bytes_ = 0;
  int64_t max_context_ = 0;
  MlaPath path_ = MlaPath::kAuto;
  int64_t min_expanded_tokens_ = 0;  // expanded_min_tokens, at load
  std::unique_ptr<RopeCache> rope_;
  std::unique_ptr<DeviceRopeTable> rope_table_;  // rope_'s table in backend memory

  const TensorView* embed_ = nullptr;       // [vocab, hidden]
  const TensorView* final_norm_ = nullptr;  // [hidden]
  const TensorView* lm_head_ = nullptr;     // [vocab, hidden]
  std::vector<LayerWeights> layers_;
  std::vector<std::unique_ptr<OwnedTensor>> owned_;  // converted FP8 weights, W_UKᵀ
  // FP8 weights as held (whole-model tensors, before any tensor-parallel cut): kept at
  // 1 byte per weight with their F32 block scales, or converted to BF16.
  struct Fp8Counts {
    int64_t n_kept = 0, n_converted = 0;
    size_t kept_bytes = 0, scale_bytes = 0, converted_bytes = 0;
  } fp8_;

  std::unique_ptr<MtpWeights> mtp_;  // enable_mtp()
  int64_t last_forward_rows_ = 0;     // tokens of the last pass (rows of s.x)

  Scratch scratch_;
  MoeStats moe_stats_;        // counted on the host (the expert-parallel exchange)
  BackendBuffer moe_counters_;  // int64 [kNumMoeCounters], counted by moe_experts
};

}  // namespace dserve
