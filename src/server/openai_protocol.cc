#include "server/openai_protocol.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "server/field_reader.h"
#include "server/structured_output_request.h"

namespace dserve::server {

using json = nlohmann::ordered_json;

namespace {

// OpenAI's logit_bias: {"token id": bias}, the id a decimal integer (the vocabulary
// bound is the serving layer's check), the bias a number in [-100, 100].
void read_logit_bias(FieldReader& f, std::map<int32_t, float>* out) {
  const json* bias = f.get("logit_bias");
  if (!bias) return;
  if (!bias->is_object()) {
    return f.fail("logit_bias must be an object mapping token ids to biases", "logit_bias");
  }
  for (auto it = bias->begin(); it != bias->end(); ++it) {
    const std::string& key = it.key();
    int64_t id = 0;
    bool digits = !key.empty() && key.size() <= 10;
    for (char c : key) {
      digits = digits && c >= '0' && c <= '9';
      if (digits) id = id * 10 + (c - '0');
    }
    if (!digits || id > std::numeric_limits<int32_t>::max()) {
      return f.fail("logit_bias keys must be token ids (non-negative integers as strings), got \"" +
                        key + "\"",
                    "logit_bias");
    }
    const json& v = it.value();
    if (!v.is_number() || !(std::abs(v.get<double>()) <= kMaxLogitBias)) {
      return f.fail("logit_bias values must be numbers between -100 and 100, got " + v.dump() +
                        " for token " + key,
                    "logit_bias");
    }
    (*out)[static_cast<int32_t>(id)] = v.get<float>();
  }
}

const std::set<std::string> kCommonFields = {
    "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
    "presence_penalty", "frequency_penalty", "logit_bias", "user", "seed", "top_k", "min_p",
    "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
    "include_stop_str_in_output", "skip_special_tokens", "add_special_tokens", "logprobs",
    "prompt_logprobs"};

// The fields both endpoints share, into `r`.
void read_common(FieldReader& f, const json& body, GenerationRequest& r) {
  f.string("model", &r.model);
  SamplingOptions& s = r.sampling;
  f.integer("n", &s.n);
  if (f.ok() && (s.n < 1 || s.n > kMaxChoices)) {
    f.fail("n must be between 1 and " + std::to_string(kMaxChoices) + ", got " +
               std::to_string(s.n),
           "n");
  }
  f.number("temperature", &s.temperature);
  f.number("top_p", &s.top_p);
  f.integer("top_k", &s.top_k);
  f.number("min_p", &s.min_p);
  f.number("presence_penalty", &s.presence_penalty);
  f.number("frequency_penalty", &s.frequency_penalty);
  f.number("repetition_penalty", &s.repetition_penalty);
  std::optional<int64_t> seed;
  f.integer("seed", &seed);
  if (seed) s.seed = static_cast<uint64_t>(*seed);
  f.integer("min_tokens", &s.min_tokens);
  f.boolean("ignore_eos", &s.ignore_eos);
  f.boolean("include_stop_str_in_output", &s.include_stop_str_in_output);
  f.boolean("skip_special_tokens", &s.skip_special_tokens);
  f.boolean("stream", &r.stream);
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) {
      f.fail("stream_options must be an object", "stream_options");
    } else {
      FieldReader sf(*so);
      sf.boolean("include_usage", &r.include_usage);
      sf.boolean("continuous_usage_stats", &r.continuous_usage_stats);
      sf.only({"include_usage", "continuous_usage_stats"});
      if (!sf.ok()) f.fail("stream_options: " + sf.error().message, "stream_options");
      if (!r.stream) f.fail("stream_options is only allowed with stream=true", "stream_options");
    }
  }
  if (const json* stop = f.get("stop")) {
    if (stop->is_string()) {
      if (!stop->get<std::string>().empty()) s.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& x : *stop) {
        if (!x.is_string()) return f.fail("stop must be a string or a list of strings", "stop");
        if (!x.get<std::string>().empty()) s.stop.push_back(x.get<std::string>());
      }
    } else {
      return f.fail("stop must be a string or a list of strings", "stop");
    }
  }
  if (s.stop.size() > kMaxStopStrings) {
    return f.fail("at most " + std::to_string(kMaxStopStrings) + " stop strings are allowed",
                  "stop");
  }
  for (const std::string& x : s.stop) {
    if (x.size() > kMaxStopStringBytes) {
      return f.fail("a stop string may be at most " + std::to_string(kMaxStopStringBytes) +
                        " bytes long",
                    "stop");
    }
  }
  if (const json* ids = f.get("stop_token_ids")) {
    if (!ids->is_array()) return f.fail("stop_token_ids must be a list of integers", "stop_token_ids");
    if (ids->size() > kMaxStopTokenIds) {
      return f.fail("at most " + std::to_string(kMaxStopTokenIds) + " stop_token_ids are allowed",
                    "stop_token_ids");
    }
    for (const json& x : *ids) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
          x.get<int64_t>() > std::numeric_limits<int32_t>::max())
        return f.fail("stop_token_ids must be a list of token ids", "stop_token_ids");
      s.stop_token_ids.push_back(x.get<int32_t>());
    }
  }
  read_logit_bias(f, &s.logit_bias);
  f.integer("prompt_logprobs", &s.prompt_logprobs);
  if (f.ok() && s.prompt_logprobs) {
    if (*s.prompt_logprobs < 0 || *s.prompt_logprobs > kMaxLogprobs) {
      f.fail("prompt_logprobs must be between 0 and " + std::to_string(kMaxLogprobs) + ", got " +
                 std::to_string(*s.prompt_logprobs),
             "prompt_logprobs");
    } else if (r.stream) {
      // vLLM refuses it too: the scores would have no place in the chunks.
      f.fail("prompt_logprobs is not available when stream=true", "prompt_logprobs");
    }
  }
  (void)body;
}

