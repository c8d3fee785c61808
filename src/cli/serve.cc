#include "cli/serve.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>

#include "base/log.h"
#include "base/log_format.h"
#include "chat/chat_template.h"
#include "chat/chat_template_source.h"
#include "cli/expert_parallel.h"
#include "dserve/async_llm.h"
#include "engine/dp_engine_client.h"
#include "engine/headless_engines.h"
#include "server/audit_log.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/serving.h"
#include "server/stats_logger.h"
#include "spec/speculative_config.h"
#include "tokenizer/tokenizer.h"

namespace dserve::cli {

namespace {
// Timeouts above this (11.6 days) are refused: they are mistakes, and far larger ones
// overflow the clocks' tick counts.
constexpr double kMaxTimeoutSeconds = 1e6;
}  // namespace

CLI::App* add_serve_command(CLI::App& app, ServeOptions* o) {
  CLI::App* cmd = app.add_subcommand("serve", "serve the OpenAI-compatible HTTP API");
  cmd->add_option("model_tag", o->common.model,
                  "model: a .gguf file or a Hugging Face directory (default: the default model)");
  cmd->add_option("--model", o->common.model, "the same as the positional MODEL");
  cmd->add_option("--host", o->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "port to listen on")->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->api_key,
                  "require `Authorization: Bearer KEY` on /v1 routes (also $DSERVE_API_KEY)")
      ->check(CLI::Validator(
          [](std::string& key) -> std::string {
            // An empty key would turn authentication off without a word.
            return key.empty() ? "the API key must not be empty (leave --api-key out to "
                                 "serve without authentication)"
                               : "";
          },
          "non-empty"));
  cmd->add_flag("--disable-ui", o->disable_ui,
                "serve no chat page at / (it is a 404 then; the API is unchanged)");
  cmd->add_option("--served-model-name", o->served_model_name,
                  "model name(s) clients use; the first is reported (default: the model path)");
  cmd->add_option("--max-model-len", o->max_model_len,
                  "prompt + output tokens at most (default 0: the model's context)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "running requests at most")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                  "tokens per engine step at most")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", o->block_size, "tokens per KV-cache block")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "on the CPU: the fraction of the memory limit (the cgroup's, in a container; "
                  "else the machine's memory) dserve may use; the KV cache gets what weights "
                  "and buffers leave (default 0: use --kv-cache-memory)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-memory", o->kv_cache_memory,
                  "bytes for the KV cache (default 0: 1 GiB, or less where 0.9 of the memory "
                  "limit leaves less; more than the limit holds is a start-up error)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  add_kv_cache_dtype_option(cmd, &o->kv_cache_dtype);
  cmd->add_option("--seed", o->seed, "seed for requests that bring none (default: random)");
  cmd->add_option("--dtype", o->dtype, "activation dtype: auto or float32")->capture_default_str();
  cmd->add_option("--fp8-weights", o->common.fp8_weights, kFp8WeightsHelp)
      ->capture_default_str()
      ->check(CLI::IsMember({"fp8", "bf16"}));
  cmd->add_option("--quantization,-q", o->quantization,
                  "weight quantisation: empty (as stored; GGUF, FP8 and W8A8 checkpoints are "
                  "detected), fp8, compressed-tensors (W8A8) or ascend; one the files "
                  "contradict is an error");
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o->enable_prefix_caching,
                "reuse KV blocks of shared prompt prefixes (default on)");
  cmd->add_option("--speculative-config", o->speculative_config,
                  "speculative decoding, as vLLM's JSON: {\"method\": \"ngram\", "
                  "\"num_speculative_tokens\": K, \"prompt_lookup_min\": a, \"prompt_lookup_max\": b} "
                  "or {\"method\": \"deepseek_mtp\", \"num_speculative_tokens\": N}");
  cmd->add_option("--log-stats-interval", o->log_stats_interval,
                  "seconds between the log's throughput and cache lines (as vLLM's "
                  "VLLM_LOG_STATS_INTERVAL)")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag_callback("--disable-log-stats", [o] { o->log_stats_interval = 0; },
                         "no periodic stats lines in the log");
  cmd->add_option("--chat-template", o->chat_template,
                  "a Jinja chat template file (or the template itself) instead of the model's");
  cmd->add_option("--reasoning-parser", o->reasoning_parser,
                  "split reasoning into reasoning_content: deepseek_r1")
      ->check(CLI::IsMember({"deepseek_r1"}));
  cmd->add_flag("--enable-auto-tool-choice", o->enable_auto_tool_choice,
                "let the model call tools on its own (tool_choice \"auto\"); needs "
                "--tool-call-parser");
  cmd->add_option("--tool-call-parser", o->tool_call_parser,
                  "the model's tool-call format: deepseek_v3 / deepseek_r1, deepseek_v31, hermes "
                  "(Qwen2.5, SmolLM)")
      ->check(CLI::IsMember(server::tool_call_parser_names()));
  cmd->add_flag("--trust-remote-code", o->trust_remote_code,
                "accepted for vLLM compatibility; dserve never runs model code");
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout,
                  "seconds running requests may take to finish after SIGTERM (0 to 1e6; a "
                  "second SIGTERM exits at once)")
      ->capture_default_str()->check(CLI::Range(0.0, kMaxTimeoutSeconds));
  cmd->add_option("--max-body-bytes", o->max_body_bytes,
                  "larger request bodies get HTTP 413 (every framing, checked as bytes arrive)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-waiting-requests", o->max_waiting_requests,
                  "completions waiting beyond the --max-num-seqs running at most; more get "
                  "HTTP 503 with Retry-After (default -1: unlimited)")
      ->capture_default_str()->check(CLI::Range(int64_t{-1}, int64_t{1} << 40));
  cmd->add_option("--max-connections", o->max_connections,
                  "open HTTP connections at most; more get HTTP 503 with Retry-After")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--http-io-threads", o->http_io_threads,
                  "threads running every HTTP connection's I/O")
      ->capture_default_str()->check(CLI::Range(1, 64));
  cmd->add_option("--request-head-timeout", o->request_head_timeout,
                  "seconds from a request's first byte to the end of its header (else 408)")
      ->capture_default_str()->check(CLI::Range(0.001, kMaxTimeoutSeconds));
  cmd->add_option("--request-body-timeout", o->request_body_timeout,
                  "seconds from a request's header to the end of its body (else 408)")
      ->capture_default_str()->check(CLI::Range(0.001, kMaxTimeoutSeconds));
  cmd->add_option("--keep-alive-timeout", o->keep_alive_timeout,
                  "seconds an idle keep-alive connection stays open")
      ->capture_default_str()->check(CLI::Range(0.001, kMaxTimeoutSeconds));
  cmd->add_option("--max-header-bytes", o->max_header_bytes,
                  "request line and header fields at most, in bytes (else 431)")
      ->capture_default_str()->check(CLI::Range(size_t{256}, size_t{1} << 24));
  cmd->add_option("--max-header-fields", o->max_header_fields,
                  "header fields per request at most (else 431)")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--ssl-certfile", o->ssl_certfile,
                  "serve HTTPS with this PEM certificate (chain); needs --ssl-keyfile")
      ->check(CLI::ExistingFile);
  cmd->add_option("--ssl-keyfile", o->ssl_keyfile, "the PEM private key of --ssl-certfile")
      ->check(CLI::ExistingFile);
  add_tensor_parallel_options(cmd, &o->tp);
  cmd->add_option("--pipeline-parallel-size", o->pipeline_parallel_size,
                  "pipeline-parallel ranks (only 1 so far)")->capture_default_str();
  add_data_parallel_options(cmd, &o->dp);
  cmd->add_option("--threads", o->common.n_threads, "worker threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--audit-log", o->audit_log,
                  "append one JSON line per request (hashes of input and output, key id, "
                  "client, tokens, status, latency) to FILE");
  cmd->add_option("--log-format", o->log_format, "text, or json: one JSON object per log line")
      ->capture_default_str()->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--log-level", o->common.log_level, "debug, info, warning or error")
      ->capture_default_str()->check(CLI::IsMember({"debug", "info", "warning", "warn", "error"}));
  cmd->add_option("--isa", o->common.isa, "force the CPU kernels' instruction set")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512", "neon", "neon-dotprod"}));
  add_device_option(cmd, &o->common.device);
  o->common.log_level = "info";
  return cmd;
}

