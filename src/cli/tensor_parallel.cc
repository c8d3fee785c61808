#include "cli/tensor_parallel.h"

#include <numa.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/log.h"
#include "cli/cli_common.h"
#include "dist/counting_communicator.h"
#include "dist/gloo_communicator.h"
#include "model/tp_causal_lm.h"

namespace dserve::cli {
namespace {

// One rank per NUMA node when the machine has several: the node's i-th rank runs on
// node i % n_nodes and takes its memory there, so a decode reads its weight shard
// from local memory instead of across the interconnect. CPU affinity and memory
// policy survive exec, so a launcher calls this in the child before exec and for itself.
// Returns the node, or -1 on a machine with one node (nothing to do).
int bind_to_numa_node(int local_index) {
  if (numa_available() < 0) return -1;
  const int nodes = numa_num_configured_nodes();
  if (nodes <= 1) return -1;
  const int node = local_index % nodes;
  if (numa_run_on_node(node) != 0) return -1;
  struct bitmask* mask = numa_allocate_nodemask();
  numa_bitmask_setbit(mask, static_cast<unsigned>(node));
  numa_set_membind(mask);
  numa_free_nodemask(mask);
  return node;
}

std::vector<std::string>& command_line() {
  static std::vector<std::string> args;
  return args;
}

// The other ranks of this node, as child processes. They die with the launcher
// (PR_SET_PDEATHSIG), so a launcher that fails leaves no rank running; on a normal
// end the launcher waits for them.
class LocalRanks final : public RankWatcher {
 public:
  explicit LocalRanks(int dp_rank) : dp_rank_(dp_rank) {}
  ~LocalRanks() override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (const auto& [rank, pid] : children_) {
      if (reaped_.count(pid) != 0) continue;
      int status = 0;
      while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() >= deadline) {
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        DS_LOG_WARN("tensor-parallel rank {} (pid {}) ended with status {}", rank, pid, status);
      }
    }
  }

  std::string dead_ranks() override {
    // The peer's socket closes as it dies, a moment before it can be reaped.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    std::string dead;
    do {
      for (const auto& [rank, pid] : children_) {
        int status = 0;
        if (reaped_.count(pid) == 0 && ::waitpid(pid, &status, WNOHANG) == pid) reaped_[pid] = status;
        auto it = reaped_.find(pid);
        if (it == reaped_.end() || dead.find("rank " + std::to_string(rank) + " ") != std::string::npos) continue;
        const int st = it->second;
        dead += (dead.empty() ? "" : ", ") + std::string("rank ") + std::to_string(rank) + " (pid " +
                std::to_string(pid) + ") " +
                (WIFSIGNALED(st) ? "was killed by signal " + std::to_string(WTERMSIG(st))
                                 : "exited with status " + std::to_string(WEXITSTATUS(st)));
      }
      if (!dead.empty()) return dead;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < deadline);
    return dead;
  }

  Status spawn(int rank, int local_index) {
    std::vector<std::string> args = command_line();
    args.push_back("--tp-rank");
    args.push_back(std::to_string(rank));
    if (dp_rank_ >= 0) {
      args.push_back("--tp-dp-rank");
      args.push_back(std::to_string(dp_rank_));
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return io_error("fork failed starting tensor-parallel rank " + std::to_string(rank));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl
      bind_to_numa_node(local_index);
      ::execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "dserve: error: rank %d: cannot start /proc/self/exe\n", rank);
      ::_exit(127);
    }
    children_.emplace_back(rank, pid);
    return Status::Ok();
  }

 private:
  const int dp_rank_;  // passed on as --tp-dp-rank (-1: none)
  std::vector<std::pair<int, pid_t>> children_;
  std::map<pid_t, int> reaped_;  // wait status of children already reaped
};


[[noreturn]] void end_worker(int rank, const Status& s) {
  if (s.ok()) std::exit(0);
  Status named = s.message().rfind("rank ", 0) == 0 ? s : s.with_context("rank " + std::to_string(rank));
  std::exit(report_error(named));
}

}  // namespace

Status validate_tensor_parallel(const TensorParallelOptions& o) {
  if (o.size < 1) return invalid_argument("--tensor-parallel-size must be at least 1");
  if (o.nnodes < 1 || o.size % o.nnodes != 0) {
    return invalid_argument("--nnodes " + std::to_string(o.nnodes) + " must divide --tensor-parallel-size " +
                            std::to_string(o.size));
  }
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    return invalid_argument("--node-rank " + std::to_string(o.node_rank) + " is outside [0, " +
                            std::to_string(o.nnodes) + ")");
  }
  if (o.master_port < 1 || o.master_port > 65535) return invalid_argument("--master-port must be in 1..65535");
  if (!(o.timeout_s > 0)) return invalid_argument("--distributed-timeout must be positive");
  return Status::Ok();
}

