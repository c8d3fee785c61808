// The chat page's response (chat_page.cc): the embedded bytes, its headers, and
// If-None-Match as RFC 9110 13.1.2 has it for GET (weak comparison, lists, "*"). The
// browser test (tests/reference/test_chat_page.py) checks the page itself and the CSP
// hashes against an independent SHA-256.
#include "server/chat_page.h"

#include <gtest/gtest.h>

#include <string>

namespace dserve::server {
namespace {

HttpRequest get_root(std::string if_none_match = "") {
  HttpRequest r{.method = "GET", .target = "/", .path = "/"};
  if (!if_none_match.empty()) r.fields.emplace_back("If-None-Match", std::move(if_none_match));
  return r;
}

std::string header(const HttpResponse& r, const std::string& name) {
  for (const auto& [k, v] : r.headers) {
    if (k == name) return v;
  }
  return "";
}

TEST(ChatPage, ServesTheEmbeddedPage) {
  const HttpResponse r = chat_page_response(get_root());
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(r.body, std::string(chat_page_html()));
  EXPECT_EQ(r.body.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(header(r, "Cache-Control"), "no-cache");
  EXPECT_EQ(header(r, "X-Content-Type-Options"), "nosniff");
  const std::string csp = header(r, "Content-Security-Policy");
  EXPECT_EQ(csp.rfind("default-src 'none'; script-src 'sha256-", 0), 0u) << csp;
  EXPECT_NE(csp.find("; style-src 'sha256-"), std::string::npos) << csp;
  EXPECT_NE(csp.find("; connect-src 'self';"), std::string::npos) << csp;
}

TEST(ChatPage, ETagIsQuotedAndStable) {
  const std::string etag = header(chat_page_response(get_root()), "ETag");
  ASSERT_GE(etag.size(), 3u);
  EXPECT_EQ(etag.front(), '"');
  EXPECT_EQ(etag.back(), '"');
  EXPECT_EQ(etag.find('"', 1), etag.size() - 1);
  EXPECT_EQ(header(chat_page_response(get_root()), "ETag"), etag);
}

TEST(ChatPage, IfNoneMatchGivesNotModified) {
  const std::string etag = header(chat_page_response(get_root()), "ETag");
  for (const std::string& value : {etag, "W/" + etag, "\"a\", " + etag, "\"a\",W/" + etag + " ",
                                   std::string("*")}) {
    const HttpResponse r = chat_page_response(get_root(value));
    EXPECT_EQ(r.status, 304) << value;
    EXPECT_TRUE(r.body.empty()) << value;
    EXPECT_EQ(header(r, "ETag"), etag) << value;
  }
  for (const std::string& value : {std::string("\"a\""), std::string("\"a\", \"b\""),
                                   etag.substr(1, etag.size() - 2), std::string(",")}) {
    EXPECT_EQ(chat_page_response(get_root(value)).status, 200) << value;
  }
}

}  // namespace
}  // namespace dserve::server
