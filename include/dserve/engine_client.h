// EngineClient: what the API server needs from "the engine", in the manner of vLLM's
// EngineClient / EngineCoreClient: one in-process engine (AsyncLlm) or several
// data-parallel engines, some of them in other processes or on other machines
// (engine/dp_engine_client.h), behind the same calls. serving.cc sees only this.
//
// Thread-safety: every method may be called from any thread, concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dserve/llm.h"

namespace dserve {

class OutputQueue;

class EngineClient {
 public:
  virtual ~EngineClient() = default;

  // Hands a request to an engine and waits until that engine has validated it; the
  // error says why when it did not. Returns ids for the options.n sequences (to
  // abort them); sequence j's deltas go to `queue` tagged index + j.
  virtual Result<std::vector<RequestId>> add_request(std::vector<int32_t> prompt,
                                                     const SamplingOptions& options,
                                                     std::shared_ptr<OutputQueue> queue,
                                                     int index) = 0;
  // Cancels a sequence (no-op if it already finished); its queue gets "abort".
  virtual void abort(RequestId id) = 0;
  // Refuses new requests from now on (add_request fails with ResourceExhausted).
  virtual void stop_accepting() = 0;
  // False once the engine(s) can serve no more requests: /health reports 503.
  virtual bool healthy() const = 0;
  // Waits until no request is unfinished, or `timeout`; true when idle.
  virtual bool wait_idle(std::chrono::milliseconds timeout) = 0;
  // Aborts every unfinished request.
  virtual void abort_all() = 0;
  // Sequences added and not yet finished: the load a data-parallel balancer compares.
  virtual int64_t load() const = 0;

  virtual const Tokenizer* tokenizer() const = 0;
  virtual int max_model_len() const = 0;
  virtual int64_t vocab_size() const = 0;
};

}  // namespace dserve
