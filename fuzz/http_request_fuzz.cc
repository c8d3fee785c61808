// Fuzz target: the HTTP/1.1 request parser (server/http_request_parser.h) fed a
// connection's bytes, the way HttpConnection feeds it: whatever has arrived is put,
// consumed bytes dropped, a finished request followed by a fresh parser for the next
// pipelined one, an error ending the connection.
//
// The first input byte sets how many bytes each read delivers (1 to 256). The same
// bytes are parsed a second time as one read: both must hand on the same requests, and
// both end in an error (or inside a request) or neither does, so no request depends on
// how TCP happened to split the stream. Which error may differ: Beast checks a request
// line on the first bytes it is given, later only once the whole header is there, so a
// bad request line can be a 400 in one case and an oversized header (431) or a stream
// cut short in the other.
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "server/http_request_parser.h"

namespace {

using dserve::server::HttpLimits;
using dserve::server::HttpRequest;
using dserve::server::HttpRequestParser;

// Small limits, so that inputs of a few kilobytes reach every limit.
HttpLimits fuzz_limits() {
  HttpLimits limits;
  limits.max_header_bytes = 1024;
  limits.max_header_fields = 8;
  limits.max_body_bytes = 512;
  return limits;
}

// What the connection made of a stream: the requests handed on, then the status of a
// parse error (0: none; kCutShort: the stream ended inside a request).
constexpr int kCutShort = -1;
struct Outcome {
  std::vector<HttpRequest> requests;
  int error_status = 0;
};

bool same_request(const HttpRequest& a, const HttpRequest& b) {
  return a.method == b.method && a.target == b.target && a.path == b.path &&
         a.version == b.version && a.fields == b.fields && a.body == b.body &&
         a.keep_alive == b.keep_alive;
}

Outcome parse_stream(std::string_view bytes, size_t read_size) {
  Outcome out;
  std::string in;  // received, not yet consumed
  auto parser = std::make_unique<HttpRequestParser>(fuzz_limits());
  size_t received = 0;
  while (true) {
    boost::beast::error_code ec;
    const size_t n = in.empty() ? 0 : parser->put(boost::asio::buffer(in), ec);
    in.erase(0, n);
    if (ec && ec != boost::beast::http::error::need_more) {
      out.error_status = HttpRequestParser::status_for(ec);
      return out;
    }
    if (!ec && parser->is_done()) {
      out.requests.push_back(std::move(parser->request()));
      parser = std::make_unique<HttpRequestParser>(fuzz_limits());
      continue;
    }
    if (!ec && n > 0) continue;
    if (received == bytes.size()) break;  // the client closed mid-request
    const size_t chunk = std::min(read_size, bytes.size() - received);
    in.append(bytes.substr(received, chunk));
    received += chunk;
  }
  if (!parser->is_done() && parser->got_some()) out.error_status = kCutShort;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t read_size = size_t{data[0]} + 1;
  const std::string_view bytes = dserve::fuzz::as_text(data + 1, size - 1);
  const Outcome dribbled = parse_stream(bytes, read_size);
  const Outcome whole = parse_stream(bytes, bytes.size() + 1);
  bool same = (dribbled.error_status == 0) == (whole.error_status == 0) &&
              dribbled.requests.size() == whole.requests.size();
  for (size_t i = 0; same && i < whole.requests.size(); ++i) {
    same = same_request(dribbled.requests[i], whole.requests[i]);
  }
  if (!same) std::abort();  // the parse depends on how the bytes were split
  return 0;
}
