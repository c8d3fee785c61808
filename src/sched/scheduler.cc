#include "sched/scheduler.h"

#include <algorithm>
#include <string>

#include "base/check.h"

namespace dserve::sched {

Status SchedulerConfig::validate() const {
  if (max_num_batched_tokens < 1) {
    return invalid_argument("max_num_batched_tokens must be >= 1, got " +
                            std::to_string(max_num_batched_tokens));
  }
  if (max_num_seqs < 1)
    return invalid_argument("max_num_seqs must be >= 1, got " + std::to_string(max_num_seqs));
  if (max_model_len < 2)
    return invalid_argument("max_model_len must be >= 2, got " + std::to_string(max_model_len));
  if (lookahead_slots < 0) return invalid_argument("lookahead_slots must be >= 0");
  return Status::Ok();
}

Result<std::unique_ptr<Scheduler>> Scheduler::create(const SchedulerConfig& config,
                                                     const kvcache::KvCacheConfig& kv_config) {
  DS_RETURN_IF_ERROR(config.validate());
  DS_RETURN_IF_ERROR(kv_config.validate());
  // The longest request keeps max_model_len - 1 tokens in the cache (the last sampled
  // token is never fed back).
  const int64_t need =
      (int64_t(config.max_model_len) - 1 + kv_config.block_size - 1) / kv_config.block_size;
  if (need > kv_config.n_blocks) {
    const int64_t fits = int64_t(kv_config.n_blocks) * kv_config.block_size + 1;
    return Status(StatusCode::kResourceExhausted,
                  "max_model_len " + std::to_string(config.max_model_len) + " needs " +
                      std::to_string(need) + " KV blocks of " +
                      std::to_string(kv_config.block_size) + " tokens but the cache has " +
                      std::to_string(kv_config.n_blocks) +
                      "; use max_model_len <= " + std::to_string(fits) + " or a larger KV cache");
  }
  return std::unique_ptr<Scheduler>(new Scheduler(config, kv_config));
}

Scheduler::Scheduler(const SchedulerConfig& config, const kvcache::KvCacheConfig& kv_config)
    : config_(config), kv_(kv_config) {}

int64_t Scheduler::max_kv_tokens(const RequestSpec& spec) const {
  const int64_t longest =
      std::min<int64_t>(int64_t(spec.prompt.size()) + spec.max_tokens, config_.max_model_len);
  return longest - 1;
}

Status Scheduler::add_request(RequestSpec spec) {
  DS_RETURN_IF_ERROR(spec.validate());
  const std::string who = "request " + std::to_string(spec.id) + ": ";
  if (requests_.count(spec.id) != 0) return invalid_argument(who + "duplicate request id");
  const int64_t n_prompt = static_cast<int64_t>(spec.prompt.size());
  if (n_prompt >= config_.max_model_len) {
    return invalid_argument(who + "prompt of " + std::to_string(n_prompt) +
                            " tokens leaves no room to generate within max_model_len " +
                            std::to_string(config_.max_model_len));
  }
  const int64_t n_blocks = kv_.blocks_for(max_kv_tokens(spec));
  if (n_blocks > kv_.n_blocks()) {
    return Status(StatusCode::kResourceExhausted, who + "needs " + std::to_string(n_blocks) +
                                                      " KV blocks even alone, the cache has " +
                                                      std::to_string(kv_.n_blocks()));
  }
  for (RequestId f : spec.fork_ids) {
    if (requests_.count(f) != 0)
      return invalid_argument(who + "fork id " + std::to_string(f) + " is in use");
  }
  auto r = std::make_unique<Request>(std::move(spec));
  for (RequestId f : r->spec.fork_ids) {
    RequestSpec cs = r->spec;
    cs.id = f;
    cs.fork_ids.clear();
    auto c = std::make_unique<Request>(std::move(cs));
    c->state = RequestState::kForkPending;
    c->fork_parent = r.get();
    r->pending_forks.push_back(c.get());
    requests_.emplace(f, std::move(c));
  }
  waiting_.push_back(r.get());
  const RequestId id = r->spec.id;
  requests_.emplace(id, std::move(r));
  return Status::Ok();
}

const Request* Scheduler::find(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

void Scheduler::release_forks(Request& parent, bool share) {
  std::vector<Request*> to_wait;
  for (Request* c : parent.pending_forks) {
    c->fork_parent = nullptr;
    std::optional<kvcache::KvCacheManager::ForkResult> f;
    if (share && static_cast<int>(running_.size()) < config_.max_num_seqs) {
      // Share all but the last prompt token, which the fork recomputes for its own logits.
      f = kv_.fork(parent.spec.id, c->spec.id, parent.n_prompt_tokens - 1);
    }
    if (f) {
      c->state = RequestState::kRunning;
      c->n_computed_tokens = parent.n_prompt_tokens - 1;
      c->announce_table = true;
      running_.push_back(c);
      if (f->copy) pending_copies_.emplace_back(c->spec.id, *f->copy);
    } else {
      c->state = RequestState::kWaiting;
      to_wait.push_back(c);
    }
  }
  parent.pending_forks.clear();
  waiting_.insert(waiting_.begin(), to_wait.begin(), to_wait.end());
}

void Scheduler::finish(Request& r) {
  switch (r.state) {
    case RequestState::kRunning:
      running_.erase(std::find(running_.begin(), running_.end(), &r));
      break;
    case RequestState::kWaiting:
    case RequestState::kPreempted:
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &r));
      break;
    case RequestState::kForkPending: {
      auto& siblings = r.fork_parent->pending_forks;
      siblings.erase(std::find(siblings.begin(), siblings.end(), &r));
      break;
    }
    case RequestState::kFinished:
      DS_CHECK_MSG(false, "request finished twice");
  }
  release_forks(r, /*share=*/false);  // the parent ends before its prompt was computed
  kv_.free(r.spec.id);
  r.state = RequestState::kFinished;
  finished_since_last_step_.push_back(r.spec.id);
  requests_.erase(r.spec.id);  // destroys r
}

