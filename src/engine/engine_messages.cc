#include "engine/engine_messages.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace dserve {

std::chrono::milliseconds ping_interval(double heartbeat_timeout_s) {
  const auto quarter = std::chrono::milliseconds(static_cast<int64_t>(heartbeat_timeout_s * 250));
  return std::clamp(quarter, std::chrono::milliseconds(10), std::chrono::milliseconds(250));
}

}  // namespace dserve

namespace dserve::engine_msg {

using nlohmann::json;

std::string first_difference(const NodeConfig& a, const NodeConfig& b) {
  auto differ = [](const char* flag, const auto& x, const auto& y) -> std::string {
    if (x == y) return "";
    auto show = [](const auto& v) {
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) return v;
      else if constexpr (std::is_same_v<std::decay_t<decltype(v)>, bool>) return std::string(v ? "on" : "off");
      else return std::to_string(v);
    };
    return std::string(flag) + " " + show(x) + " vs " + show(y);
  };
  for (std::string d :
       {differ("--model", a.model, b.model),
        differ("--data-parallel-size", a.data_parallel_size, b.data_parallel_size),
        differ("--tensor-parallel-size", a.tensor_parallel_size, b.tensor_parallel_size),
        differ("--enable-expert-parallel", a.enable_expert_parallel, b.enable_expert_parallel),
        differ("--block-size", a.block_size, b.block_size), differ("--dtype", a.dtype, b.dtype),
        differ("--max-model-len", a.max_model_len, b.max_model_len)}) {
    if (!d.empty()) return d;
  }
  return "";
}

namespace {

// Decoding: every accessor checks presence, type and range, and throws BadField, which
// decode() turns into one InvalidArgument.
struct BadField {
  std::string what;
};

const json& field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) throw BadField{std::string("missing field \"") + key + "\""};
  return *it;
}

template <typename T>
T integer(const json& v, const char* key) {
  if (!v.is_number_integer()) throw BadField{std::string("\"") + key + "\" is not an integer"};
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<T>::max()))
      throw BadField{std::string("\"") + key + "\" is out of range"};
    return static_cast<T>(u);
  }
  const int64_t i = v.get<int64_t>();
  if constexpr (std::is_unsigned_v<T>) {
    if (i < 0) throw BadField{std::string("\"") + key + "\" is negative"};
    return static_cast<T>(i);
  } else {
    if (i < std::numeric_limits<T>::min() || i > std::numeric_limits<T>::max())
      throw BadField{std::string("\"") + key + "\" is out of range"};
    return static_cast<T>(i);
  }
}
template <typename T>
T integer_at(const json& j, const char* key) {
  return integer<T>(field(j, key), key);
}

// JSON has no infinities (a log-probability may be -inf): they travel as strings.
json number(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}
double number_at(const json& j, const char* key) {
  const json& v = field(j, key);
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  if (!v.is_number()) throw BadField{std::string("\"") + key + "\" is not a number"};
  return v.get<double>();
}
float float_at(const json& j, const char* key) {
  const double d = number_at(j, key);
  // A double outside float's range has no float value (converting it is undefined).
  if (std::isfinite(d) && std::abs(d) > std::numeric_limits<float>::max())
    throw BadField{std::string("\"") + key + "\" is out of range"};
  return static_cast<float>(d);
}
std::string string_at(const json& j, const char* key) {
  const json& v = field(j, key);
  if (!v.is_string()) throw BadField{std::string("\"") + key + "\" is not a string"};
  return v.get<std::string>();
}
bool bool_at(const json& j, const char* key) {
  const json& v = field(j, key);
  if (!v.is_boolean()) throw BadField{std::string("\"") + key + "\" is not a boolean"};
  return v.get<bool>();
}
const json& array_at(const json& j, const char* key) {
  const json& v = field(j, key);
  if (!v.is_array()) throw BadField{std::string("\"") + key + "\" is not an array"};
  return v;
}
const json& object_at(const json& j, const char* key) {
  const json& v = field(j, key);
  if (!v.is_object()) throw BadField{std::string("\"") + key + "\" is not an object"};
  return v;
}
template <typename T>
std::vector<T> integers_at(const json& j, const char* key) {
  std::vector<T> out;
  for (const json& v : array_at(j, key)) out.push_back(integer<T>(v, key));
  return out;
}
// Absent or null: none.
template <typename T>
std::optional<T> optional_integer_at(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return integer<T>(*it, key);
}

