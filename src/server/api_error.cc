#include "server/api_error.h"

namespace dserve::server {

nlohmann::ordered_json ApiError::to_json() const {
  nlohmann::ordered_json e = {{"message", message}, {"type", type}};
  e["param"] = param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param);
  e["code"] = code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code);
  return {{"error", e}};
}

ApiError ApiError::from_status(const Status& s, std::string param) {
  switch (s.code()) {
    case StatusCode::kOk:
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorrupt:
      return bad_request(s.message(), std::move(param));
    case StatusCode::kUnimplemented:
      return bad_request(s.message(), std::move(param), "unsupported");
    case StatusCode::kResourceExhausted:
      if (s.message().find("shutting down") != std::string::npos) {
        return {503, s.message(), "service_unavailable", "", ""};
      }
      return bad_request(s.message(), std::move(param), "context_length_exceeded");
    case StatusCode::kIoError:
    case StatusCode::kInternal:
      return {500, s.message(), "server_error", "", ""};
  }
  return {500, s.message(), "server_error", "", ""};
}

}  // namespace dserve::server
