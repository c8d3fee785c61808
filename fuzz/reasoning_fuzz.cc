// Fuzz target: model output split into reasoning and answer (server/reasoning_parser.h,
// --reasoning-parser deepseek_r1). The input is the output text; the first byte says
// whether the prompt already closed the reasoning (odd: it did). The text is split
// whole and again streamed in the pieces a decoder hands over (stream_pieces.h): both
// must give the same reasoning and answer, and each delta whole UTF-8 characters.
#include <cstdlib>
#include <string>

#include "fuzz_support.h"
#include "server/reasoning_parser.h"
#include "stream_pieces.h"

namespace {

using dserve::server::ReasoningParser;

void take(const ReasoningParser::Delta& d, ReasoningParser::Delta* out) {
  if (!dserve::fuzz::is_valid_utf8(d.reasoning) || !dserve::fuzz::is_valid_utf8(d.content)) {
    std::abort();  // a character cut in two
  }
  out->reasoning += d.reasoning;
  out->content += d.content;
}

ReasoningParser::Delta parse(bool prompt_closed, const std::vector<std::string_view>& pieces) {
  ReasoningParser parser(prompt_closed);
  ReasoningParser::Delta out;
  for (std::string_view piece : pieces) take(parser.add(piece), &out);
  take(parser.flush(), &out);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool prompt_closed = data[0] & 1;
  const std::string_view text = dserve::fuzz::as_text(data + 1, size - 1);
  if (!dserve::fuzz::is_valid_utf8(text)) return 0;  // decoded text always is
  const ReasoningParser::Delta whole = parse(prompt_closed, {text});
  const ReasoningParser::Delta streamed = parse(prompt_closed, dserve::fuzz::decoder_pieces(text));
  if (whole.reasoning != streamed.reasoning || whole.content != streamed.content) std::abort();
  if (!prompt_closed) {
    const ReasoningParser::Delta split = ReasoningParser::split(text);
    if (split.reasoning != whole.reasoning || split.content != whole.content) std::abort();
  }
  (void)ReasoningParser::closes_reasoning(text);
  return 0;
}
