// What a speculative verify step costs on a DeepSeek model with an MTP layer (not a
// test): B sequences at context depth D, each either decoding one token or verifying
// 1 + N (N drafts), timed as forward_batch over the paged cache; and the MTP layer's
// own pass per drafted token. Beside each time ratio, the ratio the weight bytes read
// predict: a forward reads the attention, dense and shared weights once, plus each
// routed expert that any of its tokens chose once (the distinct experts, counted by
// the model during the timed forwards).
//
//   build/bench/spec_verify_bench --model DIR [--threads 2] [--depth 512]
//       [--batch 1 8 32] [--drafts 1 2 3] [--reps 20]
// prints one line per (batch, N): ms per 1-token step, per verify step, their ratio,
// the bytes' predicted ratio, and the MTP pass's ms for one token per sequence (a
// model without an MTP layer: "-").
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/log.h"
#include "loader/model_files.h"
#include "model/deepseek_model.h"

namespace dserve {
namespace {

using Clock = std::chrono::steady_clock;

struct StepInputs {
  std::vector<int32_t> tokens, positions, seq, tables, rows;
  std::vector<int64_t> offsets;
  ModelBatch batch() const { return {tokens, positions, seq, tables, offsets, rows, {}}; }
};

// B sequences, sequence s owning blocks [s * per_seq, (s + 1) * per_seq); each gets
// `n` tokens at positions [start, start + n), every position's logits.
StepInputs make_step(int B, int per_seq, int start, int n, int vocab) {
  StepInputs in;
  in.offsets.push_back(0);
  for (int s = 0; s < B; ++s) {
    for (int i = 0; i < n; ++i) {
      in.tokens.push_back((start + i * 7 + s * 13) % vocab);
      in.positions.push_back(start + i);
      in.seq.push_back(s);
      in.rows.push_back(static_cast<int32_t>(in.tokens.size()) - 1);
    }
    for (int b = 0; b < per_seq; ++b) in.tables.push_back(s * per_seq + b);
    in.offsets.push_back(static_cast<int64_t>(in.tables.size()));
  }
  return in;
}

struct Timed {
  double ms = 0;
  double expert_runs = 0;  // per forward
};

template <typename Fn>
Timed time_forwards(DeepseekModel& m, int reps, Fn&& forward) {
  forward();  // warm
  m.reset_moe_stats();
  const Clock::time_point t0 = Clock::now();
  for (int r = 0; r < reps; ++r) forward();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / reps;
  return {ms, static_cast<double>(m.moe_stats().expert_runs) / reps};
}

int main_impl(int argc, char** argv) {
  CLI::App app{"spec_verify_bench"};
  std::string model_path;
  int threads = 2, depth = 512, reps = 20;
  std::vector<int> batches = {1, 8, 32}, drafts = {1, 2, 3};
  app.add_option("--model", model_path)->required();
  app.add_option("--threads", threads);
  app.add_option("--depth", depth);
  app.add_option("--batch", batches);
  app.add_option("--drafts", drafts);
  app.add_option("--reps", reps);
  CLI11_PARSE(app, argc, argv);
  set_log_level("warning");
  auto die = [](const Status& s) {
    std::fprintf(stderr, "spec_verify_bench: %s\n", s.message().c_str());
    return 1;
  };
  Result<std::unique_ptr<ModelFiles>> files = ModelFiles::open(model_path);
  if (!files.ok()) return die(files.status());
  CpuBackendOptions bo;
  bo.n_threads = threads;
  std::unique_ptr<Backend> backend = make_cpu_backend(bo);
  const int max_n = 1 + *std::max_element(drafts.begin(), drafts.end());
  Result<std::unique_ptr<DeepseekModel>> loaded =
      DeepseekModel::load(std::move(*files), *backend, depth + max_n + 8);
  if (!loaded.ok()) return die(loaded.status());
  DeepseekModel& m = **loaded;
  const DeepseekConfig& c = m.config();
  const bool mtp = c.num_nextn_predict_layers > 0;  // else no MTP column
  if (mtp) {
    if (Status s = m.enable_mtp(); !s.ok()) return die(s);
  }
  // Bytes: what one token's forward reads, less its k routed experts, is read once
  // per forward; each (layer, expert) run reads one expert's weights.
  // One expert's gate, up and down: per-expert tensors, or a 1/E share of stacked ones.
  const std::string p = "model.layers." + std::to_string(c.first_k_dense_replace) + ".mlp.experts.";
  double expert_bytes = 0;
  for (const char* w : {"gate_proj", "up_proj", "down_proj"}) {
    if (const TensorView* t = m.files().find(p + "0." + w + ".weight")) {
      expert_bytes += static_cast<double>(t->n_bytes);
    } else if (const TensorView* st = m.files().find(p + w + ".weight")) {
      expert_bytes += static_cast<double>(st->n_bytes) / static_cast<double>(c.n_routed_experts);
    }
  }
  int moe_layers = 0;
  for (int l = 0; l < c.n_layers; ++l) moe_layers += c.is_moe_layer(l) ? 1 : 0;
  const double shared_bytes = static_cast<double>(m.active_weight_bytes_per_token()) -
                              expert_bytes * c.n_experts_per_tok * moe_layers;
  auto bytes = [&](double runs) { return shared_bytes + expert_bytes * runs; };

  constexpr int kBlock = 16;
  const int per_seq = (depth + max_n + kBlock - 1) / kBlock;
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  std::unique_ptr<PagedMlaCache> cache =
      m.new_paged_cache(max_batch * per_seq, kBlock, DType::kF16);
  std::vector<float> logits;
  // Fill every sequence's cache to `depth` (chunks of 256 tokens).
  for (int start = 0; start < depth; start += 256) {
    const int n = std::min(256, depth - start);
    StepInputs fill = make_step(max_batch, per_seq, start, n, static_cast<int>(c.vocab_size));
    fill.rows = {0};
    if (Status s = m.forward_batch(fill.batch(), *cache, &logits); !s.ok()) return die(s);
  }
  std::printf("threads=%d depth=%d expert=%.1f MiB shared=%.1f MiB\n", threads, depth,
              expert_bytes / 1048576.0, shared_bytes / 1048576.0);
  std::printf("%-6s %-3s %-10s %-10s %-7s %-9s %-12s\n", "batch", "N", "1tok ms", "verify ms",
              "ratio", "bytes", "mtp ms/tok");
  for (int B : batches) {
    const StepInputs one = make_step(B, per_seq, depth, 1, static_cast<int>(c.vocab_size));
    const Timed t1 = time_forwards(m, reps, [&] { (void)m.forward_batch(one.batch(), *cache, &logits); });
    // The MTP pass over one token per sequence, right after a target forward.
    std::vector<int32_t> prev(B);
    std::iota(prev.begin(), prev.end(), 0);
    double mtp_ms = 0;
    if (mtp) {
      (void)m.forward_batch(one.batch(), *cache, &logits);
      const Clock::time_point t0 = Clock::now();
      for (int r = 0; r < reps; ++r) {
        (void)m.forward_mtp(one.batch(), *cache, prev, /*prev_is_target=*/r == 0, &logits);
      }
      mtp_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / reps;
    }
    for (int N : drafts) {
      const StepInputs v = make_step(B, per_seq, depth, 1 + N, static_cast<int>(c.vocab_size));
      const Timed tv = time_forwards(m, reps, [&] { (void)m.forward_batch(v.batch(), *cache, &logits); });
      std::printf("%-6d %-3d %-10.2f %-10.2f %-7.2f %-9.2f %s\n", B, N, t1.ms, tv.ms,
                  tv.ms / t1.ms, bytes(tv.expert_runs) / bytes(t1.expert_runs),
                  mtp ? std::to_string(mtp_ms).c_str() : "-");
    }
  }
  return 0;
}

}  // namespace
}  // namespace dserve

int main(int argc, char** argv) { return dserve::main_impl(argc, argv); }
