// DeepseekModel's feed-forward half: the SwiGLU MLP (dense layers, shared experts),
// DeepSeekMoE's routing and experts (backend operations), and the expert-parallel
// exchange over data-parallel engines.
#include <algorithm>
#include <numeric>

#include "base/check.h"
#include "model/deepseek_model.h"

namespace dserve {

void DeepseekModel::run_mlp(const Mlp& mlp, int64_t inter, const float* in, int64_t rows,
                            float* out) {
  Scratch& s = scratch_;
  float* gate = s.gate.ensure(rows * inter);
  float* up = s.up.ensure(rows * inter);
  // gate, up [rows, inter]; gate = silu(gate) * up; out [rows, hidden] = gate · downᵀ
  const MatmulTarget gate_up[] = {{mlp.gate, nullptr, gate}, {mlp.up, nullptr, up}};
  backend_.matmul_many(in, rows, gate_up, 2);
  backend_.silu_mul(gate, up, rows * inter, gate);
  backend_.matmul(*mlp.down, nullptr, gate, rows, out);
}

// The router, as DeepSeek's MoEGate and transformers' DeepseekV2/V3TopkRouter (see
// MoeRouting): softmax or sigmoid scores, e_score_correction_bias for the choice,
// greedy / group_limited_greedy / noaux_tc selection, renormalised when
// norm_topk_prob, scaled by routed_scaling_factor. The router's logits in FP32.
void DeepseekModel::route(const LayerWeights& w, int64_t n) {
  const DeepseekConfig& c = shard_;  // this rank's FFN widths
  Scratch& s = scratch_;
  const int E = c.n_routed_experts, k = c.n_experts_per_tok;
  float* logits = s.router.ensure(n * E);
  backend_.matmul(*w.router, nullptr, s.xb.get(), n, logits);
  MoeRouting r;
  r.n_experts = E;
  r.top_k = k;
  r.scoring = c.scoring_func == ScoringFunc::kSoftmax ? MoeScoring::kSoftmax : MoeScoring::kSigmoid;
  switch (c.topk_method) {
    case TopkMethod::kGreedy:
      r.group_select = MoeGroupSelect::kNone;
      break;
    case TopkMethod::kGroupLimitedGreedy:
      r.group_select = MoeGroupSelect::kMaxOfGroup;
      break;
    case TopkMethod::kNoauxTc:
      r.group_select = MoeGroupSelect::kTopTwoSum;
      break;
  }
  r.n_groups = c.n_group;
  r.top_groups = c.topk_group;
  r.normalize = c.norm_topk_prob;
  r.scaling = c.routed_scaling_factor;
  r.correction_bias = w.router_bias.as<float>();
  backend_.moe_route(logits, n, r, s.expert_ids.ensure(n * k), s.expert_weights.ensure(n * k));
}

// s.xb [n, hidden] -> s.moe_out [n, hidden]: route, then this rank's routed experts
// and its share of the shared experts in one backend operation.
Status DeepseekModel::run_moe(const LayerWeights& w, int64_t n) {
  if (dispatch_) return run_moe_dispatched(w, n);
  const DeepseekConfig& c = shard_;  // this rank's FFN widths
  Scratch& s = scratch_;
  route(w, n);
  MoeExperts experts;
  experts.experts = w.experts.data();
  experts.n_experts = c.n_routed_experts;
  experts.first = static_cast<int>(expert_begin_);
  experts.end = static_cast<int>(expert_end_);
  experts.hidden = c.hidden_size;
  experts.inter = c.moe_intermediate_size;
  if (c.n_shared_experts > 0) {
    experts.shared = &w.shared;
    experts.shared_inter = shared_inter_;
  }
  backend_.moe_experts(s.xb.get(), n, s.expert_ids.get(), s.expert_weights.get(), c.n_experts_per_tok,
                       experts, s.moe_out.get(), moe_counters_.as<int64_t>());
  return Status::Ok();
}

// s.xb [n, hidden] -> s.moe_out [n, hidden] over the expert-parallel group: route
// here, send each slot's row to its expert's owner, run this rank's experts over
// whatever rows every engine sent, send the outputs back, and sum each token's slots
// (weighted here) in increasing expert order, then add the shared experts: the same
// additions in the same order as moe_experts on one rank. n may be 0 (forward_idle).
// With T > 1 tensor-parallel ranks per engine, this rank t takes only the slots whose
// expert's owner is a rank t (owner % T == t; the group numbers engine d's ranks
// d T .. d T + T - 1), and the shared experts' width share: the all-reduce after the
// MoE adds the T ranks' partial sums.
// ExpertDispatch exchanges host memory, so the routing, the rows and the outputs
// cross between backend and host here (explicit downloads and uploads): the one
// place a forward synchronises with the host, until the exchange runs on backend
// buffers.
Status DeepseekModel::run_moe_dispatched(const LayerWeights& w, int64_t n) {
  const DeepseekConfig& c = shard_;
  Scratch& s = scratch_;
  const int k = c.n_experts_per_tok;
  const int64_t hidden = c.hidden_size;
  const int n_tp = comm_->size(), tp = comm_->rank();
  const ExpertPlacement& place = dispatch_->placement();
  s.host_ids.resize(n * k);
  s.host_weights.resize(n * k);
  s.host_xb.resize(n * hidden);
  if (n > 0) {
    route(w, n);
    backend_.download(s.host_ids.data(), s.expert_ids.get(), s.host_ids.size() * sizeof(int32_t));
    backend_.download(s.host_weights.data(), s.expert_weights.get(), s.host_weights.size() * sizeof(float));
    backend_.download(s.host_xb.data(), s.xb.get(), s.host_xb.size() * sizeof(float));
  }
  const std::vector<int32_t>& ids = s.host_ids;
  // This rank's slots, token by token, each token's in increasing expert order.
  std::vector<int64_t> slot_token;
  std::vector<int32_t> slot_expert;
  std::vector<float> slot_weight;
  slot_token.reserve(n * k);
  slot_expert.reserve(n * k);
  slot_weight.reserve(n * k);
  std::vector<int> order(k);
  for (int64_t t = 0; t < n; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[t * k + a] < ids[t * k + b]; });
    for (int j : order) {
      const int32_t e = ids[t * k + j];
      if (place.owner(e) % n_tp != tp) continue;  // another of this engine's ranks sends it
      slot_token.push_back(t);
      slot_expert.push_back(e);
      slot_weight.push_back(s.host_weights[t * k + j]);
    }
  }
  DS_RETURN_IF_ERROR(dispatch_->dispatch(std::span<const float>(s.host_xb), slot_token, slot_expert));
  moe_stats_.routed_slots += static_cast<int64_t>(slot_token.size());
  run_received_experts(w);
  DS_RETURN_IF_ERROR(dispatch_->combine(std::span<const float>(s.host_expert_out.data(),
                                                               static_cast<size_t>(dispatch_->n_received() * hidden)),
                                        &s.slot_out));

  s.host_moe_out.assign(static_cast<size_t>(n * hidden), 0.0f);
  for (size_t i = 0; i < slot_token.size(); ++i) {
    const float wt = slot_weight[i];
    float* dst = &s.host_moe_out[slot_token[i] * hidden];
    const float* src = &s.slot_out[i * hidden];
    for (int64_t d = 0; d < hidden; ++d) dst[d] += wt * src[d];
  }
  backend_.upload(s.moe_out.get(), s.host_moe_out.data(), s.host_moe_out.size() * sizeof(float));
  if (c.n_shared_experts > 0 && n > 0) {
    float* shared_out = s.expert_in.ensure(n * hidden);
    run_mlp(w.shared, shared_inter_, s.xb.get(), n, shared_out);
    backend_.add_inplace(s.moe_out.get(), shared_out, n * hidden);
  }
  return Status::Ok();
}

