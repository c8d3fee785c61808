// Prompt lookup against a brute-force reading of its definition: for n from n_max
// down to n_min, the latest earlier place where the last n tokens occur, and the
// tokens after it.
#include "spec/ngram_proposer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace dserve::spec {
namespace {

std::vector<int32_t> brute_force(const std::vector<int32_t>& t, int n_min, int n_max, int k) {
  const int64_t len = static_cast<int64_t>(t.size());
  for (int n = n_max; n >= n_min; --n) {
    if (len < n + 1) continue;
    // Earlier occurrences start at s with s + n <= len - 1; the latest first.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (std::equal(t.begin() + s, t.begin() + s + n, t.end() - n)) {
        const int64_t from = s + n;
        return {t.begin() + from, t.begin() + std::min<int64_t>(from + k, len)};
      }
    }
  }
  return {};
}

TEST(NgramProposerTest, CopiesWhatFollowedTheLatestLongestMatch) {
  // "... 7 8 9 1 2 ... 7 8 9 3 4 ... 8 9": the 2-gram "8 9" last occurred before "3 4".
  const std::vector<int32_t> t = {5, 7, 8, 9, 1, 2, 6, 7, 8, 9, 3, 4, 0, 8, 9};
  EXPECT_EQ(propose_ngram(t, 1, 3, 2), (std::vector<int32_t>{3, 4}));
  // "7 8 9" is the longer match when the sequence ends with it.
  const std::vector<int32_t> u = {7, 8, 9, 1, 2, 0, 8, 9, 5, 7, 8, 9};
  EXPECT_EQ(propose_ngram(u, 1, 3, 3), (std::vector<int32_t>{1, 2, 0}));
  // Nothing of n_min tokens recurs: no drafts.
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{1, 2, 3, 4}, 1, 3, 2).empty());
  EXPECT_TRUE(propose_ngram(u, 4, 6, 2).empty());
  // The copy stops at the end of the sequence.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{1, 2, 1}, 1, 1, 5), (std::vector<int32_t>{2, 1}));
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{}, 1, 2, 3).empty());
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{3}, 1, 2, 3).empty());
}

TEST(NgramProposerTest, AgreesWithBruteForceOnRandomSequences) {
  std::mt19937 gen(3);
  for (int trial = 0; trial < 3000; ++trial) {
    const int len = std::uniform_int_distribution<int>(0, 60)(gen);
    const int alphabet = std::uniform_int_distribution<int>(2, 6)(gen);
    std::vector<int32_t> t(len);
    for (int32_t& x : t) x = std::uniform_int_distribution<int>(0, alphabet - 1)(gen);
    const int n_min = std::uniform_int_distribution<int>(1, 4)(gen);
    const int n_max = n_min + std::uniform_int_distribution<int>(0, 4)(gen);
    const int k = std::uniform_int_distribution<int>(1, 5)(gen);
    ASSERT_EQ(propose_ngram(t, n_min, n_max, k), brute_force(t, n_min, n_max, k))
        << "trial " << trial;
  }
}

}  // namespace
}  // namespace dserve::spec
