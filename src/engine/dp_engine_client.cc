// DpEngineClient's requests: placement on the least-loaded live engine, the way back of
// their deltas, aborts, and the moves of requests whose engine was lost. The nodes'
// side (socket, hello, liveness) is in dp_engine_client_nodes.cc.
#include "engine/dp_engine_client.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

#include "base/log.h"
#include "engine/dp_engine_client_state.h"

namespace dserve {

namespace msg = engine_msg;

namespace {
// How many times one request may move to another engine: a request that every engine
// fails on (a "query of death") must not take them all down one after the other.
constexpr int kMaxMoves = 3;
}  // namespace

Result<std::unique_ptr<DpEngineClient>> DpEngineClient::create(
    DpEngineClientConfig config, std::vector<std::unique_ptr<AsyncLlm>> local) {
  if (local.empty()) return invalid_argument("the API server's node needs at least one engine");
  if (static_cast<int>(local.size()) > config.data_parallel_size)
    return invalid_argument("more local engines than --data-parallel-size");
  const bool remote = static_cast<int>(local.size()) < config.data_parallel_size;
  std::unique_ptr<DpEngineClient> c(new DpEngineClient(std::move(config), std::move(local)));
  if (remote) {
    if (Status s = c->bind(); !s.ok()) return s;
  }
  try {
    c->retry_thread_ = std::thread([p = c.get()] { p->retry_loop(); });
    if (remote) c->thread_ = std::thread([p = c.get()] { p->run(); });
  } catch (const std::system_error& e) {
    return Status(StatusCode::kResourceExhausted,
                  std::string("cannot start the data-parallel client's threads: ") + e.what());
  }
  return c;
}

DpEngineClient::DpEngineClient(DpEngineClientConfig config,
                               std::vector<std::unique_ptr<AsyncLlm>> local)
    : config_(std::move(config)), local_(std::move(local)) {
  const int n = config_.data_parallel_size;
  remotes_.resize(n);
  n_unfinished_.assign(n, 0);
  for (int r = 0; r < n; ++r) {
    observers_.push_back(config_.observer ? config_.observer(r) : nullptr);
    if (!local_rank(r)) remotes_[r] = std::make_unique<Remote>();
  }
  for (size_t r = 0; r < local_.size(); ++r) {
    // Pushed on the engine's thread and delivered there at once (no thread in between).
    local_outputs_.push_back(std::make_shared<OutputQueue>([this, r] {
      std::vector<OutputDelta> deltas = local_outputs_[r]->pop(std::chrono::milliseconds(0));
      std::lock_guard<std::mutex> lock(mu_);
      for (OutputDelta& d : deltas) deliver(static_cast<int>(r), std::move(d));
    }));
  }
}

DpEngineClient::~DpEngineClient() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  wake();
  if (thread_.joinable()) thread_.join();  // answers the remote engines' pending adds
  if (retry_thread_.joinable()) retry_thread_.join();
  // The engines end before this object: their threads deliver into it to the last.
  local_.clear();
  if (wake_fd_ >= 0) close(wake_fd_);
}

int64_t DpEngineClient::new_tickets(int n) {
  // Tickets travel as an OutputDelta's int index: they wrap, skipping any still in use.
  for (;;) {
    if (next_ticket_ > INT_MAX - n) next_ticket_ = 0;
    const int64_t first = next_ticket_;
    next_ticket_ += n;
    auto it = requests_.lower_bound(first);
    const bool clash = (it != requests_.end() && it->first < first + n) ||
                       find_request(first, nullptr) != nullptr;
    if (!clash) return first;
  }
}

DpEngineClient::Request* DpEngineClient::find_request(int64_t ticket, int64_t* first) {
  auto it = requests_.upper_bound(ticket);
  if (it == requests_.begin()) return nullptr;
  --it;
  if (ticket >= it->first + it->second.n) return nullptr;
  if (first) *first = it->first;
  return &it->second;
}

int DpEngineClient::pick_engine() {
  const int n = config_.data_parallel_size;
  int best = -1;
  int64_t best_load = 0;
  const int start = static_cast<int>(turn_++ % static_cast<uint64_t>(n));
  for (int k = 0; k < n; ++k) {
    const int r = (start + k) % n;
    if (local_rank(r) ? !local_[r]->healthy() : !remotes_[r]->alive) continue;
    if (best < 0 || n_unfinished_[r] < best_load) {
      best = r;
      best_load = n_unfinished_[r];
    }
  }
  return best;
}

void DpEngineClient::change_work(int rank, int64_t delta) {
  n_unfinished_[rank] += delta;
  if (local_rank(rank)) return;
  auto node = nodes_.find(remotes_[rank]->node);
  if (node != nodes_.end()) node->second->watch.set_work(rank, n_unfinished_[rank], Clock::now());
}