Status Scheduler::finish_request(RequestId id, FinishReason reason) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return not_found("request " + std::to_string(id) + " is unknown or finished");
  if (step_in_flight_) {
    pending_finish_.emplace(id, reason);
  } else {
    finish(*it->second);
  }
  return Status::Ok();
}

void Scheduler::set_draft_tokens(RequestId id, std::vector<int32_t> drafts) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->state != RequestState::kRunning) return;
  it->second->draft_tokens = std::move(drafts);
}

int Scheduler::n_drafts_to_run(const Request& r, int budget) const {
  // The last draft's position must stay below max_model_len - 1 (the last token of a
  // max_model_len-long request is never fed back), and the drafts plus the token the
  // step adds must not pass max_tokens.
  const int64_t by_len = int64_t{config_.max_model_len} - 1 - r.n_tokens();
  const int64_t by_tokens = int64_t{r.spec.max_tokens} - r.n_output_tokens() - 1;
  const int64_t n = std::min({static_cast<int64_t>(r.draft_tokens.size()), int64_t{budget},
                              by_len, by_tokens});
  return static_cast<int>(std::max<int64_t>(n, 0));
}

void Scheduler::preempt_newest(SchedulerOutput& out) {
  DS_CHECK(!running_.empty());
  Request* victim = running_.back();
  running_.pop_back();
  kv_.free(victim->spec.id);
  victim->draft_tokens.clear();
  victim->n_computed_tokens = 0;
  victim->state = RequestState::kPreempted;
  victim->announce_table = false;  // a fork preempted before it ran resumes like any other
  ++victim->n_preemptions;
  ++n_preemptions_;
  waiting_.push_front(victim);
  out.preempted.push_back(victim->spec.id);
}