namespace {

Status thread_error(const char* what, const std::system_error& e) {
  return Status(StatusCode::kResourceExhausted,
                std::string("cannot create ") + what + " (" + e.what() +
                    "): the process or container limits threads (RLIMIT_NPROC, pids.max)");
}

// Flags that name something dserve cannot do yet fail instead of being ignored.
Status check_unbuilt(const ServeOptions& o) {
  auto unbuilt = [](const std::string& what) {
    return unimplemented(what + " is not built yet; run with the default");
  };
  if (o.pipeline_parallel_size != 1) return unbuilt("--pipeline-parallel-size " + std::to_string(o.pipeline_parallel_size));
  if (o.dtype != "auto" && o.dtype != "float32" && o.dtype != "float") {
    return unimplemented("--dtype " + o.dtype +
                         ": the CPU backend computes in float32 (weights stay as stored); use "
                         "auto or float32");
  }
  if (!o.quantization.empty() && o.quantization != "fp8" &&
      o.quantization != "compressed-tensors" && o.quantization != "ascend") {
    return unimplemented("--quantization " + o.quantization +
                         " is not built yet (GGUF quantisations and FP8 checkpoints load as "
                         "stored)");
  }
  return Status::Ok();
}

// --chat-template: a file, else the template text itself (as vLLM). *used gets the
// template and special tokens in effect (for /tokenizer_info).
Result<std::unique_ptr<chat::ChatTemplate>> load_chat_template(const ServeOptions& o,
                                                               const std::string& model_path,
                                                               chat::ChatTemplateSource* used) {
  Result<chat::ChatTemplateSource> found = chat::find_chat_template(model_path);
  chat::ChatTemplateSource src;
  if (found.ok()) src = std::move(found).value();
  if (!o.chat_template.empty()) {
    std::ifstream f(o.chat_template);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      src.source = ss.str();
    } else if (o.chat_template.find("{%") != std::string::npos ||
               o.chat_template.find("{{") != std::string::npos) {
      src.source = o.chat_template;
    } else {
      return not_found("--chat-template " + o.chat_template + ": no such file");
    }
  }
  *used = src;
  if (src.source.empty()) {
    DS_LOG_WARN("{}: no chat template ({}); /v1/chat/completions needs --chat-template",
                model_path, found.ok() ? "empty" : found.status().message());
    return std::unique_ptr<chat::ChatTemplate>();
  }
  Result<std::unique_ptr<chat::ChatTemplate>> t =
      chat::ChatTemplate::create(src.source, src.bos_token, src.eos_token);
  if (!t.ok()) return t.status().with_context("chat template");
  return t;
}