json to_json(const NodeConfig& c) {
  return {{"model", c.model},
          {"data_parallel_size", c.data_parallel_size},
          {"tensor_parallel_size", c.tensor_parallel_size},
          {"enable_expert_parallel", c.enable_expert_parallel},
          {"block_size", c.block_size},
          {"dtype", c.dtype},
          {"max_model_len", c.max_model_len}};
}
NodeConfig node_config(const json& j) {
  NodeConfig c;
  c.model = string_at(j, "model");
  c.data_parallel_size = integer_at<int>(j, "data_parallel_size");
  c.tensor_parallel_size = integer_at<int>(j, "tensor_parallel_size");
  c.enable_expert_parallel = bool_at(j, "enable_expert_parallel");
  c.block_size = integer_at<int>(j, "block_size");
  c.dtype = string_at(j, "dtype");
  c.max_model_len = integer_at<int>(j, "max_model_len");
  return c;
}

json to_json(const SamplingOptions& o) {
  json j = {{"n", o.n},
            {"temperature", o.temperature},
            {"top_p", o.top_p},
            {"top_k", o.top_k},
            {"min_p", o.min_p},
            {"repetition_penalty", o.repetition_penalty},
            {"frequency_penalty", o.frequency_penalty},
            {"presence_penalty", o.presence_penalty},
            {"stop", o.stop},
            {"stop_token_ids", o.stop_token_ids},
            {"include_stop_str_in_output", o.include_stop_str_in_output},
            {"ignore_eos", o.ignore_eos},
            {"skip_special_tokens", o.skip_special_tokens},
            {"max_tokens", o.max_tokens},
            {"min_tokens", o.min_tokens}};
  // [[id, bias], ...]: JSON object keys would be strings.
  j["logit_bias"] = json::array();
  for (const auto& [id, bias] : o.logit_bias) j["logit_bias"].push_back({id, bias});
  j["seed"] = o.seed ? json(*o.seed) : json(nullptr);
  j["logprobs"] = o.logprobs ? json(*o.logprobs) : json(nullptr);
  j["prompt_logprobs"] = o.prompt_logprobs ? json(*o.prompt_logprobs) : json(nullptr);
  if (o.structured_outputs) {
    // The source text crosses; each engine compiles it against its own tokenizer.
    j["structured_outputs"] = {{"kind", static_cast<int>(o.structured_outputs->kind)},
                               {"text", o.structured_outputs->text},
                               {"choices", o.structured_outputs->choices},
                               {"schema_rules", o.structured_outputs->schema_rules}};
  } else {
    j["structured_outputs"] = nullptr;
  }
  return j;
}
SamplingOptions sampling_options(const json& j) {
  SamplingOptions o;
  o.n = integer_at<int>(j, "n");
  o.temperature = float_at(j, "temperature");
  o.top_p = float_at(j, "top_p");
  o.top_k = integer_at<int>(j, "top_k");
  o.min_p = float_at(j, "min_p");
  o.repetition_penalty = float_at(j, "repetition_penalty");
  o.frequency_penalty = float_at(j, "frequency_penalty");
  o.presence_penalty = float_at(j, "presence_penalty");
  for (const json& e : array_at(j, "logit_bias")) {
    // A bias outside float's range has no float value; SamplingParams checks the rest.
    if (!e.is_array() || e.size() != 2 || !e[1].is_number() ||
        !(std::abs(e[1].get<double>()) <= std::numeric_limits<float>::max())) {
      throw BadField{"\"logit_bias\" holds something other than [id, bias]"};
    }
    o.logit_bias[integer<int32_t>(e[0], "logit_bias")] = e[1].get<float>();
  }
  o.seed = optional_integer_at<uint64_t>(j, "seed");
  for (const json& s : array_at(j, "stop")) {
    if (!s.is_string()) throw BadField{"\"stop\" holds a non-string"};
    o.stop.push_back(s.get<std::string>());
  }
  o.stop_token_ids = integers_at<int32_t>(j, "stop_token_ids");
  o.include_stop_str_in_output = bool_at(j, "include_stop_str_in_output");
  o.ignore_eos = bool_at(j, "ignore_eos");
  o.skip_special_tokens = bool_at(j, "skip_special_tokens");
  o.max_tokens = integer_at<int>(j, "max_tokens");
  o.min_tokens = integer_at<int>(j, "min_tokens");
  o.logprobs = optional_integer_at<int>(j, "logprobs");
  o.prompt_logprobs = optional_integer_at<int>(j, "prompt_logprobs");
  if (auto it = j.find("structured_outputs"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) throw BadField{"\"structured_outputs\" is not an object"};
    const int kind = integer_at<int>(*it, "kind");
    if (kind < 0 || kind > static_cast<int>(StructuredOutputs::Kind::kGrammar)) {
      throw BadField{"\"structured_outputs.kind\" is out of range"};
    }
    StructuredOutputs so;
    so.kind = static_cast<StructuredOutputs::Kind>(kind);
    so.text = string_at(*it, "text");
    for (const json& c : array_at(*it, "choices")) {
      if (!c.is_string()) throw BadField{"\"structured_outputs.choices\" holds a non-string"};
      so.choices.push_back(c.get<std::string>());
    }
    for (const json& r : array_at(*it, "schema_rules")) {
      if (!r.is_array() || r.size() != 2 || !r[0].is_string() || !r[1].is_string()) {
        throw BadField{"\"structured_outputs.schema_rules\" holds a non-pair"};
      }
      so.schema_rules.emplace_back(r[0].get<std::string>(), r[1].get<std::string>());
    }
    o.structured_outputs = std::move(so);
  }
  return o;
}

