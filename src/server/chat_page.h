// The chat page served at GET / (unless `dserve serve --disable-ui`): one self-contained
// HTML file, src/server/ui/chat.html, with its CSS and JavaScript inline and nothing
// fetched from elsewhere, embedded in the binary at build time (cmake/embed_file.cmake).
// In the browser it is a client of the OpenAI API like any other (/v1/models,
// /v1/chat/completions); the server knows nothing of it beyond this response.
//
// Thread-safety: both functions may be called from any thread at once.
#pragma once

#include <string_view>

#include "server/http_exchange.h"
#include "server/http_request_parser.h"

namespace dserve::server {

// The page's bytes (the generated chat_page_html.cc defines this).
std::string_view chat_page_html();

// The answer to GET /: 200 with the page, or 304 (no body) when the request's
// If-None-Match names the page's ETag. Its headers:
// - Content-Security-Policy: only the page's own inline <script> and <style> run (named
//   by their SHA-256), requests go to its own origin only, nothing else loads, and no
//   other site may frame it;
// - Cache-Control: no-cache with an ETag (the page's SHA-256), so a browser revalidates
//   and sees a new server's page at once, without downloading an unchanged one again;
// - X-Content-Type-Options: nosniff and Referrer-Policy: no-referrer.
HttpResponse chat_page_response(const HttpRequest& request);

}  // namespace dserve::server
