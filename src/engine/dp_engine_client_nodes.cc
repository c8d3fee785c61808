// DpEngineClient's nodes: the ROUTER socket and its I/O thread, the hello of a node
// (first connection, or a restarted node taking its ranks back), its messages, and the
// liveness checks that declare a node lost (engine/node_watch.h).
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <zmq_addon.hpp>

#include "base/log.h"
#include "engine/dp_engine_client.h"
#include "engine/dp_engine_client_state.h"

namespace dserve {

namespace msg = engine_msg;

namespace {
// A node's name is "host:pid (ranks from N)": its host.
std::string host_of(const std::string& node_name) { return node_name.substr(0, node_name.find(':')); }
std::string ranks_text(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ",")); }
}  // namespace

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

void DpEngineClient::wake() {
  if (wake_fd_ < 0) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
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
    started_ = true;
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

void DpEngineClient::declare_lost(Node& node, const std::string& identity, const std::string& why) {
  node.dead = true;
  DS_LOG_ERROR("data parallel: lost engine(s) {} on node {}: {}", ranks_text(node.ranks), node.name, why);
  // If it still listens (it hangs, or is only slow), it exits on this; a restarted
  // node takes its ranks back.
  outbox_.emplace_back(identity, msg::encode(msg::Shutdown{"the API server declared this node lost: " + why}));
  for (int r : node.ranks) {
    remotes_[r]->alive = false;
    if (EngineObserver* obs = observers_[r]) {
      obs->on_engine_lost(why);
      obs->on_stats(EngineStats{});  // it runs nothing any more
    }
  }
  for (int r : node.ranks) {
    engine_lost(r, "data-parallel engine " + std::to_string(r) + " on node " + node.name + " was lost: " + why);
  }
}

void DpEngineClient::check_liveness() {
  const auto now = Clock::now();
  for (auto& [identity, node] : nodes_) {
    if (node->dead) continue;
    if (std::string why = node->watch.lost(now); !why.empty()) declare_lost(*node, identity, why);
  }
}

void DpEngineClient::handle_hello(const std::string& identity, msg::Hello& hello) {
  auto reject = [&](const std::string& why) {
    const std::string error = "node " + hello.node + ": " + why;
    DS_LOG_ERROR("data parallel: refused {}", error);
    outbox_.emplace_back(identity, msg::encode(msg::Reject{error}));
    if (!started_ && startup_error_.empty()) startup_error_ = error;  // the start fails with it
    cv_.notify_all();
  };
  if (nodes_.count(identity)) return reject("said hello twice");
  if (std::string d = msg::first_difference(config_.node, hello.config); !d.empty())
    return reject("flags disagree with the API server's node: " + d);
  if (hello.ranks.empty()) return reject("serves no data-parallel rank");
  std::vector<Node*> replaced;  // live nodes of the same host: this is their restart
  bool rejoin = false;
  for (int r : hello.ranks) {
    if (r < 0 || r >= config_.data_parallel_size)
      return reject("data-parallel rank " + std::to_string(r) + " is outside --data-parallel-size " +
                    std::to_string(config_.data_parallel_size));
    if (local_rank(r))
      return reject("data-parallel rank " + std::to_string(r) + " overlaps the API server's node's ranks 0.." +
                    std::to_string(local_.size() - 1) + " (check --data-parallel-start-rank)");
    auto holder = nodes_.find(remotes_[r]->node);
    if (holder == nodes_.end()) continue;
    rejoin = true;
    if (holder->second->dead) continue;
    if (host_of(holder->second->name) != host_of(hello.node))
      return reject("data-parallel rank " + std::to_string(r) + " overlaps node " + holder->second->name +
                    "'s ranks (check --data-parallel-start-rank)");
    replaced.push_back(holder->second.get());
  }
  for (auto& [id, node] : nodes_) {
    if (!node->dead && std::find(replaced.begin(), replaced.end(), node.get()) != replaced.end())
      declare_lost(*node, id, "replaced by the restarted node " + hello.node);
  }
  auto node = std::make_unique<Node>(hello.node, hello.ranks, config_.deadlines);
  for (int r : hello.ranks) {
    remotes_[r]->node = identity;
    remotes_[r]->alive = true;
    if (rejoin && observers_[r]) observers_[r]->on_engine_joined();
  }
  DS_LOG_INFO("data parallel: node {} {} with rank(s) {}", node->name, rejoin ? "rejoined" : "connected",
              ranks_text(node->ranks));
  nodes_[identity] = std::move(node);
  // Lost nodes whose ranks all went to others are forgotten.
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    const bool holds_any = std::any_of(it->second->ranks.begin(), it->second->ranks.end(),
                                       [&](int r) { return remotes_[r]->node == it->first; });
    it = holds_any ? std::next(it) : nodes_.erase(it);
  }
  outbox_.emplace_back(identity, msg::encode(msg::Welcome{}));
  cv_.notify_all();
}