// With --enable-expert-parallel across data-parallel engines: this node's engines'
// places in the expert-parallel group (empty otherwise).
Result<std::vector<std::unique_ptr<dist::Communicator>>> connect_engines(const ServeOptions& o,
                                                                         const engine_msg::NodeConfig& node) {
  if (!node.enable_expert_parallel || node.data_parallel_size == 1) {
    return std::vector<std::unique_ptr<dist::Communicator>>();
  }
  const std::string fingerprint = "model=" + node.model + " --data-parallel-size " +
                                  std::to_string(node.data_parallel_size) + " --tensor-parallel-size " +
                                  std::to_string(node.tensor_parallel_size) + " --block-size " +
                                  std::to_string(node.block_size) + " --dtype " + node.dtype +
                                  " --max-model-len " + std::to_string(node.max_model_len) +
                                  " --expert-dispatch-dtype " + o.tp.expert_dispatch_dtype;
  return connect_expert_parallel(o.dp, fingerprint, o.tp.timeout_s);
}

// The load options of data-parallel engine `dp_rank`: with --tensor-parallel-size > 1
// the engine is its own tensor-parallel group (engine_tensor_parallel).
LlmOptions engine_options(const ServeOptions& o, const std::string& model_path, LlmOptions lo, int dp_rank) {
  if (o.tp.size > 1 && o.dp.size > 1) {
    lo.load_model = [tp = engine_tensor_parallel(o.tp, o.dp, dp_rank), model_path](
                        std::unique_ptr<ModelFiles> files, Backend& backend, int64_t context) {
      return load_model_on_ranks(tp, std::move(files), backend, context,
                                 "serve model=" + model_path + " ctx=" + std::to_string(context));
    };
  }
  return lo;
}