// dispatch_'s received rows (grouped by this rank's experts) -> s.host_expert_out:
// every expert that received rows runs once over them, gate/up as one grouped matmul
// and down as another, on backend copies of the rows.
void DeepseekModel::run_received_experts(const LayerWeights& w) {
  const DeepseekConfig& c = shard_;
  Scratch& s = scratch_;
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size;
  const int64_t rows = dispatch_->n_received();
  const std::span<const int64_t> offsets = dispatch_->expert_offsets();
  const int e0 = static_cast<int>(expert_begin_), n_local = dispatch_->n_local_experts();
  s.host_expert_out.resize(std::max<int64_t>(rows, 1) * hidden);
  float* in = s.expert_in.upload(dispatch_->received_rows().data(), rows * hidden);
  float* out = s.expert_out.ensure(std::max<int64_t>(rows, 1) * hidden);
  float* gate = s.gate.ensure(std::max<int64_t>(rows, 1) * inter);
  float* up = s.up.ensure(std::max<int64_t>(rows, 1) * inter);
  std::vector<MatmulTarget> gate_up, down;
  std::vector<MatmulGroup> groups;
  gate_up.reserve(2 * n_local);
  down.reserve(n_local);
  for (int j = 0; j < n_local; ++j) {
    const int64_t m = offsets[j + 1] - offsets[j];
    if (m == 0) {
      ++moe_stats_.expert_idle;
      continue;
    }
    ++moe_stats_.expert_runs;
    moe_stats_.expert_rows += m;
    const Mlp& e = w.experts[e0 + j];
    gate_up.push_back({e.gate, nullptr, gate + offsets[j] * inter});
    gate_up.push_back({e.up, nullptr, up + offsets[j] * inter});
  }
  if (gate_up.empty()) return;
  int g = 0;
  for (int j = 0; j < n_local; ++j) {
    const int64_t m = offsets[j + 1] - offsets[j];
    if (m == 0) continue;
    groups.push_back({in + offsets[j] * hidden, m, &gate_up[2 * g++], 2});
  }
  backend_.matmul_grouped(groups.data(), static_cast<int>(groups.size()));
  backend_.silu_mul(gate, up, rows * inter, gate);
  groups.clear();
  for (int j = 0; j < n_local; ++j) {
    const int64_t m = offsets[j + 1] - offsets[j];
    if (m == 0) continue;
    down.push_back({w.experts[e0 + j].down, nullptr, out + offsets[j] * hidden});
    groups.push_back({gate + offsets[j] * inter, m, &down.back(), 1});
  }
  backend_.matmul_grouped(groups.data(), static_cast<int>(groups.size()));
  backend_.download(s.host_expert_out.data(), out, static_cast<size_t>(rows * hidden) * sizeof(float));
}

Status DeepseekModel::forward_idle() {
  if (!dispatch_) return Status::Ok();
  for (const LayerWeights& w : layers_) {
    if (w.moe) DS_RETURN_IF_ERROR(run_moe_dispatched(w, 0));
  }
  return Status::Ok();
}

}  // namespace dserve
