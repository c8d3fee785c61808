#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace dserve {

std::string IncrementalDecoder::add(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return std::string();
  pending_ += tokenizer_.token_bytes(id);
  // Everything but a trailing, still-completable partial character is final: invalid
  // bytes before it cannot become valid, so repairing them now gives what a full
  // decode gives.
  const size_t hold = utf8::incomplete_tail_length(pending_);
  const size_t ready = pending_.size() - hold;
  if (ready == 0) return std::string();
  std::string out = utf8::repair(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out = utf8::repair(pending_);
  pending_.clear();
  return out;
}

}  // namespace dserve
