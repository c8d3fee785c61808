// CpuBackend's mixture-of-experts ops: the router's choice (moe_route) and the routed
// and shared experts of one layer (moe_experts), the token permutation to the experts
// and back included.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_backend.h"

namespace dserve::cpu {

void CpuBackend::moe_route(const float* logits, int64_t n, const MoeRouting& r, int32_t* ids,
                           float* weights) {
  const int E = r.n_experts, k = r.top_k;
  const int n_group = r.group_select == MoeGroupSelect::kNone ? 1 : r.n_groups;
  const int group_size = E / n_group;
  const float* bias = r.correction_bias;
  std::vector<float> scores(E), choice(E), group_score(n_group);
  std::vector<int> order(std::max(E, n_group));
  std::vector<char> allowed(E);
  for (int64_t t = 0; t < n; ++t) {
    const float* logit = logits + t * E;
    if (r.scoring == MoeScoring::kSoftmax) {
      const float mx = *std::max_element(logit, logit + E);
      float sum = 0;
      for (int e = 0; e < E; ++e) sum += scores[e] = std::exp(logit[e] - mx);
      for (int e = 0; e < E; ++e) scores[e] /= sum;
    } else {
      for (int e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logit[e]));
    }
    for (int e = 0; e < E; ++e) choice[e] = bias ? scores[e] + bias[e] : scores[e];

    std::fill(allowed.begin(), allowed.end(), 1);
    if (r.group_select != MoeGroupSelect::kNone) {
      for (int g = 0; g < n_group; ++g) {
        const float* gc = &choice[g * group_size];
        if (r.group_select == MoeGroupSelect::kMaxOfGroup) {
          group_score[g] = *std::max_element(gc, gc + group_size);
        } else {  // the sum of the group's two best
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
          order.begin(), order.begin() + r.top_groups, order.begin() + n_group, [&](int a, int b) {
            return group_score[a] > group_score[b] || (group_score[a] == group_score[b] && a < b);
          });
      std::fill(allowed.begin(), allowed.end(), 0);
      for (int i = 0; i < r.top_groups; ++i) {
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
      ids[t * k + i] = order[i];
      sum += weights[t * k + i] = scores[order[i]];
    }
    const float norm = r.normalize ? 1.0f / (sum + 1e-20f) : 1.0f;
    for (int i = 0; i < k; ++i) weights[t * k + i] *= norm * r.scaling;
  }
}

// The slots (token, choice) are counting-sorted by expert and each expert's tokens
// gathered into one contiguous batch; every active expert's gate/up (and the shared
// experts' over all tokens) runs as one grouped matmul, then every down projection as
// another, so the work is spread over the threads by weight bytes in two jobs rather
// than two per expert. Each slot's output is added back to its token scaled by its
// weight, slots in expert order (per token: increasing expert id).
void CpuBackend::moe_experts(const float* x, int64_t n, const int32_t* ids, const float* weights,
                             int k, const MoeExperts& spec, float* out, int64_t* counters) {
  MoeScratch& s = moe_;
  const int E = spec.n_experts, e0 = spec.first, e1 = spec.end;
  const int64_t hidden = spec.hidden, inter = spec.inter;
  const int64_t shared_inter = spec.shared != nullptr ? spec.shared_inter : 0;
  const int64_t n_slots = n * k;

  s.start.assign(E + 1, 0);
  for (int64_t i = 0; i < n_slots; ++i) ++s.start[ids[i] + 1];
  for (int e = 0; e < E; ++e) s.start[e + 1] += s.start[e];
  s.slot_token.resize(n_slots);
  s.slot_weight.resize(n_slots);
  s.fill.assign(s.start.begin(), s.start.end() - 1);
  for (int64_t i = 0; i < n_slots; ++i) {
    const int64_t at = s.fill[ids[i]]++;
    s.slot_token[at] = i / k;
    s.slot_weight[at] = weights[i];
  }
  // expert_in [n_slots, hidden]: slot i's token in slot (expert) order; this rank's
  // experts' slots are [start[e0], start[e1]).
  const int64_t local0 = s.start[e0], local1 = s.start[e1];
  float* expert_in = s.expert_in.get_as<float>(std::max<int64_t>(n_slots, 1) * hidden);
  for (int64_t i = local0; i < local1; ++i) {
    std::memcpy(expert_in + i * hidden, x + s.slot_token[i] * hidden, hidden * sizeof(float));
  }
  // gate, up [n_slots * inter + n * shared_inter]: the routed slots' rows, then the
  // shared experts' rows of every token.
  const int64_t act = n_slots * inter + n * shared_inter;
  float* gate = s.gate.get_as<float>(std::max<int64_t>(act, 1));
  float* up = s.up.get_as<float>(std::max<int64_t>(act, 1));
  s.gate_up.clear();
  s.down.clear();
  s.groups.clear();
  s.gate_up.reserve(2 * (E + 1));
  s.down.reserve(E + 1);
  int64_t runs = 0, rows = 0, idle = 0;
  for (int e = e0; e < e1; ++e) {
    const int64_t m = s.start[e + 1] - s.start[e];
    if (m == 0) {
      ++idle;
      continue;
    }
    ++runs;
    rows += m;
    s.gate_up.push_back({spec.experts[e].gate, nullptr, gate + s.start[e] * inter});
    s.gate_up.push_back({spec.experts[e].up, nullptr, up + s.start[e] * inter});
  }
  if (counters != nullptr) {
    counters[kMoeRoutedSlots] += n_slots;
    counters[kMoeExpertRuns] += runs;
    counters[kMoeExpertRows] += rows;
    counters[kMoeExpertIdle] += idle;
  }
  const bool shared = spec.shared != nullptr;
  if (shared) {
    s.gate_up.push_back({spec.shared->gate, nullptr, gate + n_slots * inter});
    s.gate_up.push_back({spec.shared->up, nullptr, up + n_slots * inter});
  }
  int j = 0;
  for (int e = e0; e < e1; ++e) {
    const int64_t m = s.start[e + 1] - s.start[e];
    if (m == 0) continue;
    s.groups.push_back({expert_in + s.start[e] * hidden, m, &s.gate_up[2 * j++], 2});
  }
  if (shared) s.groups.push_back({x, n, &s.gate_up[2 * j], 2});
  matmul_grouped(s.groups.data(), static_cast<int>(s.groups.size()));
  // silu(gate) * up over this rank's slots' rows and the shared experts' rows.
  const int64_t lo = local0 * inter, hi = local1 * inter, sh = n_slots * inter;
  silu_mul(gate + lo, up + lo, hi - lo, gate + lo);
  silu_mul(gate + sh, up + sh, act - sh, gate + sh);

  // expert_out [n_slots + n, hidden]: each slot's expert output, then the shared
  // experts' output of every token.
  float* expert_out = s.expert_out.get_as<float>(std::max<int64_t>(n_slots + n, 1) * hidden);
  s.groups.clear();
  for (int e = e0; e < e1; ++e) {
    const int64_t m = s.start[e + 1] - s.start[e];
    if (m == 0) continue;
    s.down.push_back({spec.experts[e].down, nullptr, expert_out + s.start[e] * hidden});
    s.groups.push_back({gate + s.start[e] * inter, m, &s.down.back(), 1});
  }
  if (shared) {
    s.down.push_back({spec.shared->down, nullptr, expert_out + n_slots * hidden});
    s.groups.push_back({gate + n_slots * inter, n, &s.down.back(), 1});
  }
  matmul_grouped(s.groups.data(), static_cast<int>(s.groups.size()));

  std::fill(out, out + n * hidden, 0.0f);
  for (int64_t i = local0; i < local1; ++i) {
    const float wt = s.slot_weight[i];
    float* dst = out + s.slot_token[i] * hidden;
    const float* src = expert_out + i * hidden;
    for (int64_t d = 0; d < hidden; ++d) dst[d] += wt * src[d];
  }
  if (shared) add_inplace(out, expert_out + n_slots * hidden, n * hidden);
}

}  // namespace dserve::cpu
