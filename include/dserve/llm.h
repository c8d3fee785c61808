// dserve's offline entry point, in the manner of vLLM's `LLM`: load a model once, then
// generate(prompts, sampling options) -> one output per prompt, running the serving
// engine (continuous batching over a paged KV cache) until every prompt has finished.
//
//   auto llm = dserve::LLM::create("model.gguf", {.max_num_seqs = 64});
//   auto outs = (*llm)->generate({"Hello,"}, {.temperature = 0, .max_tokens = 32});
//
// Text prompts need the model's tokenizer; id prompts do not (tiny test checkpoints
// without one generate ids, with empty text). Stop strings are matched on the decoded
// text (and end the request in the engine); the stop string itself is not returned.
//
// Thread-safety: not thread-safe; one thread drives one LLM.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine_output.h"
#include "sampling/sample_result.h"
#include "sampling/sampling_params.h"
#include "tensor/dtype.h"

namespace dserve {

class Backend;
class CausalLm;
class ModelFiles;
class LlmEngine;
class Tokenizer;

struct LlmOptions {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int block_size = 16;
  // Bytes for the paged KV cache; 0: 1 GiB, or less where 0.9 x the process's memory
  // limit (a container's cgroup limit, else physical memory) leaves less after the
  // weights and working buffers. A size that does not fit under the limit is refused.
  int64_t kv_cache_memory = 0;
  // The paged KV cache's element type, F16 (vLLM's --kv-cache-dtype auto, on the CPU)
  // or F32 (see EngineConfig::kv_cache_dtype).
  DType kv_cache_dtype = DType::kF16;
  // When > 0 (vLLM's --gpu-memory-utilization, read on the CPU): the fraction of the
  // process's memory limit (a container's cgroup limit, else physical memory) dserve
  // may use in all; the KV cache gets what remains after the weights and an estimate
  // of the working buffers, instead of kv_cache_memory.
  double gpu_memory_utilization = 0.0;
  int max_model_len = 0;  // 0: the model's context
  bool enable_prefix_caching = true;
  // Speculative decoding as vLLM's --speculative-config JSON (spec/speculative_config.h);
  // empty: off.
  std::string speculative_config;
  std::optional<uint64_t> seed;  // seeds unseeded requests' RNGs; none: random
  int n_threads = 0;  // 0: one per core
  std::string isa;    // force "scalar", "avx2" or "avx512" kernels; empty: best available
  // "cpu" or "cuda"; empty: cuda where this binary has it and a GPU is found, else cpu.
  std::string device;
  std::string quantization;  // expected weight quantisation (ModelFiles::open); empty: any
  // FP8 checkpoints: "fp8" keeps the weights at 1 byte each (the kernels convert),
  // "bf16" converts them at load.
  std::string fp8_weights = "fp8";
  // Optional: loads the model in place of load_causal_lm(files, backend, context), e.g.
  // as rank 0 of a tensor-parallel group (the CLI's launcher). On any other rank it
  // does not return.
  std::function<Result<std::unique_ptr<CausalLm>>(std::unique_ptr<ModelFiles>, Backend&, int64_t)>
      load_model;
};

// One prompt: text (tokenized with special tokens) or token ids.
struct Prompt {
  std::string text;
  std::vector<int32_t> ids;  // used when non-empty
};

struct CompletionOutput {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> token_ids;      // generated, a final stop id included (as vLLM)
  std::string text;                    // decoded (empty without a tokenizer)
  std::string finish_reason;           // "stop", "length" or "abort"
  std::vector<SampleResult> logprobs;  // with SamplingOptions::logprobs, per token
};

class LLM {
 public:
  static Result<std::unique_ptr<LLM>> create(const std::string& model_path,
                                             const LlmOptions& options = {});
  ~LLM();
  LLM(const LLM&) = delete;
  LLM& operator=(const LLM&) = delete;

  // Runs every prompt to completion. A bad prompt or sampling option fails the call
  // before any prompt runs (prompts already queued are aborted). With n > 1 sequences
  // per prompt, output i * n + j is sequence j of prompt i (n outputs per prompt).
  Result<std::vector<CompletionOutput>> generate(const std::vector<Prompt>& prompts,
                                                 const SamplingOptions& options);
  Result<std::vector<CompletionOutput>> generate(const std::vector<std::string>& prompts,
                                                 const SamplingOptions& options);
  Result<std::vector<CompletionOutput>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                                 const SamplingOptions& options);
  // options[i] for prompts[i] (e.g. per-request max_tokens in a benchmark).
  Result<std::vector<CompletionOutput>> generate(const std::vector<Prompt>& prompts,
                                                 const std::vector<SamplingOptions>& options);

  // The engine's counters (steps, preemptions, prefix-cache hits, blocks).
  EngineStats stats() const;
  // The last generate() call's time, and its decode phase: from the end of the step
  // after which every sequence had a token to the end (a benchmark's decode speed with
  // the prompts' processing left out).
  struct GenerateTiming {
    double seconds = 0;
    double decode_seconds = 0;
    int64_t decode_tokens = 0;
  };
  GenerateTiming last_generate_timing() const { return last_timing_; }
  // The model's own counters in one line (MoE expert use, expert-parallel traffic);
  // may be empty.
  std::string model_stats() const;
  // The engine itself, for AsyncLlm (its type is internal: engine/llm_engine.h).
  LlmEngine& engine() { return *engine_; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  int64_t vocab_size() const;

 private:
  LLM() = default;

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLm> model_;  // before engine_: the engine borrows it
  GenerateTiming last_timing_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<LlmEngine> engine_;
  RequestId next_id_ = 0;
};

}  // namespace dserve