json to_json(const SampleResult& r) {
  json top = json::array();
  for (const TokenLogprob& t : r.top_logprobs) top.push_back({t.id, number(t.logprob)});
  return {{"token", r.token}, {"logprob", number(r.logprob)}, {"rank", r.rank}, {"top", top}};
}
SampleResult sample_result(const json& j) {
  if (!j.is_object()) throw BadField{"a log-probability entry is not an object"};
  SampleResult r;
  r.token = integer_at<int32_t>(j, "token");
  r.logprob = float_at(j, "logprob");
  r.rank = integer_at<int32_t>(j, "rank");
  for (const json& t : array_at(j, "top")) {
    if (!t.is_array() || t.size() != 2) throw BadField{"\"top\" holds a non-pair"};
    json pair = {{"id", t[0]}, {"logprob", t[1]}};
    r.top_logprobs.push_back({integer_at<int32_t>(pair, "id"), float_at(pair, "logprob")});
  }
  return r;
}
json to_json(const std::vector<SampleResult>& v) {
  json a = json::array();
  for (const SampleResult& r : v) a.push_back(to_json(r));
  return a;
}
std::vector<SampleResult> sample_results(const json& j, const char* key) {
  std::vector<SampleResult> out;
  for (const json& r : array_at(j, key)) out.push_back(sample_result(r));
  return out;
}

json to_json(const OutputDelta& d) {
  json j = {{"index", d.index},
            {"text", d.text},
            {"token_ids", d.token_ids},
            {"logprobs", to_json(d.logprobs)},
            {"prompt_logprobs", to_json(d.prompt_logprobs)},
            {"error", d.error}};
  j["finish_reason"] = d.finish_reason ? json(*d.finish_reason) : json(nullptr);
  return j;
}
OutputDelta output_delta(const json& j) {
  OutputDelta d;
  d.index = integer_at<int>(j, "index");
  d.text = string_at(j, "text");
  d.token_ids = integers_at<int32_t>(j, "token_ids");
  d.logprobs = sample_results(j, "logprobs");
  d.prompt_logprobs = sample_results(j, "prompt_logprobs");
  d.error = string_at(j, "error");
  const json& r = field(j, "finish_reason");
  if (!r.is_null()) {
    if (!r.is_string()) throw BadField{"\"finish_reason\" is not a string"};
    d.finish_reason = r.get<std::string>();
  }
  return d;
}

