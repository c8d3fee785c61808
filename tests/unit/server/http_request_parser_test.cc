// HttpRequestParser against RFC 9112's framing rules and the limits, fed as a network
// delivers bytes: whole, one byte at a time, and split across chunk boundaries.
#include "server/http_request_parser.h"

#include <boost/beast/http/error.hpp>
#include <gtest/gtest.h>

#include <string>

namespace dserve::server {
namespace {

namespace http = boost::beast::http;

struct Parsed {
  boost::beast::error_code ec;  // the first error, or empty
  bool done = false;
  size_t consumed = 0;
  HttpRequest request;
};

// Feeds `wire` in pieces of `step` bytes, as the connection does (unconsumed bytes stay
// in front of the next piece).
Parsed feed(const std::string& wire, const HttpLimits& limits, size_t step) {
  HttpRequestParser p(limits);
  Parsed out;
  std::string buffer;
  size_t next = 0;
  while (!p.is_done()) {
    if (next < wire.size()) {
      const size_t n = std::min(step, wire.size() - next);
      buffer.append(wire, next, n);
      next += n;
    } else if (buffer.empty() || out.ec == http::error::need_more) {
      if (next >= wire.size()) break;
    }
    out.ec = {};
    const size_t used = p.put(boost::asio::buffer(buffer), out.ec);
    buffer.erase(0, used);
    out.consumed += used;
    if (out.ec == http::error::need_more) {
      if (next >= wire.size()) break;
      continue;
    }
    if (out.ec) break;
  }
  out.done = p.is_done();
  out.request = p.request();
  return out;
}

HttpLimits small_limits() {
  HttpLimits l;
  l.max_header_bytes = 1024;
  l.max_header_fields = 8;
  l.max_body_bytes = 100;
  return l;
}

class ParserSteps : public ::testing::TestWithParam<size_t> {};

TEST_P(ParserSteps, ContentLengthBody) {
  const std::string wire =
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
  Parsed p = feed(wire, small_limits(), GetParam());
  ASSERT_FALSE(p.ec) << p.ec.message();
  ASSERT_TRUE(p.done);
  EXPECT_EQ(p.request.method, "POST");
  EXPECT_EQ(p.request.path, "/v1/completions");
  EXPECT_EQ(p.request.target, "/v1/completions?x=1");
  EXPECT_EQ(p.request.body, "hello");
  EXPECT_EQ(p.request.header("host"), "a");
  EXPECT_TRUE(p.request.keep_alive);
}

TEST_P(ParserSteps, ChunkedBodyIsJoined) {
  const std::string wire =
      "POST /tokenize HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\n\r\n";
  Parsed p = feed(wire, small_limits(), GetParam());
  ASSERT_FALSE(p.ec) << p.ec.message();
  ASSERT_TRUE(p.done);
  EXPECT_EQ(p.request.body, "abcdefg");
}

TEST_P(ParserSteps, ChunkedBodyOverTheLimitFailsAsItArrives) {
  std::string wire = "POST /tokenize HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 20; ++i) wire += "a\r\n0123456789\r\n";  // 200 bytes > 100
  Parsed p = feed(wire, small_limits(), GetParam());
  EXPECT_EQ(p.ec, http::error::body_limit);
  EXPECT_EQ(HttpRequestParser::status_for(p.ec), 413);
  EXPECT_LE(p.request.body.size(), 100u);
}

TEST_P(ParserSteps, TooManyFieldsIs431) {
  std::string wire = "GET /health HTTP/1.1\r\n";
  for (int i = 0; i < 9; ++i) wire += "X-" + std::to_string(i) + ": v\r\n";
  wire += "\r\n";
  Parsed p = feed(wire, small_limits(), GetParam());
  EXPECT_EQ(HttpRequestParser::status_for(p.ec), 431) << p.ec.message();
  EXPECT_LE(p.request.fields.size(), 8u);
}

INSTANTIATE_TEST_SUITE_P(Steps, ParserSteps, ::testing::Values(size_t{1}, size_t{7}, size_t{4096}));

TEST(HttpRequestParser, ContentLengthOverTheLimitFailsAtTheHeader) {
  Parsed p = feed("POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", small_limits(), 4096);
  EXPECT_EQ(p.ec, http::error::body_limit);
  EXPECT_EQ(p.request.body.size(), 0u);
}

TEST(HttpRequestParser, HeaderOverItsSizeIs431) {
  const std::string wire = "GET / HTTP/1.1\r\nX: " + std::string(2000, 'a') + "\r\n\r\n";
  Parsed p = feed(wire, small_limits(), 4096);
  EXPECT_EQ(p.ec, http::error::header_limit);
  EXPECT_EQ(HttpRequestParser::status_for(p.ec), 431);
}

TEST(HttpRequestParser, PostWithoutFramingIs411) {
  Parsed p = feed("POST /tokenize HTTP/1.1\r\nHost: a\r\n\r\n{}", small_limits(), 4096);
  EXPECT_EQ(HttpRequestParser::status_for(p.ec), 411) << p.ec.message();
}

TEST(HttpRequestParser, GetWithoutBodyNeedsNoLength) {
  Parsed p = feed("GET /health HTTP/1.0\r\n\r\n", small_limits(), 4096);
  ASSERT_FALSE(p.ec) << p.ec.message();
  EXPECT_TRUE(p.done);
  EXPECT_EQ(p.request.version, 10);
  EXPECT_FALSE(p.request.keep_alive);  // HTTP/1.0 without Connection: keep-alive
}

TEST(HttpRequestParser, PipelinedRequestsStopAtTheFirstsEnd) {
  const std::string first = "GET /a HTTP/1.1\r\n\r\n";
  Parsed p = feed(first + "GET /b HTTP/1.1\r\n\r\n", small_limits(), 4096);
  ASSERT_TRUE(p.done);
  EXPECT_EQ(p.request.path, "/a");
  EXPECT_EQ(p.consumed, first.size());
}

TEST(HttpRequestParser, GarbageIs400) {
  Parsed p = feed("\x16\x03\x01 not http\r\n\r\n", small_limits(), 4096);
  EXPECT_TRUE(p.ec);
  EXPECT_EQ(HttpRequestParser::status_for(p.ec), 400);
}

}  // namespace
}  // namespace dserve::server