SchedulerOutput Scheduler::schedule() {
  DS_CHECK_MSG(!step_in_flight_, "schedule() again before update_from_output()");
  step_in_flight_ = true;
  ++n_steps_;
  SchedulerOutput out;
  out.finished = std::move(finished_since_last_step_);
  finished_since_last_step_.clear();
  int budget = config_.max_num_batched_tokens;

  auto emit = [&](Request& r, int n_new, int n_drafts, size_t n_blocks_before, bool is_new,
                  bool is_resumed) {
    if (r.announce_table) {  // forked in the last update: the runner has not seen it
      r.announce_table = false;
      is_new = true;
      n_blocks_before = 0;
    }
    ScheduledRequest s;
    s.id = r.spec.id;
    s.start_pos = r.n_computed_tokens;
    s.n_tokens = n_new;
    s.token_ids.assign(r.all_tokens.begin() + s.start_pos,
                       r.all_tokens.begin() + s.start_pos + n_new);
    s.is_new = is_new;
    s.is_resumed = is_resumed;
    s.sample = s.start_pos + n_new == r.n_tokens();
    s.draft_token_ids.assign(r.draft_tokens.begin(), r.draft_tokens.begin() + n_drafts);
    r.draft_tokens.clear();
    std::span<const kvcache::BlockId> table = kv_.block_table(r.spec.id);
    s.new_block_ids.assign(table.begin() + n_blocks_before, table.end());
    out.n_scheduled_tokens += n_new + n_drafts;
    budget -= n_new + n_drafts;
    out.requests.push_back(std::move(s));
  };

  // 1. Running requests, oldest first. Victims come from the back, which has not been
  // scheduled yet this step, so no planned request loses its blocks.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request& r = *running_[i];
    const int n_new = std::min(r.n_tokens() - r.n_computed_tokens, budget);
    DS_CHECK(n_new > 0);
    const bool reaches_end = r.n_computed_tokens + n_new == r.n_tokens();
    int n_drafts = reaches_end ? n_drafts_to_run(r, budget - n_new) : 0;
    int n_ahead = reaches_end ? config_.lookahead_slots : 0;
    const size_t n_before = kv_.block_table(r.spec.id).size();
    bool preempted_self = false;
    while (!kv_.allocate_slots(r.spec.id, r.tokens(), r.n_computed_tokens, n_new, nullptr,
                               n_drafts + n_ahead)) {
      if (n_drafts + n_ahead > 0) {  // drafts are a bet: drop them before preempting anyone
        n_drafts = n_ahead = 0;
        continue;
      }
      preempted_self = running_.back() == &r;
      preempt_newest(out);
      if (preempted_self) break;
    }
    if (preempted_self) break;  // r was the newest: nothing after it remains
    emit(r, n_new, n_drafts, n_before, /*is_new=*/false, /*is_resumed=*/false);
    ++i;
  }

  // 2. Waiting requests, first come first served, unless this step had to preempt.
  if (out.preempted.empty()) {
    while (!waiting_.empty() && budget > 0 &&
           static_cast<int>(running_.size()) < config_.max_num_seqs) {
      Request& r = *waiting_.front();
      DS_CHECK(r.n_computed_tokens == 0);
      kvcache::PrefixHit hit = r.spec.skip_prefix_cache
                                   ? kvcache::PrefixHit{}
                                   : kv_.get_computed_blocks(r.spec.id, r.tokens());
      const int n_new = std::min(r.n_tokens() - hit.n_tokens, budget);
      if (!kv_.allocate_slots(r.spec.id, r.tokens(), hit.n_tokens, n_new, &hit)) break;
      waiting_.pop_front();
      const bool resumed = r.state == RequestState::kPreempted;
      r.state = RequestState::kRunning;
      r.n_computed_tokens = hit.n_tokens;  // the cached prefix counts as computed
      running_.push_back(&r);
      emit(r, n_new, /*n_drafts=*/0, 0, !resumed, resumed);
    }
  }

  // Copies into forks preempted before they ran are moot.
  for (const auto& [child, copy] : pending_copies_) {
    const Request* c = find(child);
    if (c != nullptr && c->state == RequestState::kRunning) out.block_copies.push_back(copy);
  }
  pending_copies_.clear();
  return out;
}

std::vector<RequestOutput> Scheduler::update_from_output(const SchedulerOutput& output,
                                                         std::span<const int32_t> sampled) {
  std::vector<std::vector<int32_t>> emitted(sampled.size());
  for (size_t i = 0; i < sampled.size(); ++i) emitted[i].push_back(sampled[i]);
  return update_from_output(output, emitted);
}

