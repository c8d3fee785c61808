// ThreadPool: a fixed set of persistent worker threads that run one parallel job at
// a time. The calling thread takes part as worker 0, so a pool of N threads starts
// N-1 OS threads.
//
// Kernels are dispatched tens of times per token, so waking workers must be cheap:
// workers spin briefly on an atomic epoch before sleeping on a condition variable.
//
// Thread-safety: run() must be called from one thread at a time (the engine thread).
// It returns only when every task of the job has finished.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dserve {

class ThreadPool {
 public:
  // n_threads <= 0 means default_thread_count(). pin: bind worker i to the i-th CPU
  // this process may run on (wrapping around past the last); worker 0 is whichever
  // thread calls run(), pinned when it first does (the engine thread in a server,
  // not the thread that built the pool).
  explicit ThreadPool(int n_threads, bool pin = false);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Runs fn(task, thread) for every task in [0, n_tasks), spread over the workers
  // dynamically. `thread` is in [0, n_threads()) and is stable within one call, so it
  // can index per-thread scratch buffers.
  void run(int64_t n_tasks, const std::function<void(int64_t task, int thread)>& fn);

  // Splits [0, n) into contiguous chunks of at least `grain` elements and runs
  // fn(begin, end, thread) for each.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t begin, int64_t end, int thread)>& fn);

  // One per CPU this process may run on: its affinity mask (taskset, a container's
  // cpuset), not every online CPU.
  static int default_thread_count();
  // Those CPUs, ascending (all online CPUs where the mask cannot be read).
  static std::vector<int> allowed_cpus();

 private:
  void worker_main(int thread);
  // Claims and runs tasks of the current job until none is left; returns how many.
  int64_t work(int thread);

  int n_threads_;
  std::vector<int> pin_cpus_;  // empty: not pinned
  std::thread::id pinned_caller_;  // the last thread run() pinned as worker 0
  std::vector<std::thread> workers_;

  // The current job. `claim_` packs (generation, next task, task count) into one
  // word so that a worker claims a task of exactly the job it read: a late worker
  // can never take a task from a finished job or read half of a new one. run()
  // waits for `n_done_` to reach the task count, not for every worker to check in,
  // so a descheduled worker does not stall the job.
  const std::function<void(int64_t, int)>* job_ = nullptr;
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> n_done_{0};
  uint64_t generation_ = 0;  // engine thread only
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> epoch_{0};  // bumped per job; idle workers wait on it
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace dserve
