#include "engine/headless_engines.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
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
  void on_engine_lost(const std::string& why) override {
    msg::Event e = event(msg::Event::Kind::kLost);
    e.error = why;
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

namespace {

// Connects `dealer` to the API server at `endpoint` (head_address: as the flag gave it).
Status connect_dealer(zmq::socket_t& dealer, const std::string& endpoint,
                      const std::string& head_address) {
  try {
    dealer.set(zmq::sockopt::linger, 200);
    // No high-water mark: an output delta over it would be lost (sends never block).
    dealer.set(zmq::sockopt::sndhwm, 0);
    dealer.set(zmq::sockopt::rcvhwm, 0);
    dealer.set(zmq::sockopt::reconnect_ivl, 100);
    dealer.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return invalid_argument("--data-parallel-address " + head_address + " (" + endpoint +
                            "): " + e.what());
  }
  return Status::Ok();
}

// Tells the API server this node's ranks and the flags that must agree.
void send_hello(zmq::socket_t& dealer, const HeadlessConfig& config, const std::string& endpoint) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  msg::Hello hello;
  hello.node = std::string(host) + ":" + std::to_string(getpid()) + " (ranks from " +
               std::to_string(config.start_rank) + ")";
  for (int i = 0; i < config.n_engines; ++i) hello.ranks.push_back(config.start_rank + i);
  hello.config = config.node;
  dealer.send(zmq::buffer(msg::encode(hello)), zmq::send_flags::none);
  DS_LOG_INFO("data parallel: engines of rank(s) {}..{} connecting to the API server at {}",
              config.start_rank, config.start_rank + config.n_engines - 1, endpoint);
}

}  // namespace

// Makes the adds the API server sends, on a thread of its own: an add waits for its
// engine's validation, which may take a step, and outputs keep flowing meanwhile.
class HeadlessEngines::Adder {
 public:
  Adder(HeadlessEngines& owner, std::vector<std::unique_ptr<AsyncLlm>>& engines,
        std::shared_ptr<OutputQueue> deltas)
      : owner_(owner), engines_(engines), deltas_(std::move(deltas)), thread_([this] { loop(); }) {}

  // From the I/O thread.
  void push(msg::Add a) {
    std::lock_guard<std::mutex> lock(mu_);
    adds_.push_back(std::move(a));
    cv_.notify_all();
  }
  // The thread ends once the adds queued so far are made.
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }
  void join() { thread_.join(); }

 private:
  void loop() {
    for (;;) {
      msg::Add a;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return done_ || !adds_.empty(); });
        if (adds_.empty()) return;
        a = std::move(adds_.front());
        adds_.pop_front();
      }
      add(std::move(a));
    }
  }
  // Hands `a` to its engine and posts the answer: its sequences' ids, or why not.
  void add(msg::Add a) {
    AsyncLlm& engine = *engines_[a.engine - owner_.config_.start_rank];
    msg::Added answer;
    answer.engine = a.engine;
    answer.ticket = a.ticket;
    if (a.ticket < 0 || a.ticket > std::numeric_limits<int>::max() - a.options.n) {
      answer.error = "ticket out of range";
      answer.code = StatusCode::kInternal;
    } else {
      Result<std::vector<RequestId>> ids = engine.add_request(
          std::move(a.prompt), a.options, deltas_, static_cast<int>(a.ticket));
      if (ids.ok()) {
        answer.ids = *ids;
      } else {
        answer.error = ids.status().message();
        answer.code = ids.status().code();
      }
    }
    owner_.post(answer);
  }

  HeadlessEngines& owner_;
  std::vector<std::unique_ptr<AsyncLlm>>& engines_;
  const std::shared_ptr<OutputQueue> deltas_;  // every request's, tagged with its ticket
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<msg::Add> adds_;  // GUARDED_BY(mu_)
  bool done_ = false;          // GUARDED_BY(mu_)
  std::thread thread_;         // last: starts once the rest is made
};

// run()'s loop on its thread, which owns the socket: what this node knows of the API
// server, and one turn of the loop.
class HeadlessEngines::IoLoop {
 public:
  IoLoop(HeadlessEngines& owner, zmq::socket_t& dealer, const std::string& endpoint,
         std::vector<std::unique_ptr<AsyncLlm>>& engines, OutputQueue& deltas, Adder& adder)
      : owner_(owner), config_(owner.config_), dealer_(dealer), endpoint_(endpoint),
        engines_(engines), deltas_(deltas), adder_(adder) {}

  // Waits (100 ms at most) for a message or a wake-up, then takes the API server's
  // messages and sends the outputs, stats and events. False when the loop is over:
  // result() says why.
  bool turn();
  const Status& result() const { return result_; }

