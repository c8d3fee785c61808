// DeepseekModel's feed-forward half: the SwiGLU MLP (dense layers, shared experts,
// each routed expert) and DeepSeekMoE routing and dispatch.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "base/check.h"
#include "model/deepseek_model.h"

namespace dserve {

void DeepseekModel::run_mlp(const Mlp& mlp, int64_t inter, const float* in, int64_t rows,
                            float* out) {
  Scratch& s = scratch_;
  s.gate.resize(rows * inter);
  s.up.resize(rows * inter);
  // gate, up [rows, inter]; gate = silu(gate) * up; out [rows, hidden] = gate · downᵀ
  const MatmulTarget gate_up[] = {{mlp.gate, nullptr, s.gate.data()},
                                  {mlp.up, nullptr, s.up.data()}};
  backend_.matmul_many(in, rows, gate_up, 2);
  backend_.silu_mul(s.gate.data(), s.up.data(), rows * inter, s.gate.data());
  backend_.matmul(*mlp.down, nullptr, s.gate.data(), rows, out);
}

// The router, as DeepSeek's MoEGate and transformers' DeepseekV2/V3TopkRouter:
//   scores = softmax(logits) or sigmoid(logits)                         [E]
//   choice = scores + e_score_correction_bias (if the layer has one)
//   greedy:                top-k of choice over all experts
//   group_limited_greedy:  keep the topk_group groups with the largest max(choice)
//   noaux_tc:              keep the topk_group groups with the largest sum of their
//                          two best choices; then top-k of choice in kept groups
//   weights = scores at the chosen experts (unbiased), / their sum if norm_topk_prob
//             (+1e-20), times routed_scaling_factor.
// ids, weights: [n, k].
void DeepseekModel::route(const LayerWeights& w, int64_t n, std::vector<int32_t>* ids,
                          std::vector<float>* weights) {
  const DeepseekConfig& c = shard_;  // this rank's FFN widths
  Scratch& s = scratch_;
  const int E = c.n_routed_experts, k = c.n_experts_per_tok;
  const int n_group = c.topk_method == TopkMethod::kGreedy ? 1 : c.n_group;
  const int group_size = E / n_group;
  s.router.resize(n * E);
  // router logits [n, E] = xb · gateᵀ (in FP32, as the reference)
  backend_.matmul(*w.router, nullptr, s.xb.data(), n, s.router.data());
  const float* bias = w.router_bias.empty() ? nullptr : w.router_bias.data();
  ids->resize(n * k);
  weights->resize(n * k);
  std::vector<float> scores(E), choice(E), group_score(n_group);
  std::vector<int> order(std::max(E, n_group));
  std::vector<char> allowed(E);
  for (int64_t t = 0; t < n; ++t) {
    const float* logit = &s.router[t * E];
    if (c.scoring_func == ScoringFunc::kSoftmax) {
      const float mx = *std::max_element(logit, logit + E);
      float sum = 0;
      for (int e = 0; e < E; ++e) sum += scores[e] = std::exp(logit[e] - mx);
      for (int e = 0; e < E; ++e) scores[e] /= sum;
    } else {
      for (int e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logit[e]));
    }
    for (int e = 0; e < E; ++e) choice[e] = bias ? scores[e] + bias[e] : scores[e];

    std::fill(allowed.begin(), allowed.end(), 1);
    if (c.topk_method != TopkMethod::kGreedy) {
      for (int g = 0; g < n_group; ++g) {
        const float* gc = &choice[g * group_size];
        if (c.topk_method == TopkMethod::kGroupLimitedGreedy) {
          group_score[g] = *std::max_element(gc, gc + group_size);
        } else {  // noaux_tc: sum of the group's two best
          float a = -INFINITY, b = -INFINITY;
          for (int i = 0; i < group_size; ++i) {
            if (gc[i] > a) {
              b = a;
              a = gc[i];
            } else if (gc[i] > b) {
              b = gc[i];
            }
          }
          group_score[g] = a + b;
        }
      }
      std::iota(order.begin(), order.begin() + n_group, 0);
      std::partial_sort(
          order.begin(), order.begin() + c.topk_group, order.begin() + n_group, [&](int a, int b) {
            return group_score[a] > group_score[b] || (group_score[a] == group_score[b] && a < b);
          });
      std::fill(allowed.begin(), allowed.end(), 0);
      for (int i = 0; i < c.topk_group; ++i) {
        std::fill_n(allowed.begin() + order[i] * group_size, group_size, 1);
      }
    }
    std::iota(order.begin(), order.begin() + E, 0);
    auto better = [&](int a, int b) {
      if (allowed[a] != allowed[b]) return allowed[a] > allowed[b];
      return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
    };
    std::partial_sort(order.begin(), order.begin() + k, order.begin() + E, better);
    float sum = 0;
    for (int i = 0; i < k; ++i) {
      (*ids)[t * k + i] = order[i];
      sum += (*weights)[t * k + i] = scores[order[i]];
    }
    const float norm = c.norm_topk_prob ? 1.0f / (sum + 1e-20f) : 1.0f;
    for (int i = 0; i < k; ++i) (*weights)[t * k + i] *= norm * c.routed_scaling_factor;
  }
}

