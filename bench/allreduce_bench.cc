// All-reduce latency and bandwidth of the Communicator on localhost, for the vectors
// tensor parallelism reduces (one hidden-size row per token), with N ranks as
// processes: through gloo (TCP) and through the shared-memory path, one after the other. A plain program rather than google-benchmark: every rank must run the
// same number of collectives, which a framework's adaptive iteration count breaks.
//   build/bench/allreduce_bench [n_ranks=2] [iterations=2000]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dist/gloo_communicator.h"

namespace {

int run_rank(int rank, int n_ranks, int port, int iterations, bool shared_memory) {
  dserve::dist::GroupOptions o;
  o.rank = rank;
  o.world_size = n_ranks;
  o.master_port = port;
  o.timeout = std::chrono::seconds(60);
  o.shared_memory = shared_memory;
  auto comm = dserve::dist::connect_gloo(std::move(o));
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().message().c_str());
    return 1;
  }
  // Hidden sizes: SmolLM2 (576), Llama-3-8B (4096), DeepSeek-V3/R1 (7168); 1 and 16 tokens.
  for (int hidden : {576, 4096, 7168}) {
    for (int tokens : {1, 16}) {
      std::vector<float> v(static_cast<size_t>(hidden) * tokens, 1.0f);
      for (int i = 0; i < 50; ++i) (void)(*comm)->all_reduce_sum(v);  // warm-up
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iterations; ++i) {
        if (!(*comm)->all_reduce_sum(v).ok()) return 1;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rank == 0) {
        const double us = s / iterations * 1e6;
        const double bytes = static_cast<double>(v.size()) * sizeof(float);
        std::printf("%-13s ranks %d  hidden %5d x %2d tokens  %8.0f bytes  %8.1f us  %7.3f GB/s (algorithm bandwidth)\n",
                    shared_memory ? "shared-memory" : "gloo/tcp", n_ranks, hidden, tokens, bytes, us,
                    bytes / (us * 1e-6) / 1e9);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int n_ranks = argc > 1 ? std::atoi(argv[1]) : 2;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 2000;
  int failed = 0;
  for (bool shared_memory : {false, true}) {
    const int port = 29600 + static_cast<int>(::getpid() % 300) + (shared_memory ? 1 : 0);
    std::vector<pid_t> pids;
    for (int r = 0; r < n_ranks; ++r) {
      pid_t pid = ::fork();
      if (pid == 0) {
        const int code = run_rank(r, n_ranks, port, iterations, shared_memory);
        std::fflush(stdout);  // _exit skips stdio's buffers
        ::_exit(code);
      }
      pids.push_back(pid);
    }
    for (pid_t pid : pids) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
  }
  return failed;
}