std::vector<RequestOutput> Scheduler::update_from_output(
    const SchedulerOutput& output, std::span<const std::vector<int32_t>> emitted) {
  DS_CHECK_MSG(step_in_flight_, "update_from_output() without schedule()");
  DS_CHECK(emitted.size() == output.requests.size());
  step_in_flight_ = false;
  std::vector<RequestOutput> outs;
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const ScheduledRequest& s = output.requests[i];
    auto it = requests_.find(s.id);
    DS_CHECK_MSG(it != requests_.end(), "planned request %llu vanished",
                 static_cast<unsigned long long>(s.id));
    Request& r = *it->second;
    DS_CHECK(r.state == RequestState::kRunning && r.n_computed_tokens == s.start_pos);
    r.n_computed_tokens += s.n_tokens;
    if (!s.sample || pending_finish_.count(s.id) != 0) continue;
    DS_CHECK(r.n_computed_tokens == r.n_tokens());
    const std::vector<int32_t>& tokens = emitted[i];
    DS_CHECK(!tokens.empty() && tokens.size() <= s.draft_token_ids.size() + 1);
    if (!r.pending_forks.empty()) release_forks(r, /*share=*/true);  // the prompt is computed
    for (size_t k = 0; k < tokens.size(); ++k) {
      // Every token before the last is an accepted draft: its keys and values are in.
      if (k > 0) {
        DS_CHECK(tokens[k - 1] == s.draft_token_ids[k - 1]);
        ++r.n_computed_tokens;
      }
      r.all_tokens.push_back(tokens[k]);
      RequestOutput o{s.id, tokens[k], r.stop_reason(config_.max_model_len)};
      outs.push_back(o);
      if (o.finish_reason) {
        finish(r);
        break;
      }
    }
  }
  for (const auto& [id, reason] : pending_finish_) {
    auto it = requests_.find(id);
    if (it != requests_.end()) finish(*it->second);
  }
  pending_finish_.clear();
  return outs;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.n_steps = n_steps_;
  s.n_preemptions = n_preemptions_;
  s.n_waiting = static_cast<int>(waiting_.size());
  s.n_running = static_cast<int>(running_.size());
  s.kv = kv_.stats();
  return s;
}

Status Scheduler::check_invariants() const {
  DS_RETURN_IF_ERROR(kv_.check_invariants());
  size_t n_pending = 0;
  for (const auto& [id, r] : requests_) {
    if (r->state != RequestState::kForkPending) continue;
    ++n_pending;
    if (!kv_.block_table(id).empty()) return internal_error("a pending fork holds blocks");
    const auto& sib = r->fork_parent->pending_forks;
    if (std::find(sib.begin(), sib.end(), r.get()) == sib.end())
      return internal_error("fork lost by its parent");
  }
  if (waiting_.size() + running_.size() + n_pending != requests_.size()) {
    return internal_error("waiting + running + pending forks != unfinished requests");
  }
  if (static_cast<int>(running_.size()) > config_.max_num_seqs)
    return internal_error("more running than max_num_seqs");
  for (const Request* r : waiting_) {
    if (r->state != RequestState::kWaiting && r->state != RequestState::kPreempted) {
      return internal_error("waiting request " + std::to_string(r->spec.id) + " is " +
                            request_state_name(r->state));
    }
    if (!kv_.block_table(r->spec.id).empty() || r->n_computed_tokens != 0) {
      return internal_error("waiting request " + std::to_string(r->spec.id) +
                            " holds blocks or computed tokens");
    }
  }
  for (const Request* r : running_) {
    if (r->state != RequestState::kRunning)
      return internal_error("running request in the wrong state");
    if (static_cast<int>(kv_.block_table(r->spec.id).size()) <
        kv_.blocks_for(r->n_computed_tokens)) {
      return internal_error("running request " + std::to_string(r->spec.id) +
                            " lacks blocks for its tokens");
    }
    if (r->n_computed_tokens >= r->n_tokens() || r->n_tokens() > config_.max_model_len) {
      return internal_error("running request " + std::to_string(r->spec.id) +
                            " has a bad token count");
    }
  }
  return Status::Ok();
}

}  // namespace dserve::sched
