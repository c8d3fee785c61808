#include "server/serving.h"

#include <chrono>
#include <cmath>

#include "base/log.h"
#include "server/client_watch.h"
#include "server/openai_protocol.h"
#include "server/random_id.h"
#include "server/reasoning_parser.h"
#include "server/responses_output.h"
#include "server/responses_protocol.h"
#include "grammar/structured_output.h"
#include "server/tool_output.h"
#include "server/unix_time.h"
#include "tokenizer/tokenizer.h"

namespace dserve::server {

using json = nlohmann::ordered_json;

namespace {

// JSON cannot carry -inf; vLLM reports -9999.0 for impossible tokens.
double finite_logprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace

// One HTTP request being served: its engine requests (one per choice) and what each
// choice has produced so far.
struct OpenAiServing::Job {
  bool chat = false;
  std::string id;
  int64_t created = 0;
  std::string model;
  EngineClient* llm = nullptr;
  const Tokenizer* tok = nullptr;
  std::shared_ptr<OutputQueue> queue = std::make_shared<OutputQueue>();
  std::vector<RequestId> request_ids;
  bool reasoning = false;
  bool tools = false;  // the request had tools: messages carry tool_calls
  bool include_usage = false;
  bool continuous_usage = false;  // include_usage + continuous_usage_stats
  bool logprobs = false;
  int n_per_prompt = 1;
  // Completions with echo + logprobs: the prompt's scores lead each choice's logprobs.
  bool echo_logprobs = false;
  std::vector<std::vector<int32_t>> prompt_ids;  // per prompt, with echo_logprobs
  // Per prompt when the request asked for prompt_logprobs: vLLM's list, a null for the
  // first token, then {"id": {logprob, rank, decoded_token}} per later token.
  std::vector<json> prompt_logprobs;

  struct Choice {
    std::string text;  // everything returned so far (with the echoed prompt)
    std::string reasoning_text;
    ReasoningParser reasoning;
    std::unique_ptr<ToolOutput> tools;  // null unless the request's tool_choice may call
    int n_tokens = 0;
    int n_reasoning_tokens = 0;  // of n_tokens, those before </think>
    json logprob_entries = json::array();  // chat: content[]; completions: built at the end
    json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
         text_offset = json::array();
    size_t offset = 0;  // completions' text_offset of the next token
    std::optional<std::string> finish_reason;
    bool role_sent = false;
  };
  std::vector<Choice> choices;
  int64_t n_prompt_tokens = 0;
  std::vector<int64_t> n_prompt_tokens_of;  // per prompt (n choices each)
  int n_unfinished = 0;
  std::string error;

  ~Job() { cancel(); }
  // When the transport says the client is gone, the sequences are aborted (on the
  // transport's thread: the callback holds copies, not the job).
  ClientWatch::Subscription abort_when_client_goes() const {
    return ClientWatch::on_current_gone([llm = llm, ids = request_ids] {
      for (RequestId id : ids) llm->abort(id);
    });
  }
  void cancel() {
    for (size_t i = 0; i < choices.size(); ++i) {
      if (!choices[i].finish_reason && i < request_ids.size()) llm->abort(request_ids[i]);
    }
  }

  std::string token_text(int32_t id) const {
    return tok ? tok->decode(std::span<const int32_t>(&id, 1), false) : "";
  }
  json token_bytes(int32_t id) const {
    json b = json::array();
    if (tok) {
      for (unsigned char c : tok->token_bytes(id)) b.push_back(static_cast<int>(c));
    }
    return b;
  }