// max_tokens / max_completion_tokens must be >= 1 when given.
void read_max_tokens(FieldReader& f, const char* name, std::optional<int>* out) {
  f.integer(name, out);
  if (f.ok() && *out && **out < 1) {
    f.fail(std::string(name) + " must be at least 1, got " + std::to_string(**out), name);
  }
}

// Sampling ranges are SamplingParams' (one definition of what is valid).
void check_sampling(FieldReader& f, const GenerationRequest& r) {
  if (!f.ok()) return;
  SamplingOptions probe = r.sampling;
  probe.max_tokens = r.max_tokens.value_or(std::max(1, probe.min_tokens));
  Result<SamplingParams> p = SamplingParams::create(probe);
  if (!p.ok()) f.fail(p.status().message(), "");
}

// Token ids of a prompt given as a list of integers.
bool read_ids(const json& v, std::vector<int32_t>* out) {
  for (const json& x : v) {
    if (!x.is_number_integer()) return false;
    const int64_t id = x.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) return false;
    out->push_back(static_cast<int32_t>(id));
  }
  return true;
}

}  // namespace

Parsed<CompletionRequest> parse_completion_request(const json& body) {
  if (!body.is_object()) return ApiError::bad_request("the request body must be a JSON object");
  CompletionRequest r;
  FieldReader f(body);
  std::set<std::string> known = kCommonFields;
  known.insert({"prompt", "echo", "best_of", "suffix"});
  known.insert(kStructuredOutputFields.begin(), kStructuredOutputFields.end());
  f.only(known);
  read_common(f, body, r);
  if (f.ok()) {
    if (auto e = read_structured_outputs(body, &r.sampling)) return *e;
  }
  read_max_tokens(f, "max_tokens", &r.max_tokens);
  f.boolean("echo", &r.echo);
  f.boolean("add_special_tokens", &r.add_special_tokens);
  std::optional<int> logprobs;
  f.integer("logprobs", &logprobs);
  if (f.ok() && logprobs && (*logprobs < 0 || *logprobs > kMaxLogprobs)) {
    f.fail("logprobs must be between 0 and " + std::to_string(kMaxLogprobs), "logprobs");
  }
  r.sampling.logprobs = logprobs;
  std::optional<int> best_of;
  f.integer("best_of", &best_of);
  if (f.ok() && best_of && *best_of != r.sampling.n) {
    f.fail("best_of other than n is not supported", "best_of", "unsupported");
  }
  if (const json* suffix = f.get("suffix"); f.ok() && suffix) {
    f.fail("suffix is not supported", "suffix", "unsupported");
  }
  const json* prompt = f.get("prompt");
  if (f.ok()) {
    const char* what = "prompt must be a string, a list of strings, a list of token ids or a "
                       "list of lists of token ids";
    if (!prompt) {
      f.fail("prompt is required", "prompt");
    } else if (prompt->is_string()) {
      r.prompts.push_back({prompt->get<std::string>(), {}});
    } else if (prompt->is_array() && !prompt->empty()) {
      if ((*prompt)[0].is_number_integer()) {
        CompletionRequest::Prompt p;
        if (!read_ids(*prompt, &p.ids)) f.fail(what, "prompt");
        r.prompts.push_back(std::move(p));
      } else {
        for (const json& x : *prompt) {
          CompletionRequest::Prompt p;
          if (x.is_string()) {
            p.text = x.get<std::string>();
          } else if (!x.is_array() || x.empty() || !read_ids(x, &p.ids)) {
            f.fail(what, "prompt");
            break;
          }
          r.prompts.push_back(std::move(p));
        }
      }
    } else {
      f.fail(what, "prompt");
    }
    if (f.ok() && r.prompts.size() * static_cast<size_t>(r.sampling.n) > kMaxChoices) {
      f.fail("prompts x n must be at most " + std::to_string(kMaxChoices), "prompt");
    }
  }
  check_sampling(f, r);
  if (!f.ok()) return f.error();
  return r;
}

