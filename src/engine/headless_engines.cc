#include "engine/headless_engines.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "base/log.h"

namespace dserve {

using Clock = std::chrono::steady_clock;
namespace msg = engine_msg;

class HeadlessEngines::Forwarder : public EngineObserver {
 public:
  Forwarder(HeadlessEngines* owner, int rank) : owner_(owner), rank_(rank) {}
  void on_stats(const EngineStats& stats) override { owner_->post(msg::Stats{rank_, stats}); }
  void on_tokens(int64_t n_prompt, int64_t n_generated) override {
    msg::Event e = event(msg::Event::Kind::kTokens);
    e.n_prompt_tokens = n_prompt;
    e.n_generated_tokens = n_generated;
    owner_->post(e);
  }
  void on_first_token(double seconds) override {
    msg::Event e = event(msg::Event::Kind::kFirstToken);
    e.seconds = seconds;
    owner_->post(e);
  }
  void on_inter_token(double seconds) override {
    msg::Event e = event(msg::Event::Kind::kInterToken);
    e.seconds = seconds;
    owner_->post(e);
  }
  void on_finished(const std::string& reason, int n_prompt, int n_generated, double seconds) override {
    msg::Event e = event(msg::Event::Kind::kFinished);
    e.n_prompt_tokens = n_prompt;
    e.n_generated_tokens = n_generated;
    e.seconds = seconds;
    e.finish_reason = reason;
    owner_->post(e);
  }

 private:
  msg::Event event(msg::Event::Kind kind) const {
    msg::Event e;
    e.engine = rank_;
    e.kind = kind;
    return e;
  }
  HeadlessEngines* owner_;
  const int rank_;
};

HeadlessEngines::HeadlessEngines(HeadlessConfig config) : config_(std::move(config)) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  for (int i = 0; i < config_.n_engines; ++i)
    forwarders_.push_back(std::make_unique<Forwarder>(this, config_.start_rank + i));
}

HeadlessEngines::~HeadlessEngines() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

EngineObserver* HeadlessEngines::observer(int i) { return forwarders_.at(i).get(); }

void HeadlessEngines::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
}

void HeadlessEngines::post(const msg::Message& m) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.push_back(msg::encode(m));
  }
  wake();
}

void HeadlessEngines::stop() {
  stop_ = true;
  wake();
}