  // The logprobs of this delta's tokens, appended to the choice; returns the delta's own
  // logprobs object for a streamed chunk.
  json add_logprobs(Choice& c, const OutputDelta& d) {
    json chunk_content = json::array();
    json ct = json::array(), cl = json::array(), ctop = json::array(), coff = json::array();
    for (size_t k = 0; k < d.logprobs.size(); ++k) {
      const SampleResult& r = d.logprobs[k];
      const int32_t id = k < d.token_ids.size() ? d.token_ids[k] : r.token;
      const std::string text = token_text(id);
      if (chat) {
        json top = json::array();
        for (const TokenLogprob& t : r.top_logprobs) {
          top.push_back({{"token", token_text(t.id)},
                         {"logprob", finite_logprob(t.logprob)},
                         {"bytes", token_bytes(t.id)}});
        }
        json e = {{"token", text},
                  {"logprob", finite_logprob(r.logprob)},
                  {"bytes", token_bytes(id)},
                  {"top_logprobs", top}};
        c.logprob_entries.push_back(e);
        chunk_content.push_back(e);
      } else {
        // vLLM's completions list the chosen token among the alternatives too.
        json top = json::object();
        for (const TokenLogprob& t : r.top_logprobs) top[token_text(t.id)] = finite_logprob(t.logprob);
        if (!top.contains(text)) top[text] = finite_logprob(r.logprob);
        ct.push_back(text);
        cl.push_back(finite_logprob(r.logprob));
        ctop.push_back(top);
        coff.push_back(c.offset);
        c.offset += text.size();
      }
    }
    if (chat) return {{"content", chunk_content}};
    for (size_t k = 0; k < ct.size(); ++k) {
      c.tokens.push_back(ct[k]);
      c.token_logprobs.push_back(cl[k]);
      c.top_logprobs.push_back(ctop[k]);
      c.text_offset.push_back(coff[k]);
    }
    return {{"tokens", ct}, {"token_logprobs", cl}, {"top_logprobs", ctop}, {"text_offset", coff}};
  }

  json usage() const {
    int64_t completion = 0, reasoning_tokens = 0;
    for (const Choice& c : choices) {
      completion += c.n_tokens;
      reasoning_tokens += c.n_reasoning_tokens;
    }
    json u = {{"prompt_tokens", n_prompt_tokens},
              {"completion_tokens", completion},
              {"total_tokens", n_prompt_tokens + completion}};
    if (reasoning) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning_tokens}};
    return u;
  }