namespace {

// `tools`, `tool_choice` and `parallel_tool_calls`, with vLLM's rules: tools without a
// tool_choice mean "auto"; "required" or a named function need tools, and the name must
// be one of them; "required" with an empty list is "none" (OpenAI's behaviour).
void read_tools(FieldReader& f, ChatRequest& r) {
  f.boolean("parallel_tool_calls", &r.parallel_tool_calls);
  const json* tools = f.get("tools");
  if (tools) {
    if (!tools->is_array()) return f.fail("tools must be a list", "tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || string_member(t, "type") != "function" || !t.contains("function") ||
          !t["function"].is_object()) {
        return f.fail(where + " must be {\"type\": \"function\", \"function\": {...}}", "tools");
      }
      const json& fn = t["function"];
      if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty()) {
        return f.fail(where + ".function.name must be a non-empty string", "tools");
      }
      if (fn.contains("parameters") && !fn["parameters"].is_null() &&
          !fn["parameters"].is_object()) {
        return f.fail(where + ".function.parameters must be a JSON schema object", "tools");
      }
      if (fn.contains("description") && !fn["description"].is_null() &&
          !fn["description"].is_string()) {
        return f.fail(where + ".function.description must be a string", "tools");
      }
    }
    r.tools = *tools;
  }
  const json* tc = f.get("tool_choice");
  if (!tc) {
    r.tool_choice = tools && !tools->empty() ? ToolChoice::kAuto : ToolChoice::kNone;
    return;
  }
  const char* usage = "tool_choice must be \"none\", \"auto\", \"required\" or "
                      "{\"type\": \"function\", \"function\": {\"name\": NAME}}";
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "none") {
      r.tool_choice = ToolChoice::kNone;
      return;
    }
    if (s == "auto") {
      r.tool_choice = ToolChoice::kAuto;
    } else if (s == "required") {
      r.tool_choice = ToolChoice::kRequired;
    } else {
      return f.fail(usage, "tool_choice");
    }
  } else if (tc->is_object()) {
    const json* fn = tc->contains("function") ? &(*tc)["function"] : nullptr;
    if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
      return f.fail(usage, "tool_choice");
    }
    r.tool_choice = ToolChoice::kFunction;
    r.tool_choice_function = (*fn)["name"].get<std::string>();
  } else {
    return f.fail(usage, "tool_choice");
  }
  if (!tools) return f.fail("When using `tool_choice`, `tools` must be set.", "tool_choice");
  if (r.tool_choice == ToolChoice::kRequired && tools->empty()) {
    r.tool_choice = ToolChoice::kNone;
    return;
  }
  if (r.tool_choice == ToolChoice::kFunction) {
    for (const json& t : *tools) {
      if (t["function"]["name"] == r.tool_choice_function) return;
    }
    f.fail("The tool specified in `tool_choice` does not match any of the specified `tools`",
           "tool_choice");
  }
}

