// OpenAiServing: what each OpenAI endpoint does, independent of the HTTP library.
// A handler takes the parsed JSON body and returns a Reply: a whole JSON response, or
// an EventStream of server-sent events that the transport pulls and writes. Each
// prompt becomes one engine request with n sequences sharing the prompt's KV blocks,
// all feeding one OutputQueue; seeded choices use seed + choice index, as vLLM.
//
// Thread-safety: handlers run concurrently on HTTP threads; the object is immutable
// after construction and the EngineClient and Tokenizer it uses are thread-safe. One
// EventStream is pulled by one thread at a time.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dserve/async_llm.h"
#include "server/api_error.h"
#include "server/tool_call_parser.h"

namespace dserve::server {

struct GenerationRequest;  // openai_protocol.h

// Server-sent events for one streamed response.
class EventStream {
 public:
  virtual ~EventStream() = default;
  // The next events ("data: ...\n\n" lines); waits up to `timeout` for them. Empty when
  // nothing came in time.
  virtual std::string next(std::chrono::milliseconds timeout) = 0;
  // True once the final "data: [DONE]" has been returned.
  virtual bool done() const = 0;
  // The client went away: aborts every unfinished choice (their KV blocks are freed).
  virtual void cancel() = 0;
  // The response's token counts so far ({prompt_tokens, completion_tokens, ...}).
  virtual nlohmann::ordered_json usage() const = 0;
};

struct Reply {
  int status = 200;
  nlohmann::ordered_json body;                  // when stream is null
  std::shared_ptr<EventStream> stream;  // text/event-stream

  static Reply error(const ApiError& e) { return {e.http_status, e.to_json(), nullptr}; }
};

// Renders a conversation into prompt text (the chat template); errors are the
// template's (raise_exception, bad messages).
using ChatRenderer = std::function<Result<std::string>(
    const nlohmann::ordered_json& messages, bool add_generation_prompt, const nlohmann::ordered_json& kwargs)>;

// What GET /tokenizer_info reports; empty strings are unknown (null).
struct TokenizerInfo {
  std::string bos_token, eos_token;
  std::string chat_template;
};

struct ServingConfig {
  std::vector<std::string> served_model_names;  // the first is reported in responses
  std::string model_path;
  TokenizerInfo tokenizer_info;
  bool reasoning_deepseek_r1 = false;  // --reasoning-parser deepseek_r1
  // --enable-auto-tool-choice with --tool-call-parser: tool_choice "auto" finds the
  // model's calls in this format; without it "auto" is refused, as vLLM does.
  std::optional<ToolCallFormat> auto_tool_call_format;
};

class OpenAiServing {
 public:
  // `render_chat` may be empty (then chat requests fail with a clear error).
  OpenAiServing(EngineClient& llm, ChatRenderer render_chat, ServingConfig config);
  // The engine can still serve (GET /health).
  bool healthy() const { return llm_.healthy(); }
  ~OpenAiServing();

  Reply completions(const nlohmann::ordered_json& body) const;
  Reply chat_completions(const nlohmann::ordered_json& body) const;
  // OpenAI's Responses API, served as the chat request it maps onto
  // (responses_protocol.h).
  Reply responses(const nlohmann::ordered_json& body) const;
  Reply models() const;
  Reply tokenize(const nlohmann::ordered_json& body) const;
  Reply detokenize(const nlohmann::ordered_json& body) const;
  Reply tokenizer_info() const;

  const std::string& model_name() const { return config_.served_model_names.front(); }

 private:
  struct Job;
  class Stream;
  // A job for `r` with the fields every endpoint sets (id, model, tokenizer, usage).
  std::unique_ptr<Job> new_job(bool chat, const GenerationRequest& r) const;
  static Reply run_to_completion(Job& job);
  // An error, or empty when `model` is empty or one of the served names.
  std::optional<ApiError> check_model(const std::string& model) const;
  // Renders and tokenizes a chat conversation. Assistant tool calls' arguments are
  // given to the template as objects (transformers' convention), or as the JSON strings
  // they came as when the template cannot take objects (DeepSeek's concatenate them).
  Result<std::vector<int32_t>> chat_prompt(const nlohmann::ordered_json& messages,
                                           bool add_generation_prompt, bool add_special_tokens,
                                           const nlohmann::ordered_json& kwargs) const;

  EngineClient& llm_;
  ChatRenderer render_chat_;
  const ServingConfig config_;
};

}  // namespace dserve::server
