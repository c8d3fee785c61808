#include "server/worker_pool.h"

#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>

#include "base/log.h"

namespace dserve::server {

WorkerPool::WorkerPool(int max_threads, std::chrono::milliseconds idle_exit)
    : max_threads_(max_threads), idle_exit_(idle_exit) {}

WorkerPool::~WorkerPool() { shutdown(std::chrono::seconds(5)); }

bool WorkerPool::spawn_locked() {
  try {
    std::thread(&WorkerPool::work, this).detach();
  } catch (const std::system_error& e) {
    DS_LOG_ERROR("cannot create an HTTP worker thread: {}", e.what());
    return false;
  }
  ++n_threads_;
  ++n_idle_;
  return true;
}

Status WorkerPool::start(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < n && n_threads_ < max_threads_; ++i) {
    if (!spawn_locked()) {
      return Status(StatusCode::kResourceExhausted,
                    "cannot create HTTP worker threads (" + std::to_string(n_threads_) +
                                " made; the process or container limits threads: RLIMIT_NPROC, "
                                "pids.max)");
    }
  }
  return Status::Ok();
}

bool WorkerPool::try_run(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return false;
  if (n_idle_ <= static_cast<int>(tasks_.size())) {
    if (n_threads_ >= max_threads_ || !spawn_locked()) return false;
  }
  tasks_.push_back(std::move(task));
  work_cv_.notify_one();
  return true;
}

void WorkerPool::work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (tasks_.empty()) {
      if (stopping_) break;
      if (!work_cv_.wait_for(lock, idle_exit_, [&] { return !tasks_.empty() || stopping_; })) {
        break;  // idle too long
      }
      continue;
    }
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    --n_idle_;
    lock.unlock();
    task();
    task = nullptr;  // destroyed before the thread counts as idle again
    lock.lock();
    ++n_idle_;
  }
  --n_idle_;
  --n_threads_;
  exit_cv_.notify_all();
}

bool WorkerPool::shutdown(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  work_cv_.notify_all();
  return exit_cv_.wait_for(lock, timeout, [&] { return n_threads_ == 0; });
}

int WorkerPool::n_threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_threads_;
}

int WorkerPool::n_busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_threads_ - n_idle_ + static_cast<int>(tasks_.size());  // queued tasks have a thread
}

}  // namespace dserve::server