  json chunk_base() const {
    return {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model}};
  }

  // Completions with echo + logprobs: the prompt's tokens lead every choice of that
  // prompt, the first with a null logprob (nothing precedes it).
  void add_echo_logprobs(const OutputDelta& d) {
    const size_t group = static_cast<size_t>(d.index) / n_per_prompt;
    if (group >= prompt_ids.size()) return;
    const std::vector<int32_t>& ids = prompt_ids[group];
    OutputDelta scored;
    for (size_t k = 0; k < d.prompt_logprobs.size() && k + 1 < ids.size(); ++k) {
      scored.token_ids.push_back(ids[k + 1]);
      scored.logprobs.push_back(d.prompt_logprobs[k]);
    }
    for (int j = 0; j < n_per_prompt; ++j) {
      Choice& c = choices[group * n_per_prompt + j];
      const size_t echo_end = c.offset;
      c.offset = 0;
      const std::string first = token_text(ids[0]);
      c.tokens.push_back(first);
      c.token_logprobs.push_back(nullptr);
      c.top_logprobs.push_back(nullptr);
      c.text_offset.push_back(0);
      c.offset = first.size();
      add_logprobs(c, scored);
      c.offset = echo_end;
    }
  }

  // vLLM's prompt_logprobs entries for the prompt of delta d (its first): per position
  // the actual token with its rank, then the best alternatives ranked 1.. (the actual
  // token, when among them, keeps its place and takes the alternative's rank, as
  // vLLM's dict does).
  void add_prompt_logprobs(const OutputDelta& d) {
    const size_t group = static_cast<size_t>(d.index) / n_per_prompt;
    if (group >= prompt_logprobs.size()) return;
    json& list = prompt_logprobs[group];
    for (const SampleResult& r : d.prompt_logprobs) {
      json position = json::object();
      auto add = [&](int32_t id, float logprob, int32_t rank) {
        position[std::to_string(id)] = {{"logprob", finite_logprob(logprob)},
                                        {"rank", rank},
                                        {"decoded_token", token_text(id)}};
      };
      add(r.token, r.logprob, r.rank);
      for (size_t k = 0; k < r.top_logprobs.size(); ++k) {
        add(r.top_logprobs[k].id, r.top_logprobs[k].logprob, static_cast<int32_t>(k + 1));
      }
      list.push_back(std::move(position));
    }
  }

  // Applies one delta; with `events`, appends the SSE chunks it gives.
  void apply(OutputDelta& d, std::string* events) {
    if (d.index < 0 || static_cast<size_t>(d.index) >= choices.size()) return;
    Choice& c = choices[d.index];
    if (c.finish_reason) return;
    if (!d.prompt_logprobs.empty()) {
      if (echo_logprobs) add_echo_logprobs(d);
      add_prompt_logprobs(d);
    }
    c.n_tokens += static_cast<int>(d.token_ids.size());
    json lp = logprobs && !d.logprobs.empty() ? add_logprobs(c, d) : json(nullptr);
    std::string reasoning_piece, content_piece = d.text;
    if (reasoning) {
      ReasoningParser::Delta r = c.reasoning.add(d.text);
      if (d.finish_reason) {
        ReasoningParser::Delta f = c.reasoning.flush();
        r.reasoning += f.reasoning;
        r.content += f.content;
      }
      // As vLLM counts them: the tokens before </think>, not the tag's own.
      if (c.reasoning.in_reasoning()) c.n_reasoning_tokens += static_cast<int>(d.token_ids.size());
      reasoning_piece = std::move(r.reasoning);
      content_piece = std::move(r.content);
      c.reasoning_text += reasoning_piece;
    }
    json tool_deltas = json::array();
    if (c.tools) {
      ToolOutput::Delta t = c.tools->add(content_piece);
      if (d.finish_reason) {
        ToolOutput::Delta f = c.tools->flush();
        t.content += f.content;
        for (json& call : f.tool_calls) t.tool_calls.push_back(std::move(call));
      }
      content_piece = std::move(t.content);
      tool_deltas = std::move(t.tool_calls);
    }
    c.text += content_piece;
    if (d.finish_reason) {
      c.finish_reason = c.tools ? c.tools->finish_reason(*d.finish_reason) : *d.finish_reason;
      if (*d.finish_reason == "error") error = d.error;
      --n_unfinished;
    }
    if (!events) return;
    const bool has_text =
        !content_piece.empty() || !reasoning_piece.empty() || !tool_deltas.empty();
    if (!has_text && !d.finish_reason && (lp.is_null() || d.logprobs.empty())) return;
    json choice = {{"index", d.index}};
    if (chat) {
      json delta = json::object();
      if (!c.role_sent) {
        delta["role"] = "assistant";
        c.role_sent = true;
      }
      if (!reasoning_piece.empty()) delta["reasoning_content"] = reasoning_piece;
      if (!content_piece.empty() || (!reasoning && !d.finish_reason && tool_deltas.empty())) {
        delta["content"] = content_piece;
      }
      if (!tool_deltas.empty()) delta["tool_calls"] = std::move(tool_deltas);
      choice["delta"] = delta;
    } else {
      choice["text"] = content_piece;
    }
    choice["logprobs"] = lp;
    choice["finish_reason"] = c.finish_reason ? json(*c.finish_reason) : json(nullptr);
    json chunk = chunk_base();
    chunk["choices"] = json::array({choice});
    if (continuous_usage) {
      // As vLLM: this choice's prompt and its tokens so far.
      const size_t group = static_cast<size_t>(d.index) / n_per_prompt;
      const int64_t prompt = group < n_prompt_tokens_of.size() ? n_prompt_tokens_of[group] : 0;
      chunk["usage"] = {{"prompt_tokens", prompt},
                        {"completion_tokens", c.n_tokens},
                        {"total_tokens", prompt + c.n_tokens}};
    } else if (include_usage) {
      chunk["usage"] = nullptr;
    }
    *events += sse(chunk);
  }

  // The whole non-streamed response.
  json response() const {
    json out = chunk_base();
    out["object"] = chat ? "chat.completion" : "text_completion";
    json cs = json::array();
    for (size_t i = 0; i < choices.size(); ++i) {
      const Choice& c = choices[i];
      json choice = {{"index", i}};
      if (chat) {
        json message = {{"role", "assistant"}};
        if (reasoning) {
          message["reasoning_content"] =
              c.reasoning_text.empty() ? json(nullptr) : json(c.reasoning_text);
          message["content"] = c.text.empty() ? json(nullptr) : json(c.text);
        } else {
          message["content"] = c.text;
        }
        if (c.tools) message["content"] = c.tools->content();
        if (tools) message["tool_calls"] = c.tools ? c.tools->tool_calls() : json::array();
        choice["message"] = message;
        choice["logprobs"] = logprobs ? json{{"content", c.logprob_entries}} : json(nullptr);
      } else {
        choice["text"] = c.text;
        choice["logprobs"] = logprobs ? json{{"tokens", c.tokens},
                                             {"token_logprobs", c.token_logprobs},
                                             {"top_logprobs", c.top_logprobs},
                                             {"text_offset", c.text_offset}}
                                      : json(nullptr);
      }
      choice["finish_reason"] = c.finish_reason ? json(*c.finish_reason) : json(nullptr);
      // vLLM: completions carry each prompt's scores in its choices, chat at the top.
      if (!chat && !prompt_logprobs.empty()) {
        choice["prompt_logprobs"] = prompt_logprobs[i / n_per_prompt];
      }
      cs.push_back(choice);
    }
    out["choices"] = cs;
    if (chat && !prompt_logprobs.empty()) out["prompt_logprobs"] = prompt_logprobs[0];
    out["usage"] = usage();
    return out;
  }
};