// s.xb [n, hidden] -> s.moe_out [n, hidden]. Tokens are bucketed by expert and
// gathered into one contiguous batch per expert; every active expert's gate/up (and
// the shared experts' over all tokens) runs as one grouped matmul, then every down
// projection as another, so the backend spreads the layer's weight bytes over its
// threads in two jobs rather than two per expert. Each expert's output is scattered
// back scaled by the routing weight, experts in increasing order.
Status DeepseekModel::run_moe(const LayerWeights& w, int64_t n) {
  if (dispatch_) return run_moe_dispatched(w, n);
  const DeepseekConfig& c = shard_;  // this rank's FFN widths
  Scratch& s = scratch_;
  const int E = c.n_routed_experts, k = c.n_experts_per_tok;
  const int64_t hidden = c.hidden_size;
  const int64_t inter = c.moe_intermediate_size;
  const int64_t shared_inter = shared_inter_;
  // This rank's routed experts (all of them without expert parallelism).
  const int e0 = static_cast<int>(expert_begin_), e1 = static_cast<int>(expert_end_);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  route(w, n, &ids, &weights);

  // Counting sort of the n * k (token, weight) slots by expert.
  std::vector<int64_t> start(E + 1, 0);
  for (int32_t e : ids) ++start[e + 1];
  for (int e = 0; e < E; ++e) start[e + 1] += start[e];
  const int64_t n_slots = n * k;
  std::vector<int64_t> slot_token(n_slots);
  std::vector<float> slot_weight(n_slots);
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < n_slots; ++i) {
    const int64_t at = fill[ids[i]]++;
    slot_token[at] = i / k;
    slot_weight[at] = weights[i];
  }
  // expert_in [n_slots, hidden]: slot i's token, in slot (expert) order; this rank's
  // experts' slots are [start[e0], start[e1]).
  const int64_t local0 = start[e0], local1 = start[e1];
  s.expert_in.resize(n_slots * hidden);
  for (int64_t i = local0; i < local1; ++i) {
    std::memcpy(&s.expert_in[i * hidden], &s.xb[slot_token[i] * hidden], hidden * sizeof(float));
  }

  // gate, up [n_slots * inter + n * shared_inter]: the routed slots' rows, then the
  // shared experts' rows of every token.
  const int64_t act = n_slots * inter + n * shared_inter;
  s.gate.resize(act);
  s.up.resize(act);
  std::vector<MatmulTarget> gate_up;
  std::vector<MatmulTarget> down;
  std::vector<MatmulGroup> groups;
  gate_up.reserve(2 * (E + 1));
  down.reserve(E + 1);
  groups.reserve(E + 1);
  moe_stats_.routed_slots += n_slots;
  for (int e = e0; e < e1; ++e) {
    const int64_t m = start[e + 1] - start[e];
    if (m == 0) {
      ++moe_stats_.expert_idle;
      continue;
    }
    ++moe_stats_.expert_runs;
    moe_stats_.expert_rows += m;
    gate_up.push_back({w.experts[e].gate, nullptr, s.gate.data() + start[e] * inter});
    gate_up.push_back({w.experts[e].up, nullptr, s.up.data() + start[e] * inter});
  }
  const bool shared = c.n_shared_experts > 0;
  if (shared) {
    gate_up.push_back({w.shared.gate, nullptr, s.gate.data() + n_slots * inter});
    gate_up.push_back({w.shared.up, nullptr, s.up.data() + n_slots * inter});
  }
  int j = 0;
  for (int e = e0; e < e1; ++e) {
    const int64_t m = start[e + 1] - start[e];
    if (m == 0) continue;
    groups.push_back({s.expert_in.data() + start[e] * hidden, m, &gate_up[2 * j++], 2});
  }
  if (shared) groups.push_back({s.xb.data(), n, &gate_up[2 * j], 2});
  backend_.matmul_grouped(groups.data(), static_cast<int>(groups.size()));
  // silu(gate) * up over this rank's slots' rows and the shared experts' rows.
  const int64_t lo = local0 * inter, hi = local1 * inter, sh = n_slots * inter;
  backend_.silu_mul(s.gate.data() + lo, s.up.data() + lo, hi - lo, s.gate.data() + lo);
  backend_.silu_mul(s.gate.data() + sh, s.up.data() + sh, act - sh, s.gate.data() + sh);

  // expert_out [n_slots + n, hidden]: each slot's expert output, then the shared
  // experts' output of every token.
  s.expert_out.resize((n_slots + n) * hidden);
  groups.clear();
  for (int e = e0; e < e1; ++e) {
    const int64_t m = start[e + 1] - start[e];
    if (m == 0) continue;
    down.push_back({w.experts[e].down, nullptr, s.expert_out.data() + start[e] * hidden});
    groups.push_back({s.gate.data() + start[e] * inter, m, &down.back(), 1});
  }
  if (shared) {
    down.push_back({w.shared.down, nullptr, s.expert_out.data() + n_slots * hidden});
    groups.push_back({s.gate.data() + n_slots * inter, n, &down.back(), 1});
  }
  backend_.matmul_grouped(groups.data(), static_cast<int>(groups.size()));

  std::fill(s.moe_out.begin(), s.moe_out.begin() + n * hidden, 0.0f);
  for (int64_t i = local0; i < local1; ++i) {
    const float wt = slot_weight[i];
    float* dst = &s.moe_out[slot_token[i] * hidden];
    const float* src = &s.expert_out[i * hidden];
    for (int64_t d = 0; d < hidden; ++d) dst[d] += wt * src[d];
  }
  if (shared) backend_.add_inplace(s.moe_out.data(), s.expert_out.data() + n_slots * hidden, n * hidden);
  return Status::Ok();
}