Status DpEngineClient::place(std::unique_lock<std::mutex>& lock, int64_t first) {
  for (;;) {
    Request& r = requests_.at(first);  // never erased while placing
    if (r.n_unfinished == 0) {  // the caller aborted it all while it moved
      requests_.erase(first);
      cv_.notify_all();
      return Status::Ok();
    }
    if (stopping_) return Status(StatusCode::kResourceExhausted, "the server is shutting down");
    const int rank = pick_engine();
    if (rank < 0) return internal_error("no data-parallel engine is left to serve requests");
    r.rank = rank;
    r.placing = true;
    r.engine_ids.clear();
    change_work(rank, r.n_unfinished);
    Status taken = Status::Ok();
    if (local_rank(rank)) {
      std::vector<int32_t> prompt = r.prompt;
      SamplingOptions options = r.options;
      lock.unlock();
      Result<std::vector<RequestId>> ids =
          local_[rank]->add_request(std::move(prompt), options, local_outputs_[rank], static_cast<int>(first));
      lock.lock();
      if (ids.ok()) requests_.at(first).engine_ids = std::move(ids).value();
      else taken = ids.status();
    } else {
      auto answer = std::make_shared<std::promise<msg::Added>>();
      std::future<msg::Added> answered = answer->get_future();
      r.answer = answer;
      outbox_.emplace_back(remotes_[rank]->node, msg::encode(msg::Add{rank, first, r.prompt, r.options}));
      wake();
      lock.unlock();
      msg::Added a = answered.get();
      lock.lock();
      if (!a.error.empty()) taken = Status(a.code, a.error);
      else requests_.at(first).engine_ids = std::move(a.ids);
    }
    Request& placed = requests_.at(first);
    placed.placing = false;
    placed.answer.reset();
    if (placed.rank != rank) {
      // Its engine was lost while taking it (engine_lost moved the count away).
      if (!placed.lost_error.empty()) return internal_error(placed.lost_error);
      continue;
    }
    if (!taken.ok()) {
      change_work(rank, -placed.n_unfinished);
      placed.rank = -1;
      // A local engine that failed meanwhile refuses with an error of its own: try another.
      if (local_rank(rank) && !local_[rank]->healthy() && !config_.lockstep) continue;
      return taken;
    }
    for (int j = 0; j < placed.n; ++j) {
      if (placed.abort_wanted[j]) abort_on_engine(placed, j);
    }
    if (placed.n_unfinished == 0) requests_.erase(first);
    cv_.notify_all();
    return Status::Ok();
  }
}

Result<std::vector<RequestId>> DpEngineClient::add_request(std::vector<int32_t> prompt,
                                                           const SamplingOptions& options,
                                                           std::shared_ptr<OutputQueue> queue,
                                                           int index) {
  if (!queue) return invalid_argument("add_request needs an output queue");
  if (options.n < 1) return invalid_argument("n must be at least 1, got " + std::to_string(options.n));
  std::unique_lock<std::mutex> lock(mu_);
  if (!accepting_ || stopping_)
    return Status(StatusCode::kResourceExhausted, "the server is shutting down");
  const int64_t first = new_tickets(options.n);
  Request& r = requests_[first];
  r.prompt = std::move(prompt);
  r.options = options;
  r.queue = std::move(queue);
  r.index = index;
  r.n = options.n;
  r.n_unfinished = options.n;
  r.done.assign(options.n, false);
  r.abort_wanted.assign(options.n, false);
  if (Status s = place(lock, first); !s.ok()) {
    requests_.erase(first);
    cv_.notify_all();
    return s;
  }
  std::vector<RequestId> ids;
  for (int j = 0; j < options.n; ++j) ids.push_back(static_cast<RequestId>(first + j));
  return ids;
}

void DpEngineClient::deliver(int rank, OutputDelta d) {
  int64_t first = 0;
  Request* r = find_request(d.index, &first);
  if (r == nullptr || r->rank != rank) return;  // ended here already, or a late delta of an engine it left
  const int j = static_cast<int>(d.index - first);
  if (r->done[j]) return;  // aborted here already
  const bool last = d.finish_reason.has_value();
  if (last && *d.finish_reason == "error" && !r->started && local_rank(rank) && !local_[rank]->healthy()) {
    // A local engine failed before this request produced anything: as a lost engine.
    engine_lost(rank, d.error);
    return;
  }
  if (!d.token_ids.empty() || !d.text.empty() || !d.prompt_logprobs.empty()) {
    r->started = true;  // the caller has seen output: the request can no longer move
    std::vector<int32_t>().swap(r->prompt);
  }
  d.index = r->index + j;
  if (last) {
    r->done[j] = true;
    --r->n_unfinished;
    change_work(rank, -1);
  }
  r->queue->push(std::move(d));
  if (r->n_unfinished == 0 && !r->placing) {
    requests_.erase(first);
    cv_.notify_all();
  }
}

