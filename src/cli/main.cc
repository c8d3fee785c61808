// dserve: the command-line entry point. Parses the subcommand and its options, then
// hands over to run_generate / run_perplexity. Every failure ends as one line on
// stderr ("dserve: error: ...") and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "base/log.h"
#include "cli/bench_serve.h"
#include "cli/bench_throughput.h"
#include "cli/generate.h"
#include "cli/perplexity.h"
#include "cli/serve.h"

namespace {

using dserve::cli::CommonOptions;

void add_common_options(CLI::App* cmd, CommonOptions* o) {
  cmd->add_option("--model", o->model,
                  "model: a .gguf file or a Hugging Face directory (default: $DSERVE_MODEL, else "
                  "$DSERVE_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  cmd->add_option("--threads", o->n_threads, "worker threads (default: one per CPU this process may run on)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--pin-threads", o->pin_threads, "pin worker i to the i-th CPU this process may run on");
  cmd->add_option("--log-level", o->log_level, "debug, info, warning or error")
      ->check(CLI::IsMember({"debug", "info", "warning", "warn", "error"}));
  cmd->add_option("--isa", o->isa,
                  "force the CPU kernels' instruction set (default: best available)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512", "neon", "neon-dotprod"}));
  dserve::cli::add_device_option(cmd, &o->device);
  cmd->add_option("--quantization", o->quantization,
                  "the weights' quantisation: compressed-tensors (W8A8) or ascend; default: "
                  "read from the files (a mismatch is an error)")
      ->check(CLI::IsMember({"compressed-tensors", "ascend"}));
  cmd->add_option("--fp8-weights", o->fp8_weights, dserve::cli::kFp8WeightsHelp)
      ->capture_default_str()
      ->check(CLI::IsMember({"fp8", "bf16"}));
}

