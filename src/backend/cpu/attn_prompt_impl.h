// The prompt attention kernel (AttnPromptArgs, kernels.h) over a vector type V, shared
// by the x86 and Arm levels. Included only by kernels_x86_impl.h and
// kernels_arm_impl.h, inside their anonymous namespaces (after kernels.h and <cmath>),
// so each level's target flags compile their own copy (see those files).
//
// V provides: T, kWidth (floats per vector), kPromptAcc (accumulators of a register
// tile), zero, set1, load, store, fma(a, b, c) = a * b + c rounded once, add, sub, mul,
// max, select_ge(a, b, x, y) (x where a >= b, else y), exp.
//
// A block of queries sits in the lanes of NQV vectors. Every FMA takes one broadcast
// key or value element and a vector of the queries' numbers, so no sum crosses lanes
// and a lane's arithmetic is the same whatever the other lanes hold.
#pragma once

// Scores of a step's keys [0, nk) from p0 for the block's lanes:
// st[j][lane] = scale * sum_d k_j[d] q_lane[d], the sum one FMA chain over d in order.
// NQV vectors of queries times kPromptAcc / NQV keys of accumulators.
template <typename V, int NQV>
void attn_prompt_scores(const AttnPromptArgs& a, const float* qt, int64_t p0, int nk, float* st) {
  constexpr int W = V::kWidth, L = NQV * W, NK = V::kPromptAcc / NQV;
  const typename V::T scale = V::set1(a.scale);
  for (int j0 = 0; j0 < nk; j0 += NK) {
    const float* kr[NK];  // keys past nk repeat the last one; their scores are dropped
    for (int c = 0; c < NK; ++c) kr[c] = a.k + (p0 + (j0 + c < nk ? j0 + c : nk - 1)) * a.k_stride;
    typename V::T acc[NK][NQV];
    for (int c = 0; c < NK; ++c) {
      for (int u = 0; u < NQV; ++u) acc[c][u] = V::zero();
    }
    for (int d = 0; d < a.head_dim; ++d) {
      typename V::T qv[NQV];
      for (int u = 0; u < NQV; ++u) qv[u] = V::load(qt + d * L + u * W);
      for (int c = 0; c < NK; ++c) {
        const typename V::T kb = V::set1(kr[c][d]);
        for (int u = 0; u < NQV; ++u) acc[c][u] = V::fma(kb, qv[u], acc[c][u]);
      }
    }
    const int nc = nk - j0 < NK ? nk - j0 : NK;
    for (int c = 0; c < nc; ++c) {
      for (int u = 0; u < NQV; ++u) V::store(st + (j0 + c) * L + u * W, V::mul(acc[c][u], scale));
    }
  }
}

// ot[d][lane] = ot[d][lane] * corr[lane] + sum_j st[j][lane] v_j[d] for value dims
// [d0, d0 + C): a multiply, then FMAs in key order.
template <typename V, int NQV, int C>
void attn_prompt_values(const AttnPromptArgs& a, const float* st, const typename V::T* corr,
                        int64_t p0, int nk, int d0, float* ot) {
  constexpr int W = V::kWidth, L = NQV * W;
  typename V::T acc[C][NQV];
  for (int c = 0; c < C; ++c) {
    for (int u = 0; u < NQV; ++u) acc[c][u] = V::mul(V::load(ot + (d0 + c) * L + u * W), corr[u]);
  }
  for (int j = 0; j < nk; ++j) {
    const float* vr = a.v + (p0 + j) * a.v_stride + d0;
    typename V::T pv[NQV];
    for (int u = 0; u < NQV; ++u) pv[u] = V::load(st + j * L + u * W);
    for (int c = 0; c < C; ++c) {
      const typename V::T vb = V::set1(vr[c]);
      for (int u = 0; u < NQV; ++u) acc[c][u] = V::fma(vb, pv[u], acc[c][u]);
    }
  }
  for (int c = 0; c < C; ++c) {
    for (int u = 0; u < NQV; ++u) V::store(ot + (d0 + c) * L + u * W, acc[c][u]);
  }
}

