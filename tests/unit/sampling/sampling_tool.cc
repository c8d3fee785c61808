// sampling_tool: a test-only bridge for tests/reference/test_sampling_reference.py.
// Reads cases from stdin, four lines each:
//   key=value ...       SamplingOptions fields (temperature top_k top_p min_p
//                       repetition_penalty frequency_penalty presence_penalty;
//                       logit_bias=ID:BIAS,ID:BIAS,...)
//   prompt ids          space-separated, may be empty
//   output ids          space-separated, may be empty (generated so far)
//   logits              space-separated floats, the row for the next position
// and prints, per case, one line: Sampler::processed_logits (bias, penalties, temperature
// and filters applied; "-inf" where filtered), or "error: ..." for invalid options.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace {

template <typename T>
std::vector<T> parse_list(const std::string& line) {
  std::istringstream in(line);
  std::vector<T> v;
  T x;
  while (in >> x) v.push_back(x);
  return v;
}

bool set_option(dserve::SamplingOptions* o, const std::string& key, const std::string& value) {
  if (key == "logit_bias") {
    std::istringstream in(value);
    std::string pair;
    while (std::getline(in, pair, ',')) {
      const size_t colon = pair.find(':');
      if (colon == std::string::npos) return false;
      o->logit_bias[std::stoi(pair.substr(0, colon))] = std::stof(pair.substr(colon + 1));
    }
    return true;
  }
  const float f = std::stof(value);
  if (key == "temperature")
    o->temperature = f;
  else if (key == "top_k")
    o->top_k = std::stoi(value);
  else if (key == "top_p")
    o->top_p = f;
  else if (key == "min_p")
    o->min_p = f;
  else if (key == "repetition_penalty")
    o->repetition_penalty = f;
  else if (key == "frequency_penalty")
    o->frequency_penalty = f;
  else if (key == "presence_penalty")
    o->presence_penalty = f;
  else
    return false;
  return true;
}

}  // namespace

int main() {
  std::string opts, prompt_line, output_line, logits_line;
  dserve::Sampler sampler;
  while (std::getline(std::cin, opts) && std::getline(std::cin, prompt_line) &&
         std::getline(std::cin, output_line) && std::getline(std::cin, logits_line)) {
    dserve::SamplingOptions o;
    o.max_tokens = 1 << 30;
    std::istringstream in(opts);
    std::string kv;
    bool ok = true;
    while (in >> kv) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || !set_option(&o, kv.substr(0, eq), kv.substr(eq + 1))) {
        std::printf("error: bad option '%s'\n", kv.c_str());
        ok = false;
        break;
      }
    }
    if (!ok) continue;
    dserve::Result<dserve::SamplingParams> params = dserve::SamplingParams::create(o);
    if (!params.ok()) {
      std::printf("error: %s\n", params.status().to_string().c_str());
      continue;
    }
    const std::vector<int32_t> prompt = parse_list<int32_t>(prompt_line);
    dserve::SamplingState state(std::move(params).value(), prompt, {});
    for (int32_t t : parse_list<int32_t>(output_line)) (void)state.accept(t);
    const std::vector<float> logits = parse_list<float>(logits_line);
    std::vector<float> out(logits.size());
    sampler.processed_logits(state, logits, out);
    for (size_t i = 0; i < out.size(); ++i) std::printf(i ? " %.9g" : "%.9g", out[i]);
    std::printf("\n");
  }
  return 0;
}
