#include "cli/bench_datasets.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "base/log.h"
#include "tokenizer/tokenizer.h"

namespace dserve::cli {
namespace {

// Draws random non-special tokens and turns them into ids that survive a
// decode -> encode round trip, as vLLM's _generate_exact_length_tokens does.
class RandomTokens {
 public:
  RandomTokens(const Tokenizer& tok, std::mt19937_64& rng) : tok_(tok), rng_(rng) {
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      if (!tok.is_special(id) && !tok.token_bytes(id).empty()) allowed_.push_back(id);
    }
  }

  bool usable() const { return !allowed_.empty(); }

  // n ids whose decoded text re-encodes (without special tokens) to themselves.
  std::vector<int32_t> exact(int n) {
    std::vector<int32_t> out;
    std::uniform_int_distribution<size_t> pick(0, allowed_.size() - 1);
    // Each round usually fills the rest; the bound only guards against a tokenizer
    // that never re-encodes to anything.
    for (int round = 0; static_cast<int>(out.size()) < n && round < 1000; ++round) {
      const size_t need = static_cast<size_t>(n) - out.size();
      std::vector<int32_t> ids(need);
      for (int32_t& id : ids) id = allowed_[pick(rng_)];
      std::vector<int32_t> re = tok_.encode(tok_.decode(ids, false), false);
      if (re.size() > need) re.resize(need);
      out.insert(out.end(), re.begin(), re.end());
    }
    return out;
  }

  // Text whose encoding without special tokens is `prefix` (or close: the boundary may
  // merge) followed by random tokens, `n_body` in all after the prefix.
  std::string text(const std::vector<int32_t>& prefix, int n_body) {
    const size_t target = prefix.size() + static_cast<size_t>(n_body);
    std::vector<int32_t> ids = prefix;
    const std::vector<int32_t> body = exact(n_body);
    ids.insert(ids.end(), body.begin(), body.end());
    std::string text = tok_.decode(ids, false);
    // Concatenated pieces may merge at their joins; settle on the exact length.
    for (int round = 0; round < 8; ++round) {
      std::vector<int32_t> re = tok_.encode(text, false);
      if (re.size() == target) break;
      if (re.size() > target) {
        re.resize(target);
      } else {
        const std::vector<int32_t> more = exact(static_cast<int>(target - re.size()));
        re.insert(re.end(), more.begin(), more.end());
      }
      text = tok_.decode(re, false);
    }
    return text;
  }

 private:
  const Tokenizer& tok_;
  std::mt19937_64& rng_;
  std::vector<int32_t> allowed_;
};

SampleRequest make_request(const Tokenizer& tok, std::string prompt, int output_len) {
  SampleRequest r;
  r.prompt_ids = tok.encode(prompt, /*add_special_tokens=*/true);
  r.prompt = std::move(prompt);
  r.prompt_len = static_cast<int>(r.prompt_ids.size());
  r.expected_output_len = output_len;
  return r;
}

Status check_random(const RandomDatasetOptions& o) {
  if (o.num_prompts < 1) return invalid_argument("--num-prompts must be >= 1");
  if (o.input_len < 1) return invalid_argument("--random-input-len must be >= 1");
  if (o.output_len < 1) return invalid_argument("--random-output-len must be >= 1");
  if (o.prefix_len < 0) return invalid_argument("--random-prefix-len must be >= 0");
  if (!(o.range_ratio >= 0 && o.range_ratio < 1)) {
    return invalid_argument("--random-range-ratio must be in [0, 1)");
  }
  return Status::Ok();
}

// vLLM's length range [int(len * (1 - r)), int(len * (1 + r))], at least `floor`.
std::uniform_int_distribution<int> length_range(int len, double r, int floor) {
  const int lo = std::max(floor, static_cast<int>(len * (1 - r)));
  const int hi = std::max(lo, static_cast<int>(len * (1 + r)));
  return std::uniform_int_distribution<int>(lo, hi);
}

}  // namespace