// A streamed response: pulls the job's queue and formats chunks.
class OpenAiServing::Stream : public EventStream {
 public:
  explicit Stream(std::unique_ptr<Job> job)
      : job_(std::move(job)), client_gone_(job_->abort_when_client_goes()) {}

  std::string next(std::chrono::milliseconds timeout) override {
    std::string events;
    if (done_) return events;
    if (!prefix_.empty()) events.swap(prefix_);
    for (OutputDelta& d : job_->queue->pop(events.empty() ? timeout : std::chrono::milliseconds(0)))
      job_->apply(d, &events);
    if (job_->n_unfinished == 0) {
      if (!job_->error.empty()) {
        events += sse(ApiError{500, job_->error, "server_error", "", ""}.to_json());
      }
      if (job_->include_usage) {
        json chunk = job_->chunk_base();
        chunk["choices"] = json::array();
        chunk["usage"] = job_->usage();
        events += sse(chunk);
      }
      events += "data: [DONE]\n\n";
      done_ = true;
    }
    return events;
  }
  bool done() const override { return done_; }
  void cancel() override { job_->cancel(); }
  json usage() const override { return job_->usage(); }
  // Events to send before any output (the echoed prompt).
  void set_prefix(std::string events) { prefix_ = std::move(events); }

 private:
  std::unique_ptr<Job> job_;
  ClientWatch::Subscription client_gone_;
  std::string prefix_;
  bool done_ = false;
};

std::unique_ptr<OpenAiServing::Job> OpenAiServing::new_job(bool chat,
                                                           const GenerationRequest& r) const {
  auto job = std::make_unique<Job>();
  job->chat = chat;
  job->id = random_id(chat ? "chatcmpl-" : "cmpl-");
  job->created = unix_now();
  job->model = model_name();
  job->llm = &llm_;
  job->tok = llm_.tokenizer();
  job->include_usage = r.include_usage;
  job->continuous_usage = r.include_usage && r.continuous_usage_stats;
  return job;
}

// A non-streamed response: waits for every choice, then answers at once.
Reply OpenAiServing::run_to_completion(Job& job) {
  ClientWatch::Subscription client_gone = job.abort_when_client_goes();
  while (job.n_unfinished > 0) {
    for (OutputDelta& d : job.queue->pop(std::chrono::milliseconds(1000))) job.apply(d, nullptr);
  }
  if (!job.error.empty()) return Reply::error({500, job.error, "server_error", "", ""});
  return {200, job.response(), nullptr};
}

OpenAiServing::OpenAiServing(EngineClient& llm, ChatRenderer render_chat, ServingConfig config)
    : llm_(llm), render_chat_(std::move(render_chat)), config_(std::move(config)) {}

OpenAiServing::~OpenAiServing() = default;

