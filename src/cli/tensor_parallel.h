// Starting a tensor-parallel group from the command line: the flags (vLLM's
// --tensor-parallel-size, torchrun's --nnodes/--node-rank/--master-addr/--master-port,
// --distributed-timeout), the ranks this machine runs (the launching process is the
// node's first rank and re-executes the dserve binary for the others, each with the
// same command line plus the hidden --tp-rank), and loading the model on every rank.
//
// Across machines each node runs the same command with its own --node-rank; ranks
// node_rank * (size / nnodes) ... are started there. Rank 0 (node 0) serves the
// rendezvous at --master-addr:--master-port and drives the model; every other rank
// follows it (model/tp_causal_lm.h).
//
// Thread-safety: main thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "base/status.h"
#include "loader/model_files.h"
#include "model/causal_lm.h"

namespace CLI {
class App;
}

namespace dserve::cli {

struct TensorParallelOptions {
  int size = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_s = 300;
  int rank = -1;  // hidden --tp-rank: set on the processes a launcher started
  // Hidden --tp-dp-rank: the data-parallel engine whose tensor-parallel group this is
  // (-1: none). A launcher passes it on to the ranks it starts, so that they join
  // their engine's group (cli/data_parallel.h: engine_tensor_parallel).
  int dp_rank = -1;
  // --enable-expert-parallel: DeepSeek's routed experts dealt out whole over the ranks
  // instead of each cut by width (model/deepseek_model.h).
  bool expert_parallel = false;
  // --expert-dispatch-dtype: the element type of the rows expert parallelism over
  // data-parallel engines exchanges ("float32" or "bfloat16").
  std::string expert_dispatch_dtype = "float32";
  ExpertWire expert_wire() const {
    return expert_dispatch_dtype == "bfloat16" ? ExpertWire::kBf16 : ExpertWire::kF32;
  }
  // With expert_parallel over data-parallel engines (dp_rank >= 0 and
  // expert_dp_size > 1): every rank also joins the expert-parallel group of all
  // expert_dp_size x size ranks, as rank dp_rank * size + its rank, meeting at
  // expert_addr:expert_port (cli/expert_parallel.h: engine_expert_group).
  int expert_dp_size = 1;
  std::string expert_addr;
  int expert_port = 0;
};

void add_tensor_parallel_options(CLI::App* cmd, TensorParallelOptions* o);

// Checks the flags together: a size of at least 1 that --nnodes divides, --node-rank
// among the nodes, a port, a positive timeout; one clear error naming the flag.
Status validate_tensor_parallel(const TensorParallelOptions& o);

// The command line this process was started with (main calls it first), so that the
// launcher can start the other ranks with the same one.
void remember_command_line(int argc, char** argv);

// Loads files as this process's rank of the group the options describe. Rank 0 (and a
// group of one) gets the model back: with several ranks a driver whose every call the
// other ranks follow. Any other rank serves rank 0 inside this call and then ends the
// process (exit status 0 when rank 0 shut down normally, 1 with one error line
// otherwise); it never returns. `fingerprint` is what must match on every rank
// (compared at rendezvous).
Result<std::unique_ptr<CausalLm>> load_model_on_ranks(const TensorParallelOptions& o,
                                                      std::unique_ptr<ModelFiles> files,
                                                      Backend& backend, int64_t context,
                                                      const std::string& fingerprint);

}  // namespace dserve::cli
