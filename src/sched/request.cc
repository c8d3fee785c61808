#include "sched/request.h"

#include <algorithm>

namespace dserve::sched {

const char* request_state_name(RequestState s) {
  switch (s) {
    case RequestState::kWaiting:
      return "waiting";
    case RequestState::kRunning:
      return "running";
    case RequestState::kPreempted:
      return "preempted";
    case RequestState::kForkPending:
      return "fork pending";
    case RequestState::kFinished:
      return "finished";
  }
  return "?";
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "?";
}

Status RequestSpec::validate() const {
  const std::string who = "request " + std::to_string(id) + ": ";
  if (prompt.empty()) return invalid_argument(who + "empty prompt");
  if (max_tokens < 1)
    return invalid_argument(who + "max_tokens must be >= 1, got " + std::to_string(max_tokens));
  if (min_tokens < 0)
    return invalid_argument(who + "min_tokens must be >= 0, got " + std::to_string(min_tokens));
  for (RequestId f : fork_ids) {
    if (f == id || std::count(fork_ids.begin(), fork_ids.end(), f) > 1) {
      return invalid_argument(who + "fork ids must be distinct from each other and the request");
    }
  }
  return Status::Ok();
}

Request::Request(RequestSpec s)
    : spec(std::move(s)),
      n_prompt_tokens(static_cast<int>(spec.prompt.size())),
      all_tokens(spec.prompt) {}

std::optional<FinishReason> Request::stop_reason(int max_model_len) const {
  const int n_out = n_output_tokens();
  if (n_out > 0 && n_out >= spec.min_tokens) {
    const auto& stops = spec.stop_token_ids;
    if (std::find(stops.begin(), stops.end(), all_tokens.back()) != stops.end())
      return FinishReason::kStop;
  }
  if (n_out >= spec.max_tokens || n_tokens() >= max_model_len) return FinishReason::kLength;
  return std::nullopt;
}

}  // namespace dserve::sched