// Engine i of this node: its LLM behind its engine thread. lockstep (null: none): its
// rank in the one-rank-per-engine group; with one tensor-parallel rank per engine
// also the group its MoE layers exchange tokens through (else every rank of the
// engine joins the group of all ranks as it loads: engine_options).
Result<std::unique_ptr<AsyncLlm>> start_engine(const ServeOptions& o, const std::string& model_path, LlmOptions lo,
                                               EngineObserver* observer, dist::Communicator* lockstep) {
  if (lockstep != nullptr && o.tp.size == 1) {
    lo.load_model = [lockstep, wire = o.tp.expert_wire()](std::unique_ptr<ModelFiles> files, Backend& backend, int64_t context) {
      return load_causal_lm(std::move(files), backend, context, nullptr, false, lockstep,
                            wire);
    };
  }
  Result<std::unique_ptr<LLM>> llm = LLM::create(model_path, lo);
  if (!llm.ok()) return llm.status();
  return AsyncLlm::create(std::move(llm).value(), observer, lockstep);
}

// The threads that loaded this node's engines concurrently; see start_engines.
class EngineLoaders {
 public:
  EngineLoaders() = default;
  EngineLoaders(const EngineLoaders&) = delete;
  EngineLoaders& operator=(const EngineLoaders&) = delete;
  ~EngineLoaders() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  // Runs load on a new thread that stays until this object goes. Throws
  // std::system_error when no thread can be made.
  void start(std::function<void()> load) {
    threads_.emplace_back([this, load = std::move(load)] {
      load();
      std::unique_lock<std::mutex> lock(mu_);
      ++n_loaded_;
      loaded_cv_.notify_all();
      cv_.wait(lock, [this] { return released_; });
    });
  }
  // Waits until every load started has run.
  void wait_loaded() {
    std::unique_lock<std::mutex> lock(mu_);
    loaded_cv_.wait(lock, [&] { return n_loaded_ == static_cast<int>(threads_.size()); });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_, loaded_cv_;
  bool released_ = false;  // GUARDED_BY(mu_)
  int n_loaded_ = 0;       // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

// This node's engines (data-parallel ranks start_rank ..), in order. Tensor-parallel
// engines under expert parallelism load concurrently: each engine's ranks join the
// group of every rank while loading, which waits for the node's other engines too.
// Their loading threads then stay (in *loaders, which must outlive the engines): a
// launcher's rank processes die with the thread that started them (PR_SET_PDEATHSIG).
Result<std::vector<std::unique_ptr<AsyncLlm>>> start_engines(
    const ServeOptions& o, const std::string& model_path, const LlmOptions& lo,
    const std::function<EngineObserver*(int)>& observer, std::vector<std::unique_ptr<dist::Communicator>>& lockstep,
    EngineLoaders* loaders) {
  const int n = o.dp.size_local;
  std::vector<Result<std::unique_ptr<AsyncLlm>>> results;
  for (int i = 0; i < n; ++i) results.emplace_back(internal_error("not loaded"));
  auto load = [&](int i) {
    results[i] = start_engine(o, model_path, engine_options(o, model_path, lo, o.dp.start_rank + i), observer(i),
                              lockstep.empty() ? nullptr : lockstep[i].get());
  };
  if (!lockstep.empty() && o.tp.size > 1 && n > 1) {
    try {
      for (int i = 0; i < n; ++i) {
        loaders->start([&load, i] { load(i); });
      }
    } catch (const std::system_error& e) {
      loaders->wait_loaded();  // they borrow `results`; they fail at the rendezvous's timeout
      return thread_error("an engine-loading thread", e);
    }
    loaders->wait_loaded();
  } else {
    for (int i = 0; i < n; ++i) {
      load(i);
      if (!results[i].ok()) break;
    }
  }
  std::vector<std::unique_ptr<AsyncLlm>> engines;
  for (int i = 0; i < n; ++i) {
    if (!results[i].ok()) return results[i].status();
    engines.push_back(std::move(results[i]).value());
  }
  return engines;
}

// `--headless`: this node's engines, serving the API server's node over ZeroMQ until
// it goes away; SIGTERM/SIGINT end them.
int run_headless(const ServeOptions& o, const std::string& model_path, const LlmOptions& lo,
                 const engine_msg::NodeConfig& node, sigset_t signals) {
  // Before the engines (which borrow them), so destroyed after them.
  Result<std::vector<std::unique_ptr<dist::Communicator>>> expert_comms = connect_engines(o, node);
  if (!expert_comms.ok()) return report_error(expert_comms.status());
  HeadlessConfig hc;
  hc.head_address = o.dp.address;
  hc.rpc_port = o.dp.rpc_port;
  hc.start_rank = o.dp.start_rank;
  hc.n_engines = o.dp.size_local;
  hc.node = node;
  hc.startup_timeout_s = o.tp.timeout_s;
  hc.heartbeat_timeout_s = o.dp.heartbeat_timeout_s;
  hc.lockstep = !expert_comms->empty();
  for (const auto& c : *expert_comms) hc.lockstep_groups.push_back(c.get());
  HeadlessEngines headless(hc);
  EngineLoaders loaders;  // outlives the engines
  Result<std::vector<std::unique_ptr<AsyncLlm>>> engines = start_engines(
      o, model_path, lo, [&headless](int i) { return headless.observer(i); }, *expert_comms, &loaders);
  if (!engines.ok()) return report_error(engines.status());
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    headless.stop();
  });
  Status s = headless.run(std::move(engines).value());
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  if (!s.ok()) return report_error(s);
  DS_LOG_INFO("shut down");
  return 0;
}

