// DraftThrottle: the pause schedule its header promises.
#include "spec/draft_throttle.h"

#include <gtest/gtest.h>

namespace dserve::spec {
namespace {

// Steps without drafts before the next drafting step.
int pause_after_miss(DraftThrottle& t, uint64_t id) {
  t.record(id, 0);
  int n = 0;
  while (!t.should_draft(id)) ++n;
  return n;
}

TEST(DraftThrottleTest, PausesDoubleAfterRepeatedMissesAndResetOnAnAcceptance) {
  DraftThrottle t;
  EXPECT_TRUE(t.should_draft(1));
  EXPECT_EQ(pause_after_miss(t, 1), 0);  // one miss: keep drafting
  EXPECT_EQ(pause_after_miss(t, 1), 1);
  EXPECT_EQ(pause_after_miss(t, 1), 2);
  EXPECT_EQ(pause_after_miss(t, 1), 4);
  EXPECT_EQ(pause_after_miss(t, 1), 8);
  EXPECT_EQ(pause_after_miss(t, 1), 16);
  EXPECT_EQ(pause_after_miss(t, 1), 32);
  EXPECT_EQ(pause_after_miss(t, 1), 32);  // capped
  EXPECT_TRUE(t.should_draft(2));          // other sequences are not affected
  t.record(1, 2);                          // an acceptance resets
  EXPECT_TRUE(t.should_draft(1));
  EXPECT_EQ(pause_after_miss(t, 1), 0);
  t.forget(1);
  EXPECT_EQ(t.n_tracked(), 0u);
}

}  // namespace
}  // namespace dserve::spec