json to_json(const EngineStats& s) {
  return {{"n_steps", s.n_steps},
          {"n_preemptions", s.n_preemptions},
          {"n_prefix_queried_tokens", s.n_prefix_queried_tokens},
          {"n_prefix_hit_tokens", s.n_prefix_hit_tokens},
          {"n_computed_tokens", s.n_computed_tokens},
          {"n_generated_tokens", s.n_generated_tokens},
          {"n_running", s.n_running},
          {"n_waiting", s.n_waiting},
          {"n_blocks", s.n_blocks},
          {"n_free_blocks", s.n_free_blocks},
          {"spec_n_drafts", s.spec.n_drafts},
          {"spec_n_draft_tokens", s.spec.n_draft_tokens},
          {"spec_n_accepted_tokens", s.spec.n_accepted_tokens},
          {"spec_n_accepted_per_pos", s.spec.n_accepted_per_pos}};
}
EngineStats engine_stats(const json& j) {
  EngineStats s;
  s.n_steps = integer_at<int64_t>(j, "n_steps");
  s.n_preemptions = integer_at<int64_t>(j, "n_preemptions");
  s.n_prefix_queried_tokens = integer_at<int64_t>(j, "n_prefix_queried_tokens");
  s.n_prefix_hit_tokens = integer_at<int64_t>(j, "n_prefix_hit_tokens");
  s.n_computed_tokens = integer_at<int64_t>(j, "n_computed_tokens");
  s.n_generated_tokens = integer_at<int64_t>(j, "n_generated_tokens");
  s.n_running = integer_at<int>(j, "n_running");
  s.n_waiting = integer_at<int>(j, "n_waiting");
  s.n_blocks = integer_at<int>(j, "n_blocks");
  s.n_free_blocks = integer_at<int>(j, "n_free_blocks");
  s.spec.n_drafts = integer_at<int64_t>(j, "spec_n_drafts");
  s.spec.n_draft_tokens = integer_at<int64_t>(j, "spec_n_draft_tokens");
  s.spec.n_accepted_tokens = integer_at<int64_t>(j, "spec_n_accepted_tokens");
  s.spec.n_accepted_per_pos = integers_at<int64_t>(j, "spec_n_accepted_per_pos");
  if (s.spec.n_accepted_per_pos.size() > 64) {
    throw BadField{"\"spec_n_accepted_per_pos\" is longer than any draft"};
  }
  return s;
}

const char* kind_name(Event::Kind k) {
  switch (k) {
    case Event::Kind::kTokens: return "tokens";
    case Event::Kind::kFirstToken: return "first_token";
    case Event::Kind::kInterToken: return "inter_token";
    case Event::Kind::kFinished: return "finished";
    case Event::Kind::kLost: return "lost";
  }
  return "";
}

// A StatusCode by its status_code_name.
StatusCode status_code_at(const json& j, const char* key) {
  const std::string name = string_at(j, key);
  for (StatusCode c : {StatusCode::kOk, StatusCode::kInvalidArgument, StatusCode::kNotFound,
                       StatusCode::kCorrupt, StatusCode::kUnimplemented, StatusCode::kIoError,
                       StatusCode::kResourceExhausted, StatusCode::kInternal}) {
    if (name == status_code_name(c)) return c;
  }
  throw BadField{std::string("\"") + key + "\" is not a status code: \"" + name + "\""};
}

