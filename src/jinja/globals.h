// The global functions a chat template can call: Jinja's range, namespace, dict,
// joiner, cycler, and the ones transformers adds (raise_exception, strftime_now).
//
// Thread-safety: make_globals() returns fresh objects for each render.
#pragma once

#include <string>
#include <unordered_map>

#include "jinja/value.h"

namespace dserve::jinja {

// Jinja's sandbox refuses ranges longer than this.
inline constexpr int64_t kMaxRange = 100000;

std::unordered_map<std::string, Value> make_globals();

}  // namespace dserve::jinja
