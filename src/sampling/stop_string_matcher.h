// StopStringMatcher: finds stop strings in a sequence's text as it is decoded, token
// by token, including stop strings that span several tokens.
//
// It never emits a stop string, nor any part of one that may still complete: the
// longest suffix of the text that is a prefix of some stop string is held back until
// the next piece shows whether it completes (then the text before it is the final
// output, or the text through it with include_stop_str: vLLM's
// include_stop_str_in_output, default false) or not (then it is emitted).
// When several stop strings match, the one starting earliest wins, so the output is
// the shortest text that ends before any stop string.
//
// Input pieces must be whole UTF-8 characters (as IncrementalDecoder gives them).
// Stop strings are valid UTF-8, so a match or a held-back suffix always starts on a
// character boundary and every emitted piece is whole characters too.
//
// Cost per piece: O(held-back + piece length) per stop string for the search, and
// O(S * L^2) for the held-back suffix (S stop strings of at most L bytes).
//
// Thread-safety: not thread-safe; one per sequence.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dserve {

class StopStringMatcher {
 public:
  // stops: non-empty strings (SamplingParams validates this).
  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop_str = false);

  struct Output {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string ended the output; `text` is the last of it
  };

  // Adds the next decoded piece. After a stop, returns {"", true} forever.
  Output add(std::string_view piece);

  // At the end of generation for another reason (eos, max_tokens): the held-back
  // text, which can no longer become a stop string. Empty after a stop.
  std::string flush();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_str_;
  std::string pending_;  // held back: a proper prefix of some stop string
  bool stopped_ = false;
};

}  // namespace dserve
