#include "server/chat_page.h"

#include <openssl/evp.h>

#include <array>
#include <string>

#include "base/check.h"

namespace dserve::server {

namespace {

using Digest = std::array<unsigned char, 32>;

Digest sha256(std::string_view bytes) {
  Digest d{};
  unsigned int n = 0;
  DS_CHECK_MSG(EVP_Digest(bytes.data(), bytes.size(), d.data(), &n, EVP_sha256(), nullptr) == 1 &&
                   n == d.size(),
               "SHA-256 of the chat page failed");
  return d;
}

std::string base64(const Digest& d) {
  // 4 characters per 3 bytes, rounded up, and the NUL EVP_EncodeBlock writes.
  std::string out(4 * ((d.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), d.data(),
                                static_cast<int>(d.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string hex(const Digest& d, size_t n_bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n_bytes && i < d.size(); ++i) {
    out += kDigits[d[i] >> 4];
    out += kDigits[d[i] & 15];
  }
  return out;
}

// The CSP source list allowing exactly the inline elements `<tag>...</tag>` of the
// page (by the hash of their text, which is what browsers compare), or 'none'. The
// page writes these tags without attributes.
std::string inline_sources(std::string_view html, std::string_view tag) {
  const std::string open = std::string("<").append(tag).append(">");
  const std::string close = std::string("</").append(tag).append(">");
  std::string sources;
  size_t pos = 0;
  while ((pos = html.find(open, pos)) != std::string_view::npos) {
    const size_t begin = pos + open.size();
    const size_t end = html.find(close, begin);
    DS_CHECK_MSG(end != std::string_view::npos, "the chat page's %s is not closed", open.c_str());
    if (!sources.empty()) sources += ' ';
    sources += "'sha256-" + base64(sha256(html.substr(begin, end - begin))) + "'";
    pos = end + close.size();
  }
  return sources.empty() ? "'none'" : sources;
}

struct PageHeaders {
  std::string etag;
  std::string csp;
};

const PageHeaders& page_headers() {
  static const PageHeaders headers = [] {
    const std::string_view html = chat_page_html();
    PageHeaders h;
    // (Appended piece by piece: GCC 12 warns, wrongly, of overlapping copies in
    // `"literal" + std::string` here.)
    h.etag.append("\"").append(hex(sha256(html), 16)).append("\"");
    h.csp.append("default-src 'none'; script-src ")
        .append(inline_sources(html, "script"))
        .append("; style-src ")
        .append(inline_sources(html, "style"))
        .append("; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
                "frame-ancestors 'none'");
    return h;
  }();
  return headers;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// If-None-Match: "*" or a comma-separated list of entity tags, weak ones (W/"...")
// compared weakly, as RFC 9110 says for GET.
bool none_match_names(std::string_view if_none_match, std::string_view etag) {
  while (!if_none_match.empty()) {
    const size_t comma = if_none_match.find(',');
    std::string_view tag = trim(if_none_match.substr(0, comma));
    if_none_match = comma == std::string_view::npos ? "" : if_none_match.substr(comma + 1);
    if (tag.substr(0, 2) == "W/") tag.remove_prefix(2);
    if (tag == "*" || tag == etag) return true;
  }
  return false;
}

}  // namespace

HttpResponse chat_page_response(const HttpRequest& request) {
  const PageHeaders& h = page_headers();
  HttpResponse r;
  r.headers = {{"ETag", h.etag},
               {"Cache-Control", "no-cache"},
               {"Content-Security-Policy", h.csp},
               {"X-Content-Type-Options", "nosniff"},
               {"Referrer-Policy", "no-referrer"}};
  if (none_match_names(request.header("If-None-Match"), h.etag)) {
    r.status = 304;
    return r;
  }
  r.content_type = "text/html; charset=utf-8";
  r.body = std::string(chat_page_html());
  return r;
}

}  // namespace dserve::server