int run(int argc, char** argv) {
  CLI::App app{"dserve: an LLM inference engine"};
  app.require_subcommand(1);

  dserve::cli::GenerateOptions gen;
  CLI::App* generate =
      app.add_subcommand("generate", "continue a prompt, streaming text to stdout");
  add_common_options(generate, &gen.common);
  dserve::cli::add_tensor_parallel_options(generate, &gen.tp);
  generate->add_option("--prompt", gen.prompt, "prompt text");
  generate->add_option("--prompt-ids", gen.prompt_ids,
                       "prompt as token ids, e.g. 1,2,3 (instead of --prompt)");
  generate->add_option("--max-tokens", gen.max_tokens, "tokens to generate at most (default 128)");
  generate->add_option("--temperature", gen.sampling.temperature,
                       "sampling temperature; 0: greedy (default 1)");
  generate->add_option("--top-p", gen.sampling.top_p, "nucleus sampling mass (default 1: off)");
  generate->add_option("--top-k", gen.sampling.top_k,
                       "sample among the k best tokens (default 0 or -1: off)");
  generate->add_option("--min-p", gen.sampling.min_p,
                       "drop tokens below this fraction of the best one's probability "
                       "(default 0: off)");
  generate->add_option("--repetition-penalty", gen.sampling.repetition_penalty,
                       "penalise tokens of the prompt and output, > 0 (default 1: off)");
  generate->add_option("--frequency-penalty", gen.sampling.frequency_penalty,
                       "subtract this times each output token's count, in [-2, 2] (default 0)");
  generate->add_option("--presence-penalty", gen.sampling.presence_penalty,
                       "subtract this from tokens already output, in [-2, 2] (default 0)");
  generate->add_option("--stop", gen.sampling.stop,
                       "stop before this text, not printing it (repeatable)")
      ->allow_extra_args(false);
  generate->add_option("--min-tokens", gen.sampling.min_tokens,
                       "generate at least this many tokens before a stop id may end the output "
                       "(default 0)");
  generate->add_option("--seed", gen.seed, "random seed (default 0)");
  generate->add_flag("--ignore-eos", gen.ignore_eos, "do not stop at end-of-sequence tokens");
  generate->add_flag("--print-ids", gen.print_ids, "print generated token ids instead of text");

  dserve::cli::PerplexityOptions ppl;
  CLI::App* perplexity = app.add_subcommand("perplexity", "score a text and print its perplexity");
  add_common_options(perplexity, &ppl.common);
  dserve::cli::add_tensor_parallel_options(perplexity, &ppl.tp);
  perplexity->add_option("--file", ppl.file, "text file to score");
  perplexity->add_option("--token-ids", ppl.token_ids_file,
                         "file of token ids to score (instead of --file)");
  perplexity->add_option(
      "--ctx", ppl.ctx,
      "window length in tokens (default: the whole input, up to the model's context)");
  perplexity->add_option("--batch", ppl.batch, "tokens per forward pass (default 512)");
  perplexity->add_option("--logprobs-out", ppl.logprobs_out,
                         "write per-position log-probabilities to this JSON file");

  dserve::cli::BenchThroughputOptions bt;
  CLI::App* bench_cmd = app.add_subcommand("bench", "benchmarks");
  bench_cmd->require_subcommand(1);
  CLI::App* throughput = bench_cmd->add_subcommand(
      "throughput", "offline throughput: N prompts at once through the engine (as vLLM's)");
  add_common_options(throughput, &bt.common);
  throughput->add_option("--dataset-name", bt.dataset_name, "random or sharegpt (default random)")
      ->check(CLI::IsMember({"random", "sharegpt"}));
  throughput->add_option("--dataset-path", bt.dataset_path, "ShareGPT JSON file");
  throughput->add_option("--num-prompts", bt.num_prompts, "number of prompts (default 100)");
  throughput->add_option("--input-len", bt.input_len, "random: prompt tokens (default 1024)");
  throughput->add_option("--output-len", bt.output_len,
                         "tokens to generate per prompt (default: 128 for random, the reply's length for sharegpt)");
  throughput->add_option("--seed", bt.seed, "dataset seed (default 0)");
  throughput->add_option("--max-num-seqs", bt.max_num_seqs, "running requests at most (256)");
  throughput->add_option("--max-num-batched-tokens", bt.max_num_batched_tokens,
                         "tokens per step at most (2048)");
  throughput->add_option("--block-size", bt.block_size, "tokens per KV block (16)");
  throughput->add_option("--kv-cache-memory", bt.kv_cache_memory,
                         "bytes for the KV cache (default 0: 1 GiB, or less where 0.9 of "
                         "the memory limit leaves less)");
  dserve::cli::add_kv_cache_dtype_option(throughput, &bt.kv_cache_dtype);
  throughput->add_option("--max-model-len", bt.max_model_len,
                         "prompt + output tokens at most (default: input + output length)");
  throughput->add_flag("--no-enable-prefix-caching", bt.no_enable_prefix_caching,
                       "do not reuse cached prefix blocks");
  throughput->add_flag("--identical-requests", bt.identical_requests,
                       "every request the first one's prompt and sampling seed, so that all "
                       "streams stay the same (as llama-batched-bench's parallel sequences); "
                       "with --no-enable-prefix-caching each still computes its prompt");
  throughput->add_flag("--warmup", bt.warmup,
                       "run requests of the same kind (other prompts) once before the timed "
                       "run, as llama-bench's warm-up pass");
  throughput->add_option("--output-json", bt.output_json, "also write the results here");
  dserve::cli::BenchServeOptions bs;
  CLI::App* bench_serve = dserve::cli::add_bench_serve_command(bench_cmd, &bs);

  dserve::cli::ServeOptions so;
  CLI::App* serve = dserve::cli::add_serve_command(app, &so);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "dserve: error: %s (see dserve --help)\n", e.what());
    return 2;
  }

  if (bench_serve->parsed()) return dserve::cli::run_bench_serve(bs);
  if (serve->parsed()) {
    dserve::set_log_level(so.common.log_level);
    return dserve::cli::run_serve(std::move(so));
  }
  CommonOptions& common =
      generate->parsed() ? gen.common : (throughput->parsed() ? bt.common : ppl.common);
  dserve::set_log_level(common.log_level);
  if (generate->parsed()) return dserve::cli::run_generate(gen);
  if (throughput->parsed()) return dserve::cli::run_bench_throughput(bt);
  return dserve::cli::run_perplexity(ppl);
}

}  // namespace

int main(int argc, char** argv) {
  // Library code reports failures as Status; this only catches what the standard
  // library throws (allocation failure) so that it too ends as one line.
  try {
    dserve::cli::remember_command_line(argc, argv);
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dserve: error: %s\n", e.what());
    return 1;
  }
}