void add_tensor_parallel_options(CLI::App* cmd, TensorParallelOptions* o) {
  cmd->add_option("--tensor-parallel-size", o->size,
                  "split the model over this many ranks (processes); this machine starts its share")
      ->capture_default_str();
  cmd->add_option("--nnodes", o->nnodes, "machines the ranks are spread over (torchrun's name)")
      ->capture_default_str();
  cmd->add_option("--node-rank", o->node_rank, "this machine's index among --nnodes")->capture_default_str();
  cmd->add_option("--master-addr", o->master_addr, "address of node 0, where the ranks meet")
      ->capture_default_str();
  cmd->add_option("--master-port", o->master_port, "port of the rendezvous on node 0")->capture_default_str();
  cmd->add_option("--distributed-timeout", o->timeout_s,
                  "seconds a rank waits for the others at start-up and in any one collective")
      ->capture_default_str();
  cmd->add_flag("--enable-expert-parallel", o->expert_parallel,
                "give each rank whole routed experts (1/N of them) instead of 1/N of every expert");
  cmd->add_option("--expert-dispatch-dtype", o->expert_dispatch_dtype,
                  "element type of the token rows expert parallelism sends between data-parallel "
                  "engines: float32 (results equal one process's) or bfloat16 (half the bytes)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  cmd->add_option("--tp-rank", o->rank, "(internal) this process's rank, set by the launcher")->group("");
  cmd->add_option("--tp-dp-rank", o->dp_rank, "(internal) the data-parallel engine of this rank's group")
      ->group("");
}

void remember_command_line(int argc, char** argv) {
  command_line().assign(argv, argv + argc);
}

Result<std::unique_ptr<CausalLm>> load_model_on_ranks(const TensorParallelOptions& o,
                                                      std::unique_ptr<ModelFiles> files, Backend& backend,
                                                      int64_t context, const std::string& fingerprint) {
  DS_RETURN_IF_ERROR(validate_tensor_parallel(o));
  if (o.size == 1) return load_causal_lm(std::move(files), backend, context);

  const int per_node = o.size / o.nnodes;
  const int first = o.node_rank * per_node;
  const bool launcher = o.rank < 0;
  const int rank = launcher ? first : o.rank;
  if (!launcher && (rank < first || rank >= first + per_node)) {
    return invalid_argument("--tp-rank " + std::to_string(rank) + " is not one of this node's ranks");
  }

  dist::GroupOptions group;
  group.rank = rank;
  group.world_size = o.size;
  group.master_addr = o.master_addr;
  group.master_port = o.master_port;
  group.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  group.fingerprint = fingerprint + " tp=" + std::to_string(o.size) + " nnodes=" + std::to_string(o.nnodes) +
                      (o.expert_parallel ? " ep " + o.expert_dispatch_dtype : "");
  // The expert-parallel group over every rank of every data-parallel engine.
  const bool expert_group = o.expert_parallel && o.dp_rank >= 0 && o.expert_dp_size > 1;
  dist::GroupOptions experts;
  if (expert_group) {
    experts.rank = o.dp_rank * o.size + rank;
    experts.world_size = o.expert_dp_size * o.size;
    experts.master_addr = o.expert_addr;
    experts.master_port = o.expert_port;
    experts.timeout = group.timeout;
    experts.fingerprint = group.fingerprint + " dp=" + std::to_string(o.expert_dp_size);
    // Its exchanges are all-to-all: nothing for the shared-memory all-reduce to speed up.
    experts.shared_memory = false;
  }
  std::unique_ptr<LocalRanks> children;
  if (launcher) {
    // Rank 0 takes the port before any other rank starts: a port in use is one error
    // here, with nothing left running.
    if (rank == 0) {
      DS_ASSIGN_OR_RETURN(group.server, dist::TcpStoreServer::start("", o.master_port));
    }
    if (expert_group && experts.rank == 0) {
      DS_ASSIGN_OR_RETURN(experts.server, dist::TcpStoreServer::start("", o.expert_port));
    }
    children = std::make_unique<LocalRanks>(o.dp_rank);
    if (const int node = bind_to_numa_node(0); node >= 0) {
      DS_LOG_INFO("{} ranks on this machine, one per NUMA node of {}", per_node, numa_num_configured_nodes());
    }
    for (int r = first + 1; r < first + per_node; ++r) DS_RETURN_IF_ERROR(children->spawn(r, r - first));
  }
  Result<std::unique_ptr<dist::Communicator>> comm = dist::connect_gloo(std::move(group));
  if (!comm.ok()) {
    if (rank != 0) end_worker(rank, comm.status());
    return comm.status();
  }
  // Calls and time per collective, for the share of a run spent communicating (logged
  // with the model's stats at --log-level info).
  *comm = std::make_unique<dist::CountingCommunicator>(std::move(*comm));
  // Every rank joins after its own engine's group is whole, so a rank of another engine
  // that never arrives is named by this group's rendezvous, not the engine's.
  std::unique_ptr<dist::Communicator> expert_comm;
  if (expert_group) {
    Result<std::unique_ptr<dist::Communicator>> e = dist::connect_gloo(std::move(experts));
    if (!e.ok()) {
      Status s = e.status().with_context("expert-parallel group of every engine's ranks");
      if (rank != 0) end_worker(rank, s);
      return s;
    }
    expert_comm = std::move(e).value();
  }
  Result<std::unique_ptr<CausalLm>> local = load_causal_lm(std::move(files), backend, context, comm->get(),
                                                           o.expert_parallel, expert_comm.get(),
                                                           o.expert_wire());
  if (rank != 0) {
    if (!local.ok()) end_worker(rank, local.status());
    Status s = run_tp_worker(**local, **comm);
    local->reset();
    expert_comm.reset();
    children.reset();
    end_worker(rank, s);
  }
  if (!local.ok()) return local.status();
  return make_tp_driver(std::move(*local), std::move(*comm), std::move(children), std::move(expert_comm));
}

}  // namespace dserve::cli
