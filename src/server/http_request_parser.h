// HttpRequestParser: an HTTP/1.1 request parser (Boost.Beast's basic_parser) that holds
// what the server needs and enforces the limits as bytes arrive, before anything is
// allocated for them: the header's size (Beast's header_limit) and number of fields,
// the body's size for every framing (Content-Length is checked against the limit when
// the header ends; a chunked body as each chunk arrives). A request with a body but
// neither Content-Length nor chunked framing cannot be delimited (RFC 9112 6.3): it
// gets 411 instead of being read until the client closes.
//
// Thread-safety: none; one connection's parser is used by one thread at a time.
#pragma once

// GCC 12 at -O2 with the sanitizers takes Beast's empty boost::optional<uint64_t> (the
// absent Content-Length) for an uninitialised read: a known false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/beast/http/basic_parser.hpp>
#pragma GCC diagnostic pop

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dserve::server {

struct HttpLimits {
  size_t max_header_bytes = 16 << 10;  // request line + fields
  int max_header_fields = 100;
  size_t max_body_bytes = size_t{32} << 20;
};

struct HttpRequest {
  std::string method;  // as sent ("GET")
  std::string target;  // as sent ("/v1/models?x=1")
  std::string path;    // target without the query
  int version = 11;    // 10 or 11
  std::vector<std::pair<std::string, std::string>> fields;
  std::string body;
  bool keep_alive = true;  // what the client asked for (Connection, version)

  // The first field named `name` (case-insensitive); empty when absent.
  std::string header(std::string_view name) const;
};

class HttpRequestParser : public boost::beast::http::basic_parser<true> {
 public:
  explicit HttpRequestParser(const HttpLimits& limits);

  HttpRequest& request() { return request_; }
  // The HTTP status that a parse error asks for (400, 411, 413, 431).
  static int status_for(const boost::beast::error_code& ec);

 private:
  void on_request_impl(boost::beast::http::verb method, boost::beast::string_view method_str,
                       boost::beast::string_view target, int version,
                       boost::beast::error_code& ec) override;
  void on_response_impl(int, boost::beast::string_view, int, boost::beast::error_code&) override {}
  void on_field_impl(boost::beast::http::field name, boost::beast::string_view name_string,
                     boost::beast::string_view value, boost::beast::error_code& ec) override;
  void on_header_impl(boost::beast::error_code& ec) override;
  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                         boost::beast::error_code& ec) override;
  std::size_t on_body_impl(boost::beast::string_view body, boost::beast::error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t size, boost::beast::string_view extensions,
                            boost::beast::error_code& ec) override;
  std::size_t on_chunk_body_impl(std::uint64_t remain, boost::beast::string_view body,
                                 boost::beast::error_code& ec) override;
  void on_finish_impl(boost::beast::error_code& ec) override {}

  const HttpLimits limits_;
  HttpRequest request_;
};

// Errors of our own beyond Beast's (http::error::header_limit, body_limit, ...).
enum class HttpParseError { kTooManyFields = 1, kLengthRequired };
const boost::system::error_category& http_parse_category();
inline boost::beast::error_code make_error_code(HttpParseError e) {
  return {static_cast<int>(e), http_parse_category()};
}

}  // namespace dserve::server

template <>
struct boost::system::is_error_code_enum<dserve::server::HttpParseError> : std::true_type {};
