#include "engine/dp_engine_client.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "base/log.h"

namespace dserve {

using Clock = std::chrono::steady_clock;
namespace msg = engine_msg;

struct DpEngineClient::Socket {
  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};
};

// A remote engine, once its node said hello.
struct DpEngineClient::Remote {
  std::string node;      // the node's ZeroMQ identity; empty until connected
  bool alive = false;
  int64_t n_unfinished = 0;
  EngineObserver* observer = nullptr;
};

struct DpEngineClient::Node {
  std::string name;  // host:pid
  std::vector<int> ranks;
  Clock::time_point last_seen;
  bool dead = false;
};

struct DpEngineClient::Sequence {
  std::shared_ptr<OutputQueue> queue;
  int index = 0;  // the caller's
  int rank = 0;
  RequestId engine_id = 0;  // the engine's id, once it took the request (ids start at 1)
};

Result<std::unique_ptr<DpEngineClient>> DpEngineClient::create(
    DpEngineClientConfig config, std::vector<std::unique_ptr<AsyncLlm>> local) {
  if (local.empty()) return invalid_argument("the API server's node needs at least one engine");
  if (static_cast<int>(local.size()) > config.data_parallel_size)
    return invalid_argument("more local engines than --data-parallel-size");
  const bool remote = static_cast<int>(local.size()) < config.data_parallel_size;
  std::unique_ptr<DpEngineClient> c(new DpEngineClient(std::move(config), std::move(local)));
  if (!remote) return c;  // one node: no socket
  if (Status s = c->bind(); !s.ok()) return s;
  c->thread_ = std::thread([p = c.get()] { p->run(); });
  return c;
}

DpEngineClient::DpEngineClient(DpEngineClientConfig config,
                               std::vector<std::unique_ptr<AsyncLlm>> local)
    : config_(std::move(config)), local_(std::move(local)) {
  remotes_.resize(config_.data_parallel_size);
  for (int r = static_cast<int>(local_.size()); r < config_.data_parallel_size; ++r) {
    remotes_[r] = std::make_unique<Remote>();
    if (config_.observer) remotes_[r]->observer = config_.observer(r);
  }
}

Status DpEngineClient::bind() {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return io_error("eventfd failed");
  socket_ = std::make_unique<Socket>();
  try {
    socket_->router.set(zmq::sockopt::linger, 200);
    // No high-water mark: a message over it would be dropped (sends never block here).
    socket_->router.set(zmq::sockopt::sndhwm, 0);
    socket_->router.set(zmq::sockopt::rcvhwm, 0);
    socket_->router.bind("tcp://*:" + std::to_string(config_.rpc_port));
  } catch (const zmq::error_t& e) {
    return io_error("--data-parallel-rpc-port " + std::to_string(config_.rpc_port) +
                    ": cannot bind (" + e.what() + ")");
  }
  DS_LOG_INFO("data parallel: {} engine(s) here, waiting for ranks {}..{} on port {}",
              local_.size(), local_.size(), config_.data_parallel_size - 1, config_.rpc_port);
  return Status::Ok();
}

DpEngineClient::~DpEngineClient() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake();
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void DpEngineClient::wake() {
  if (wake_fd_ < 0) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
}

void DpEngineClient::send(const std::string& identity, const msg::Message& m) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.emplace_back(identity, msg::encode(m));
  }
  wake();
}

Status DpEngineClient::wait_for_engines() {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(config_.startup_timeout_s * 1000));
  std::unique_lock<std::mutex> lock(mu_);
  auto all_here = [&] {
    for (const auto& r : remotes_)
      if (r && r->node.empty()) return false;
    return true;
  };
  cv_.wait_until(lock, deadline, [&] { return !startup_error_.empty() || all_here(); });
  if (!startup_error_.empty()) return invalid_argument(startup_error_);
  if (all_here()) {
    DS_LOG_INFO("data parallel: all {} engines connected", config_.data_parallel_size);
    return Status::Ok();
  }
  std::string missing;
  for (size_t r = 0; r < remotes_.size(); ++r) {
    if (remotes_[r] && remotes_[r]->node.empty())
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  return io_error("data parallel: rank(s) " + missing + " never connected to port " +
                           std::to_string(config_.rpc_port) + " within --distributed-timeout " +
                           fmt::format("{}", config_.startup_timeout_s) + " s");
}

void DpEngineClient::set_shutdown_error(std::string error) {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_error_ = std::move(error);
}

