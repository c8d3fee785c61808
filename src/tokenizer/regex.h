// Regex: a compiled Oniguruma pattern, the engine Hugging Face `tokenizers` itself
// uses for `Split` pre-tokenizers, so Unicode classes (\p{L}, \p{N}, \s), case folding
// and look-ahead behave exactly as they do there.
//
// Thread-safety: immutable after compile(); find_all() may run concurrently.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dserve {

class Regex {
 public:
  struct Match {
    size_t begin = 0;
    size_t end = 0;
  };

  // InvalidArgument with Oniguruma's message if `pattern` does not compile.
  static Result<std::unique_ptr<Regex>> compile(std::string_view pattern);
  // A pattern that matches `literal` exactly.
  static std::string escape(std::string_view literal);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All non-overlapping matches in `text` (valid UTF-8), left to right, with the
  // empty-match rule of the `onig` crate's find_iter (an empty match right where the
  // previous match ended is skipped by one character).
  void find_all(std::string_view text, std::vector<Match>* out) const;

 private:
  explicit Regex(void* re) : re_(re) {}
  void* re_;  // OnigRegex
};

}  // namespace dserve
