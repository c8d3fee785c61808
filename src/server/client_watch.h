// ClientWatch: the transport's word that the client of one request is gone (it closed
// its connection, or stopped reading until the write deadline). The request's engine
// work subscribes to it and aborts its sequences, queued or running, so they stop within
// one engine step instead of running to their end for nobody.
//
// The transport makes one per request and makes it current on the thread that runs the
// request's handler (Scope); serving.cc, which knows nothing of sockets, subscribes to
// the current one once it holds engine request ids (on_current_gone).
//
// Thread-safety: every method may be called from any thread. A callback runs once, on
// the thread that calls client_gone() (or at once in on_gone when the client is
// already gone), outside the watch's lock; it must be thread-safe and must not rely on
// its Subscription still being alive (copy what it needs).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

namespace dserve::server {

class ClientWatch : public std::enable_shared_from_this<ClientWatch> {
 public:
  // Cancels its callback when destroyed (a callback already running still finishes).
  class Subscription {
   public:
    Subscription() = default;
    Subscription(std::weak_ptr<ClientWatch> watch, uint64_t id) : watch_(std::move(watch)), id_(id) {}
    Subscription(Subscription&& o) noexcept : watch_(std::move(o.watch_)), id_(o.id_) { o.id_ = 0; }
    Subscription& operator=(Subscription&& o) noexcept;
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;
    ~Subscription() { reset(); }
    void reset();

   private:
    std::weak_ptr<ClientWatch> watch_;
    uint64_t id_ = 0;
  };

  // Makes `watch` current on this thread until destroyed (nesting restores the outer one).
  class Scope {
   public:
    explicit Scope(std::shared_ptr<ClientWatch> watch);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::shared_ptr<ClientWatch> previous_;
  };

  // The client went away: runs every callback once; later calls do nothing.
  void client_gone();
  bool gone() const;
  // Runs `f` when the client goes (at once if it is already gone).
  [[nodiscard]] Subscription on_gone(std::function<void()> f);

  // The watch current on this thread; null outside a transport's handler.
  static std::shared_ptr<ClientWatch> current();
  // on_gone on the current watch; an empty Subscription when there is none.
  [[nodiscard]] static Subscription on_current_gone(std::function<void()> f);

 private:
  void unsubscribe(uint64_t id);

  mutable std::mutex mu_;
  bool gone_ = false;                                  // GUARDED_BY(mu_)
  uint64_t next_id_ = 1;                               // GUARDED_BY(mu_)
  std::map<uint64_t, std::function<void()>> callbacks_;  // GUARDED_BY(mu_)
};

}  // namespace dserve::server
