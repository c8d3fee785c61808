#include "base/progress_bar.h"

#include <unistd.h>

#include <cstdio>

namespace dserve {

ProgressBar::ProgressBar(std::string label, int64_t total)
    : label_(std::move(label)),
      total_(total > 0 ? total : 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_),
      tty_(isatty(STDERR_FILENO) != 0) {}

ProgressBar::~ProgressBar() {
  if (drawn_) {
    update(total_);
    std::fputc('\n', stderr);
  }
}

void ProgressBar::update(int64_t done) {
  auto now = std::chrono::steady_clock::now();
  if (now - start_ < std::chrono::seconds(1)) return;
  // Without a terminal, redraw rarely so logs stay readable.
  auto interval = tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000);
  if (drawn_ && done < total_ && now - last_draw_ < interval) return;
  last_draw_ = now;
  drawn_ = true;
  constexpr int kWidth = 30;
  int filled = static_cast<int>(kWidth * done / total_);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
  bar[kWidth] = 0;
  double secs = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "%s%s [%s] %3d%% %.1fs%s", tty_ ? "\r" : "", label_.c_str(), bar,
               static_cast<int>(100 * done / total_), secs, tty_ ? "" : "\n");
  std::fflush(stderr);
}

}  // namespace dserve