// s.xb [n, hidden] -> s.moe_out [n, hidden] over the expert-parallel group: route
// here, send each slot's row to its expert's owner, run this rank's experts over
// whatever rows every engine sent, send the outputs back, and sum each token's slots
// (weighted here) in increasing expert order, then add the shared experts: the same
// additions in the same order as run_moe on one rank. n may be 0 (forward_idle).
// With T > 1 tensor-parallel ranks per engine, this rank t takes only the slots whose
// expert's owner is a rank t (owner % T == t; the group numbers engine d's ranks
// d T .. d T + T - 1), and the shared experts' width share: the all-reduce after the
// MoE adds the T ranks' partial sums.
Status DeepseekModel::run_moe_dispatched(const LayerWeights& w, int64_t n) {
  const DeepseekConfig& c = shard_;
  Scratch& s = scratch_;
  const int k = c.n_experts_per_tok;
  const int64_t hidden = c.hidden_size;
  const int n_tp = comm_->size(), tp = comm_->rank();
  const ExpertPlacement& place = dispatch_->placement();
  std::vector<int32_t> ids;
  std::vector<float> weights;
  if (n > 0) route(w, n, &ids, &weights);
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
      slot_weight.push_back(weights[t * k + j]);
    }
  }
  DS_RETURN_IF_ERROR(dispatch_->dispatch(std::span<const float>(s.xb.data(), static_cast<size_t>(n * hidden)),
                                         slot_token, slot_expert));
  moe_stats_.routed_slots += static_cast<int64_t>(slot_token.size());
  run_received_experts(w);
  DS_RETURN_IF_ERROR(dispatch_->combine(
      std::span<const float>(s.expert_out.data(), static_cast<size_t>(dispatch_->n_received() * hidden)),
      &s.slot_out));

  std::fill(s.moe_out.begin(), s.moe_out.begin() + n * hidden, 0.0f);
  for (size_t i = 0; i < slot_token.size(); ++i) {
    const float wt = slot_weight[i];
    float* dst = &s.moe_out[slot_token[i] * hidden];
    const float* src = &s.slot_out[i * hidden];
    for (int64_t d = 0; d < hidden; ++d) dst[d] += wt * src[d];
  }
  if (c.n_shared_experts > 0 && n > 0) {
    s.expert_in.resize(n * hidden);
    run_mlp(w.shared, shared_inter_, s.xb.data(), n, s.expert_in.data());
    backend_.add_inplace(s.moe_out.data(), s.expert_in.data(), n * hidden);
  }
  return Status::Ok();
}