 private:
  bool on_this_node(int rank) const {
    return rank >= config_.start_rank && rank < config_.start_rank + config_.n_engines;
  }
  // False: leave now (result_ says why).
  bool receive_messages();
  bool handle(msg::Message& m);
  void forward_outputs();
  // True when this node must leave after this turn's sends (result_ says why).
  bool lockstep_group_failed(Clock::time_point now);
  // True when the API server never answered or stopped answering (result_ says so).
  bool api_server_lost(Clock::time_point now);
  void send_outbox(Clock::time_point now);

  HeadlessEngines& owner_;
  const HeadlessConfig& config_;
  zmq::socket_t& dealer_;
  const std::string& endpoint_;
  std::vector<std::unique_ptr<AsyncLlm>>& engines_;
  OutputQueue& deltas_;
  Adder& adder_;
  // Which engine each ticket's sequence runs on, to tag its deltas.
  std::map<int64_t, int> ticket_rank_;
  Status result_ = Status::Ok();
  bool welcomed_ = false;
  const Clock::time_point started_ = Clock::now();
  Clock::time_point last_heard_ = Clock::now();
  std::optional<Clock::time_point> unhealthy_since_;  // lockstep: an engine failed
  int unhealthy_rank_ = -1;
  Clock::time_point next_ping_ = Clock::now();
  const std::string ping_ = msg::encode(msg::Ping{});
};

bool HeadlessEngines::IoLoop::turn() {
  zmq::pollitem_t items[] = {{dealer_.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, owner_.wake_fd_, ZMQ_POLLIN, 0}};
  try {
    zmq::poll(items, 2, std::min(ping_interval(config_.heartbeat_timeout_s), std::chrono::milliseconds(100)));
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return true;
    result_ = io_error(std::string("data parallel: poll failed: ") + e.what());
    return false;
  }
  if (items[1].revents & ZMQ_POLLIN) {
    uint64_t n;
    [[maybe_unused]] ssize_t r = read(owner_.wake_fd_, &n, sizeof n);
  }
  if (!receive_messages()) return false;
  forward_outputs();
  // In lockstep (expert parallelism) an engine that failed stops the whole group:
  // its requests' errors go out below, then this node exits.
  const auto now = Clock::now();
  const bool leave_after_send = config_.lockstep && lockstep_group_failed(now);
  if (api_server_lost(now)) return false;
  send_outbox(now);
  return !leave_after_send;
}

