// AsyncLlm: the serving engine behind a thread, in the manner of vLLM's AsyncLLM.
// One engine thread owns the LLM's LlmEngine and runs schedule -> execute -> sample ->
// update for as long as there is work; HTTP handler threads add and abort requests and
// read each request's output from an OutputQueue, so a slow reader never stalls the
// engine or another reader.
//
//   auto queue = std::make_shared<dserve::OutputQueue>();
//   auto id = async->add_request(prompt_ids, options, queue, /*index=*/0);
//   while (auto items = queue->pop(100ms)) ...    // text deltas, then a finish reason
//
// The engine thread also detokenizes (never splitting a UTF-8 character) and matches
// stop strings, so a stop string ends a request at once and its blocks return to the
// pool in the same step. Timings (time to first token, inter-token latency, end to end)
// and engine counters go to an EngineObserver, e.g. the server's Prometheus metrics.
//
// Thread-safety: every public method of AsyncLlm and OutputQueue may be called from
// any thread. EngineObserver methods are called on the engine thread only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dserve/engine_client.h"
#include "dserve/llm.h"

namespace dserve {

namespace dist {
class Communicator;
}

// One piece of one request's output.
struct OutputDelta {
  int index = 0;                       // which of the caller's requests (n > 1 choices)
  std::string text;                    // text that became final with these tokens
  std::vector<int32_t> token_ids;      // tokens sampled since the last delta
  std::vector<SampleResult> logprobs;  // one per token, when the request asked for logprobs
  // With prompt_logprobs, on the first delta: prompt positions 1..P-1.
  std::vector<SampleResult> prompt_logprobs;
  // Set on the request's last delta: "stop", "length", "abort" or "error".
  std::optional<std::string> finish_reason;
  std::string error;  // with finish_reason "error": why the engine failed
};

// Where the engine thread puts a request's deltas for the thread serving it. Several
// requests (the n choices of one HTTP request) may share a queue.
class OutputQueue {
 public:
  OutputQueue() = default;
  // `on_push` runs after every push (outside the lock), e.g. to wake a poller that
  // forwards the deltas elsewhere; it must be thread-safe.
  explicit OutputQueue(std::function<void()> on_push) : on_push_(std::move(on_push)) {}
  // Everything queued so far; waits up to `timeout` when empty. Empty on timeout.
  std::vector<OutputDelta> pop(std::chrono::milliseconds timeout);
  void push(OutputDelta delta);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<OutputDelta> items_;  // GUARDED_BY(mu_)
  const std::function<void()> on_push_;
};

// Engine events for metrics; called on the engine thread.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  // After every step (and after requests were added or aborted).
  virtual void on_stats(const EngineStats& stats) {}
  // Per request and step that produced tokens: its prompt length on its first token
  // (prefill done, else 0) and the tokens generated, as vLLM counts them.
  virtual void on_tokens(int64_t n_prompt_tokens, int64_t n_generated_tokens) {}
  virtual void on_first_token(double seconds_since_arrival) {}
  virtual void on_inter_token(double seconds) {}
  // finish_reason: "stop", "length", "abort" or "error".
  virtual void on_finished(const std::string& finish_reason, int n_prompt_tokens,
                           int n_generated_tokens, double seconds_since_arrival) {}
  // The engine can serve no more: it failed, or (a data-parallel engine on another
  // node) its node stopped answering or it stopped stepping; `why` says which.
  virtual void on_engine_lost(const std::string& why) {}
  // A lost data-parallel engine is back: its node was restarted and joined again.
  virtual void on_engine_joined() {}
};

class AsyncLlm : public EngineClient {
 public:
  // Takes the loaded LLM and starts the engine thread. `observer` may be null and
  // must outlive the AsyncLlm. lockstep (may be null; must outlive the AsyncLlm): the
  // expert-parallel group of data-parallel engines this engine steps with
  // (engine/dp_lockstep.h), the communicator of the model's expert exchanges. Once
  // any engine of the group stops or fails, the others fail: they cannot step alone.
  static Result<std::unique_ptr<AsyncLlm>> create(std::unique_ptr<LLM> llm,
                                                  EngineObserver* observer = nullptr,
                                                  dist::Communicator* lockstep = nullptr);
  // Aborts whatever is still running and joins the engine thread.
  ~AsyncLlm();
  AsyncLlm(const AsyncLlm&) = delete;
  AsyncLlm& operator=(const AsyncLlm&) = delete;

  // Hands a request to the engine thread and waits until the engine has validated it
  // (prompt length, sampling options, whether it can ever fit in the KV cache); the
  // error says why when it did not. Returns the ids of its options.n sequences (they
  // share the prompt's KV blocks); sequence j's deltas go to `queue` tagged
  // index + j.
  Result<std::vector<RequestId>> add_request(std::vector<int32_t> prompt,
                                             const SamplingOptions& options,
                                             std::shared_ptr<OutputQueue> queue,
                                             int index) override;
  // Cancels a request (no-op if it already finished); its blocks are freed by the
  // engine thread before its next step, and its queue gets finish_reason "abort".
  void abort(RequestId id) override;

  // Refuses new requests from now on (add_request fails with ResourceExhausted).
  void stop_accepting() override;
  // False once an engine step failed (a tensor-parallel rank died, say): the engine
  // serves no more requests and /health reports 503.
  bool healthy() const override;
  // Waits until no request is unfinished, or `timeout`; true when idle.
  bool wait_idle(std::chrono::milliseconds timeout) override;
  // Aborts every unfinished request.
  void abort_all() override;
  int64_t load() const override;

  EngineStats stats() const;
  const Tokenizer* tokenizer() const override { return llm_->tokenizer(); }
  int max_model_len() const override { return max_model_len_; }
  int64_t vocab_size() const override { return llm_->vocab_size(); }

 private:
  struct Pending;
  struct Command;
  AsyncLlm(std::unique_ptr<LLM> llm, EngineObserver* observer);
  void run();
  void run_lockstep();
  // Applies the commands (or, when `refuse`, answers adds with an error); deletes them.
  void take(std::deque<Command*>& inbox, bool refuse, const char* why);
  // Marks the engine failed and ends every unfinished request with `error`.
  void fail(const Status& error);
  bool is_failed() const;
  void publish_stats();
  void abort_remaining();
  void apply(Command& c);
  void publish(std::vector<EngineOutput>& outputs);
  void finish(RequestId id, const std::string& reason, const std::string& error = "");

  std::unique_ptr<LLM> llm_;
  EngineObserver* observer_;
  dist::Communicator* lockstep_ = nullptr;
  int max_model_len_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;          // wakes the engine thread; and wait_idle
  std::deque<Command*> inbox_;          // GUARDED_BY(mu_)
  bool stopping_ = false;               // GUARDED_BY(mu_): the destructor asks the thread to end
  bool accepting_ = true;               // GUARDED_BY(mu_)
  int64_t n_unfinished_ = 0;            // GUARDED_BY(mu_): added and not yet finished
  EngineStats stats_;                   // GUARDED_BY(mu_): as of the last step
  RequestId next_id_ = 1;               // GUARDED_BY(mu_)
  bool failed_ = false;                 // GUARDED_BY(mu_): a step failed; the engine is unusable

  // Engine-thread state.
  std::unique_ptr<std::unordered_map<RequestId, Pending>> pending_;
  std::thread thread_;
};

}  // namespace dserve
