// WorkerPool: threads for the blocking part of HTTP requests (parsing a body, the chat
// template, tokenizing, waiting for the engine's output). A thread is made when a task
// finds none idle, up to max_threads, and ends after idle_exit without work, so an idle
// server holds none beyond `n_initial`. There is no queue: a task that finds every
// thread busy (or whose thread cannot be created) is refused, and the caller answers
// 503 rather than letting the request wait unseen inside the HTTP layer.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

#include "base/status.h"

namespace dserve::server {

class WorkerPool {
 public:
  WorkerPool(int max_threads, std::chrono::milliseconds idle_exit);
  // Waits for the running tasks (see shutdown()).
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts `n` idle threads now; the error names the system's reason when it cannot.
  Status start(int n);
  // Runs `task` on an idle or new thread; false when max_threads are busy, a thread
  // cannot be created, or the pool is shut down.
  [[nodiscard]] bool try_run(std::function<void()> task);
  // Refuses new tasks and waits up to `timeout` for the running ones to end; true when
  // every thread has ended. Threads still running then end on their own.
  bool shutdown(std::chrono::milliseconds timeout);

  int n_threads() const;
  int n_busy() const;

 private:
  void work();
  bool spawn_locked();  // REQUIRES(mu_)

  const int max_threads_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, exit_cv_;
  std::deque<std::function<void()>> tasks_;  // GUARDED_BY(mu_); never more than n_idle_
  int n_threads_ = 0;                        // GUARDED_BY(mu_)
  int n_idle_ = 0;                           // GUARDED_BY(mu_)
  bool stopping_ = false;                    // GUARDED_BY(mu_)
};

}  // namespace dserve::server
