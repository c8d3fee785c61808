// FinishReason: why a request ended. A leaf header, so that the public API
// (include/dserve) can name it without the scheduler.
//
// Thread-safety: plain data.
#pragma once

namespace dserve::sched {

enum class FinishReason {
  kStop,    // a stop token (or, through finish_request, a stop string)
  kLength,  // max_tokens or max_model_len reached
  kAbort,   // cancelled by the client
};
const char* finish_reason_name(FinishReason r);

}  // namespace dserve::sched