// dispatch_'s received rows (grouped by this rank's experts) -> s.expert_out: every
// expert that received rows runs once over them, gate/up as one grouped matmul and
// down as another (as run_moe).
void DeepseekModel::run_received_experts(const LayerWeights& w) {
  const DeepseekConfig& c = shard_;
  Scratch& s = scratch_;
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size;
  const int64_t rows = dispatch_->n_received();
  const std::span<const int64_t> offsets = dispatch_->expert_offsets();
  const float* in = dispatch_->received_rows().data();
  const int e0 = static_cast<int>(expert_begin_), n_local = dispatch_->n_local_experts();
  s.expert_out.resize(std::max<int64_t>(rows, 1) * hidden);
  s.gate.resize(std::max<int64_t>(rows, 1) * inter);
  s.up.resize(std::max<int64_t>(rows, 1) * inter);
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
    gate_up.push_back({e.gate, nullptr, s.gate.data() + offsets[j] * inter});
    gate_up.push_back({e.up, nullptr, s.up.data() + offsets[j] * inter});
  }
  if (gate_up.empty()) return;
  int g = 0;
  for (int j = 0; j < n_local; ++j) {
    const int64_t m = offsets[j + 1] - offsets[j];
    if (m == 0) continue;
    groups.push_back({in + offsets[j] * hidden, m, &gate_up[2 * g++], 2});
  }
  backend_.matmul_grouped(groups.data(), static_cast<int>(groups.size()));
  backend_.silu_mul(s.gate.data(), s.up.data(), rows * inter, s.gate.data());
  groups.clear();
  for (int j = 0; j < n_local; ++j) {
    const int64_t m = offsets[j + 1] - offsets[j];
    if (m == 0) continue;
    down.push_back({w.experts[e0 + j].down, nullptr, s.expert_out.data() + offsets[j] * hidden});
    groups.push_back({s.gate.data() + offsets[j] * inter, m, &down.back(), 1});
  }
  backend_.matmul_grouped(groups.data(), static_cast<int>(groups.size()));
}

Status DeepseekModel::forward_idle() {
  if (!dispatch_) return Status::Ok();
  for (const LayerWeights& w : layers_) {
    if (w.moe) DS_RETURN_IF_ERROR(run_moe_dispatched(w, 0));
  }
  return Status::Ok();
}

}  // namespace dserve
