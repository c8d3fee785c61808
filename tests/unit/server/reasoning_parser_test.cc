// The streamed split must equal the whole-text split wherever the text is cut into
// pieces (tags split across tokens included), and the whole-text split must follow
// the rule: before the first </think> is reasoning (a leading <think> dropped), after
// it is content, and without </think> everything is reasoning.
#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dserve::server {
namespace {

const std::vector<std::string> kTexts = {
    "",
    "plain thoughts",
    "<think>a</think>b",
    "a</think>b",
    "</think>",
    "<thi",
    "</thin",
    "x</think>y</think>z",
    "<think>\nLet me think</think>\n\nAnswer",
    "a <think> b </think> c",
    "<<think>x",
    "é</think>ü",
};

TEST(ReasoningParser, SplitRule) {
  for (const std::string& t : kTexts) {
    std::string body = t.rfind("<think>", 0) == 0 ? t.substr(7) : t;
    const size_t close = body.find("</think>");
    const std::string reasoning = close == std::string::npos ? body : body.substr(0, close);
    const std::string content = close == std::string::npos ? "" : body.substr(close + 8);
    ReasoningParser::Delta d = ReasoningParser::split(t);
    EXPECT_EQ(d.reasoning, reasoning) << t;
    EXPECT_EQ(d.content, content) << t;
  }
}

TEST(ReasoningParser, StreamedEqualsWholeAtEveryCut) {
  for (const std::string& t : kTexts) {
    const ReasoningParser::Delta whole = ReasoningParser::split(t);
    for (size_t i = 0; i <= t.size(); ++i) {
      for (size_t j = i; j <= t.size(); ++j) {
        ReasoningParser p;
        std::string r, c;
        for (const std::string& piece : {t.substr(0, i), t.substr(i, j - i), t.substr(j)}) {
          ReasoningParser::Delta d = p.add(piece);
          r += d.reasoning;
          c += d.content;
        }
        ReasoningParser::Delta f = p.flush();
        EXPECT_EQ(r + f.reasoning, whole.reasoning) << t << " cut " << i << "," << j;
        EXPECT_EQ(c + f.content, whole.content) << t << " cut " << i << "," << j;
      }
    }
  }
}

}  // namespace
}  // namespace dserve::server
