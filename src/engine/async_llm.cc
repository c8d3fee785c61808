#include "dserve/async_llm.h"

#include <future>
#include <string>
#include <system_error>
#include <thread>

#include "base/log.h"
#include "engine/dp_lockstep.h"
#include "engine/llm_engine.h"
#include "engine/output_text.h"
#include "tokenizer/tokenizer.h"

namespace dserve {

using Clock = std::chrono::steady_clock;

static double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<OutputDelta> OutputQueue::pop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !items_.empty(); });
  std::vector<OutputDelta> out(std::make_move_iterator(items_.begin()),
                               std::make_move_iterator(items_.end()));
  items_.clear();
  return out;
}

void OutputQueue::push(OutputDelta delta) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(std::move(delta));
  }
  cv_.notify_all();
  if (on_push_) on_push_();
}

// A request the engine thread is serving.
struct AsyncLlm::Pending {
  std::shared_ptr<OutputQueue> queue;
  int index = 0;
  std::unique_ptr<OutputText> text;  // null without a tokenizer
  Clock::time_point arrival, last_token;
  int n_prompt_tokens = 0;
  int n_generated_tokens = 0;
};

// What a handler thread asks of the engine thread.
struct AsyncLlm::Command {
  enum class Kind { kAdd, kAbort, kAbortAll } kind = Kind::kAdd;
  RequestId id = 0;             // kAbort
  std::vector<RequestId> ids;   // kAdd: the request's sequences
  std::vector<int32_t> prompt;
  SamplingOptions options;
  std::shared_ptr<OutputQueue> queue;
  int index = 0;
  Clock::time_point arrival;
  std::promise<Status> done;  // kAdd: whether the engine took the request
};

Result<std::unique_ptr<AsyncLlm>> AsyncLlm::create(std::unique_ptr<LLM> llm,
                                                   EngineObserver* observer,
                                                   dist::Communicator* lockstep) {
  if (!llm) return invalid_argument("AsyncLlm needs a loaded LLM");
  std::unique_ptr<AsyncLlm> a(new AsyncLlm(std::move(llm), observer));
  a->lockstep_ = lockstep;
  try {
    a->thread_ = std::thread([p = a.get()] {
      if (p->lockstep_ != nullptr) {
        p->run_lockstep();
      } else {
        p->run();
      }
    });
  } catch (const std::system_error& e) {
    return Status(StatusCode::kResourceExhausted,
                  std::string("cannot create the engine thread (") + e.what() +
                      "): the process or container limits threads (RLIMIT_NPROC, pids.max)");
  }
  return a;
}

AsyncLlm::AsyncLlm(std::unique_ptr<LLM> llm, EngineObserver* observer)
    : llm_(std::move(llm)),
      observer_(observer),
      max_model_len_(llm_->engine().config().max_model_len),
      pending_(std::make_unique<std::unordered_map<RequestId, Pending>>()) {
  stats_ = llm_->engine().stats();
}

AsyncLlm::~AsyncLlm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<std::vector<RequestId>> AsyncLlm::add_request(std::vector<int32_t> prompt,
                                                     const SamplingOptions& options,
                                                     std::shared_ptr<OutputQueue> queue,
                                                     int index) {
  if (!queue) return invalid_argument("AsyncLlm::add_request needs an output queue");
  if (options.n < 1) return invalid_argument("n must be at least 1, got " + std::to_string(options.n));
  auto c = std::make_unique<Command>();
  c->kind = Command::Kind::kAdd;
  c->prompt = std::move(prompt);
  c->options = options;
  c->queue = std::move(queue);
  c->index = index;
  c->arrival = Clock::now();
  std::future<Status> done = c->done.get_future();
  std::vector<RequestId> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_ || stopping_)
      return Status(StatusCode::kResourceExhausted, "the server is shutting down");
    if (failed_) return internal_error("the engine failed and serves no more requests");
    for (int j = 0; j < options.n; ++j) ids.push_back(next_id_++);
    c->ids = ids;
    n_unfinished_ += options.n;
    inbox_.push_back(c.release());
  }
  cv_.notify_all();
  Status s = done.get();
  if (!s.ok()) return s;
  return ids;
}

void AsyncLlm::abort(RequestId id) {
  auto c = new Command();
  c->kind = Command::Kind::kAbort;
  c->id = id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(c);
  }
  cv_.notify_all();
}

void AsyncLlm::abort_all() {
  auto c = new Command();
  c->kind = Command::Kind::kAbortAll;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(c);
  }
  cv_.notify_all();
}

int64_t AsyncLlm::load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_unfinished_;
}

bool AsyncLlm::healthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !failed_;
}

void AsyncLlm::stop_accepting() {
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

bool AsyncLlm::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return n_unfinished_ == 0; });
}

