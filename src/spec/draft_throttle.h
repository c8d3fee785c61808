// DraftThrottle: stops drafting for a sequence whose drafts keep being rejected.
//
// A verify step costs more than a plain decode step (every draft is a query position
// of the forward pass, and for a MoE model may touch more experts), so drafts that are
// never accepted make decoding slower. On chat that does not copy from its prompt,
// prompt lookup still finds short matches and drafts nearly every step. After two
// verify steps in a row with nothing accepted, a sequence pauses drafting for 1 step,
// then 2, 4, ... up to 32 (each pause ends with one probing step); one accepted draft
// resets it. Output never depends on this: only how often a sequence speculates.
//
// Thread-safety: not thread-safe (the engine thread's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace dserve::spec {

class DraftThrottle {
 public:
  // After a step that verified drafts of sequence `id`: how many it accepted.
  void record(uint64_t id, int n_accepted);
  // Whether sequence `id` should get drafts for its next step; a paused one counts
  // its pause down.
  bool should_draft(uint64_t id);
  // The sequence ended.
  void forget(uint64_t id) { states_.erase(id); }
  size_t n_tracked() const { return states_.size(); }

  static constexpr int kMissesBeforePause = 2;
  static constexpr int kMaxPause = 32;

 private:
  struct State {
    int misses = 0;  // verify steps in a row with nothing accepted
    int pause = 0;   // steps left without drafts
  };
  std::unordered_map<uint64_t, State> states_;
};

}  // namespace dserve::spec
