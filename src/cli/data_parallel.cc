#include "cli/data_parallel.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "cli/expert_parallel.h"

namespace dserve::cli {

void add_data_parallel_options(CLI::App* cmd, DataParallelOptions* o) {
  cmd->add_option("--data-parallel-size", o->size,
                  "data-parallel engines in all, over every node (each an engine of "
                  "--tensor-parallel-size ranks); the API server sends each request to the "
                  "least loaded")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--data-parallel-size-local", o->size_local,
                  "data-parallel engines on this node (default: all of them)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--data-parallel-start-rank", o->start_rank,
                  "the data-parallel rank of this node's first engine (with --headless)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--data-parallel-address", o->address,
                  "the address of the API server's node, which headless nodes connect to");
  cmd->add_option("--data-parallel-rpc-port", o->rpc_port,
                  "the port the API server's node listens on for headless nodes' engines")
      ->capture_default_str()->check(CLI::Range(1, 65535));
  cmd->add_flag("--headless", o->headless,
                "run this node's engines only (no API server), serving the API server at "
                "--data-parallel-address:--data-parallel-rpc-port");
  cmd->add_option("--engine-heartbeat-timeout", o->heartbeat_timeout_s,
                  "seconds without a message after which the API server declares a headless node "
                  "lost (its engines' requests move to the engines left, or end with an error), and "
                  "a headless node gives up on a silent API server")
      ->capture_default_str();
  cmd->add_option("--engine-step-timeout", o->step_timeout_s,
                  "seconds a headless node's engine with unfinished requests may go without "
                  "finishing a step before the API server declares it lost (hung, or too slow)")
      ->capture_default_str();
  cmd->add_option("--additional-config", o->additional_config,
                  "a JSON object of platform-specific settings (vLLM's); dserve's CPU backend "
                  "uses none of them and logs each key as ignored");
}

Status validate_data_parallel(DataParallelOptions* o, int tensor_parallel_size) {
  if (!o->additional_config.empty()) {
    nlohmann::json j = nlohmann::json::parse(o->additional_config, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return invalid_argument("--additional-config: not a JSON object: " + o->additional_config);
    }
    for (const auto& [key, value] : j.items()) {
      DS_LOG_WARN("--additional-config: \"{}\" ignored (a platform-specific setting; it means "
                  "nothing to dserve's CPU backend)", key);
    }
  }
  for (const auto& [flag, value] : {std::pair{"--engine-heartbeat-timeout", o->heartbeat_timeout_s},
                                    std::pair{"--engine-step-timeout", o->step_timeout_s}}) {
    // A deadline under a tenth of a second would fire on a busy machine's scheduling delays.
    if (!(value >= 0.1) || !(value <= 86400)) {
      return invalid_argument(std::string(flag) + " " + fmt::format("{}", value) +
                              ": must be between 0.1 and 86400 seconds");
    }
  }
  if (o->size_local < 0) o->size_local = o->headless ? 1 : o->size;
  if (o->size_local > o->size) {
    return invalid_argument("--data-parallel-size-local " + std::to_string(o->size_local) +
                            " is more than --data-parallel-size " + std::to_string(o->size));
  }
  if (o->headless) {
    if (o->address.empty()) {
      return invalid_argument(
          "--headless needs --data-parallel-address: the address of the API server's node, "
          "which this node's engines connect to");
    }
    if (o->size_local < 1) return invalid_argument("--headless needs --data-parallel-size-local >= 1");
    if (o->start_rank + o->size_local > o->size) {
      return invalid_argument("data-parallel ranks " + std::to_string(o->start_rank) + ".." +
                              std::to_string(o->start_rank + o->size_local - 1) +
                              " (--data-parallel-start-rank, --data-parallel-size-local) go past "
                              "--data-parallel-size " + std::to_string(o->size));
    }
  } else {
    if (o->start_rank != 0) {
      return invalid_argument("--data-parallel-start-rank " + std::to_string(o->start_rank) +
                              " without --headless: the API server's node has ranks 0.." +
                              "(--data-parallel-size-local - 1)");
    }
    if (o->size > 1 && o->size_local < 1) {
      return unimplemented("--data-parallel-size-local 0 (an API server without engines) is not "
                           "built yet: the API server's node runs at least one engine");
    }
  }
  if (o->size > 1 && tensor_parallel_size > 1 && o->enable_expert_parallel &&
      expert_group_port(*o) > 65535) {
    return invalid_argument("--enable-expert-parallel with tensor-parallel engines uses --data-parallel-rpc-port "
                            "+ 2 for its expert-parallel group: " + std::to_string(o->rpc_port) +
                            " + 2 is not a port");
  }
  return Status::Ok();
}

TensorParallelOptions engine_tensor_parallel(const TensorParallelOptions& tp, const DataParallelOptions& dp,
                                             int dp_rank) {
  TensorParallelOptions e = tp;
  e.nnodes = 1;
  e.node_rank = 0;
  e.master_addr = "127.0.0.1";
  e.master_port = tp.master_port + dp_rank;
  e.dp_rank = dp_rank;
  if (tp.expert_parallel && dp.size > 1) {
    e.expert_dp_size = dp.size;
    e.expert_addr = dp.address.empty() ? "127.0.0.1" : dp.address;
    e.expert_port = expert_group_port(dp);
  }
  return e;
}

}  // namespace dserve::cli