int DpEngineClient::pick_engine() {
  const int n = config_.data_parallel_size;
  int best = -1;
  int64_t best_load = 0;
  const int start = static_cast<int>(turn_++ % static_cast<uint64_t>(n));
  for (int k = 0; k < n; ++k) {
    const int r = (start + k) % n;
    int64_t load = 0;
    if (r < static_cast<int>(local_.size())) {
      if (!local_[r]->healthy()) continue;
      load = local_[r]->load();
    } else {
      if (!remotes_[r]->alive) continue;
      load = remotes_[r]->n_unfinished;
    }
    if (best < 0 || load < best_load) {
      best = r;
      best_load = load;
    }
  }
  return best;
}

Result<std::vector<RequestId>> DpEngineClient::add_request(std::vector<int32_t> prompt,
                                                           const SamplingOptions& options,
                                                           std::shared_ptr<OutputQueue> queue,
                                                           int index) {
  if (!queue) return invalid_argument("add_request needs an output queue");
  if (options.n < 1) return invalid_argument("n must be at least 1, got " + std::to_string(options.n));
  const RequestId dp = static_cast<RequestId>(config_.data_parallel_size);
  std::unique_lock<std::mutex> lock(mu_);
  if (!accepting_ || stopping_)
    return Status(StatusCode::kResourceExhausted, "the server is shutting down");
  const int rank = pick_engine();
  if (rank < 0) return internal_error("no data-parallel engine is left to serve requests");
  if (rank < static_cast<int>(local_.size())) {
    lock.unlock();
    Result<std::vector<RequestId>> ids = local_[rank]->add_request(std::move(prompt), options, std::move(queue), index);
    if (!ids.ok()) return ids;
    std::vector<RequestId> out;
    for (RequestId id : *ids) out.push_back(id * dp + static_cast<RequestId>(rank));
    return out;
  }
  Remote& remote = *remotes_[rank];
  const int64_t ticket = next_ticket_;
  next_ticket_ += options.n;
  for (int j = 0; j < options.n; ++j) sequences_[ticket + j] = Sequence{queue, index + j, rank};
  remote.n_unfinished += options.n;
  adds_[ticket].rank = rank;
  std::future<msg::Added> added = adds_[ticket].answer.get_future();
  outbox_.emplace_back(remote.node, msg::encode(msg::Add{rank, ticket, std::move(prompt), options}));
  lock.unlock();
  wake();
  msg::Added a = added.get();
  if (!a.error.empty()) {
    lock.lock();
    for (int j = 0; j < options.n; ++j) {
      if (sequences_.erase(ticket + j)) --remotes_[rank]->n_unfinished;
    }
    cv_.notify_all();
    return invalid_argument(a.error);
  }
  std::vector<RequestId> out;
  for (RequestId id : a.ids) out.push_back(id * dp + static_cast<RequestId>(rank));
  return out;
}

void DpEngineClient::abort(RequestId id) {
  const RequestId dp = static_cast<RequestId>(config_.data_parallel_size);
  const int rank = static_cast<int>(id % dp);
  const RequestId engine_id = id / dp;
  if (rank < static_cast<int>(local_.size())) {
    local_[rank]->abort(engine_id);
    return;
  }
  std::string node;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!remotes_[rank]->alive) return;
    node = remotes_[rank]->node;
  }
  send(node, msg::Abort{rank, engine_id});
}

void DpEngineClient::abort_all() {
  for (const auto& e : local_) e->abort_all();
  {
    // Each remote engine aborts its sequences and answers with their last deltas.
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [ticket, s] : sequences_) {
      if (s.engine_id == 0 || !remotes_[s.rank]->alive) continue;
      outbox_.emplace_back(remotes_[s.rank]->node, msg::encode(msg::Abort{s.rank, s.engine_id}));
    }
  }
  wake();
}

void DpEngineClient::stop_accepting() {
  for (const auto& e : local_) e->stop_accepting();
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

bool DpEngineClient::healthy() const {
  if (config_.lockstep) {
    for (const auto& e : local_)
      if (!e->healthy()) return false;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : remotes_)
      if (r && !r->alive) return false;
    return true;
  }
  for (const auto& e : local_)
    if (e->healthy()) return true;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& r : remotes_)
    if (r && r->alive) return true;
  return false;
}

int64_t DpEngineClient::load() const {
  int64_t n = 0;
  for (const auto& e : local_) n += e->load();
  std::lock_guard<std::mutex> lock(mu_);
  return n + static_cast<int64_t>(sequences_.size());
}

bool DpEngineClient::wait_idle(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const auto& e : local_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (!e->wait_idle(std::max(left, std::chrono::milliseconds(0)))) return false;
  }
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return sequences_.empty(); });
}

