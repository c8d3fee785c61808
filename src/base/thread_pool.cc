#include "base/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "base/check.h"

namespace dserve {
namespace {

// How long an idle thread spins before sleeping or yielding; about the gap between
// two kernels of one decode step.
constexpr int kSpinIterations = 20000;

// claim_ layout: generation (20 bits) | next task (22 bits) | task count (22 bits).
constexpr int kTaskBits = 22;
constexpr uint64_t kTaskMask = (uint64_t{1} << kTaskBits) - 1;
constexpr int64_t kMaxTasks = int64_t{1} << kTaskBits;

inline uint64_t pack(uint64_t generation, uint64_t next, uint64_t count) {
  return (generation << (2 * kTaskBits)) | (next << kTaskBits) | count;
}
inline uint64_t next_of(uint64_t w) { return (w >> kTaskBits) & kTaskMask; }
inline uint64_t count_of(uint64_t w) { return w & kTaskMask; }

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

std::vector<int> ThreadPool::allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < std::max(n, 1L); ++c) cpus.push_back(c);
  }
  return cpus;
}

int ThreadPool::default_thread_count() { return static_cast<int>(allowed_cpus().size()); }

ThreadPool::ThreadPool(int n_threads, bool pin)
    : n_threads_(n_threads > 0 ? n_threads : default_thread_count()) {
  if (pin) pin_cpus_ = allowed_cpus();
  for (int t = 1; t < n_threads_; ++t) {
    workers_.emplace_back([this, t] {
      if (!pin_cpus_.empty()) pin_to_cpu(pin_cpus_[t % pin_cpus_.size()]);
      worker_main(t);
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    epoch_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

int64_t ThreadPool::work(int thread) {
  int64_t n_ran = 0;
  uint64_t w = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (next_of(w) >= count_of(w)) return n_ran;
    // Success means task next_of(w) of the generation in w's top bits is ours, and that
    // job cannot finish (so job_ stays valid) until we report it done.
    if (!claim_.compare_exchange_weak(w, w + (uint64_t{1} << kTaskBits),
                                      std::memory_order_acq_rel, std::memory_order_acquire)) {
      continue;
    }
    (*job_)(static_cast<int64_t>(next_of(w)), thread);
    n_done_.fetch_add(1, std::memory_order_acq_rel);
    ++n_ran;
    w = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_main(int thread) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (epoch_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) {
      cpu_relax();
      ++spins;
    }
    if (epoch_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return epoch_.load() != seen; });
    }
    seen = epoch_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    work(thread);
  }
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
  if (n_tasks <= 0) return;
  if (!pin_cpus_.empty() && std::this_thread::get_id() != pinned_caller_) {
    pin_to_cpu(pin_cpus_[0]);
    pinned_caller_ = std::this_thread::get_id();
  }
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i, 0);
    return;
  }
  DS_CHECK_MSG(n_tasks < kMaxTasks, "too many tasks in one job: %lld",
               static_cast<long long>(n_tasks));
  job_ = &fn;
  n_done_.store(0, std::memory_order_relaxed);
  generation_ = (generation_ + 1) & ((uint64_t{1} << (64 - 2 * kTaskBits)) - 1);
  // Publishing the claim word releases job_ and n_done_ to whoever claims a task.
  claim_.store(pack(generation_, 0, static_cast<uint64_t>(n_tasks)), std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  work(0);
  // A worker may have been descheduled mid-task (more runnable threads than cores):
  // after a short spin, give the core away instead of burning our time slice.
  for (int spins = 0; n_done_.load(std::memory_order_acquire) != n_tasks; ++spins) {
    if (spins < kSpinIterations) cpu_relax();
    else std::this_thread::yield();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  // Four chunks per thread balance uneven progress without much dispatch overhead.
  int64_t n_chunks = std::min<int64_t>((n + grain - 1) / grain, int64_t{n_threads_} * 4);
  n_chunks = std::max<int64_t>(n_chunks, 1);
  int64_t chunk = (n + n_chunks - 1) / n_chunks;
  n_chunks = (n + chunk - 1) / chunk;
  run(n_chunks, [&](int64_t c, int thread) {
    int64_t begin = c * chunk;
    fn(begin, std::min(n, begin + chunk), thread);
  });
}

}  // namespace dserve