Result<std::vector<SampleRequest>> sample_random(const Tokenizer& tok,
                                                 const RandomDatasetOptions& o) {
  DS_RETURN_IF_ERROR(check_random(o));
  std::mt19937_64 rng(o.seed);
  RandomTokens random(tok, rng);
  if (!random.usable())
    return invalid_argument("random dataset: the tokenizer has no plain tokens");
  // As vLLM: --random-input-len counts the special tokens the tokenizer adds (BOS);
  // the shared prefix comes on top.
  const int n_special = static_cast<int>(tok.encode("", true).size());
  const int real_input_len = std::max(1, o.input_len - n_special);
  std::uniform_int_distribution<int> input_len = length_range(real_input_len, o.range_ratio, 1);
  std::uniform_int_distribution<int> output_len = length_range(o.output_len, o.range_ratio, 1);
  const std::vector<int32_t> prefix = random.exact(o.prefix_len);
  std::vector<SampleRequest> out;
  out.reserve(o.num_prompts);
  for (int i = 0; i < o.num_prompts; ++i) {
    const int n_in = input_len(rng);
    const int n_out = output_len(rng);
    const int target = n_special + static_cast<int>(prefix.size()) + n_in;
    SampleRequest r = make_request(tok, random.text(prefix, n_in), n_out);
    // Rarely the text settles one token off; fresh tokens almost always fix it.
    for (int retry = 0; retry < 4 && r.prompt_len != target; ++retry) {
      r = make_request(tok, random.text(prefix, n_in), n_out);
    }
    out.push_back(std::move(r));
  }
  return out;
}

Result<std::vector<SampleRequest>> sample_random_ids(int64_t vocab_size,
                                                     const RandomDatasetOptions& o) {
  DS_RETURN_IF_ERROR(check_random(o));
  if (vocab_size < 1) return invalid_argument("random dataset: empty vocabulary");
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab_size - 1));
  std::uniform_int_distribution<int> input_len = length_range(o.input_len, o.range_ratio, 1);
  std::uniform_int_distribution<int> output_len = length_range(o.output_len, o.range_ratio, 1);
  std::vector<int32_t> prefix(o.prefix_len);
  for (int32_t& t : prefix) t = id(rng);
  std::vector<SampleRequest> out(o.num_prompts);
  for (SampleRequest& s : out) {
    s.prompt_ids = prefix;
    const int n_in = input_len(rng);
    for (int k = 0; k < n_in; ++k) s.prompt_ids.push_back(id(rng));
    s.prompt_len = static_cast<int>(s.prompt_ids.size());
    s.expected_output_len = output_len(rng);
  }
  return out;
}

bool sharegpt_pair_is_valid(int prompt_len, int output_len, bool skip_min_output_check) {
  constexpr int kMinLen = 4, kMaxPromptLen = 1024, kMaxTotalLen = 2048;
  const bool prompt_too_short = prompt_len < kMinLen;
  const bool output_too_short = !skip_min_output_check && output_len < kMinLen;
  const bool prompt_too_long = prompt_len > kMaxPromptLen;
  const bool total_too_long = prompt_len + output_len > kMaxTotalLen;
  return !(prompt_too_short || output_too_short || prompt_too_long || total_too_long);
}