void DpEngineClient::declare_dead(Node& node, const std::string& why) {
  node.dead = true;
  DS_LOG_ERROR("data parallel: node {} (ranks {}) {}; its requests end with an error", node.name,
               fmt::format("{}", fmt::join(node.ranks, ",")), why);
  const std::string error = "data-parallel engine on node " + node.name + " " + why;
  for (int r : node.ranks) remotes_[r]->alive = false;
  for (auto it = sequences_.begin(); it != sequences_.end();) {
    if (std::find(node.ranks.begin(), node.ranks.end(), it->second.rank) == node.ranks.end()) {
      ++it;
      continue;
    }
    OutputDelta d;
    d.index = it->second.index;
    d.finish_reason = "error";
    d.error = error;
    it->second.queue->push(std::move(d));
    Remote& remote = *remotes_[it->second.rank];
    --remote.n_unfinished;
    if (remote.observer) remote.observer->on_finished("error", 0, 0, 0.0);
    it = sequences_.erase(it);
  }
  for (auto it = adds_.begin(); it != adds_.end();) {
    if (std::find(node.ranks.begin(), node.ranks.end(), it->second.rank) == node.ranks.end()) {
      ++it;
      continue;
    }
    msg::Added a;
    a.ticket = it->first;
    a.error = error;
    it->second.answer.set_value(std::move(a));
    it = adds_.erase(it);
  }
  cv_.notify_all();
}

void DpEngineClient::handle(const std::string& identity, const std::string& payload) {
  Result<msg::Message> decoded = msg::decode(payload);
  std::lock_guard<std::mutex> lock(mu_);
  auto node_it = nodes_.find(identity);
  if (!decoded.ok()) {
    DS_LOG_ERROR("data parallel: dropped a message from {}: {}",
                 node_it != nodes_.end() ? node_it->second->name : std::string("an unknown peer"),
                 decoded.status().message());
    return;
  }
  msg::Message& m = *decoded;
  if (auto* hello = std::get_if<msg::Hello>(&m)) {
    auto reject = [&](const std::string& why) {
      const std::string error = "node " + hello->node + ": " + why;
      DS_LOG_ERROR("data parallel: refused {}", error);
      outbox_.emplace_back(identity, msg::encode(msg::Reject{error}));
      if (startup_error_.empty()) startup_error_ = error;
      cv_.notify_all();
    };
    if (node_it != nodes_.end()) return reject("said hello twice");
    if (std::string d = msg::first_difference(config_.node, hello->config); !d.empty())
      return reject("flags disagree with the API server's node: " + d);
    if (hello->ranks.empty()) return reject("serves no data-parallel rank");
    for (int r : hello->ranks) {
      if (r < 0 || r >= config_.data_parallel_size)
        return reject("data-parallel rank " + std::to_string(r) + " is outside --data-parallel-size " +
                      std::to_string(config_.data_parallel_size));
      if (r < static_cast<int>(local_.size()))
        return reject("data-parallel rank " + std::to_string(r) +
                      " overlaps the API server's node's ranks 0.." + std::to_string(local_.size() - 1) +
                      " (check --data-parallel-start-rank)");
      if (!remotes_[r]->node.empty()) {
        const std::string other = nodes_.count(remotes_[r]->node) ? nodes_[remotes_[r]->node]->name : "";
        return reject("data-parallel rank " + std::to_string(r) + " overlaps node " + other +
                      "'s ranks (check --data-parallel-start-rank)");
      }
    }
    auto node = std::make_unique<Node>();
    node->name = hello->node;
    node->ranks = hello->ranks;
    node->last_seen = Clock::now();
    for (int r : hello->ranks) {
      remotes_[r]->node = identity;
      remotes_[r]->alive = true;
    }
    DS_LOG_INFO("data parallel: node {} connected with rank(s) {}", node->name,
                fmt::format("{}", fmt::join(node->ranks, ",")));
    nodes_[identity] = std::move(node);
    outbox_.emplace_back(identity, msg::encode(msg::Welcome{}));
    cv_.notify_all();
    return;
  }
  if (node_it == nodes_.end() || node_it->second->dead) return;  // not (or no longer) ours
  Node& node = *node_it->second;
  node.last_seen = Clock::now();
  auto owns = [&](int rank) {
    return std::find(node.ranks.begin(), node.ranks.end(), rank) != node.ranks.end();
  };
  auto bad = [&](const std::string& why) {
    DS_LOG_ERROR("data parallel: dropped a message from node {}: {}", node.name, why);
  };
  if (auto* a = std::get_if<msg::Added>(&m)) {
    auto it = adds_.find(a->ticket);
    if (it == adds_.end() || it->second.rank != a->engine) return bad("an answer to no request");
    if (a->error.empty()) {
      if (a->ids.empty()) a->error = "node " + node.name + " took a request without sequence ids";
      for (size_t j = 0; j < a->ids.size(); ++j) {
        auto seq = sequences_.find(a->ticket + static_cast<int64_t>(j));
        if (seq != sequences_.end() && seq->second.rank == a->engine) seq->second.engine_id = a->ids[j];
      }
    }
    it->second.answer.set_value(std::move(*a));
    adds_.erase(it);
  } else if (auto* o = std::get_if<msg::Output>(&m)) {
    auto it = sequences_.find(o->delta.index);
    if (it == sequences_.end()) return;  // aborted here already
    if (it->second.rank != o->engine || !owns(o->engine)) return bad("output of another engine's request");
    o->delta.index = it->second.index;
    const bool last = o->delta.finish_reason.has_value();
    it->second.queue->push(std::move(o->delta));
    if (last) {
      --remotes_[it->second.rank]->n_unfinished;
      sequences_.erase(it);
      cv_.notify_all();
    }
  } else if (auto* s = std::get_if<msg::Stats>(&m)) {
    if (!owns(s->engine)) return bad("stats of another node's engine");
    if (EngineObserver* obs = remotes_[s->engine]->observer) obs->on_stats(s->stats);
  } else if (auto* e = std::get_if<msg::Event>(&m)) {
    if (!owns(e->engine)) return bad("an event of another node's engine");
    EngineObserver* obs = remotes_[e->engine]->observer;
    if (!obs) return;
    switch (e->kind) {
      case msg::Event::Kind::kTokens: obs->on_tokens(e->n_prompt_tokens, e->n_generated_tokens); break;
      case msg::Event::Kind::kFirstToken: obs->on_first_token(e->seconds); break;
      case msg::Event::Kind::kInterToken: obs->on_inter_token(e->seconds); break;
      case msg::Event::Kind::kFinished:
        obs->on_finished(e->finish_reason, static_cast<int>(e->n_prompt_tokens),
                         static_cast<int>(e->n_generated_tokens), e->seconds);
        break;
    }
  } else if (std::holds_alternative<msg::Ping>(m)) {
    // last_seen is all it is for
  } else {
    bad("a message only the API server sends");
  }
}

