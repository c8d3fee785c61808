// Fuzz target: model output read for tool calls: the --tool-call-parser formats
// (server/tool_call_parser.h) and, through ToolOutput (server/tool_output.h), the output
// of tool_choice "required" (a JSON list of calls) and of a named function (its
// arguments). The input is the mode on the first line, then the output text:
//
//   hermes | deepseek_v3 | deepseek_v31 | required | function
//   <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>
//
// The text is given whole and again in the pieces a decoder hands over (stream_pieces.h);
// both must find the same content and calls, each delta must hold whole UTF-8
// characters, and a call's argument pieces must add up to its arguments.
#include <cstdlib>
#include <map>
#include <string>

#include "fuzz_support.h"
#include "server/tool_call_parser.h"
#include "server/tool_output.h"
#include "stream_pieces.h"

namespace {

using namespace dserve::server;
using json = nlohmann::ordered_json;

// A parser's output, accumulated as the OpenAI SDK accumulates deltas.
struct Parsed {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool valid = false;
  bool operator==(const Parsed&) const = default;
};

void take(const ToolCallParser::Delta& d, Parsed* out) {
  if (!dserve::fuzz::is_valid_utf8(d.content)) std::abort();  // a character cut in two
  out->content += d.content;
  for (const ToolCallParser::CallDelta& c : d.calls) {
    if (!dserve::fuzz::is_valid_utf8(c.arguments) || !dserve::fuzz::is_valid_utf8(c.name)) std::abort();
    if (c.index == static_cast<int>(out->calls.size())) {
      out->calls.emplace_back(c.name, c.arguments);
    } else if (c.index == static_cast<int>(out->calls.size()) - 1 && c.name.empty()) {
      out->calls.back().second += c.arguments;
    } else {
      std::abort();  // a delta for a call that is not the current one
    }
  }
}

Parsed parse(ToolCallFormat format, const std::vector<std::string_view>& pieces) {
  ToolCallParser parser(format);
  Parsed out;
  for (std::string_view piece : pieces) take(parser.add(piece), &out);
  take(parser.flush(), &out);
  out.valid = parser.valid();
  if (parser.n_calls() != static_cast<int>(out.calls.size())) std::abort();
  return out;
}

// ToolOutput's final message, call ids left out (they are random).
json tool_output(ToolChoice choice, std::optional<ToolCallFormat> format,
                 const std::vector<std::string_view>& pieces) {
  ToolOutput output(choice, "get_weather", format);
  for (std::string_view piece : pieces) (void)output.add(piece);
  (void)output.flush();
  json calls = output.tool_calls();
  for (json& c : calls) c.erase("id");
  (void)output.finish_reason("stop");
  return {{"content", output.content()}, {"tool_calls", calls}};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = dserve::fuzz::as_text(data, size);
  const size_t newline = input.find('\n');
  if (newline == std::string_view::npos) return 0;
  const std::string_view mode = input.substr(0, newline);
  const std::string_view text = input.substr(newline + 1);
  if (!dserve::fuzz::is_valid_utf8(text)) return 0;  // decoded text always is
  const std::vector<std::string_view> whole = {text};
  const std::vector<std::string_view> pieces = dserve::fuzz::decoder_pieces(text);
  ToolChoice choice = ToolChoice::kAuto;
  std::optional<ToolCallFormat> format;
  if (mode == "required") {
    choice = ToolChoice::kRequired;
  } else if (mode == "function") {
    choice = ToolChoice::kFunction;
  } else {
    format = tool_call_format(mode);
    if (!format) return 0;
    if (parse(*format, whole) != parse(*format, pieces)) std::abort();  // streaming differs
  }
  if (tool_output(choice, format, whole) != tool_output(choice, format, pieces)) std::abort();
  return 0;
}