bool HeadlessEngines::IoLoop::receive_messages() {
  for (;;) {
    zmq::message_t frame;
    zmq::recv_result_t got;
    try {
      got = dealer_.recv(frame, zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      result_ = io_error(std::string("data parallel: receive failed: ") + e.what());
      return false;
    }
    if (!got) return true;
    last_heard_ = Clock::now();
    Result<msg::Message> m = msg::decode(frame.to_string_view());
    if (!m.ok()) {
      DS_LOG_ERROR("data parallel: dropped a message from the API server: {}",
                   m.status().message());
      continue;
    }
    if (!handle(*m)) return false;
  }
}

// One message from the API server.
bool HeadlessEngines::IoLoop::handle(msg::Message& m) {
  if (std::holds_alternative<msg::Welcome>(m)) {
    welcomed_ = true;
    DS_LOG_INFO("data parallel: connected to the API server at {}", endpoint_);
  } else if (auto* r = std::get_if<msg::Reject>(&m)) {
    result_ =
        invalid_argument("the API server at " + endpoint_ + " refused this node: " + r->error);
    return false;
  } else if (auto* sd = std::get_if<msg::Shutdown>(&m)) {
    if (sd->error.empty()) {
      DS_LOG_INFO("data parallel: the API server shut down; exiting");
    } else {
      result_ = internal_error("data parallel: the API server stopped with an error: " + sd->error);
    }
    return false;
  } else if (auto* a = std::get_if<msg::Add>(&m)) {
    if (!on_this_node(a->engine)) {
      DS_LOG_ERROR("data parallel: dropped a request for rank {}, not on this node", a->engine);
      return true;
    }
    for (int j = 0; j < a->options.n; ++j) ticket_rank_[a->ticket + j] = a->engine;
    adder_.push(std::move(*a));
  } else if (auto* a = std::get_if<msg::Abort>(&m)) {
    if (!on_this_node(a->engine)) return true;
    engines_[a->engine - config_.start_rank]->abort(a->id);
  } else if (!std::holds_alternative<msg::Ping>(m)) {
    DS_LOG_ERROR("data parallel: dropped a message only engines send");
  }
  return true;
}

// Deltas out, tagged with their engine.
void HeadlessEngines::IoLoop::forward_outputs() {
  for (OutputDelta& d : deltas_.pop(std::chrono::milliseconds(0))) {
    auto it = ticket_rank_.find(d.index);
    if (it == ticket_rank_.end()) continue;
    const int rank = it->second;
    if (d.finish_reason) ticket_rank_.erase(it);
    owner_.post(msg::Output{rank, std::move(d)});
  }
}

// After a grace period: when the API server shuts down normally its engines leave the
// group too, and its shutdown message is on its way.
bool HeadlessEngines::IoLoop::lockstep_group_failed(Clock::time_point now) {
  for (size_t i = 0; i < engines_.size() && !unhealthy_since_; ++i) {
    if (!engines_[i]->healthy()) {
      unhealthy_since_ = now;
      unhealthy_rank_ = config_.start_rank + static_cast<int>(i);
    }
  }
  if (unhealthy_since_ && now - *unhealthy_since_ > std::chrono::milliseconds(1500)) {
    result_ = internal_error("data parallel: engine " + std::to_string(unhealthy_rank_) +
                             " of the expert-parallel group failed (see the error above); exiting");
    return true;
  }
  return false;
}

bool HeadlessEngines::IoLoop::api_server_lost(Clock::time_point now) {
  const double silent = std::chrono::duration<double>(now - last_heard_).count();
  if (!welcomed_ &&
      std::chrono::duration<double>(now - started_).count() > config_.startup_timeout_s) {
    result_ = io_error("data parallel: no answer from the API server at " + endpoint_ +
                       " within --distributed-timeout " +
                       fmt::format("{}", config_.startup_timeout_s) + " s");
    return true;
  }
  if (welcomed_ && silent > config_.heartbeat_timeout_s) {
    result_ = io_error(fmt::format(
        "data parallel: the API server at {} stopped answering ({:.1f} s without a message; "
        "--engine-heartbeat-timeout {}); exiting", endpoint_, silent, config_.heartbeat_timeout_s));
    return true;
  }
  return false;
}

// What was posted since the last turn, and a ping every ping_interval (the API
// server's liveness check of this node), once the API server has welcomed this node.
void HeadlessEngines::IoLoop::send_outbox(Clock::time_point now) {
  std::vector<std::string> outbox;
  {
    std::lock_guard<std::mutex> lock(owner_.mu_);
    outbox.swap(owner_.outbox_);
  }
  if (welcomed_ && now >= next_ping_) {
    outbox.push_back(ping_);
    next_ping_ = now + ping_interval(config_.heartbeat_timeout_s);
  }
  if (!welcomed_) outbox.clear();  // stats before the hello was answered mean nothing
  for (const std::string& payload : outbox) {
    try {
      dealer_.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      DS_LOG_WARN("data parallel: send failed: {}", e.what());
    }
  }
}

// With the API server lost, an engine thread may still sit in a collective whose peer
// died with it: aborting the group shuts its connections, but gloo does not always
// fail a send already posted to a dead peer before its timeout (--distributed-timeout,
// a minute). Nothing this node computes is wanted any more, so after a grace period
// the process exits (an error, as for any lost API server) instead of waiting it out.
std::shared_ptr<std::atomic<bool>> HeadlessEngines::exit_if_engines_hang(const std::string& why) {
  static constexpr auto kGrace = std::chrono::seconds(5);
  auto stopped = std::make_shared<std::atomic<bool>>(false);
  std::thread([why, stopped] {
    std::this_thread::sleep_for(kGrace);
    if (stopped->load()) return;
    DS_LOG_ERROR("data parallel: the engines did not stop within {} s of losing the API server "
                 "({}); exiting",
                 kGrace.count(), why);
    std::_Exit(1);
  }).detach();
  return stopped;
}

Status HeadlessEngines::run(std::vector<std::unique_ptr<AsyncLlm>> engines) {
  if (static_cast<int>(engines.size()) != config_.n_engines)
    return invalid_argument("HeadlessEngines::run: engine count differs from the config");
  if (wake_fd_ < 0) return io_error("eventfd failed");
  const std::string endpoint =
      "tcp://" + config_.head_address + ":" + std::to_string(config_.rpc_port);
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  if (Status s = connect_dealer(dealer, endpoint, config_.head_address); !s.ok()) return s;
  send_hello(dealer, config_, endpoint);

  // Every request's deltas come to one queue, tagged with the head's ticket.
  auto deltas = std::make_shared<OutputQueue>([this] { wake(); });
  Adder adder(*this, engines, deltas);
  IoLoop loop(*this, dealer, endpoint, engines, *deltas, adder);
  while (!stop_.load() && loop.turn()) {
  }
  adder.close();
  std::shared_ptr<std::atomic<bool>> engines_stopped;  // the watchdog's flag, if one runs
  if (!loop.result().ok()) {
    for (dist::Communicator* group : config_.lockstep_groups) group->abort(loop.result().message());
    engines_stopped = exit_if_engines_hang(loop.result().message());
  }
  for (auto& e : engines) e->abort_all();
  adder.join();
  engines.clear();  // joins the engine threads while the forwarders still exist
  if (engines_stopped) engines_stopped->store(true);
  return loop.result();
}

}  // namespace dserve