// $DSERVE_API_KEY when --api-key is not given. Set but empty would silently mean "no
// authentication": refused, as --api-key "".
Status take_api_key_from_env(ServeOptions* o) {
  if (!o->api_key.empty()) return Status::Ok();
  const char* k = std::getenv("DSERVE_API_KEY");
  if (k == nullptr) return Status::Ok();
  if (*k == '\0') {
    return invalid_argument(
        "DSERVE_API_KEY is set but empty; unset it to serve without authentication");
  }
  o->api_key = k;
  return Status::Ok();
}

// The checks of the flags that need no model; applies --log-format and fills in what
// the flags imply.
Status check_serve_flags(ServeOptions* o) {
  if (Status s = take_api_key_from_env(o); !s.ok()) return s;
  if (!set_log_format(o->log_format)) return invalid_argument("--log-format " + o->log_format);
  if (Status s = check_unbuilt(*o); !s.ok()) return s;
  if (o->enable_auto_tool_choice && o->tool_call_parser.empty()) {
    return invalid_argument("--enable-auto-tool-choice requires --tool-call-parser");
  }
  o->dp.enable_expert_parallel = o->tp.expert_parallel;
  return validate_data_parallel(&o->dp, o->tp.size);
}

// Blocks SIGTERM and SIGINT in this thread and so in every thread it starts after: they
// go to one thread that waits for them (the set returned). A SIGPIPE is ignored: a
// write to a closed socket is an error, not a death.
sigset_t block_shutdown_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return signals;
}

// --audit-log's file, open; null without the flag.
Result<std::unique_ptr<server::AuditLog>> open_audit_log(const ServeOptions& o) {
  if (o.audit_log.empty()) return std::unique_ptr<server::AuditLog>();
  return server::AuditLog::open(o.audit_log);
}

// The engines' load options from the flags (engine_options adds a data-parallel
// engine's own). With tensor parallelism alone, load_model reads o.tp: `o` must outlive
// the options.
Result<LlmOptions> llm_options(const ServeOptions& o, const std::string& model_path) {
  LlmOptions lo;
  lo.max_num_seqs = o.max_num_seqs;
  lo.max_num_batched_tokens = o.max_num_batched_tokens;
  lo.block_size = o.block_size;
  lo.kv_cache_memory = o.kv_cache_memory;
  Result<DType> kv_dtype = kv_cache_dtype_from_flag(o.kv_cache_dtype);
  if (!kv_dtype.ok()) return kv_dtype.status();
  lo.kv_cache_dtype = *kv_dtype;
  lo.gpu_memory_utilization = o.gpu_memory_utilization;
  lo.max_model_len = o.max_model_len;
  lo.enable_prefix_caching = o.enable_prefix_caching;
  lo.speculative_config = o.speculative_config;
  if (!o.speculative_config.empty()) {  // refused before the model loads
    Result<spec::SpeculativeConfig> sc = spec::SpeculativeConfig::parse(o.speculative_config);
    if (!sc.ok()) return sc.status();
  }
  lo.seed = o.seed;
  lo.n_threads = o.common.n_threads;
  lo.isa = o.common.isa;
  lo.device = o.common.device;
  // fp8 is how FP8 checkpoints load anyway; the W8A8 formats are checked by the loader.
  lo.quantization = o.quantization == "fp8" ? "" : o.quantization;
  lo.fp8_weights = o.common.fp8_weights;
  if (o.tp.size > 1 && o.dp.size > 1 && o.tp.nnodes != 1) {
    return invalid_argument("--nnodes " + std::to_string(o.tp.nnodes) +
                            " with --data-parallel-size " + std::to_string(o.dp.size) +
                            ": a data-parallel engine's tensor-parallel ranks run on its own "
                            "node (the data-parallel flags place the engines on nodes)");
  }
  if (o.tp.size > 1 && o.dp.size == 1) {
    lo.load_model = [&o, model_path](std::unique_ptr<ModelFiles> files, Backend& backend,
                                     int64_t context) {
      return load_model_on_ranks(o.tp, std::move(files), backend, context,
                                 "serve model=" + model_path + " ctx=" + std::to_string(context));
    };
  }
  return lo;
}