void DpEngineClient::handle_added(msg::Added& a) {
  Request* r = find_request(a.ticket, nullptr);
  if (r == nullptr || !r->placing || r->rank != a.engine || !r->answer) {
    DS_LOG_ERROR("data parallel: dropped an answer of engine {} to no request", a.engine);
    return;
  }
  if (a.error.empty() && static_cast<int>(a.ids.size()) != r->n) {
    a.error = "engine " + std::to_string(a.engine) + " took a request without its sequence ids";
    a.code = StatusCode::kInternal;
  }
  r->answer->set_value(std::move(a));
  r->answer.reset();
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
  if (auto* hello = std::get_if<msg::Hello>(&m)) return handle_hello(identity, *hello);
  if (node_it == nodes_.end() || node_it->second->dead) return;  // not (or no longer) ours
  Node& node = *node_it->second;
  const auto now = Clock::now();
  node.watch.heard(now);
  auto owns = [&](int rank) { return std::find(node.ranks.begin(), node.ranks.end(), rank) != node.ranks.end(); };
  auto bad = [&](const std::string& why) {
    DS_LOG_ERROR("data parallel: dropped a message from node {}: {}", node.name, why);
  };
  if (auto* a = std::get_if<msg::Added>(&m)) {
    if (!owns(a->engine)) return bad("an answer of another node's engine");
    handle_added(*a);
  } else if (auto* o = std::get_if<msg::Output>(&m)) {
    if (!owns(o->engine)) return bad("output of another node's engine");
    node.watch.stepped(o->engine, now);
    deliver(o->engine, std::move(o->delta));
  } else if (auto* s = std::get_if<msg::Stats>(&m)) {
    if (!owns(s->engine)) return bad("stats of another node's engine");
    node.watch.stepped(s->engine, now);
    if (EngineObserver* obs = observers_[s->engine]) obs->on_stats(s->stats);
  } else if (auto* e = std::get_if<msg::Event>(&m)) {
    if (!owns(e->engine)) return bad("an event of another node's engine");
    EngineObserver* obs = observers_[e->engine];
    if (e->kind == msg::Event::Kind::kLost && remotes_[e->engine]->alive) {
      // The engine failed on its node (a tensor-parallel rank died, say); the node lives.
      DS_LOG_ERROR("data parallel: lost engine {} on node {}: {}", e->engine, node.name, e->error);
      remotes_[e->engine]->alive = false;
      if (obs) obs->on_engine_lost(e->error);
      engine_lost(e->engine, "data-parallel engine " + std::to_string(e->engine) + " on node " + node.name +
                                 " failed: " + e->error);
    }
    if (!obs) return;
    switch (e->kind) {
      case msg::Event::Kind::kTokens: obs->on_tokens(e->n_prompt_tokens, e->n_generated_tokens); break;
      case msg::Event::Kind::kFirstToken: obs->on_first_token(e->seconds); break;
      case msg::Event::Kind::kInterToken: obs->on_inter_token(e->seconds); break;
      case msg::Event::Kind::kFinished:
        obs->on_finished(e->finish_reason, static_cast<int>(e->n_prompt_tokens),
                         static_cast<int>(e->n_generated_tokens), e->seconds);
        break;
      case msg::Event::Kind::kLost:
        break;  // below
    }
  } else if (std::holds_alternative<msg::Ping>(m)) {
    // heard() is all it is for
  } else {
    bad("a message only the API server sends");
  }
}

void DpEngineClient::run() {
  zmq::socket_t& router = socket_->router;
  const auto ping_every = ping_interval(config_.deadlines.heartbeat_s);
  auto next_ping = Clock::now();
  const std::string ping = msg::encode(msg::Ping{});
  for (;;) {
    zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::min(ping_every, std::chrono::milliseconds(100)));
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
      const auto now = Clock::now();
      if (now >= next_ping) {
        check_liveness();
        for (auto& [identity, node] : nodes_)
          if (!node->dead) outbox_.emplace_back(identity, ping);
        next_ping = now + ping_every;
      }
      stopping = stopping_;
      if (stopping) {
        for (auto& [identity, node] : nodes_) {
          if (!node->dead) outbox_.emplace_back(identity, msg::encode(msg::Shutdown{shutdown_error_}));
        }
      }
      outbox.swap(outbox_);
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
  // No more answers will come: the remote engines' requests end here.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : remotes_)
    if (r) r->alive = false;
  std::vector<int64_t> ended;
  for (auto& [first, r] : requests_) {
    if (r.rank < 0 || local_rank(r.rank)) continue;
    if (r.placing) {
      msg::Added a;
      a.error = "the API server is shutting down";
      a.code = StatusCode::kResourceExhausted;
      if (r.answer) r.answer->set_value(std::move(a));
      r.answer.reset();
    } else {
      ended.push_back(first);
    }
  }
  for (int64_t first : ended) end_request(first, "abort", "");
  cv_.notify_all();
}

}  // namespace dserve
