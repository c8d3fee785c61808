#include "sampling/stop_string_matcher.h"

#include <gtest/gtest.h>

namespace dserve {
namespace {

// Feeds pieces one by one; returns everything emitted (plus flush() if not stopped)
// and whether a stop string was hit.
std::pair<std::string, bool> run(std::vector<std::string> stops,
                                 const std::vector<std::string>& pieces) {
  StopStringMatcher m(std::move(stops));
  std::string text;
  for (const std::string& p : pieces) {
    StopStringMatcher::Output o = m.add(p);
    text += o.text;
    if (o.stopped) return {text, true};
  }
  return {text + m.flush(), false};
}

TEST(StopStringMatcherTest, NoStopsPassesThrough) {
  StopStringMatcher m({});
  EXPECT_EQ(m.add("hello").text, "hello");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStringMatcherTest, StopInsideOnePiece) {
  EXPECT_EQ(run({"END"}, {"abc", "xEND tail"}), std::make_pair(std::string("abcx"), true));
}

TEST(StopStringMatcherTest, StopSpanningTokensIsHeldBackThenDropped) {
  StopStringMatcher m({"</s>"});
  EXPECT_EQ(m.add("Hi <").text, "Hi ");  // "<" may start "</s>": held back
  StopStringMatcher::Output o = m.add("/");
  EXPECT_EQ(o.text, "");
  EXPECT_FALSE(o.stopped);
  o = m.add("s>more");
  EXPECT_EQ(o.text, "");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(m.add("x").text, "");  // stays stopped
  EXPECT_TRUE(m.stopped());
}

TEST(StopStringMatcherTest, HeldBackTextReleasedWhenItCannotMatch) {
  StopStringMatcher m({"</s>"});
  EXPECT_EQ(m.add("a</").text, "a");
  EXPECT_EQ(m.add("b").text, "</b");
  EXPECT_EQ(m.add("<").text, "");
  EXPECT_EQ(m.flush(), "<");  // at eos the held-back text is output
}

TEST(StopStringMatcherTest, HoldsTheLongestPossibleStart) {
  // "aab" ends with "aa" and "a"; "aaa" may still start at either. Holding only the
  // shorter one would wrongly emit an "a" of "aaa".
  StopStringMatcher m({"aaa"});
  EXPECT_EQ(m.add("xaa").text, "x");
  StopStringMatcher::Output o = m.add("a");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
}

TEST(StopStringMatcherTest, OverlappingCandidatesEarliestWins) {
  // "abc" starts at 1, "bcd" at 2: the output ends before the earliest.
  EXPECT_EQ(run({"bcd", "abc"}, {"xa", "b", "cd"}), std::make_pair(std::string("x"), true));
  // One stop is a prefix of another: the shorter completes first.
  EXPECT_EQ(run({"ab", "abcd"}, {"1a", "bcd"}), std::make_pair(std::string("1"), true));
  // A partial of one candidate fails while another completes later.
  EXPECT_EQ(run({"abx", "bc"}, {"a", "b", "c"}), std::make_pair(std::string("a"), true));
}

TEST(StopStringMatcherTest, IncludeStopStringInOutput) {
  StopStringMatcher m({"</s>", "</"}, /*include_stop_str=*/true);
  EXPECT_EQ(m.add("ab<").text, "ab");
  StopStringMatcher::Output o = m.add("/s> tail");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "</");  // both start at the same place; the shorter one completes first
  StopStringMatcher m2({"END"}, true);
  EXPECT_EQ(m2.add("xEN").text, "x");
  o = m2.add("D!");
  EXPECT_EQ(o.text, "END");
}

TEST(StopStringMatcherTest, StopAtTheVeryStart) {
  EXPECT_EQ(run({"##"}, {"#", "#", "tail"}), std::make_pair(std::string(""), true));
}

TEST(StopStringMatcherTest, MultiByteUtf8) {
  // "é" is C3 A9, "日本" is E6 97 A5 E6 9C AC. Pieces are whole characters.
  EXPECT_EQ(run({"日本"}, {"caf", "é ", "日", "本", "!"}),
            std::make_pair(std::string("café "), true));
  // A stop string sharing a lead byte with the text: "é" vs "è" (C3 A8) must not be
  // held back as a partial character, and the text comes out whole.
  StopStringMatcher m({"è!"});
  EXPECT_EQ(m.add("é").text, "é");
  EXPECT_EQ(m.add("è").text, "");
  EXPECT_EQ(m.add("?").text, "è?");
  // A held-back multi-byte prefix completes across pieces.
  EXPECT_EQ(run({"—end"}, {"a—", "en", "d"}), std::make_pair(std::string("a"), true));
}

TEST(StopStringMatcherTest, EverythingEmittedEqualsTextBeforeStop) {
  // Property: for any split of the text into pieces, the concatenated output is the
  // text before the earliest stop string.
  const std::string text = "the cat<|im_end|> sat";
  for (size_t cut1 = 0; cut1 <= text.size(); ++cut1) {
    for (size_t cut2 = cut1; cut2 <= text.size(); ++cut2) {
      auto r = run({"<|im_end|>", "sat"},
                   {text.substr(0, cut1), text.substr(cut1, cut2 - cut1), text.substr(cut2)});
      EXPECT_EQ(r, std::make_pair(std::string("the cat"), true)) << cut1 << " " << cut2;
    }
  }
}

}  // namespace
}  // namespace dserve
