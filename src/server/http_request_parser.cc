#include "server/http_request_parser.h"

#include <boost/beast/http/error.hpp>

#include <strings.h>

namespace dserve::server {

namespace http = boost::beast::http;

namespace {

class ParseCategory : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "dserve.http"; }
  std::string message(int ev) const override {
    switch (static_cast<HttpParseError>(ev)) {
      case HttpParseError::kTooManyFields: return "too many header fields";
      case HttpParseError::kLengthRequired: return "a request body needs Content-Length or chunked framing";
    }
    return "http parse error";
  }
};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

const boost::system::error_category& http_parse_category() {
  static const ParseCategory category;
  return category;
}

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : fields) {
    if (iequals(k, name)) return v;
  }
  return "";
}

HttpRequestParser::HttpRequestParser(const HttpLimits& limits) : limits_(limits) {
  header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
  body_limit(limits.max_body_bytes);
  eager(true);
}

int HttpRequestParser::status_for(const boost::beast::error_code& ec) {
  if (ec == http::error::body_limit) return 413;
  if (ec == http::error::header_limit || ec == HttpParseError::kTooManyFields) return 431;
  if (ec == HttpParseError::kLengthRequired) return 411;
  return 400;
}

void HttpRequestParser::on_request_impl(http::verb, boost::beast::string_view method_str,
                                        boost::beast::string_view target, int version,
                                        boost::beast::error_code&) {
  request_.method = std::string(method_str);
  request_.target = std::string(target);
  const size_t q = request_.target.find('?');
  request_.path = request_.target.substr(0, q);
  request_.version = version;
}

void HttpRequestParser::on_field_impl(http::field, boost::beast::string_view name_string,
                                      boost::beast::string_view value, boost::beast::error_code& ec) {
  if (static_cast<int>(request_.fields.size()) >= limits_.max_header_fields) {
    ec = HttpParseError::kTooManyFields;
    return;
  }
  request_.fields.emplace_back(std::string(name_string), std::string(value));
}

void HttpRequestParser::on_header_impl(boost::beast::error_code& ec) {
  request_.keep_alive = keep_alive();
  // A body the parser would take as empty (no Content-Length, not chunked) though the
  // client sends one: refuse it rather than parse the body as the next request.
  if (!content_length() && !chunked() && (request_.method == "POST" || request_.method == "PUT")) {
    ec = HttpParseError::kLengthRequired;
  }
}

void HttpRequestParser::on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                                          boost::beast::error_code&) {
  // Beast has already compared content_length with body_limit.
  if (content_length) request_.body.reserve(*content_length);
}

std::size_t HttpRequestParser::on_body_impl(boost::beast::string_view body, boost::beast::error_code&) {
  request_.body.append(body.data(), body.size());
  return body.size();
}

void HttpRequestParser::on_chunk_header_impl(std::uint64_t, boost::beast::string_view,
                                             boost::beast::error_code&) {}

std::size_t HttpRequestParser::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                                  boost::beast::error_code&) {
  request_.body.append(body.data(), body.size());
  return body.size();
}

}  // namespace dserve::server