EngineStats AsyncLlm::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void AsyncLlm::finish(RequestId id, const std::string& reason, const std::string& error) {
  auto it = pending_->find(id);
  if (it == pending_->end()) return;
  Pending& p = it->second;
  OutputDelta d;
  d.index = p.index;
  d.finish_reason = reason;
  d.error = error;
  if (p.text && reason != "error") d.text = p.text->finish();  // final now
  // Counted before the client can see the end (so /metrics read after a response has
  // it; and a remote engine's event travels ahead of the last delta).
  if (observer_) {
    observer_->on_finished(reason, p.n_prompt_tokens, p.n_generated_tokens,
                           seconds_between(p.arrival, Clock::now()));
  }
  p.queue->push(std::move(d));
  pending_->erase(it);
  std::lock_guard<std::mutex> lock(mu_);
  --n_unfinished_;
}

void AsyncLlm::apply(Command& c) {
  LlmEngine& engine = llm_->engine();
  switch (c.kind) {
    case Command::Kind::kAdd: {
      const RequestId id = c.ids.front();
      Status s = engine.add_request(id, c.prompt, c.options,
                                    std::span<const RequestId>(c.ids).subspan(1));
      const Tokenizer* tok = llm_->tokenizer();
      if (s.ok() && !c.options.stop.empty() && !tok) {
        for (RequestId r : c.ids) (void)engine.abort_request(r);
        s = invalid_argument("stop strings need the model's tokenizer");
      }
      if (!s.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          n_unfinished_ -= static_cast<int64_t>(c.ids.size());
        }
        c.done.set_value(std::move(s));
        return;
      }
      for (size_t j = 0; j < c.ids.size(); ++j) {
        Pending p;
        p.queue = c.queue;
        p.index = c.index + static_cast<int>(j);
        if (tok) p.text = std::make_unique<OutputText>(*tok, c.options);
        p.arrival = c.arrival;
        p.n_prompt_tokens = static_cast<int>(c.prompt.size());
        pending_->emplace(c.ids[j], std::move(p));
      }
      c.done.set_value(Status::Ok());
      return;
    }
    case Command::Kind::kAbort:
      if (pending_->count(c.id) == 0) return;  // already finished
      (void)engine.abort_request(c.id);
      finish(c.id, "abort");
      return;
    case Command::Kind::kAbortAll: {
      std::vector<RequestId> ids;
      for (const auto& [id, p] : *pending_) ids.push_back(id);
      for (RequestId id : ids) {
        (void)engine.abort_request(id);
        finish(id, "abort");
      }
      return;
    }
  }
}

void AsyncLlm::publish(std::vector<EngineOutput>& outputs) {
  LlmEngine& engine = llm_->engine();
  const Clock::time_point now = Clock::now();
  for (EngineOutput& e : outputs) {
    auto it = pending_->find(e.id);
    if (it == pending_->end()) continue;
    Pending& p = it->second;
    OutputDelta d;
    d.index = p.index;
    // Tokens after one that completes a stop string are dropped (a step that verified
    // drafts can emit several), as if the request had ended there.
    bool stopped = false;
    for (size_t k = 0; k < e.new_token_ids.size() && !stopped; ++k) {
      const int32_t t = e.new_token_ids[k];
      d.token_ids.push_back(t);
      const bool stop_token = e.ends_with_stop_token && k + 1 == e.new_token_ids.size();
      if (p.text) d.text += p.text->add(t, &stopped, stop_token);
    }
    if (e.logprobs.size() > d.token_ids.size()) e.logprobs.resize(d.token_ids.size());
    if (!d.token_ids.empty() && observer_) {
      // Counted now, before the request's output can reach its client.
      observer_->on_tokens(p.n_generated_tokens == 0 ? p.n_prompt_tokens : 0,
                           static_cast<int64_t>(d.token_ids.size()));
      if (p.n_generated_tokens == 0) {
        observer_->on_first_token(seconds_between(p.arrival, now));
      } else {
        observer_->on_inter_token(seconds_between(p.last_token, now));
      }
    }
    p.last_token = now;
    p.n_generated_tokens += static_cast<int>(d.token_ids.size());
    d.logprobs = std::move(e.logprobs);
    d.prompt_logprobs = std::move(e.prompt_logprobs);
    std::optional<std::string> reason;
    const bool cut_short = d.token_ids.size() < e.new_token_ids.size();
    if (e.finish_reason && !cut_short) reason = sched::finish_reason_name(*e.finish_reason);
    if (stopped && !reason) {
      if (!e.finish_reason) (void)engine.finish_request(e.id, sched::FinishReason::kStop);
      reason = "stop";
    }
    if (!d.token_ids.empty() || !d.text.empty() || !d.prompt_logprobs.empty())
      p.queue->push(std::move(d));
    if (reason) finish(e.id, *reason);
  }
}

void AsyncLlm::take(std::deque<Command*>& inbox, bool refuse, const char* why) {
  for (Command* c : inbox) {
    if (!refuse) {
      apply(*c);
    } else if (c->kind == Command::Kind::kAdd) {
      c->done.set_value(internal_error(why));
    }
    delete c;
  }
  inbox.clear();
}

