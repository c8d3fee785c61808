// The tool-call parser must give the same content and calls however the text is cut
// into pieces (markers split across tokens included), stream each call's arguments as
// pieces that concatenate to the arguments, and survive any malformed text (no crash,
// valid() false). The formats are rendered here from (name, arguments) pairs the way the
// models' chat templates render an assistant's tool_calls; the server tests check the
// same against the real templates through transformers.
#include "server/tool_call_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace dserve::server {
namespace {

struct Call {
  std::string name, arguments;
  bool operator==(const Call&) const = default;
};
struct Parsed {
  std::string content;
  std::vector<Call> calls;
  bool valid = true;
};

Parsed collect(ToolCallFormat format, const std::vector<std::string>& pieces) {
  ToolCallParser p(format);
  Parsed out;
  auto take = [&](ToolCallParser::Delta d) {
    out.content += d.content;
    for (auto& c : d.calls) {
      if (c.index == static_cast<int>(out.calls.size())) {
        out.calls.push_back({c.name, ""});
      } else {
        EXPECT_EQ(c.index, static_cast<int>(out.calls.size()) - 1);
        EXPECT_TRUE(c.name.empty());
      }
      out.calls.back().arguments += c.arguments;
    }
  };
  for (const std::string& s : pieces) take(p.add(s));
  take(p.flush());
  out.valid = p.valid();
  EXPECT_EQ(p.n_calls(), static_cast<int>(out.calls.size()));
  return out;
}

std::string render_v3(const std::vector<Call>& calls) {
  std::string s = "<｜tool▁calls▁begin｜>";
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) s += "\n";
    s += "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + calls[i].name + "\n```json\n" +
         calls[i].arguments + "\n```<｜tool▁call▁end｜>";
  }
  return s + "<｜tool▁calls▁end｜>";
}

std::string render_v31(const std::vector<Call>& calls) {
  std::string s = "<｜tool▁calls▁begin｜>";
  for (const Call& c : calls) {
    s += "<｜tool▁call▁begin｜>" + c.name + "<｜tool▁sep｜>" + c.arguments + "<｜tool▁call▁end｜>";
  }
  return s + "<｜tool▁calls▁end｜>";
}

std::string render_hermes(const std::vector<Call>& calls) {
  std::string s;
  for (const Call& c : calls) {
    s += "\n<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + c.arguments +
         "}\n</tool_call>";
  }
  return s;
}

const std::vector<std::vector<Call>> kCallSets = {
    {{"get_weather", "{\"city\": \"Paris\"}"}},
    {{"f", "{}"}, {"g", "{\"a\": [1, 2, {\"b\": \"}`\"}]}"}},
    {{"search", "{\"q\": \"caf\xc3\xa9 ``` } \\\"x\\\"\", \"n\": 3}"}},
};

void check_all_cuts(ToolCallFormat format, const std::string& text, const Parsed& want) {
  const Parsed whole = collect(format, {text});
  EXPECT_EQ(whole.content, want.content) << text;
  EXPECT_EQ(whole.calls, want.calls) << text;
  EXPECT_EQ(whole.valid, want.valid) << text;
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const Parsed two = collect(format, {text.substr(0, cut), text.substr(cut)});
    EXPECT_EQ(two.content, want.content) << cut;
    EXPECT_EQ(two.calls, want.calls) << cut;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const Parsed each = collect(format, bytes);
  EXPECT_EQ(each.content, want.content);
  EXPECT_EQ(each.calls, want.calls);
}

TEST(ToolCallParser, DeepSeekV3) {
  for (const auto& calls : kCallSets) {
    check_all_cuts(ToolCallFormat::kDeepSeekV3, "I will look.\n\n" + render_v3(calls),
                   {"I will look.\n\n", calls, true});
    check_all_cuts(ToolCallFormat::kDeepSeekV3, render_v3(calls), {"", calls, true});
  }
}

TEST(ToolCallParser, DeepSeekV31) {
  for (const auto& calls : kCallSets) {
    check_all_cuts(ToolCallFormat::kDeepSeekV31, "ok" + render_v31(calls), {"ok", calls, true});
  }
}

TEST(ToolCallParser, Hermes) {
  for (const auto& calls : kCallSets) {
    check_all_cuts(ToolCallFormat::kHermes, "Let me check." + render_hermes(calls),
                   {"Let me check.\n", calls, true});
  }
  // Arguments before the name: the call arrives whole, arguments re-serialised.
  check_all_cuts(ToolCallFormat::kHermes,
                 "<tool_call>{\"arguments\": {\"x\": 1}, \"name\": \"f\"}</tool_call>",
                 {"", {{"f", "{\"x\":1}"}}, true});
}

TEST(ToolCallParser, PlainTextIsContent) {
  for (ToolCallFormat f : {ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31,
                           ToolCallFormat::kHermes}) {
    const std::string text = "No tools < here <tool <｜tool▁calls";
    check_all_cuts(f, text, {text, {}, true});
  }
}

TEST(ToolCallParser, IncompleteOrBadCallsAreInvalid) {
  const std::string v3 = render_v3({{"f", "{\"a\": 1}"}});
  for (size_t cut = std::string("<｜tool▁calls▁begin｜>").size() + 1;
       cut < v3.find("<｜tool▁call▁end｜>"); ++cut) {
    EXPECT_FALSE(collect(ToolCallFormat::kDeepSeekV3, {v3.substr(0, cut)}).valid) << cut;
  }
  EXPECT_FALSE(collect(ToolCallFormat::kDeepSeekV3, {render_v3({{"f", "{not json"}})}).valid);
  EXPECT_FALSE(collect(ToolCallFormat::kHermes, {"<tool_call>{\"name\": 3}</tool_call>"}).valid);
  EXPECT_FALSE(collect(ToolCallFormat::kHermes, {"<tool_call>{\"name\": \"f\", \"arg"}).valid);
}

TEST(ToolCallParser, HermesCallEndsAtTheFirstEndMarker) {
  // Even inside what would be the name's JSON string: whole or cut anywhere, the call
  // is the text up to the marker (not a call), and the rest is what follows it.
  const std::string text =
      "ok\n<tool_call>\n{\"name\": \"get_we</tool_call>ather\", \"arguments\": {}}\n</tool_call>";
  const Parsed whole = collect(ToolCallFormat::kHermes, {text});
  EXPECT_FALSE(whole.valid);
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.calls[0].name, "");
  check_all_cuts(ToolCallFormat::kHermes, text, whole);
}

TEST(ToolCallParser, RandomTextNeverBreaksIt) {
  const std::vector<std::string> atoms = {
      "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁calls▁end｜>", "<tool_call>", "</tool_call>", "```json", "```", "\n", " ", "{",
      "}", "\"", "\"name\"", "\"arguments\"", ":", ",", "f", "\\", "<", "\xe2\x96"};
  std::mt19937 rng(7);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
    for (ToolCallFormat f : {ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31,
                             ToolCallFormat::kHermes}) {
      const Parsed whole = collect(f, {text});
      std::vector<std::string> pieces;
      for (size_t i = 0; i < text.size();) {
        const size_t len = 1 + rng() % 5;
        pieces.push_back(text.substr(i, len));
        i += len;
      }
      const Parsed cut = collect(f, pieces);
      EXPECT_EQ(cut.content, whole.content) << text;
      EXPECT_EQ(cut.calls, whole.calls) << text;
    }
  }
}

}  // namespace
}  // namespace dserve::server
