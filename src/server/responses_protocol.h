// The request schema of OpenAI's Responses API (POST /v1/responses), served through the
// chat path: a Responses request is validated here and rewritten as the chat completions
// request that asks the same, so templates, tools, structured output and reasoning
// behave exactly as they do for chat. What maps onto what:
//
//   instructions                    a leading system message
//   input (string)                  one user message
//   input (items)                   messages: user / system / developer (as system) /
//                                   assistant with input_text / output_text parts;
//                                   function_call items as the assistant's tool_calls,
//                                   function_call_output items as tool messages;
//                                   reasoning items are dropped (templates drop them too)
//   max_output_tokens               max_completion_tokens
//   tools [{type: function, name, description, parameters, strict}]
//                                   tools [{type: function, function: {...}}]
//   tool_choice {type: function, name}   tool_choice {type: function, function: {name}}
//   text.format json_schema / json_object   response_format
//   include message.output_text.logprobs + top_logprobs   logprobs + top_logprobs
//
// Stored responses are not kept, so store=true, previous_response_id and conversation are
// refused (400); omitting store answers with store=false. An unknown field is refused
// as on the other endpoints.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/openai_protocol.h"

namespace dserve::server {

struct ResponsesRequest {
  nlohmann::ordered_json chat_body;  // the chat completions request it is served as
  // The settings the Response object repeats back: instructions, max_output_tokens,
  // parallel_tool_calls, temperature, text, tool_choice, tools, top_logprobs, top_p,
  // metadata, user, ... (OpenAI's defaults where not given).
  nlohmann::ordered_json echo;
  bool stream = false;
};

Parsed<ResponsesRequest> parse_responses_request(const nlohmann::ordered_json& body);

// An error of the chat path, with its `param` named as the Responses request names it
// (messages -> input, max_completion_tokens -> max_output_tokens, response_format ->
// text.format).
nlohmann::ordered_json responses_error_body(nlohmann::ordered_json chat_error_body);

}  // namespace dserve::server
