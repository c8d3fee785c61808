// Random identifiers the API hands out: response ids ("chatcmpl-..."), tool call ids
// ("chatcmpl-tool-...") and request ids: `prefix` + 32 hex digits (128 random bits).
// Thread-safety: safe from any thread (a generator per thread).
#pragma once

#include <string>
#include <string_view>

namespace dserve::server {

std::string random_id(std::string_view prefix = {});

}  // namespace dserve::server