// The queries' running max m, sum l and factor corr after step [p0, p0 + nk): per lane
// m' = max(m, the scores of keys it sees), corr = exp(m - m'), st[j] = exp(s_j - m')
// for keys it sees and exactly 0 for the others (a step past a lane's position leaves
// its state as it was: corr = exp(0) = 1), l' = l corr + sum_j st[j].
template <typename V, int NQV>
void attn_prompt_softmax(const typename V::T* pos, int64_t p0, int nk, float* st, typename V::T* m,
                         typename V::T* l, typename V::T* corr) {
  constexpr int W = V::kWidth, L = NQV * W;
  const typename V::T neg_inf = V::set1(-INFINITY);
  for (int u = 0; u < NQV; ++u) {
    typename V::T mx = m[u];
    for (int j = 0; j < nk; ++j) {
      const typename V::T key = V::set1(static_cast<float>(p0 + j));
      mx = V::max(mx, V::select_ge(pos[u], key, V::load(st + j * L + u * W), neg_inf));
    }
    corr[u] = V::exp(V::sub(m[u], mx));  // m = -inf: exp(-87), times l = 0 and acc = 0
    typename V::T sum = V::zero();
    for (int j = 0; j < nk; ++j) {
      const typename V::T key = V::set1(static_cast<float>(p0 + j));
      float* sj = st + j * L + u * W;
      const typename V::T p = V::select_ge(pos[u], key, V::exp(V::sub(V::load(sj), mx)), V::zero());
      V::store(sj, p);
      sum = V::add(sum, p);
    }
    l[u] = V::add(V::mul(l[u], corr[u]), sum);
    m[u] = mx;
  }
}

// One block of queries in NQV vectors of lanes; lanes past n_q repeat the last query.
template <typename V, int NQV>
void attn_prompt_block(const AttnPromptArgs& a) {
  using T = typename V::T;
  constexpr int W = V::kWidth, L = NQV * W, DV = V::kPromptAcc / NQV;
  const int hd = a.head_dim, vd = a.v_dim;
  float* qt = a.scratch;                    // [hd, L] the queries, transposed
  float* st = qt + hd * L;                  // [kAttnPromptKeyStep, L] scores, then weights
  float* ot = st + kAttnPromptKeyStep * L;  // [vd, L] unnormalised outputs
  float* lanes = ot + vd * L;               // [L]
  int64_t n_keys = 0;
  for (int i = 0; i < L; ++i) {
    const int src = i < a.n_q ? i : a.n_q - 1;
    const float* qr = a.q + src * a.q_stride;
    for (int d = 0; d < hd; ++d) qt[d * L + i] = qr[d];
    lanes[i] = static_cast<float>(a.positions[src]);  // exact below 2^24
    const int64_t seen = int64_t{a.positions[src]} + 1;
    n_keys = seen > n_keys ? seen : n_keys;
  }
  T pos[NQV], m[NQV], l[NQV], corr[NQV];
  for (int u = 0; u < NQV; ++u) {
    pos[u] = V::load(lanes + u * W);
    m[u] = V::set1(-INFINITY);
    l[u] = V::zero();
  }
  for (int e = 0; e < vd * L; e += W) V::store(ot + e, V::zero());
  for (int64_t p0 = 0; p0 < n_keys; p0 += kAttnPromptKeyStep) {
    const int nk = static_cast<int>(n_keys - p0 < kAttnPromptKeyStep ? n_keys - p0 : kAttnPromptKeyStep);
    attn_prompt_scores<V, NQV>(a, qt, p0, nk, st);
    attn_prompt_softmax<V, NQV>(pos, p0, nk, st, m, l, corr);
    int d0 = 0;
    for (; d0 + DV <= vd; d0 += DV) attn_prompt_values<V, NQV, DV>(a, st, corr, p0, nk, d0, ot);
    for (; d0 + 4 <= vd; d0 += 4) attn_prompt_values<V, NQV, 4>(a, st, corr, p0, nk, d0, ot);
    for (; d0 < vd; ++d0) attn_prompt_values<V, NQV, 1>(a, st, corr, p0, nk, d0, ot);
  }
  for (int u = 0; u < NQV; ++u) V::store(lanes + u * W, l[u]);
  for (int i = 0; i < a.n_q; ++i) {
    const float inv = 1.0f / lanes[i];  // >= 1: the largest score contributes exp(0)
    float* o = a.out + i * a.out_stride;
    for (int d = 0; d < vd; ++d) o[d] = ot[d * L + i] * inv;
  }
}

// A block of up to kAttnPromptVectors vectors of queries, as few as hold them (the
// lanes' arithmetic is the same either way).
inline constexpr int kAttnPromptVectors = 2;
template <typename V>
void attn_prompt(const AttnPromptArgs& a) {
  if (a.n_q <= V::kWidth) {
    attn_prompt_block<V, 1>(a);
  } else {
    attn_prompt_block<V, 2>(a);
  }
}