// An assistant message's tool_calls: [{id, type: "function", function: {name, arguments}}].
std::optional<std::string> check_tool_calls(const json& calls) {
  if (!calls.is_array()) return "tool_calls must be a list";
  for (const json& c : calls) {
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) {
      return "each tool call must be {\"id\", \"type\": \"function\", \"function\": {...}}";
    }
    const json& fn = c["function"];
    if (!fn.contains("name") || !fn["name"].is_string()) return "a tool call's function.name must be a string";
    if (fn.contains("arguments") && !fn["arguments"].is_string() && !fn["arguments"].is_object()) {
      return "a tool call's function.arguments must be a JSON string";
    }
  }
  return std::nullopt;
}

}  // namespace

Parsed<ChatRequest> parse_chat_request(const json& body) {
  if (!body.is_object()) return ApiError::bad_request("the request body must be a JSON object");
  ChatRequest r;
  FieldReader f(body);
  std::set<std::string> known = kCommonFields;
  known.insert({"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                "parallel_tool_calls", "response_format", "store", "metadata", "service_tier",
                "add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                "documents"});
  known.insert(kStructuredOutputFields.begin(), kStructuredOutputFields.end());
  f.only(known);
  read_common(f, body, r);
  if (f.ok()) {
    if (auto e = read_structured_outputs(body, &r.sampling)) return *e;
  }
  read_max_tokens(f, "max_tokens", &r.max_tokens);
  std::optional<int> max_completion;
  read_max_tokens(f, "max_completion_tokens", &max_completion);
  if (max_completion) r.max_tokens = max_completion;
  f.boolean("logprobs", &r.logprobs);
  std::optional<int> top;
  f.integer("top_logprobs", &top);
  if (f.ok() && top) {
    if (*top < 0 || *top > kMaxLogprobs) {
      f.fail("top_logprobs must be between 0 and " + std::to_string(kMaxLogprobs), "top_logprobs");
    } else if (!r.logprobs) {
      f.fail("top_logprobs requires logprobs=true", "top_logprobs");
    }
  }
  if (r.logprobs) r.sampling.logprobs = top.value_or(0);
  f.boolean("add_generation_prompt", &r.add_generation_prompt);
  f.boolean("continue_final_message", &r.continue_final_message);
  f.boolean("add_special_tokens", &r.add_special_tokens);
  if (f.ok() && r.add_generation_prompt && r.continue_final_message) {
    f.fail("add_generation_prompt and continue_final_message cannot both be true",
           "continue_final_message");
  }
  if (f.ok()) read_tools(f, r);
  if (const json* docs = f.get("documents"); f.ok() && docs) r.template_kwargs["documents"] = *docs;
  if (const json* kw = f.get("chat_template_kwargs"); f.ok() && kw) {
    if (!kw->is_object()) {
      f.fail("chat_template_kwargs must be an object", "chat_template_kwargs");
    } else {
      for (auto it = kw->begin(); it != kw->end(); ++it) r.template_kwargs[it.key()] = it.value();
    }
  }
  const json* messages = f.get("messages");
  if (f.ok()) {
    if (!messages || !messages->is_array()) {
      f.fail("messages must be a list of messages", "messages");
    } else if (messages->empty()) {
      f.fail("messages must not be empty", "messages");
    } else {
      for (size_t i = 0; i < messages->size() && f.ok(); ++i) {
        const json& m = (*messages)[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) {
          f.fail(where + " must be an object", "messages");
        } else if (!m.contains("role") || !m["role"].is_string()) {
          f.fail(where + ".role must be a string", "messages");
        } else if (m.contains("content") && !m["content"].is_null() &&
                   !m["content"].is_string() && !m["content"].is_array()) {
          f.fail(where + ".content must be a string or a list of content parts", "messages");
        } else if (m.contains("tool_calls") && !m["tool_calls"].is_null() &&
                   check_tool_calls(m["tool_calls"])) {
          f.fail(where + "." + *check_tool_calls(m["tool_calls"]), "messages");
        } else if (m.contains("content") && m["content"].is_array()) {
          for (const json& part : m["content"]) {
            if (!part.is_object() || string_member(part, "type") != "text" ||
                !part.contains("text") || !part["text"].is_string()) {
              f.fail(where + ".content: only text parts ({\"type\": \"text\", \"text\": ...}) "
                             "are supported",
                     "messages");
              break;
            }
          }
        }
      }
      r.messages = *messages;
    }
  }
  check_sampling(f, r);
  if (!f.ok()) return f.error();
  return r;
}

}  // namespace dserve::server