// A tensor-parallel rank its engine's launcher started (--tp-rank under
// --data-parallel-size): it joins that engine's group and follows it inside
// LLM::create until the engine ends (it does not return).
int run_tensor_parallel_worker(const ServeOptions& o, const std::string& model_path,
                               const LlmOptions& lo) {
  if (o.tp.dp_rank < 0 || o.tp.dp_rank >= o.dp.size) {
    return report_error(
        invalid_argument("--tp-rank without a valid --tp-dp-rank under --data-parallel-size"));
  }
  Result<std::unique_ptr<LLM>> llm =
      LLM::create(model_path, engine_options(o, model_path, lo, o.tp.dp_rank));
  return report_error(llm.ok() ? internal_error("a tensor-parallel worker's model load returned")
                               : llm.status());
}

// What every node of a data-parallel deployment must agree on.
engine_msg::NodeConfig node_config(const ServeOptions& o, const std::string& model_path) {
  engine_msg::NodeConfig node;
  node.model = model_path;
  node.data_parallel_size = o.dp.size;
  node.tensor_parallel_size = o.tp.size;
  node.enable_expert_parallel = o.dp.enable_expert_parallel;
  node.block_size = o.block_size;
  node.dtype = o.dtype;
  node.max_model_len = o.max_model_len;
  return node;
}

// The API server's DpEngineClient: over this node's engines and the other nodes' ranks,
// which connect to --data-parallel-rpc-port.
DpEngineClientConfig dp_client_config(const ServeOptions& o, const engine_msg::NodeConfig& node,
                                      const std::vector<std::unique_ptr<dist::Communicator>>& lockstep,
                                      server::ServerMetrics& metrics) {
  DpEngineClientConfig dc;
  dc.data_parallel_size = o.dp.size;
  dc.rpc_port = o.dp.rpc_port;
  dc.node = node;
  dc.startup_timeout_s = o.tp.timeout_s;
  dc.deadlines = {o.dp.heartbeat_timeout_s, o.dp.step_timeout_s};
  dc.lockstep = !lockstep.empty();
  for (const auto& c : lockstep) dc.lockstep_groups.push_back(c.get());
  dc.observer = [&metrics](int rank) { return metrics.engine(rank); };
  return dc;
}

server::ServingConfig serving_config(const ServeOptions& o, const std::string& model_path,
                                     const chat::ChatTemplateSource& template_source) {
  server::ServingConfig sc;
  sc.served_model_names = o.served_model_name;
  sc.model_path = model_path;
  sc.reasoning_deepseek_r1 = o.reasoning_parser == "deepseek_r1";
  if (o.enable_auto_tool_choice) {
    sc.auto_tool_call_format = server::tool_call_format(o.tool_call_parser);
  }
  sc.tokenizer_info = {template_source.bos_token, template_source.eos_token,
                       template_source.source};
  return sc;
}

// Renders chat messages with the template; empty without one (/v1/chat/completions then
// fails).
server::ChatRenderer chat_renderer(std::shared_ptr<chat::ChatTemplate> chat_template) {
  if (!chat_template) return server::ChatRenderer();
  return [chat_template](const nlohmann::ordered_json& messages, bool add_generation_prompt,
                         const nlohmann::ordered_json& kwargs) {
    return chat_template->render(messages, add_generation_prompt, kwargs);
  };
}

