// Sampler: turns one row of logits into the next token of one sequence, following
// vLLM v1's sampler (see sampling_params.h for the order of processing).
//
// Cost per call, V = vocabulary:
//   penalties, min_tokens masking, O(V) copy + O(distinct prompt and output ids
//   logit_bias                     + biased ids)
//   greedy                         O(V) (argmax)
//   plain temperature sampling     O(V) (one exp per id, inverse CDF in id order)
//   min_p                          O(V) (a threshold on the logit)
//   top_k (k <= 4096)              O(V) compares + O(k log(V/k) log k) expected heap
//                                  updates; larger k: nth_element, O(V)
//   top_p                          O(V + C log m): only the C ids whose weight is at
//                                  least (1 - top_p) / n of the total can be in the
//                                  nucleus (the rest hold less than 1 - top_p of the
//                                  mass together); of those a best-first prefix of
//                                  m = 64 is partially sorted, growing 4x while it
//                                  holds less than top_p of the mass
//   logprobs (L alternatives)      O(V) compares + O(L log(V/L) log L) heap updates
// The vocabulary is never fully sorted.
//
// Structured output (SamplingState::constraint()): first of all, ids the constraint
// does not allow get -inf, as vLLM v1 applies its grammar bitmask to the logits; stop
// ids are allowed exactly when the constraint is complete (or nothing else is).
//
// Logprobs are vLLM's default mode, "raw_logprobs": log-softmax of the model's logits
// (after a constraint's mask) before logit_bias, penalties, temperature and filtering;
// with them come the sampled token's rank (how many tokens have a raw log-prob >= its
// own) and the best params.logprobs() alternatives.
//
// Randomness: one uniform per step from counter_rng.h, keyed by the state's seed,
// sample index and n_output(), so a sequence's tokens do not depend on the batch.
//
// Thread-safety: a Sampler holds scratch buffers; use one per thread.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "sampling/sample_result.h"
#include "sampling/sampling_state.h"

namespace dserve {

class Sampler {
 public:
  Sampler() = default;
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // logits: [vocab], the model's raw output for this sequence's next position.
  SampleResult sample(const SamplingState& state, std::span<const float> logits);

  // The raw log-probability and rank of a given `token` under logits, with the best
  // n_top alternatives (prompt logprobs: how likely the model found the actual text).
  SampleResult score(std::span<const float> logits, int32_t token, int n_top);

  // The distribution sample() draws from, as logits: masking, bias and penalties
  // applied, divided by the temperature, -inf for every id min_p / top_k / top_p
  // removed. Greedy requests get the biased and penalised logits unscaled. out: [vocab].
  // For tests and a future "processed_logprobs" mode; O(V log V) in the worst case.
  void processed_logits(const SamplingState& state, std::span<const float> logits,
                        std::span<float> out);

 private:
  using Candidate = std::pair<float, int32_t>;  // (processed logit, id)

  // logits, or (for a constrained state) scratch holding them with -inf for every id
  // the constraint does not allow; stop ids are then decided here (stops_handled).
  std::span<const float> constrained(const SamplingState& state, std::span<const float> logits,
                                     bool* stops_handled);
  // logits, or scratch holding them with masking, bias and penalties applied.
  // mask_stops: apply min_tokens' masking of stop ids.
  std::span<const float> penalised(const SamplingState& state, std::span<const float> logits,
                                   bool mask_stops);
  // Fills candidates_ with the ids that survive min_p, top_k and top_p; returns how
  // many of them (a prefix of candidates_) are kept. max: the largest logit in row.
  size_t filter(const SamplingParams& p, std::span<const float> row, float max);
  // The best min(k, |{row >= threshold}|) finite entries of row, in no order.
  static void best_k(std::span<const float> row, size_t k, float threshold,
                     std::vector<Candidate>* out);
  void fill_logprobs(std::span<const float> logits, size_t n_top, SampleResult* result);

  std::vector<uint64_t> allowed_;      // [ceil(vocab / 64)] a constraint's allowed ids
  std::vector<float> masked_;          // [vocab] logits of a constrained sequence
  std::vector<float> row_;             // [vocab] penalised logits
  std::vector<Candidate> candidates_;  // scratch for filtering
  std::vector<Candidate> heap_;        // scratch for top logprobs
  std::vector<float> weights_;         // [vocab] scratch: exp((logit - max) / T)
};

}  // namespace dserve
