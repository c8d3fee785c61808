// Mixture of experts on the GPU: the router's choice (one thread per token, the CPU
// backend's rule: group selection, top-k with ties to the lower id, normalisation) and
// the routed experts as per-slot products (a slot is one (token, choice) pair): gate
// and up with SiLU over the slot's token, down over that, then each token's slots
// summed in increasing expert id. Everything stays on the device: no slot counts come
// back to the host, so a step needs no synchronisation here.
#include "backend/cuda/decode.cuh"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace dserve::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// Whether expert a ranks before expert b (allowed first, then the higher choice, ties
// to the lower id), as the CPU backend's partial_sort.
__host__ __device__ inline bool ranks_before(int a, int b, const float* choice, const bool* allowed) {
  if (allowed[a] != allowed[b]) return allowed[a];
  return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
}

// One token's choice: ids [top_k], weights [top_k] from logit [n_experts].
__host__ __device__ void route_token(const float* logit, const RoutingArgs& r, int32_t* ids,
                                     float* weights) {
  const int E = r.n_experts, k = r.top_k;
  float scores[kMaxRoutedExperts], choice[kMaxRoutedExperts];
  bool allowed[kMaxRoutedExperts], taken[kMaxRoutedExperts];
  if (!r.sigmoid) {
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = fmaxf(mx, logit[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += scores[e] = expf(logit[e] - mx);
    for (int e = 0; e < E; ++e) scores[e] /= sum;
  } else {
    for (int e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + expf(-logit[e]));
  }
  for (int e = 0; e < E; ++e) {
    choice[e] = r.correction_bias != nullptr ? scores[e] + r.correction_bias[e] : scores[e];
    allowed[e] = r.group_select == 0;
    taken[e] = false;
  }
  if (r.group_select != 0) {
    const int group_size = E / r.n_groups;
    float group_score[kMaxExpertGroups];
    bool group_taken[kMaxExpertGroups];
    for (int g = 0; g < r.n_groups; ++g) {
      const float* gc = choice + g * group_size;
      float a = -INFINITY, b = -INFINITY;
      for (int i = 0; i < group_size; ++i) {
        if (gc[i] > a) {
          b = a;
          a = gc[i];
        } else if (gc[i] > b) {
          b = gc[i];
        }
      }
      group_score[g] = r.group_select == 1 ? a : a + b;
      group_taken[g] = false;
    }
    for (int i = 0; i < r.top_groups; ++i) {
      int best = -1;
      for (int g = 0; g < r.n_groups; ++g) {
        if (!group_taken[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
      }
      group_taken[best] = true;
      for (int e = best * group_size; e < (best + 1) * group_size; ++e) allowed[e] = true;
    }
  }
  float sum = 0.0f;
  for (int i = 0; i < k; ++i) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (!taken[e] && (best < 0 || ranks_before(e, best, choice, allowed))) best = e;
    }
    taken[best] = true;
    ids[i] = best;
    sum += weights[i] = scores[best];
  }
  const float norm = r.normalize ? 1.0f / (sum + 1e-20f) : 1.0f;
  for (int i = 0; i < k; ++i) weights[i] *= norm * r.scaling;
}

__global__ void moe_route_kernel(const float* logits, int64_t n_tokens, RoutingArgs r,
                                 int32_t* ids, float* weights) {
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= n_tokens) return;
  route_token(logits + t * r.n_experts, r, ids + t * r.top_k, weights + t * r.top_k);
}

// h[slot, row] = silu(gate_e[row] · x[token]) * (up_e[row] · x[token]) for the slot's
// expert e, where this rank holds e. Grid: (slots, rows / kWarpsPerBlock).
template <DType T>
__global__ void expert_gate_up_kernel(MoeArgs a) {
  const int64_t slot = blockIdx.x;
  const int e = a.ids[slot];
  const int64_t row = int64_t{blockIdx.y} * kWarpsPerBlock + threadIdx.x / kWarp;
  if (e < a.first || e >= a.end || row >= a.inter) return;
  const float* x = a.x + slot / a.k * a.hidden;
  const float g = warp_dot_row<T>(a.experts[3 * e], row, x);
  const float u = warp_dot_row<T>(a.experts[3 * e + 1], row, x);
  if (threadIdx.x % kWarp == 0) a.h[slot * a.inter + row] = g / (1.0f + expf(-g)) * u;
}

// slot_out[slot, row] = down_e[row] · h[slot].
template <DType T>
__global__ void expert_down_kernel(MoeArgs a) {
  const int64_t slot = blockIdx.x;
  const int e = a.ids[slot];
  const int64_t row = int64_t{blockIdx.y} * kWarpsPerBlock + threadIdx.x / kWarp;
  if (e < a.first || e >= a.end || row >= a.hidden) return;
  const float d = warp_dot_row<T>(a.experts[3 * e + 2], row, a.h + slot * a.inter);
  if (threadIdx.x % kWarp == 0) a.slot_out[slot * a.hidden + row] = d;
}

// out[t] = sum of t's local slots' weight * slot_out, in increasing expert id.
__global__ void expert_combine_kernel(MoeArgs a) {
  const int64_t t = blockIdx.x;
  const int32_t* ids = a.ids + t * a.k;
  for (int64_t d = threadIdx.x; d < a.hidden; d += blockDim.x) {
    float sum = 0.0f;
    int last = -1;
    for (int i = 0; i < a.k; ++i) {  // the next larger expert id each time
      int next = -1;
      for (int j = 0; j < a.k; ++j) {
        if (ids[j] > last && (next < 0 || ids[j] < ids[next])) next = j;
      }
      if (next < 0) break;
      last = ids[next];
      if (last < a.first || last >= a.end) continue;
      sum += a.weights[t * a.k + next] * a.slot_out[(t * a.k + next) * a.hidden + d];
    }
    a.out[t * a.hidden + d] = sum;
  }
}

__global__ void expert_counters_kernel(MoeArgs a) {
  __shared__ int count[kMaxRoutedExperts];
  for (int e = threadIdx.x; e < a.n_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  const int64_t n_slots = a.n_tokens * a.k;
  for (int64_t i = threadIdx.x; i < n_slots; i += blockDim.x) atomicAdd(&count[a.ids[i]], 1);
  __syncthreads();
  if (threadIdx.x != 0) return;
  long long runs = 0, rows = 0, idle = 0;
  for (int e = a.first; e < a.end; ++e) {
    runs += count[e] > 0;
    idle += count[e] == 0;
    rows += count[e];
  }
  a.counters[kMoeRoutedSlotsIndex] += n_slots;
  a.counters[kMoeExpertRunsIndex] += runs;
  a.counters[kMoeExpertRowsIndex] += rows;
  a.counters[kMoeExpertIdleIndex] += idle;
}

}  // namespace

void moe_route(const float* logits, int64_t n_tokens, const RoutingArgs& routing, int32_t* ids,
               float* weights, cudaStream_t stream) {
  if (n_tokens == 0) return;
  moe_route_kernel<<<blocks_for(n_tokens, 64), 64, 0, stream>>>(logits, n_tokens, routing, ids,
                                                                weights);
}

void route_on_host(const float* logits, int64_t n_tokens, const RoutingArgs& routing,
                   int32_t* ids, float* weights) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    route_token(logits + t * routing.n_experts, routing, ids + t * routing.top_k,
                weights + t * routing.top_k);
  }
}

void moe_experts(const MoeArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0) return;
  const auto slots = static_cast<unsigned>(a.n_tokens * a.k);
  const int threads = kWarpsPerBlock * kWarp;
  dispatch_dtype(a.dtype, [&]<DType T>() {
    expert_gate_up_kernel<T><<<dim3(slots, blocks_for(a.inter, kWarpsPerBlock)), threads, 0, stream>>>(a);
    expert_down_kernel<T><<<dim3(slots, blocks_for(a.hidden, kWarpsPerBlock)), threads, 0, stream>>>(a);
  });
  expert_combine_kernel<<<static_cast<unsigned>(a.n_tokens), 256, 0, stream>>>(a);
  if (a.counters != nullptr) expert_counters_kernel<<<1, 256, 0, stream>>>(a);
}

}  // namespace dserve::cuda