server::HttpServerConfig http_config(const ServeOptions& o, server::AuditLog* audit_log) {
  server::HttpServerConfig hc;
  hc.host = o.host;
  hc.port = o.port;
  hc.api_key = o.api_key;
  hc.chat_page = !o.disable_ui;
  hc.limits.max_body_bytes = o.max_body_bytes;
  hc.limits.max_header_bytes = o.max_header_bytes;
  hc.limits.max_header_fields = o.max_header_fields;
  hc.n_io_threads = o.http_io_threads;
  hc.max_connections = o.max_connections;
  hc.max_waiting_requests = o.max_waiting_requests;
  hc.max_num_seqs = o.max_num_seqs * o.dp.size;
  hc.head_timeout_s = o.request_head_timeout;
  hc.body_timeout_s = o.request_body_timeout;
  hc.keep_alive_timeout_s = o.keep_alive_timeout;
  hc.ssl_certfile = o.ssl_certfile;
  hc.ssl_keyfile = o.ssl_keyfile;
  hc.audit_log = audit_log;
  return hc;
}

// Stops new requests, lets the running ones finish for up to shutdown_timeout seconds,
// aborts the rest, and stops the HTTP server.
void drain(EngineClient& engine, server::HttpServer& http, double shutdown_timeout) {
  engine.stop_accepting();
  const auto budget = std::chrono::milliseconds(static_cast<int64_t>(shutdown_timeout * 1000));
  if (!engine.wait_idle(budget)) {
    DS_LOG_WARN("shutdown timeout: aborting the requests still running");
    engine.abort_all();
    engine.wait_idle(std::chrono::seconds(5));
  }
  http.stop();
}

// The signal thread. The first signal drains (on *drain_thread, so that the next signal
// is seen while it waits); a second one exits at once. Returns when woken at exit
// (serving_stopped).
void handle_signals(sigset_t signals, double shutdown_timeout, EngineClient& engine,
                    server::HttpServer& http, const std::atomic<bool>& serving_stopped,
                    std::thread* drain_thread) {
  int sig = 0;
  sigwait(&signals, &sig);
  if (sig == 0 || serving_stopped.load()) return;  // woken by ourselves at exit
  DS_LOG_INFO("signal {}: no new requests; waiting up to {} s for running ones (a second "
              "signal exits at once)", sig, shutdown_timeout);
  http.set_draining(true);
  try {
    *drain_thread =
        std::thread([&engine, &http, shutdown_timeout] { drain(engine, http, shutdown_timeout); });
  } catch (const std::system_error& e) {
    DS_LOG_ERROR("cannot start the drain thread ({}); stopping now", e.what());
    engine.abort_all();
    http.stop();
    return;
  }
  sig = 0;
  sigwait(&signals, &sig);
  if (sig == 0 || serving_stopped.load()) return;
  DS_LOG_WARN("second signal {}: exiting now", sig);
  std::fflush(nullptr);
  std::_Exit(128 + sig);
}

