// OutputText: one sequence's generated tokens turned into the text a client sees:
// incremental detokenisation (never an incomplete UTF-8 character) followed by stop
// strings (never a stop string, nor a part of one that may still complete). The
// offline LLM and the serving AsyncLlm both finish requests on what it reports.
// Thread-safety: one per sequence, used by one thread.
#pragma once

#include <string>

#include "sampling/sampling_params.h"
#include "sampling/stop_string_matcher.h"
#include "tokenizer/tokenizer.h"

namespace dserve {

class OutputText {
 public:
  OutputText(const Tokenizer& tokenizer, const SamplingOptions& options)
      : decoder_(tokenizer, options.skip_special_tokens),
        stops_(options.stop, options.include_stop_str_in_output),
        include_stop_token_(options.include_stop_str_in_output) {}

  // The text that became final with token `id`; sets *stopped when a stop string
  // ended the output (nothing follows it then). A `stop_token` (the eos or stop id that
  // ended the request) adds no text unless include_stop_str_in_output, as vLLM.
  std::string add(int32_t id, bool* stopped, bool stop_token = false) {
    if (stops_.stopped()) {
      *stopped = true;
      return {};
    }
    if (stop_token && !include_stop_token_) return {};
    StopStringMatcher::Output so = stops_.add(decoder_.add(id));
    *stopped = so.stopped;
    return std::move(so.text);
  }

  // At the end of the output for another reason (stop id, length, abort): whatever
  // the decoder and the matcher still hold. Empty after a stop string.
  std::string finish() {
    if (stops_.stopped()) return {};
    StopStringMatcher::Output so = stops_.add(decoder_.flush());
    if (!so.stopped) so.text += stops_.flush();
    return std::move(so.text);
  }

 private:
  IncrementalDecoder decoder_;
  StopStringMatcher stops_;
  bool include_stop_token_;
};

}  // namespace dserve
