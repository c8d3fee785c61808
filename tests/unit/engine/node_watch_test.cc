// NodeWatch on a made-up clock: a node is lost once it is silent past the heartbeat
// deadline, or once an engine with work finishes no step within the step deadline;
// an idle engine is never "slow", and the step deadline runs from when work arrived.
#include "engine/node_watch.h"

#include <gtest/gtest.h>

namespace dserve {
namespace {

using namespace std::chrono_literals;
using Clock = NodeWatch::Clock;

TEST(NodeWatch, SilencePastTheHeartbeatDeadlineIsLoss) {
  const Clock::time_point t0{};
  NodeWatch w({1, 2}, {/*heartbeat_s=*/3.0, /*step_s=*/60.0}, t0);
  EXPECT_EQ(w.lost(t0 + 2900ms), "");
  w.heard(t0 + 2900ms);
  EXPECT_EQ(w.lost(t0 + 5800ms), "");
  const std::string why = w.lost(t0 + 6000ms);
  EXPECT_NE(why.find("stopped answering (3.1 s without a message; --engine-heartbeat-timeout 3)"),
            std::string::npos) << why;
}

TEST(NodeWatch, AnEngineWithWorkThatStopsSteppingIsLoss) {
  const Clock::time_point t0{};
  NodeWatch w({1, 2}, {/*heartbeat_s=*/3.0, /*step_s=*/5.0}, t0);
  // Idle for a minute (pings keep coming): not slow.
  for (auto t = t0; t < t0 + 60s; t += 1s) w.heard(t);
  EXPECT_EQ(w.lost(t0 + 60s), "");
  // Work arrives at 60 s: the deadline runs from then, not from the last step.
  w.set_work(2, 3, t0 + 60s);
  w.heard(t0 + 64s);
  EXPECT_EQ(w.lost(t0 + 64s), "");
  w.stepped(2, t0 + 64s);
  w.heard(t0 + 68s);
  EXPECT_EQ(w.lost(t0 + 68s), "");
  w.heard(t0 + 69500ms);
  const std::string why = w.lost(t0 + 69500ms);
  EXPECT_NE(why.find("engine 2 finished no step in 5.5 s with 3 unfinished sequence(s)"), std::string::npos)
      << why;
  EXPECT_NE(why.find("--engine-step-timeout 5"), std::string::npos) << why;
}

TEST(NodeWatch, AnEngineThatFinishedItsWorkIsNotSlow) {
  const Clock::time_point t0{};
  NodeWatch w({1}, {3.0, 5.0}, t0);
  w.set_work(1, 1, t0);
  w.set_work(1, 0, t0 + 1s);
  w.heard(t0 + 20s);
  EXPECT_EQ(w.lost(t0 + 20s), "");
  // An engine this node does not have is ignored.
  w.set_work(7, 1, t0 + 20s);
  EXPECT_EQ(w.lost(t0 + 22s), "");
}

}  // namespace
}  // namespace dserve