void DpEngineClient::end_request(int64_t first, const std::string& reason, const std::string& error) {
  Request& r = requests_.at(first);
  for (int j = 0; j < r.n; ++j) {
    if (r.done[j]) continue;
    r.done[j] = true;
    --r.n_unfinished;
    if (r.rank >= 0) change_work(r.rank, -1);
    OutputDelta d;
    d.index = r.index + j;
    d.finish_reason = reason;
    d.error = error;
    r.queue->push(std::move(d));
  }
  if (!r.placing) requests_.erase(first);
  cv_.notify_all();
}

void DpEngineClient::engine_lost(int rank, const std::string& error) {
  // Lockstep: the engines here may wait in a collective for the lost one.
  if (config_.lockstep) {
    for (dist::Communicator* group : config_.lockstep_groups) group->abort(error);
  }
  std::vector<int64_t> affected;
  for (const auto& [first, r] : requests_)
    if (r.rank == rank) affected.push_back(first);
  int n_moved = 0;
  for (int64_t first : affected) {
    Request& r = requests_.at(first);
    const bool movable = !config_.lockstep && !r.started && r.n_moves < kMaxMoves;
    change_work(rank, -r.n_unfinished);
    r.rank = -1;
    r.engine_ids.clear();
    if (movable) {
      ++r.n_moves;
      ++n_moved;
    }
    if (r.placing) {
      // place() is waiting for this engine's answer: it moves the request, or fails.
      if (!movable) r.lost_error = error;
      if (r.answer) r.answer->set_value(msg::Added{});
      r.answer.reset();
    } else if (movable) {
      retries_.push_back(first);
    } else {
      if (!local_rank(rank) && observers_[rank]) {
        for (int j = 0; j < r.n; ++j)
          if (!r.done[j]) observers_[rank]->on_finished("error", 0, 0, 0.0);
      }
      end_request(first, "error", error);
    }
  }
  if (n_moved > 0) {
    DS_LOG_WARN("data parallel: {} request(s) of engine {} had produced no output yet: placed again on "
                "the engines left", n_moved, rank);
  }
  cv_.notify_all();
}

void DpEngineClient::retry_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !retries_.empty(); });
    if (retries_.empty()) return;  // stopping, nothing left
    const int64_t first = retries_.front();
    retries_.pop_front();
    auto it = requests_.find(first);
    if (it == requests_.end() || it->second.rank >= 0 || it->second.placing) continue;  // aborted meanwhile
    Status s = stopping_ ? Status(StatusCode::kResourceExhausted, "the server is shutting down")
                         : place(lock, first);
    if (!s.ok() && requests_.count(first)) {
      end_request(first, stopping_ ? "abort" : "error",
                  "its data-parallel engine was lost and no other engine could take it: " + s.message());
    }
  }
}

void DpEngineClient::abort_on_engine(Request& r, int j) {
  if (j >= static_cast<int>(r.engine_ids.size())) return;
  if (local_rank(r.rank)) {
    local_[r.rank]->abort(r.engine_ids[j]);
  } else if (remotes_[r.rank]->alive) {
    outbox_.emplace_back(remotes_[r.rank]->node, msg::encode(msg::Abort{r.rank, r.engine_ids[j]}));
    wake();
  }
}

void DpEngineClient::abort_sequence(int64_t first, int j) {
  Request& r = requests_.at(first);
  if (r.done[j]) return;
  if (r.rank >= 0 && !r.placing) {
    abort_on_engine(r, j);  // the engine answers with the sequence's last delta
    return;
  }
  // Being placed, or waiting to move: it ends here; its engine is told once known.
  r.abort_wanted[j] = true;
  r.done[j] = true;
  --r.n_unfinished;
  if (r.rank >= 0) change_work(r.rank, -1);
  OutputDelta d;
  d.index = r.index + j;
  d.finish_reason = "abort";
  r.queue->push(std::move(d));
  if (r.n_unfinished == 0 && !r.placing) requests_.erase(first);
  cv_.notify_all();
}

void DpEngineClient::abort(RequestId id) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t first = 0;
  if (find_request(static_cast<int64_t>(id), &first) == nullptr) return;
  abort_sequence(first, static_cast<int>(static_cast<int64_t>(id) - first));
}

void DpEngineClient::abort_all() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int64_t, int>> sequences;
  for (const auto& [first, r] : requests_)
    for (int j = 0; j < r.n; ++j)
      if (!r.done[j]) sequences.emplace_back(first, j);
  for (const auto& [first, j] : sequences) {
    if (requests_.count(first)) abort_sequence(first, j);
  }
}

void DpEngineClient::stop_accepting() {
  // The local engines keep accepting: requests moved from a lost engine still need one.
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
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (int64_t k : n_unfinished_) n += k;
  return n;
}

bool DpEngineClient::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return requests_.empty(); });
}

}  // namespace dserve
