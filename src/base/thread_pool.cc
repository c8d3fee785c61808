#include "base/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace dserve {
namespace {

// How long an idle worker spins before sleeping; about the gap between two kernels
// of one decode step.
constexpr int kSpinIterations = 20000;

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

int ThreadPool::default_thread_count() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

ThreadPool::ThreadPool(int n_threads, bool pin)
    : n_threads_(n_threads > 0 ? n_threads : default_thread_count()) {
  if (pin) pin_to_cpu(0);
  for (int t = 1; t < n_threads_; ++t) {
    workers_.emplace_back([this, t, pin] {
      if (pin) pin_to_cpu(t);
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

void ThreadPool::work(int thread) {
  for (;;) {
    int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) break;
    (*job_)(task, thread);
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
    n_busy_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i, 0);
    return;
  }
  job_ = &fn;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  n_busy_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  work(0);
  // A worker may have been descheduled (more runnable threads than cores): after a
  // short spin, give the core away instead of burning the rest of our time slice.
  for (int spins = 0; n_busy_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kSpinIterations) cpu_relax();
    else std::this_thread::yield();
  }
  job_ = nullptr;
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