// A failed engine (with tensor parallelism: a rank died) cannot recover: /health says
// 503 for a moment so probes see it, then the server shuts down with an error.
void watch_engine_health(EngineClient& engine, server::HttpServer& http,
                         const std::atomic<bool>& serving_done, std::atomic<bool>* engine_failed) {
  while (!serving_done.load()) {
    if (!engine.healthy()) {
      *engine_failed = true;
      DS_LOG_ERROR("the engine failed; shutting down");
      std::this_thread::sleep_for(std::chrono::seconds(2));
      http.stop();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Serves HTTP until a signal drains the server (for up to shutdown_timeout seconds) or
// the engine fails; returns the exit status.
int serve_until_stopped(server::HttpServer& http, EngineClient& engine, sigset_t signals,
                        double shutdown_timeout) {
  std::thread drain_thread;
  std::atomic<bool> serving_stopped{false};
  // A thread that cannot be made (RLIMIT_NPROC, a container's pids.max) is a clear
  // start-up error, never a hang.
  std::thread signal_thread;
  try {
    signal_thread = std::thread([&] {
      handle_signals(signals, shutdown_timeout, engine, http, serving_stopped, &drain_thread);
    });
  } catch (const std::system_error& e) {
    return report_error(thread_error("the signal-handling thread", e));
  }
  std::atomic<bool> engine_failed{false};
  std::atomic<bool> serving_done{false};
  std::thread health_thread;
  Status s = Status::Ok();
  try {
    health_thread =
        std::thread([&] { watch_engine_health(engine, http, serving_done, &engine_failed); });
  } catch (const std::system_error& e) {
    s = thread_error("the health-watching thread", e);
  }
  if (s.ok()) s = http.run();
  serving_done = true;
  if (health_thread.joinable()) health_thread.join();
  // The signal thread waits for a (first or second) signal: wake it with one.
  serving_stopped = true;
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  if (drain_thread.joinable()) drain_thread.join();
  if (engine_failed.load()) {
    return report_error(internal_error("the engine failed (see the error above); server stopped"));
  }
  if (!s.ok()) return report_error(s);
  DS_LOG_INFO("shut down");
  return 0;
}

// The API server's node: its engines (data-parallel ranks 0..size_local-1) behind one
// EngineClient, the OpenAI API over HTTP in front.
int run_api_server(const ServeOptions& o, const std::string& model_path, const LlmOptions& lo,
                   const engine_msg::NodeConfig& node, sigset_t signals,
                   server::AuditLog* audit_log) {
  // The engines' expert-parallel group (if any) is declared first: the engines borrow
  // it, so it goes after them.
  Result<std::vector<std::unique_ptr<dist::Communicator>>> expert_comms = connect_engines(o, node);
  if (!expert_comms.ok()) return report_error(expert_comms.status());
  server::ServerMetrics metrics(o.served_model_name.front(), o.dp.size);
  EngineLoaders loaders;  // outlives the engines
  Result<std::vector<std::unique_ptr<AsyncLlm>>> engines = start_engines(
      o, model_path, lo, [&metrics](int i) { return metrics.engine(i); }, *expert_comms, &loaders);
  if (!engines.ok()) return report_error(engines.status());
  std::vector<std::unique_ptr<AsyncLlm>> local = std::move(engines).value();
  std::unique_ptr<EngineClient> client;
  if (o.dp.size == 1) {
    client = std::move(local.front());
  } else {
    Result<std::unique_ptr<DpEngineClient>> dp =
        DpEngineClient::create(dp_client_config(o, node, *expert_comms, metrics), std::move(local));
    if (!dp.ok()) return report_error(dp.status());
    if (Status s = (*dp)->wait_for_engines(); !s.ok()) {
      (*dp)->set_shutdown_error(s.message());
      return report_error(s);
    }
    client = std::move(dp).value();
  }
  chat::ChatTemplateSource template_source;
  Result<std::unique_ptr<chat::ChatTemplate>> tmpl =
      load_chat_template(o, model_path, &template_source);
  if (!tmpl.ok()) return report_error(tmpl.status());
  server::OpenAiServing serving(*client, chat_renderer(std::move(tmpl).value()),
                                serving_config(o, model_path, template_source));
  server::HttpServer http(http_config(o, audit_log), serving, metrics);
  std::unique_ptr<server::StatsLogger> stats_logger;
  try {
    stats_logger = std::make_unique<server::StatsLogger>(metrics, o.log_stats_interval);
  } catch (const std::system_error& e) {
    return report_error(thread_error("the stats-logging thread", e));
  }
  return serve_until_stopped(http, *client, signals, o.shutdown_timeout);
}

}  // namespace

int run_serve(ServeOptions o) {
  if (Status s = check_serve_flags(&o); !s.ok()) return report_error(s);
  const std::string model_path = o.common.model.empty() ? default_model_path() : o.common.model;
  if (o.served_model_name.empty()) o.served_model_name.push_back(model_path);
  // Before any thread starts (the audit log's writer too: a SIGTERM delivered to a
  // thread that does not block it kills the process at once, losing the drain and the
  // audit lines not yet written).
  const sigset_t signals = block_shutdown_signals();
  Result<std::unique_ptr<server::AuditLog>> audit_log = open_audit_log(o);
  if (!audit_log.ok()) return report_error(audit_log.status());
  Result<LlmOptions> lo = llm_options(o, model_path);
  if (!lo.ok()) return report_error(lo.status());
  if (o.tp.size > 1 && o.dp.size > 1 && o.tp.rank >= 0) {
    return run_tensor_parallel_worker(o, model_path, *lo);
  }
  const engine_msg::NodeConfig node = node_config(o, model_path);
  if (o.dp.headless) return run_headless(o, model_path, *lo, node, signals);
  return run_api_server(o, model_path, *lo, node, signals, audit_log->get());
}

}  // namespace dserve::cli