void DpEngineClient::run() {
  zmq::socket_t& router = socket_->router;
  const auto ping_every = std::chrono::milliseconds(250);
  auto next_ping = Clock::now();
  const std::string ping = msg::encode(msg::Ping{});
  for (;;) {
    zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      DS_LOG_ERROR("data parallel: poll failed: {}", e.what());
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t n;
      [[maybe_unused]] ssize_t r = read(wake_fd_, &n, sizeof n);
    }
    // Everything the socket holds now.
    for (;;) {
      std::vector<zmq::message_t> parts;
      zmq::recv_result_t got;
      try {
        got = zmq::recv_multipart(router, std::back_inserter(parts), zmq::recv_flags::dontwait);
      } catch (const zmq::error_t& e) {
        DS_LOG_ERROR("data parallel: receive failed: {}", e.what());
        break;
      }
      if (!got) break;
      if (parts.size() != 2) {
        DS_LOG_ERROR("data parallel: dropped a message of {} frames (want identity + 1)", parts.size());
        continue;
      }
      handle(parts[0].to_string(), parts[1].to_string());
    }
    std::vector<std::pair<std::string, std::string>> outbox;
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      outbox.swap(outbox_);
      stopping = stopping_;
      const auto now = Clock::now();
      if (now >= next_ping) {
        for (auto& [identity, node] : nodes_) {
          if (node->dead) continue;
          const double silent = std::chrono::duration<double>(now - node->last_seen).count();
          if (silent > kLivenessSeconds) {
            declare_dead(*node, fmt::format("stopped answering ({:.1f} s without a message)", silent));
            continue;
          }
          outbox.emplace_back(identity, ping);
        }
        next_ping = now + ping_every;
      }
      if (stopping) {
        for (auto& [identity, node] : nodes_) {
          if (!node->dead) outbox.emplace_back(identity, msg::encode(msg::Shutdown{shutdown_error_}));
        }
      }
    }
    for (auto& [identity, payload] : outbox) {
      try {
        router.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        router.send(zmq::buffer(payload), zmq::send_flags::dontwait);
      } catch (const zmq::error_t& e) {
        DS_LOG_WARN("data parallel: send failed: {}", e.what());
      }
    }
    if (stopping) break;
  }
  // No more answers will come: whatever waits is answered with an error.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [ticket, p] : adds_) {
    msg::Added a;
    a.ticket = ticket;
    a.error = "the API server is shutting down";
    p.answer.set_value(std::move(a));
  }
  adds_.clear();
  for (auto& [ticket, s] : sequences_) {
    OutputDelta d;
    d.index = s.index;
    d.finish_reason = "abort";
    s.queue->push(std::move(d));
  }
  sequences_.clear();
  cv_.notify_all();
}

}  // namespace dserve
