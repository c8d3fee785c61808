// `dserve bench serve`: an online load generator for any OpenAI-compatible server, with
// the options, metrics, summary table and JSON result of vLLM's `vllm bench serve`.
//
// Prompts come from bench_datasets (random, sharegpt, prefix-repetition); they are sent
// as streaming /v1/completions or /v1/chat/completions requests, arriving all at once
// (--request-rate inf) or as a Poisson / gamma process, at most --max-concurrency at a
// time. One thread schedules the arrivals and drives every stream (HttpStreamClient on
// libcurl's multi interface), timestamping each SSE chunk for TTFT, ITL, TPOT and E2EL
// (bench_metrics). Failed requests are counted and listed, never fatal.
//
// Thread-safety: run from main's thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dserve::cli {

// The command line as given; validated once into an immutable plan by run_bench_serve.
struct BenchServeOptions {
  std::string backend = "openai";  // "openai" (/v1/completions) or "openai-chat"
  std::string base_url;            // e.g. http://host:8000; else --host / --port
  std::string host;                // default 127.0.0.1
  int port = 0;                    // default 8000
  std::string endpoint;            // default by backend
  std::string model;               // sent as "model"; empty: the server's first /v1/models
  std::string served_model_name;   // sent instead of --model when given
  std::string tokenizer;           // model path for token counts; default: see .cc
  std::string dataset_name = "random";
  std::string dataset_path;
  int num_prompts = 1000;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  std::optional<int> max_concurrency;
  int random_input_len = 1024;
  int random_output_len = 128;
  double random_range_ratio = 0.0;
  int random_prefix_len = 0;
  std::optional<int> sharegpt_output_len;
  int prefix_repetition_prefix_len = 256;
  int prefix_repetition_suffix_len = 256;
  int prefix_repetition_num_prefixes = 10;
  int prefix_repetition_output_len = 128;
  bool ignore_eos = false;
  std::optional<double> temperature;  // sent only when given
  uint64_t seed = 0;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  std::vector<std::string> goodput;  // "ttft:500" ...
  bool save_result = false;
  std::string result_dir;
  std::string result_filename;
  std::string api_key;  // default: $OPENAI_API_KEY
  bool disable_tqdm = false;
  std::string log_level = "warning";
};

// Adds the `serve` subcommand and its options (vLLM's names) under `bench`.
CLI::App* add_bench_serve_command(CLI::App* bench, BenchServeOptions* options);

// Returns the process exit code; errors are reported as one line on stderr. Failed
// requests are not errors: they are counted in the result.
int run_bench_serve(const BenchServeOptions& options);

// Send times in seconds from the start, as vLLM schedules them: the first at 0, then
// gaps drawn from a gamma distribution with shape = burstiness and mean 1 / rate
// (burstiness 1: a Poisson process); all 0 for an infinite rate.
std::vector<double> arrival_times(int n, double request_rate, double burstiness, uint64_t seed);

}  // namespace dserve::cli
