// ApiError: an HTTP error in OpenAI's shape,
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// The server maps every failure to one of these in one place (from_status), so a
// client always gets a status code and a message that says what to change.
// Thread-safety: plain values.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace dserve::server {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault; empty: null
  std::string code;   // OpenAI's machine-readable code; empty: null

  nlohmann::ordered_json to_json() const;

  static ApiError bad_request(std::string message, std::string param = "",
                              std::string code = "") {
    return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
  }
  // An engine or library Status: InvalidArgument -> 400, ResourceExhausted -> 400
  // (the request cannot fit) or 503 (shutting down), Unimplemented -> 400, anything
  // else -> 500.
  static ApiError from_status(const Status& s, std::string param = "");
};

}  // namespace dserve::server