std::optional<ApiError> OpenAiServing::check_model(const std::string& model) const {
  if (model.empty()) return std::nullopt;
  for (const std::string& n : config_.served_model_names) {
    if (n == model) return std::nullopt;
  }
  return ApiError{404, "The model `" + model + "` does not exist.", "invalid_request_error",
                  "model", "model_not_found"};
}

Result<std::vector<int32_t>> OpenAiServing::chat_prompt(const json& messages,
                                                        bool add_generation_prompt,
                                                        bool add_special_tokens,
                                                        const json& kwargs) const {
  if (!render_chat_) {
    return invalid_argument(
        "this model has no chat template; pass one with --chat-template FILE, or use "
        "/v1/completions");
  }
  json with_objects = messages;
  const bool has_arguments = parse_tool_call_arguments(with_objects);
  Result<std::string> text = render_chat_(with_objects, add_generation_prompt, kwargs);
  if (!text.ok() && has_arguments) text = render_chat_(messages, add_generation_prompt, kwargs);
  if (!text.ok()) return text.status();
  return llm_.tokenizer()->encode(*text, add_special_tokens);
}

namespace {
// logit_bias keys must be ids of this model's vocabulary (the protocol checked the rest).
std::optional<ApiError> check_logit_bias(const SamplingOptions& s, int64_t vocab) {
  for (const auto& [id, bias] : s.logit_bias) {
    if (id >= vocab) {
      return ApiError::bad_request("logit_bias token id " + std::to_string(id) +
                                       " is outside the vocabulary [0, " +
                                       std::to_string(vocab) + ")",
                                   "logit_bias");
    }
  }
  return std::nullopt;
}

// Resolves max_tokens against the context: vLLM's rules and messages.
std::optional<ApiError> fit_context(int prompt_len, std::optional<int> max_tokens,
                                    int default_max, int max_model_len, int* out) {
  if (prompt_len == 0) return ApiError::bad_request("the prompt is empty", "prompt");
  if (prompt_len >= max_model_len) {
    return ApiError::bad_request(
        "This model's maximum context length is " + std::to_string(max_model_len) +
            " tokens. However, your request has " + std::to_string(prompt_len) +
            " input tokens. Please reduce the length of the input messages.",
        "messages", "context_length_exceeded");
  }
  const int room = max_model_len - prompt_len;
  if (max_tokens && *max_tokens > room) {
    // In 64 bits: max_tokens may be up to INT32_MAX, and the sum must not wrap.
    const int64_t requested = int64_t{prompt_len} + *max_tokens;
    return ApiError::bad_request(
        "This model's maximum context length is " + std::to_string(max_model_len) +
            " tokens. However, you requested " + std::to_string(requested) +
            " tokens (" + std::to_string(prompt_len) + " in the messages, " +
            std::to_string(*max_tokens) + " in the completion). Please reduce the length of "
            "the messages or completion.",
        "max_tokens", "context_length_exceeded");
  }
  *out = max_tokens ? *max_tokens : std::min(default_max, room);
  return std::nullopt;
}
}  // namespace

