// ProgressBar: a one-line progress display on stderr for slow operations (model
// loads). Silent for the first second so that fast loads print nothing.
// Thread-safety: one thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dserve {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total);
  ~ProgressBar();  // finishes the line if anything was drawn
  void update(int64_t done);

 private:
  std::string label_;
  int64_t total_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
  bool tty_;
};

}  // namespace dserve
