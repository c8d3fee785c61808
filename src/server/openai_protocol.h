// The OpenAI request schema: parses and validates the JSON body of
// POST /v1/completions and POST /v1/chat/completions into typed requests, with
// OpenAI's field names and vLLM's extensions (top_k, min_p, repetition_penalty,
// min_tokens, ignore_eos, stop_token_ids, ...). Every problem becomes one ApiError
// naming the field; an unknown field is rejected ("unrecognized request argument"),
// as OpenAI does, because silently ignoring it could change what the client gets.
// Nothing here touches the engine or the tokenizer.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/sampling_params.h"
#include "server/api_error.h"

namespace dserve::server {

// Choices per request at most (`n`).
inline constexpr int kMaxChoices = 64;
// Stop strings: matching costs O(count x length^2) per generated token on the engine
// thread, which every request shares, so both are bounded (OpenAI allows 4 strings).
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;
inline constexpr size_t kMaxStopTokenIds = 1024;

// What completions and chat requests share.
struct GenerationRequest {
  std::string model;                // empty: not given
  SamplingOptions sampling;         // n, temperature, stop, seed, logprobs, ...
  std::optional<int> max_tokens;    // none: the endpoint's default
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage
  // stream_options.continuous_usage_stats: with include_usage, usage on every chunk.
  bool continuous_usage_stats = false;
};

struct CompletionRequest : GenerationRequest {
  // Each prompt: text, or token ids when `ids` is non-empty.
  struct Prompt {
    std::string text;
    std::vector<int32_t> ids;
  };
  std::vector<Prompt> prompts;
  bool echo = false;
  bool add_special_tokens = true;
};

// How a chat request may call its tools (OpenAI's tool_choice).
enum class ToolChoice {
  kNone,      // never: the output is content (tools are still shown to the model)
  kAuto,      // the model decides; the server's --tool-call-parser finds the calls
  kRequired,  // at least one call, enforced by constrained decoding
  kFunction,  // exactly one call of tool_choice_function, enforced likewise
};

struct ChatRequest : GenerationRequest {
  nlohmann::ordered_json messages;  // validated: non-empty array of {role: string, content, ...}
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool add_special_tokens = false;  // the template writes BOS itself
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // documents, chat_template_kwargs
  bool logprobs = false;           // then sampling.logprobs = top_logprobs
  nlohmann::ordered_json tools;    // null, or validated [{type: "function", function: {...}}]
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_choice_function;  // kFunction: the tool's name
  bool parallel_tool_calls = true;
};

template <typename T>
using Parsed = std::variant<T, ApiError>;

Parsed<CompletionRequest> parse_completion_request(const nlohmann::ordered_json& body);
Parsed<ChatRequest> parse_chat_request(const nlohmann::ordered_json& body);

}  // namespace dserve::server
