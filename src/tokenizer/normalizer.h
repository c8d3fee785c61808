// Normalizer: the `normalizer` section of tokenizer.json. Supported: null, NFC, NFD,
// NFKC, NFKD (through ICU) and Sequence of those. Anything else is Unimplemented at
// load time rather than silently ignored.
//
// Thread-safety: immutable; normalize() may run concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace dserve {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string_view text) const = 0;

  // nullptr (no error) when `j` is null or an empty Sequence: text passes unchanged.
  // `where` names the file and field for error messages.
  static Result<std::unique_ptr<Normalizer>> from_json(const nlohmann::json& j,
                                                        const std::string& where);
};

}  // namespace dserve