Status HeadlessEngines::run(std::vector<std::unique_ptr<AsyncLlm>> engines) {
  if (static_cast<int>(engines.size()) != config_.n_engines)
    return invalid_argument("HeadlessEngines::run: engine count differs from the config");
  if (wake_fd_ < 0) return io_error("eventfd failed");
  const std::string endpoint =
      "tcp://" + config_.head_address + ":" + std::to_string(config_.rpc_port);
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  try {
    dealer.set(zmq::sockopt::linger, 200);
    // No high-water mark: an output delta over it would be lost (sends never block).
    dealer.set(zmq::sockopt::sndhwm, 0);
    dealer.set(zmq::sockopt::rcvhwm, 0);
    dealer.set(zmq::sockopt::reconnect_ivl, 100);
    dealer.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return invalid_argument("--data-parallel-address " + config_.head_address + " (" + endpoint +
                            "): " + e.what());
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  msg::Hello hello;
  hello.node = std::string(host) + ":" + std::to_string(getpid()) + " (ranks from " +
               std::to_string(config_.start_rank) + ")";
  for (int i = 0; i < config_.n_engines; ++i) hello.ranks.push_back(config_.start_rank + i);
  hello.config = config_.node;
  dealer.send(zmq::buffer(msg::encode(hello)), zmq::send_flags::none);
  DS_LOG_INFO("data parallel: engines of rank(s) {}..{} connecting to the API server at {}",
              config_.start_rank, config_.start_rank + config_.n_engines - 1, endpoint);

  // Every request's deltas come to one queue, tagged with the head's ticket.
  auto deltas = std::make_shared<OutputQueue>([this] { wake(); });
  // Adds wait for their engine's validation, which may take a step: a worker makes them
  // so that outputs keep flowing meanwhile.
  std::mutex add_mu;
  std::condition_variable add_cv;
  std::deque<msg::Add> adds;  // GUARDED_BY(add_mu)
  bool adds_done = false;     // GUARDED_BY(add_mu)
  std::thread adder([&] {
    for (;;) {
      msg::Add a;
      {
        std::unique_lock<std::mutex> lock(add_mu);
        add_cv.wait(lock, [&] { return adds_done || !adds.empty(); });
        if (adds.empty()) return;
        a = std::move(adds.front());
        adds.pop_front();
      }
      AsyncLlm& engine = *engines[a.engine - config_.start_rank];
      msg::Added answer;
      answer.engine = a.engine;
      answer.ticket = a.ticket;
      if (a.ticket < 0 || a.ticket > std::numeric_limits<int>::max() - a.options.n) {
        answer.error = "ticket out of range";
      } else {
        Result<std::vector<RequestId>> ids = engine.add_request(
            std::move(a.prompt), a.options, deltas, static_cast<int>(a.ticket));
        if (ids.ok()) answer.ids = *ids;
        else answer.error = ids.status().message();
      }
      post(answer);
    }
  });
  // Which engine each ticket's sequence runs on, to tag its deltas.
  std::map<int64_t, int> ticket_rank;  // I/O thread only

  Status result = Status::Ok();
  bool welcomed = false;
  const auto started = Clock::now();
  auto last_heard = Clock::now();
  std::optional<Clock::time_point> unhealthy_since;  // lockstep: an engine failed
  int unhealthy_rank = -1;
  auto next_ping = Clock::now();
  const std::string ping = msg::encode(msg::Ping{});
  while (!stop_.load()) {
    zmq::pollitem_t items[] = {{dealer.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      result = io_error(std::string("data parallel: poll failed: ") + e.what());
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t n;
      [[maybe_unused]] ssize_t r = read(wake_fd_, &n, sizeof n);
    }
    bool leave = false;
    for (;;) {
      zmq::message_t frame;
      zmq::recv_result_t got;
      try {
        got = dealer.recv(frame, zmq::recv_flags::dontwait);
      } catch (const zmq::error_t& e) {
        result = io_error(std::string("data parallel: receive failed: ") + e.what());
        leave = true;
        break;
      }
      if (!got) break;
      last_heard = Clock::now();
      Result<msg::Message> m = msg::decode(frame.to_string_view());
      if (!m.ok()) {
        DS_LOG_ERROR("data parallel: dropped a message from the API server: {}", m.status().message());
        continue;
      }
      if (std::holds_alternative<msg::Welcome>(*m)) {
        welcomed = true;
        DS_LOG_INFO("data parallel: connected to the API server at {}", endpoint);
      } else if (auto* r = std::get_if<msg::Reject>(&*m)) {
        result = invalid_argument("the API server at " + endpoint + " refused this node: " + r->error);
        leave = true;
        break;
      } else if (auto* sd = std::get_if<msg::Shutdown>(&*m)) {
        if (sd->error.empty()) {
          DS_LOG_INFO("data parallel: the API server shut down; exiting");
        } else {
          result = internal_error("data parallel: the API server stopped with an error: " + sd->error);
        }
        leave = true;
        break;
      } else if (auto* a = std::get_if<msg::Add>(&*m)) {
        if (a->engine < config_.start_rank || a->engine >= config_.start_rank + config_.n_engines) {
          DS_LOG_ERROR("data parallel: dropped a request for rank {}, not on this node", a->engine);
          continue;
        }
        for (int j = 0; j < a->options.n; ++j) ticket_rank[a->ticket + j] = a->engine;
        std::lock_guard<std::mutex> lock(add_mu);
        adds.push_back(std::move(*a));
        add_cv.notify_all();
      } else if (auto* a = std::get_if<msg::Abort>(&*m)) {
        if (a->engine < config_.start_rank || a->engine >= config_.start_rank + config_.n_engines) continue;
        engines[a->engine - config_.start_rank]->abort(a->id);
      } else if (!std::holds_alternative<msg::Ping>(*m)) {
        DS_LOG_ERROR("data parallel: dropped a message only engines send");
      }
    }
    if (leave) break;
    // Deltas out, tagged with their engine.
    for (OutputDelta& d : deltas->pop(std::chrono::milliseconds(0))) {
      auto it = ticket_rank.find(d.index);
      if (it == ticket_rank.end()) continue;
      const int rank = it->second;
      if (d.finish_reason) ticket_rank.erase(it);
      post(msg::Output{rank, std::move(d)});
    }
    // In lockstep (expert parallelism) an engine that failed stops the whole group:
    // its requests' errors go out below, then this node exits.
    // (After a grace period: when the API server shuts down normally its engines leave
    // the group too, and its shutdown message is on its way.)
    bool leave_after_send = false;
    const auto now = Clock::now();
    if (config_.lockstep) {
      for (size_t i = 0; i < engines.size() && !unhealthy_since; ++i) {
        if (!engines[i]->healthy()) {
          unhealthy_since = now;
          unhealthy_rank = config_.start_rank + static_cast<int>(i);
        }
      }
      if (unhealthy_since && now - *unhealthy_since > std::chrono::milliseconds(1500)) {
        result = internal_error("data parallel: engine " + std::to_string(unhealthy_rank) +
                                " of the expert-parallel group failed (see the error above); exiting");
        leave_after_send = true;
      }
    }
    const double silent = std::chrono::duration<double>(now - last_heard).count();
    if (!welcomed && std::chrono::duration<double>(now - started).count() > config_.startup_timeout_s) {
      result = io_error("data parallel: no answer from the API server at " + endpoint +
                                 " within --distributed-timeout " +
                                 fmt::format("{}", config_.startup_timeout_s) + " s");
      break;
    }
    if (welcomed && silent > kLivenessSeconds) {
      result = io_error(fmt::format(
          "data parallel: the API server at {} stopped answering ({:.1f} s without a message); "
          "exiting", endpoint, silent));
      break;
    }
    std::vector<std::string> outbox;
    {
      std::lock_guard<std::mutex> lock(mu_);
      outbox.swap(outbox_);
    }
    if (welcomed && now >= next_ping) {
      outbox.push_back(ping);
      next_ping = now + std::chrono::milliseconds(250);
    }
    if (!welcomed) outbox.clear();  // stats before the hello was answered mean nothing
    for (const std::string& payload : outbox) {
      try {
        dealer.send(zmq::buffer(payload), zmq::send_flags::dontwait);
      } catch (const zmq::error_t& e) {
        DS_LOG_WARN("data parallel: send failed: {}", e.what());
      }
    }
    if (leave_after_send) break;
  }
  {
    std::lock_guard<std::mutex> lock(add_mu);
    adds_done = true;
  }
  add_cv.notify_all();
  for (auto& e : engines) e->abort_all();
  adder.join();
  engines.clear();  // joins the engine threads while the forwarders still exist
  return result;
}

}  // namespace dserve