struct Encoder {
  json operator()(const Hello& m) const {
    return {{"type", "hello"}, {"node", m.node}, {"ranks", m.ranks}, {"config", to_json(m.config)}};
  }
  json operator()(const Welcome&) const { return {{"type", "welcome"}}; }
  json operator()(const Reject& m) const { return {{"type", "reject"}, {"error", m.error}}; }
  json operator()(const Add& m) const {
    return {{"type", "add"}, {"engine", m.engine}, {"ticket", m.ticket},
            {"prompt", m.prompt}, {"options", to_json(m.options)}};
  }
  json operator()(const Added& m) const {
    return {{"type", "added"}, {"engine", m.engine}, {"ticket", m.ticket},
            {"error", m.error}, {"code", status_code_name(m.code)}, {"ids", m.ids}};
  }
  json operator()(const Abort& m) const {
    return {{"type", "abort"}, {"engine", m.engine}, {"id", m.id}};
  }
  json operator()(const Output& m) const {
    return {{"type", "output"}, {"engine", m.engine}, {"delta", to_json(m.delta)}};
  }
  json operator()(const Stats& m) const {
    return {{"type", "stats"}, {"engine", m.engine}, {"stats", to_json(m.stats)}};
  }
  json operator()(const Event& m) const {
    return {{"type", "event"},           {"engine", m.engine},
            {"kind", kind_name(m.kind)}, {"n_prompt_tokens", m.n_prompt_tokens},
            {"n_generated_tokens", m.n_generated_tokens}, {"seconds", number(m.seconds)},
            {"finish_reason", m.finish_reason}, {"error", m.error}};
  }
  json operator()(const Ping&) const { return {{"type", "ping"}}; }
  json operator()(const Shutdown& m) const { return {{"type", "shutdown"}, {"error", m.error}}; }
};

Message decode_object(const json& j) {
  const std::string type = string_at(j, "type");
  if (type == "hello") {
    Hello m;
    m.node = string_at(j, "node");
    m.ranks = integers_at<int>(j, "ranks");
    m.config = node_config(object_at(j, "config"));
    return m;
  }
  if (type == "welcome") return Welcome{};
  if (type == "reject") return Reject{string_at(j, "error")};
  if (type == "add") {
    Add m;
    m.engine = integer_at<int>(j, "engine");
    m.ticket = integer_at<int64_t>(j, "ticket");
    m.prompt = integers_at<int32_t>(j, "prompt");
    m.options = sampling_options(object_at(j, "options"));
    return m;
  }
  if (type == "added") {
    Added m;
    m.engine = integer_at<int>(j, "engine");
    m.ticket = integer_at<int64_t>(j, "ticket");
    m.error = string_at(j, "error");
    m.code = status_code_at(j, "code");
    m.ids = integers_at<RequestId>(j, "ids");
    return m;
  }
  if (type == "abort") return Abort{integer_at<int>(j, "engine"), integer_at<RequestId>(j, "id")};
  if (type == "output") {
    return Output{integer_at<int>(j, "engine"), output_delta(object_at(j, "delta"))};
  }
  if (type == "stats") return Stats{integer_at<int>(j, "engine"), engine_stats(object_at(j, "stats"))};
  if (type == "event") {
    Event m;
    m.engine = integer_at<int>(j, "engine");
    const std::string kind = string_at(j, "kind");
    if (kind == "tokens") m.kind = Event::Kind::kTokens;
    else if (kind == "first_token") m.kind = Event::Kind::kFirstToken;
    else if (kind == "inter_token") m.kind = Event::Kind::kInterToken;
    else if (kind == "finished") m.kind = Event::Kind::kFinished;
    else if (kind == "lost") m.kind = Event::Kind::kLost;
    else throw BadField{"unknown event kind \"" + kind + "\""};
    m.n_prompt_tokens = integer_at<int64_t>(j, "n_prompt_tokens");
    m.n_generated_tokens = integer_at<int64_t>(j, "n_generated_tokens");
    m.seconds = number_at(j, "seconds");
    m.finish_reason = string_at(j, "finish_reason");
    m.error = string_at(j, "error");
    return m;
  }
  if (type == "ping") return Ping{};
  if (type == "shutdown") return Shutdown{string_at(j, "error")};
  throw BadField{"unknown message type \"" + type + "\""};
}

}  // namespace

std::string encode(const Message& m) {
  // Invalid UTF-8 (only an error text could hold it) is replaced, not thrown.
  return std::visit(Encoder{}, m).dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<Message> decode(std::string_view bytes) {
  json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("engine message: not JSON");
  if (!j.is_object()) return invalid_argument("engine message: not a JSON object");
  try {
    return decode_object(j);
  } catch (const BadField& e) {
    return invalid_argument("engine message: " + e.what);
  } catch (const json::exception& e) {
    return invalid_argument(std::string("engine message: ") + e.what());
  }
}

}  // namespace dserve::engine_msg
