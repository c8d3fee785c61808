// The data-parallel flags of `dserve serve`, with vLLM's names and meanings:
//   --data-parallel-size N        engines in all (each itself --tensor-parallel-size ranks)
//   --data-parallel-size-local L  engines on this node (default: all N, one node)
//   --data-parallel-start-rank S  the first rank on this node (a headless node's ranks are
//                                 S..S+L-1; the API server's node has ranks 0..L-1)
//   --data-parallel-address A     the API server's node, where headless nodes connect
//   --data-parallel-rpc-port P    the port the API server's node listens on for them
//   --headless                    run engines only, serving the API server at A:P
//   --engine-heartbeat-timeout S  a node (or the API server) silent this long is lost
//   --engine-step-timeout S       an engine with work that finishes no step this long
//                                 is lost (engine/node_watch.h)
// and --additional-config
// (JSON; vLLM's platform-specific settings, which mean nothing to the CPU backend: each
// key is logged as ignored). --enable-expert-parallel is a tensor-parallel flag
// (cli/tensor_parallel.h); with --data-parallel-size > 1 the routed experts are dealt
// out over every rank of every engine and the engines step in lockstep
// (cli/expert_parallel.h).
//
// Thread-safety: main thread only.
#pragma once

#include <string>

#include "base/status.h"
#include "cli/tensor_parallel.h"

namespace CLI {
class App;
}

namespace dserve::cli {

struct DataParallelOptions {
  int size = 1;
  int size_local = -1;  // -1: not given (then all of them)
  int start_rank = 0;
  std::string address;
  int rpc_port = 29550;  // vLLM's default
  bool headless = false;
  double heartbeat_timeout_s = 3.0;
  double step_timeout_s = 60.0;
  bool enable_expert_parallel = false;  // --enable-expert-parallel (a tensor-parallel flag), copied
  std::string additional_config;  // JSON object
};

void add_data_parallel_options(CLI::App* cmd, DataParallelOptions* o);

// Checks the flags together (and --tensor-parallel-size), fills in size_local, and
// logs --additional-config's keys as ignored (once); one clear error otherwise.
Status validate_data_parallel(DataParallelOptions* o, int tensor_parallel_size);

// Data-parallel engines that are themselves tensor-parallel: every engine is its own
// group of --tensor-parallel-size ranks on its node, meeting at 127.0.0.1 on
// --master-port + its data-parallel rank (so a node's engines do not share a port);
// with --enable-expert-parallel every rank of every engine also joins the
// expert-parallel group (cli/expert_parallel.h). The tensor-parallel options of
// engine `dp_rank`.
TensorParallelOptions engine_tensor_parallel(const TensorParallelOptions& tp, const DataParallelOptions& dp,
                                             int dp_rank);

}  // namespace dserve::cli