Reply OpenAiServing::completions(const json& body) const {
  Parsed<CompletionRequest> parsed = parse_completion_request(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return Reply::error(*e);
  CompletionRequest& r = std::get<CompletionRequest>(parsed);
  if (auto e = check_model(r.model)) return Reply::error(*e);
  const Tokenizer* tok = llm_.tokenizer();
  // echo + logprobs scores the prompt too, as evaluation harnesses use it (with
  // prompt_logprobs' number of alternatives when also given, as vLLM).
  if (r.sampling.logprobs && r.echo && !r.sampling.prompt_logprobs) {
    r.sampling.prompt_logprobs = r.sampling.logprobs;
  }
  if (auto e = check_logit_bias(r.sampling, llm_.vocab_size())) return Reply::error(*e);

  std::unique_ptr<Job> job = new_job(/*chat=*/false, r);
  job->logprobs = r.sampling.logprobs.has_value();
  const int n = r.sampling.n;
  job->n_per_prompt = n;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echoes;
  for (const CompletionRequest::Prompt& p : r.prompts) {
    std::vector<int32_t> ids = p.ids;
    if (ids.empty()) {
      if (!tok) return Reply::error(ApiError::bad_request("text prompts need the model's tokenizer", "prompt"));
      ids = tok->encode(p.text, r.add_special_tokens);
    }
    for (int32_t id : ids) {
      if (id >= llm_.vocab_size()) {
        return Reply::error(ApiError::bad_request(
            "token id " + std::to_string(id) + " is outside the vocabulary", "prompt"));
      }
    }
    int max_tokens = 0;
    if (auto e = fit_context(static_cast<int>(ids.size()), r.max_tokens, 16, llm_.max_model_len(),
                             &max_tokens)) {
      return Reply::error(*e);
    }
    r.sampling.max_tokens = max_tokens;
    job->n_prompt_tokens += static_cast<int64_t>(ids.size());
    job->n_prompt_tokens_of.push_back(static_cast<int64_t>(ids.size()));
    echoes.push_back(!r.echo ? "" : !p.ids.empty() && tok ? tok->decode(p.ids, false) : p.text);
    prompts.push_back(std::move(ids));
  }
  job->echo_logprobs = r.echo && r.sampling.logprobs;
  if (job->echo_logprobs) job->prompt_ids = prompts;
  if (r.sampling.prompt_logprobs) {
    job->prompt_logprobs.assign(prompts.size(), json::array({nullptr}));
  }
  job->choices.resize(prompts.size() * n);
  for (size_t p = 0; p < prompts.size(); ++p) {
    const int first = static_cast<int>(p) * n;
    for (int j = 0; j < n; ++j) {
      job->choices[first + j].text = echoes[p];
      job->choices[first + j].offset = echoes[p].size();
    }
    Result<std::vector<RequestId>> ids = llm_.add_request(prompts[p], r.sampling, job->queue, first);
    if (!ids.ok()) return Reply::error(ApiError::from_status(ids.status(), "prompt"));
    job->request_ids.insert(job->request_ids.end(), ids->begin(), ids->end());
    job->n_unfinished += n;
  }
  if (r.stream) {
    std::string prefix;
    if (r.echo) {
      for (size_t i = 0; i < job->choices.size(); ++i) {
        if (job->choices[i].text.empty()) continue;
        json chunk = job->chunk_base();
        chunk["choices"] = json::array({{{"index", i},
                                         {"text", job->choices[i].text},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}});
        if (job->continuous_usage) {
          const int64_t prompt = job->n_prompt_tokens_of[i / n];
          chunk["usage"] = {{"prompt_tokens", prompt}, {"completion_tokens", 0},
                            {"total_tokens", prompt}};
        } else if (job->include_usage) {
          chunk["usage"] = nullptr;
        }
        prefix += sse(chunk);
      }
    }
    auto s = std::make_shared<Stream>(std::move(job));
    s->set_prefix(std::move(prefix));
    return {200, nullptr, s};
  }
  return run_to_completion(*job);
}

Reply OpenAiServing::chat_completions(const json& body) const {
  Parsed<ChatRequest> parsed = parse_chat_request(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return Reply::error(*e);
  ChatRequest& r = std::get<ChatRequest>(parsed);
  if (auto e = check_model(r.model)) return Reply::error(*e);
  if (auto e = check_logit_bias(r.sampling, llm_.vocab_size())) return Reply::error(*e);
  if (r.continue_final_message) {
    return Reply::error(ApiError::bad_request("continue_final_message is not supported yet",
                                              "continue_final_message", "unsupported"));
  }
  if (!llm_.tokenizer()) {
    return Reply::error(ApiError::bad_request("chat needs the model's tokenizer", "messages"));
  }
  // Tools are shown to the model whatever tool_choice says (vLLM's default).
  if (!r.tools.is_null()) r.template_kwargs["tools"] = r.tools;
  if (r.tool_choice == ToolChoice::kAuto) {
    if (!config_.auto_tool_call_format) {
      return Reply::error(ApiError::bad_request(
          "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to "
          "be set",
          "tool_choice"));
    }
    // DeepSeek's call markers are special tokens: the parser must see them.
    r.sampling.skip_special_tokens = false;
  } else if (r.tool_choice != ToolChoice::kNone) {
    // "required" and a named function are enforced, as vLLM does, by constraining the
    // output to a JSON list of calls / the function's arguments (ToolOutput reads it).
    if (r.sampling.structured_outputs) {
      return Reply::error(ApiError::bad_request(
          "tool_choice \"required\" or a named function cannot be combined with "
          "response_format or structured outputs",
          "tool_choice"));
    }
    StructuredOutputs spec;
    spec.kind = StructuredOutputs::Kind::kJson;
    spec.text = tool_choice_schema(r).dump();
    if (Result<std::shared_ptr<const grammar::Grammar>> g = grammar::compile_grammar(spec); !g.ok()) {
      return Reply::error(ApiError::bad_request(
          "the tools' parameters cannot constrain decoding: " + g.status().message(), "tools"));
    }
    r.sampling.structured_outputs = std::move(spec);
  }
  Result<std::vector<int32_t>> prompt =
      chat_prompt(r.messages, r.add_generation_prompt, r.add_special_tokens, r.template_kwargs);
  if (!prompt.ok()) return Reply::error(ApiError::from_status(prompt.status(), "messages"));
  int max_tokens = 0;
  if (auto e = fit_context(static_cast<int>(prompt->size()), r.max_tokens, llm_.max_model_len(),
                           llm_.max_model_len(), &max_tokens)) {
    return Reply::error(*e);
  }
  r.sampling.max_tokens = max_tokens;

  std::unique_ptr<Job> job = new_job(/*chat=*/true, r);
  job->logprobs = r.logprobs;
  if (r.sampling.prompt_logprobs) job->prompt_logprobs = {json::array({nullptr})};
  job->reasoning = config_.reasoning_deepseek_r1;
  job->tools = !r.tools.is_null();
  job->n_prompt_tokens = static_cast<int64_t>(prompt->size());
  job->n_prompt_tokens_of = {job->n_prompt_tokens};
  const int n = r.sampling.n;
  job->choices.resize(n);
  if (job->reasoning) {
    // DeepSeek-V3.1 without thinking ends the prompt with </think>: the output is answer.
    const size_t tail = std::min<size_t>(prompt->size(), 8);
    const std::string end = llm_.tokenizer()->decode(
        std::span<const int32_t>(prompt->data() + prompt->size() - tail, tail), false);
    if (ReasoningParser::closes_reasoning(end)) {
      for (Job::Choice& c : job->choices) c.reasoning = ReasoningParser(true);
    }
  }
  if (r.tool_choice != ToolChoice::kNone) {
    for (Job::Choice& c : job->choices) {
      c.tools = std::make_unique<ToolOutput>(r.tool_choice, r.tool_choice_function,
                                             config_.auto_tool_call_format);
    }
  }
  Result<std::vector<RequestId>> ids = llm_.add_request(*prompt, r.sampling, job->queue, 0);
  if (!ids.ok()) return Reply::error(ApiError::from_status(ids.status(), "messages"));
  job->request_ids = std::move(ids).value();
  job->n_unfinished = n;
  if (r.stream) return {200, nullptr, std::make_shared<Stream>(std::move(job))};
  return run_to_completion(*job);
}

Reply OpenAiServing::responses(const json& body) const {
  Parsed<ResponsesRequest> parsed = parse_responses_request(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return Reply::error(*e);
  ResponsesRequest& r = std::get<ResponsesRequest>(parsed);
  Reply chat = chat_completions(r.chat_body);
  if (chat.status != 200) return {chat.status, responses_error_body(std::move(chat.body)), nullptr};
  auto builder = std::make_unique<ResponseBuilder>(std::move(r.echo), model_name());
  if (chat.stream) {
    return {200, nullptr, responses_event_stream(std::move(chat.stream), std::move(builder))};
  }
  builder->add_chat_completion(chat.body);
  builder->finish();
  return {200, builder->response(), nullptr};
}

Reply OpenAiServing::models() const {
  json data = json::array();
  for (const std::string& name : config_.served_model_names) {
    data.push_back({{"id", name},
                    {"object", "model"},
                    {"created", unix_now()},
                    {"owned_by", "dserve"},
                    {"root", config_.model_path},
                    {"parent", nullptr},
                    {"max_model_len", llm_.max_model_len()}});
  }
  return {200, {{"object", "list"}, {"data", data}}, nullptr};
}

Reply OpenAiServing::tokenize(const json& body) const {
  if (!body.is_object()) return Reply::error(ApiError::bad_request("the body must be a JSON object"));
  const Tokenizer* tok = llm_.tokenizer();
  if (!tok) return Reply::error(ApiError::bad_request("this model has no tokenizer"));
  if (body.contains("model") && body["model"].is_string()) {
    if (auto e = check_model(body["model"].get<std::string>())) return Reply::error(*e);
  }
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    json chat_body = {{"messages", body["messages"]}};
    Parsed<ChatRequest> parsed = parse_chat_request(chat_body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return Reply::error(*e);
    // Read as the typed fields they are: a wrong type is the client's error (400), not
    // a JSON-library exception (500).
    bool add_generation_prompt = true, add_special = false;
    for (auto [name, out] : {std::pair{"add_generation_prompt", &add_generation_prompt},
                             std::pair{"add_special_tokens", &add_special}}) {
      if (!body.contains(name) || body[name].is_null()) continue;
      if (!body[name].is_boolean()) {
        return Reply::error(ApiError::bad_request(std::string(name) + " must be a boolean", name));
      }
      *out = body[name].get<bool>();
    }
    // Tools render as they would in a chat request (vLLM's /tokenize takes them too).
    json kwargs = json::object();
    if (body.contains("tools") && !body["tools"].is_null()) {
      if (!body["tools"].is_array()) return Reply::error(ApiError::bad_request("tools must be a list", "tools"));
      kwargs["tools"] = body["tools"];
    }
    Result<std::vector<int32_t>> p =
        chat_prompt(body["messages"], add_generation_prompt, add_special, kwargs);
    if (!p.ok()) return Reply::error(ApiError::from_status(p.status(), "messages"));
    ids = std::move(p).value();
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    const json& add = body.contains("add_special_tokens") ? body["add_special_tokens"] : json(true);
    if (!add.is_boolean())
      return Reply::error(ApiError::bad_request("add_special_tokens must be a boolean", "add_special_tokens"));
    ids = tok->encode(body["prompt"].get<std::string>(), add.get<bool>());
  } else {
    return Reply::error(ApiError::bad_request("prompt (a string) or messages is required", "prompt"));
  }
  return {200,
          {{"count", ids.size()}, {"max_model_len", llm_.max_model_len()}, {"tokens", ids}},
          nullptr};
}

Reply OpenAiServing::tokenizer_info() const {
  if (!llm_.tokenizer()) return Reply::error(ApiError::bad_request("this model has no tokenizer"));
  // vLLM's GET /tokenizer_info: the tokenizer's configuration (special tokens, chat
  // template, length), which lm-eval's tokenizer_backend=remote reads instead of
  // downloading the tokenizer; it then tokenizes through /tokenize.
  const TokenizerInfo& t = config_.tokenizer_info;
  auto token = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json body = {{"tokenizer_class", "PreTrainedTokenizerFast"},
               {"bos_token", token(t.bos_token)},
               {"eos_token", token(t.eos_token)},
               {"model_max_length", llm_.max_model_len()}};
  if (!t.chat_template.empty()) body["chat_template"] = t.chat_template;
  return {200, body, nullptr};
}

Reply OpenAiServing::detokenize(const json& body) const {
  if (!body.is_object()) return Reply::error(ApiError::bad_request("the body must be a JSON object"));
  const Tokenizer* tok = llm_.tokenizer();
  if (!tok) return Reply::error(ApiError::bad_request("this model has no tokenizer"));
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    return Reply::error(ApiError::bad_request("tokens (a list of token ids) is required", "tokens"));
  }
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= llm_.vocab_size()) {
      return Reply::error(ApiError::bad_request("tokens must be token ids of this model", "tokens"));
    }
    ids.push_back(t.get<int32_t>());
  }
  return {200, {{"prompt", tok->decode(ids, false)}}, nullptr};
}

}  // namespace dserve::server
