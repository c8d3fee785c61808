#include "server/client_watch.h"

#include <utility>
#include <vector>

namespace dserve::server {

namespace {
thread_local std::shared_ptr<ClientWatch> t_current;
}  // namespace

ClientWatch::Subscription& ClientWatch::Subscription::operator=(Subscription&& o) noexcept {
  if (this != &o) {
    reset();
    watch_ = std::move(o.watch_);
    id_ = o.id_;
    o.id_ = 0;
  }
  return *this;
}

void ClientWatch::Subscription::reset() {
  if (id_ == 0) return;
  if (std::shared_ptr<ClientWatch> w = watch_.lock()) w->unsubscribe(id_);
  id_ = 0;
  watch_.reset();
}

ClientWatch::Scope::Scope(std::shared_ptr<ClientWatch> watch) : previous_(std::move(t_current)) {
  t_current = std::move(watch);
}

ClientWatch::Scope::~Scope() { t_current = std::move(previous_); }

void ClientWatch::client_gone() {
  std::map<uint64_t, std::function<void()>> run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_) return;
    gone_ = true;
    run.swap(callbacks_);
  }
  for (auto& [id, f] : run) f();
}

bool ClientWatch::gone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gone_;
}

ClientWatch::Subscription ClientWatch::on_gone(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!gone_) {
      const uint64_t id = next_id_++;
      callbacks_.emplace(id, std::move(f));
      return Subscription(weak_from_this(), id);
    }
  }
  f();
  return Subscription();
}

void ClientWatch::unsubscribe(uint64_t id) {
  std::function<void()> dropped;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = callbacks_.find(id);
  if (it == callbacks_.end()) return;
  dropped = std::move(it->second);
  callbacks_.erase(it);
}

std::shared_ptr<ClientWatch> ClientWatch::current() { return t_current; }

ClientWatch::Subscription ClientWatch::on_current_gone(std::function<void()> f) {
  if (!t_current) return Subscription();
  return t_current->on_gone(std::move(f));
}

}  // namespace dserve::server
