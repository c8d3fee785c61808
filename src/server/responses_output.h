// ResponseBuilder: a chat completion's output seen as a Responses API Response object,
// with the server-sent events OpenAI streams while building it.
//
// The output items, in the order the model wrote them:
//   reasoning       {type: reasoning, content: [{type: reasoning_text, text}]}
//                   (with a --reasoning-parser)
//   message         {type: message, role: assistant, content: [{type: output_text, text,
//                   annotations: [], logprobs}]}
//   function_call   {type: function_call, call_id, name, arguments}
//
// Streamed, each item is opened and closed with OpenAI's events, every event carrying a
// sequence_number from 0:
//   response.created, response.in_progress,
//   response.output_item.added, response.content_part.added,
//     response.output_text.delta ... response.output_text.done      (a message)
//     response.reasoning_text.delta ... response.reasoning_text.done  (reasoning)
//   response.content_part.done, response.output_item.done,
//   response.output_item.added,                                       (a function call)
//     response.function_call_arguments.delta ... .done, response.output_item.done,
//   response.completed | response.incomplete (max_output_tokens reached) | response.failed
// A non-streamed response is built by the same steps, its events dropped, so both carry
// the same items.
//
// The chat side comes in as chat.completion.chunk objects (streamed) or one
// chat.completion object.
//
// Thread-safety: not thread-safe; one per response.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>


namespace dserve::server {

class EventStream;  // serving.h

class ResponseBuilder {
 public:
  // `echo`: the request's settings the Response repeats (ResponsesRequest::echo).
  ResponseBuilder(nlohmann::ordered_json echo, std::string model);

  // response.created and response.in_progress.
  std::string begin();
  // The events one chat.completion.chunk gives (its delta, finish_reason, usage or error).
  std::string add_chat_chunk(const nlohmann::ordered_json& chunk);
  // A whole chat.completion (non-streamed): its message as items, its usage.
  void add_chat_completion(const nlohmann::ordered_json& completion);
  // Closes the open item; the terminal event (completed, incomplete or failed).
  std::string finish();

  // The Response object as it stands.
  nlohmann::ordered_json response() const;

 private:
  enum class ItemKind { kNone, kReasoning, kMessage, kFunctionCall };

  std::string emit(const char* type, nlohmann::ordered_json fields);
  std::string open(ItemKind kind, nlohmann::ordered_json item);
  std::string close_item();
  std::string add_reasoning(const std::string& text);
  std::string add_text(const std::string& text, const nlohmann::ordered_json& logprobs);
  std::string start_call(const std::string& call_id, const std::string& name);
  std::string add_arguments(const std::string& piece);
  std::string add_tool_call_delta(const nlohmann::ordered_json& call);
  void set_usage(const nlohmann::ordered_json& chat_usage);
  // The open item's id, output_index and content_index (the event fields naming it).
  nlohmann::ordered_json where(bool with_content_index = true) const;

  const nlohmann::ordered_json echo_;
  const std::string model_;
  const std::string id_;
  const int64_t created_at_;
  int64_t sequence_number_ = 0;
  std::string status_ = "in_progress";
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  ItemKind open_ = ItemKind::kNone;
  std::map<int, size_t> call_items_;  // a chat tool call's index -> its output index
  nlohmann::ordered_json usage_;      // null until the chat side reports it
  // Logprobs of tokens whose text is still held back (a chunk with logprobs and no
  // text): they go with the next text delta.
  nlohmann::ordered_json pending_logprobs_ = nlohmann::ordered_json::array();
  std::string finish_reason_;         // the chat side's
  std::string error_;                 // an engine error, when the response failed
};

// The Responses events of a streamed chat completion: pulls `chat` and hands each of its
// chunks to `builder`. Ends after the terminal event (no [DONE], as OpenAI's).
std::shared_ptr<EventStream> responses_event_stream(std::shared_ptr<EventStream> chat,
                                                    std::unique_ptr<ResponseBuilder> builder);

}  // namespace dserve::server