bool AsyncLlm::is_failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

void AsyncLlm::fail(const Status& error) {
  DS_LOG_ERROR("engine step failed: {}", error.message());
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
  }
  if (observer_) observer_->on_engine_lost("engine step failed: " + error.message());
  std::vector<RequestId> ids;
  for (const auto& [id, p] : *pending_) ids.push_back(id);
  for (RequestId id : ids) finish(id, "error", error.message());
}

void AsyncLlm::publish_stats() {
  const EngineStats s = llm_->engine().stats();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = s;
  }
  if (observer_) observer_->on_stats(s);
  cv_.notify_all();  // wait_idle
}

// Whatever is left ends as aborted, so no reader waits forever.
void AsyncLlm::abort_remaining() {
  LlmEngine& engine = llm_->engine();
  std::vector<RequestId> ids;
  for (const auto& [id, p] : *pending_) ids.push_back(id);
  for (RequestId id : ids) {
    (void)engine.abort_request(id);
    finish(id, "abort");
  }
}

void AsyncLlm::run() {
  LlmEngine& engine = llm_->engine();
  for (;;) {
    std::deque<Command*> inbox;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || (!failed_ && engine.has_unfinished_requests());
      });
      inbox.swap(inbox_);
      if (stopping_) {
        lock.unlock();
        take(inbox, true, "shutting down");
        break;
      }
    }
    // After a failed step the engine is left mid-step: it takes no more commands.
    const bool failed = is_failed();
    take(inbox, failed, "the engine failed and serves no more requests");
    if (!failed && engine.has_unfinished_requests()) {
      Result<std::vector<EngineOutput>> outputs = engine.step();
      if (!outputs.ok()) {
        // The engine cannot go on (and, mid-step, cannot abort): it is never stepped again.
        fail(outputs.status());
      } else {
        publish(*outputs);
      }
    }
    publish_stats();
  }
  abort_remaining();
}

// The loop of an engine in an expert-parallel group: one DpLockstep round, then one
// forward (its own step, or the idle forward when only others have work).
void AsyncLlm::run_lockstep() {
  LlmEngine& engine = llm_->engine();
  DpLockstep lockstep(*lockstep_);
  bool in_group = true;  // until some engine left (or a collective failed)
  bool busy = false;     // the last round had work somewhere: no waiting
  for (;;) {
    std::deque<Command*> inbox;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] {
        return stopping_ || !inbox_.empty() || (!failed_ && engine.has_unfinished_requests());
      };
      if (!in_group) {
        cv_.wait(lock, [&] { return stopping_ || !inbox_.empty(); });
      } else if (!busy) {
        cv_.wait_for(lock, DpLockstep::kIdleTick, ready);
      }
      stopping = stopping_;
      inbox.swap(inbox_);
    }
    const bool failed = is_failed();
    const bool had_commands = !inbox.empty();
    take(inbox, failed || stopping,
         stopping ? "shutting down" : "the engine failed and serves no more requests");
    if (!in_group) {
      if (stopping) break;
      if (had_commands) publish_stats();
      continue;
    }
    Result<DpLockstep::Round> round =
        lockstep.agree(!failed && engine.has_unfinished_requests(), stopping, failed);
    if (!round.ok()) {
      in_group = false;
      if (!failed) fail(round.status());
      if (stopping) break;
      publish_stats();
      continue;
    }
    if (round->leaver >= 0) {
      // Nobody issues another collective from here on.
      in_group = false;
      const std::string why = "data-parallel engine " + std::to_string(round->leaver) +
                              " of the expert-parallel group " + (round->leaver_failed ? "failed" : "stopped") +
                              "; the others cannot step without its experts";
      if (!failed && !stopping && !round->leaver_failed && pending_->empty()) {
        // A normal shutdown (nothing of ours was running): not an error, but no more steps.
        DS_LOG_INFO("{}", why);
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = true;
      } else if (!failed && !stopping) {
        fail(internal_error(why));
      }
      if (stopping) break;
      publish_stats();
      continue;
    }
    busy = round->any_work;
    if (busy) {
      const int64_t before = engine.n_forward_passes();
      Status s = Status::Ok();
      if (engine.has_unfinished_requests()) {
        Result<std::vector<EngineOutput>> outputs = engine.step();
        if (outputs.ok()) {
          publish(*outputs);
        } else {
          s = outputs.status();
        }
      }
      // Every engine runs exactly one forward per busy round.
      if (s.ok() && engine.n_forward_passes() == before) s = engine.forward_idle();
      if (!s.ok()) fail(s);  // the next round tells the others
    }
    if (busy || had_commands) publish_stats();
  }
  abort_remaining();
  // What the group's exchanges moved, for the log (the engine thread owns the model).
  if (const std::string s = llm_->model_stats(); !s.empty()) DS_LOG_INFO("{}", s);
}

}  // namespace dserve
