// `dserve serve [MODEL]`: the OpenAI-compatible server, with vLLM's flag names and
// meanings. Loads the model, starts the engine thread and the HTTP server, and on
// SIGTERM/SIGINT stops accepting (/health 503), lets running requests finish for up to
// --shutdown-timeout seconds, aborts the rest and exits 0; a second signal exits at once.
// Thread-safety: called from main's thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/cli_common.h"
#include "cli/data_parallel.h"
#include "cli/tensor_parallel.h"

namespace dserve::cli {

struct ServeOptions {
  CommonOptions common;
  TensorParallelOptions tp;
  DataParallelOptions dp;
  std::string host = "0.0.0.0";
  int port = 8000;
  std::string api_key;  // also $DSERVE_API_KEY
  bool disable_ui = false;  // --disable-ui: no chat page at /
  std::string audit_log;          // --audit-log FILE: one JSON line per request
  std::string log_format = "text";  // --log-format text|json
  std::vector<std::string> served_model_name;
  int max_model_len = 0;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int block_size = 16;
  double gpu_memory_utilization = 0.0;
  int64_t kv_cache_memory = 0;  // 0: 1 GiB, or less under a tight memory limit
  std::string kv_cache_dtype = "auto";  // auto (float16), float16 or float32
  std::optional<uint64_t> seed;
  std::string dtype = "auto";
  std::string quantization;
  bool enable_prefix_caching = true;
  std::string speculative_config;  // vLLM's JSON; empty: off
  double log_stats_interval = 10.0;  // seconds between stats lines; --disable-log-stats: 0
  std::string chat_template;
  std::string reasoning_parser;
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;  // deepseek_v3, deepseek_r1, deepseek_v31, hermes
  bool trust_remote_code = false;
  double shutdown_timeout = 30.0;
  size_t max_body_bytes = size_t{32} << 20;
  // The HTTP front end (server/http_server.h).
  int64_t max_waiting_requests = -1;  // < 0: unlimited
  int max_connections = 4096;
  int http_io_threads = 2;
  double request_head_timeout = 10.0;
  double request_body_timeout = 60.0;
  double keep_alive_timeout = 5.0;
  size_t max_header_bytes = 16 << 10;
  int max_header_fields = 100;
  std::string ssl_keyfile, ssl_certfile;
  // Capabilities not built yet: any value but the default fails with a clear message.
  int pipeline_parallel_size = 1;
};

// Registers `serve` and its flags on `app`.
CLI::App* add_serve_command(CLI::App& app, ServeOptions* options);
int run_serve(ServeOptions options);

}  // namespace dserve::cli
