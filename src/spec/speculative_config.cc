#include "spec/speculative_config.h"

#include <set>

#include <nlohmann/json.hpp>

namespace dserve::spec {
namespace {

constexpr int kMaxMtpTokens = 4;     // one MTP layer run up to 4 times, as vLLM allows
constexpr int kMaxNgramTokens = 16;  // beyond this a verify step mostly wastes work
constexpr int kMaxLookup = 64;

Status bad(const std::string& what) {
  return invalid_argument("--speculative-config: " + what);
}

// An integer field in [lo, hi], or `fallback` when absent.
Result<int> int_field(const nlohmann::json& j, const char* key, int lo, int hi, int fallback) {
  if (!j.contains(key)) return fallback;
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer()) return bad(std::string(key) + " must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) {
    return bad(std::string(key) + " = " + std::to_string(x) + " is outside [" +
               std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<int>(x);
}

}  // namespace

const char* SpeculativeConfig::method_name() const {
  switch (method) {
    case SpeculativeMethod::kNgram: return "ngram";
    case SpeculativeMethod::kMtp: return "deepseek_mtp";
    case SpeculativeMethod::kNone: break;
  }
  return "none";
}

Result<SpeculativeConfig> SpeculativeConfig::parse(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("expected a JSON object");
  static const std::set<std::string> kKeys = {"method", "num_speculative_tokens",
                                              "prompt_lookup_min", "prompt_lookup_max"};
  for (const auto& [key, value] : j.items()) {
    if (kKeys.count(key) == 0) {
      return bad("unknown key \"" + key +
                 "\" (known: method, num_speculative_tokens, prompt_lookup_min, "
                 "prompt_lookup_max)");
    }
  }
  if (!j.contains("method") || !j.at("method").is_string()) {
    return bad("\"method\" (\"ngram\", \"deepseek_mtp\" or \"mtp\") is required");
  }
  const std::string method = j.at("method").get<std::string>();
  SpeculativeConfig c;
  if (method == "ngram") {
    c.method = SpeculativeMethod::kNgram;
  } else if (method == "deepseek_mtp" || method == "mtp") {
    c.method = SpeculativeMethod::kMtp;
  } else {
    return bad("unknown method \"" + method + "\" (ngram, deepseek_mtp or mtp)");
  }
  if (!j.contains("num_speculative_tokens")) return bad("num_speculative_tokens is required");
  const int max_tokens = c.method == SpeculativeMethod::kMtp ? kMaxMtpTokens : kMaxNgramTokens;
  DS_ASSIGN_OR_RETURN(c.num_speculative_tokens,
                      int_field(j, "num_speculative_tokens", 1, max_tokens, 0));
  if (c.method == SpeculativeMethod::kMtp) {
    if (j.contains("prompt_lookup_min") || j.contains("prompt_lookup_max")) {
      return bad("prompt_lookup_min and prompt_lookup_max apply to method ngram only");
    }
    return c;
  }
  DS_ASSIGN_OR_RETURN(int lo, int_field(j, "prompt_lookup_min", 1, kMaxLookup, 0));
  DS_ASSIGN_OR_RETURN(int hi, int_field(j, "prompt_lookup_max", 1, kMaxLookup, 0));
  if (lo == 0 && hi == 0) lo = hi = 5;
  if (lo == 0) lo = hi;
  if (hi == 0) hi = lo;
  if (lo > hi) {
    return bad("prompt_lookup_min " + std::to_string(lo) + " exceeds prompt_lookup_max " +
               std::to_string(hi));
  }
  c.prompt_lookup_min = lo;
  c.prompt_lookup_max = hi;
  return c;
}

}  // namespace dserve::spec