Result<std::vector<SampleRequest>> sample_sharegpt_json(const Tokenizer& tok,
                                                        const nlohmann::json& data,
                                                        const ShareGptOptions& o,
                                                        const std::string& source) {
  if (o.num_prompts < 1) return invalid_argument("--num-prompts must be >= 1");
  if (!data.is_array()) return invalid_argument(source + ": not a ShareGPT JSON list");
  // As vLLM: keep entries with at least two turns, shuffle them, then take pairs in
  // that order until enough pass the length filter.
  std::vector<size_t> order;
  for (size_t i = 0; i < data.size(); ++i) {
    const nlohmann::json& e = data[i];
    if (e.is_object() && e.contains("conversations") && e["conversations"].is_array() &&
        e["conversations"].size() >= 2) {
      order.push_back(i);
    }
  }
  std::mt19937_64 rng(o.seed);
  std::shuffle(order.begin(), order.end(), rng);
  auto text_of = [](const nlohmann::json& turn) -> const std::string* {
    if (!turn.is_object() || !turn.contains("value") || !turn["value"].is_string()) return nullptr;
    return turn["value"].get_ptr<const std::string*>();
  };
  std::vector<SampleRequest> out;
  for (size_t i : order) {
    if (static_cast<int>(out.size()) >= o.num_prompts) break;
    const nlohmann::json& conv = data[i]["conversations"];
    const std::string* prompt = text_of(conv[0]);
    const std::string* reply = text_of(conv[1]);
    if (prompt == nullptr || reply == nullptr) continue;
    SampleRequest s = make_request(tok, *prompt, 0);
    // vLLM counts the reply as tokenizer(reply).input_ids: with special tokens.
    const int n_reply = static_cast<int>(tok.encode(*reply, true).size());
    s.expected_output_len = o.output_len > 0 ? o.output_len : n_reply;
    if (!sharegpt_pair_is_valid(s.prompt_len, s.expected_output_len, o.output_len > 0)) continue;
    out.push_back(std::move(s));
  }
  if (out.empty()) return invalid_argument(source + ": no usable conversations");
  if (o.oversample && static_cast<int>(out.size()) < o.num_prompts) {
    DS_LOG_WARN("{}: {} usable conversations for {} prompts; repeating random ones", source,
                out.size(), o.num_prompts);
    std::uniform_int_distribution<size_t> pick(0, out.size() - 1);
    const size_t n_usable = out.size();
    while (static_cast<int>(out.size()) < o.num_prompts) {
      out.push_back(out[pick(rng) % n_usable]);
    }
  }
  return out;
}

Result<std::vector<SampleRequest>> sample_sharegpt(const Tokenizer& tok, const ShareGptOptions& o) {
  if (o.path.empty()) return invalid_argument("--dataset-name sharegpt needs --dataset-path");
  std::ifstream f(o.path);
  if (!f) return not_found(o.path + ": cannot open");
  const nlohmann::json data = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (data.is_discarded()) return corrupt(o.path + ": not valid JSON");
  return sample_sharegpt_json(tok, data, o, o.path);
}

Result<std::vector<SampleRequest>> sample_prefix_repetition(const Tokenizer& tok,
                                                            const PrefixRepetitionOptions& o) {
  if (o.num_prefixes < 1) return invalid_argument("--prefix-repetition-num-prefixes must be >= 1");
  if (o.prefix_len < 0 || o.suffix_len < 0 || o.prefix_len + o.suffix_len < 1) {
    return invalid_argument(
        "--prefix-repetition-prefix-len and -suffix-len must be >= 0, with a sum >= 1");
  }
  if (o.output_len < 1) return invalid_argument("--prefix-repetition-output-len must be >= 1");
  const int per_prefix = o.num_prompts / o.num_prefixes;
  if (per_prefix == 0) {
    return invalid_argument("--num-prompts (" + std::to_string(o.num_prompts) +
                            ") must be >= --prefix-repetition-num-prefixes (" +
                            std::to_string(o.num_prefixes) + ")");
  }
  std::mt19937_64 rng(o.seed);
  RandomTokens random(tok, rng);
  if (!random.usable()) {
    return invalid_argument("prefix-repetition dataset: the tokenizer has no plain tokens");
  }
  std::vector<SampleRequest> out;
  out.reserve(static_cast<size_t>(per_prefix) * o.num_prefixes);
  for (int p = 0; p < o.num_prefixes; ++p) {
    const std::vector<int32_t> prefix = random.exact(o.prefix_len);
    for (int k = 0; k < per_prefix; ++k) {
      out.push_back(make_request(tok, random.text(prefix, o.suffix_len), o.output_len));
    }
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

}  // namespace dserve::cli
