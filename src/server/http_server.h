// HttpServer: dserve's OpenAI-compatible HTTP/1.1 front end, asynchronous on Boost.Asio
// with Boost.Beast's parser. Routes: POST /v1/completions, /v1/chat/completions,
// /tokenize, /detokenize; GET /v1/models, /health, /metrics, /version, /tokenizer_info,
// and GET / the chat page (chat_page.h) unless chat_page is off (then / is a 404).
// With an API key, every /v1 route needs `Authorization: Bearer KEY` (compared in
// constant time) and answers 401 otherwise. Errors of every kind (bad JSON, limits,
// unknown route: 404, wrong method: 405 with Allow) come back in OpenAI's error shape.
// One access-log line per request at info level. Every request gets an id (the
// client's X-Request-Id, else a random one; echoed in the response) that its log lines
// carry; with an AuditLog, every request but GET /health and /metrics (probes,
// scrapers) gets an audit line.
//
// Threads. `n_io_threads` threads run every connection (http_connection.h): accepting,
// reading and parsing under deadlines and limits, writing; an idle or slow connection
// holds no thread. The cheap GET routes (/health, /metrics, /version, /v1/models,
// /tokenizer_info, /) are answered right there, so probes and scrapers never wait behind
// inference. A POST runs on a WorkerPool thread, because what it calls blocks (chat
// template, tokenizer, EngineClient::add_request, then EventStream::next or the whole
// non-streamed generation): one thread per POST being served, made on demand and kept
// a while for reuse, at most max_connections of them. A stream's worker pulls events
// and hands them to the connection, waiting (backpressure) while 256 KiB are unwritten.
//
// Limits: at most max_connections open (beyond: 503 with Retry-After, closed); at most
// max_waiting_requests completions waiting beyond the engine's max_num_seqs running
// (beyond: 503 with Retry-After); both counted in dserve:http_requests_rejected_total.
// A client that leaves (its connection ends, or it reads nothing for write_timeout) has
// its request's engine sequences aborted through a ClientWatch (client_watch.h).
//
// TLS (ssl_certfile + ssl_keyfile, PEM): TLS 1.2 at least, OpenSSL's defaults otherwise
// (1.3 preferred).
//
// Thread-safety: run() blocks the calling thread; stop() and set_draining() may be
// called from any thread (e.g. a signal-handling thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "server/http_request_parser.h"

namespace dserve::server {

class AuditLog;
class OpenAiServing;
class ServerMetrics;

struct HttpServerConfig {
  std::string host = "0.0.0.0";
  int port = 8000;
  std::string api_key;                       // empty: no authentication
  bool chat_page = true;                     // GET / serves the chat page
  HttpLimits limits;                         // header size/fields, body bytes
  int n_io_threads = 2;
  int max_connections = 4096;
  int64_t max_waiting_requests = -1;         // < 0: unlimited
  int max_num_seqs = 256;                    // the engine's running requests, for the above
  double head_timeout_s = 10;                // first byte to end of the request head
  double body_timeout_s = 60;                // end of head to end of body
  double keep_alive_timeout_s = 5;           // idle between requests
  double write_timeout_s = 30;               // a client that reads nothing this long is gone
  std::string ssl_certfile, ssl_keyfile;     // both or neither
  AuditLog* audit_log = nullptr;             // --audit-log; must outlive the server
};

class HttpServer {
 public:
  HttpServer(HttpServerConfig config, OpenAiServing& serving, ServerMetrics& metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds (exclusively: a port in use is an error) and serves until stop(). Errors:
  // the address cannot be bound, the TLS files cannot be loaded, threads cannot be made.
  Status run();
  // Closes the listener and every connection; run() returns once the I/O threads end
  // and the POSTs still running have ended (at most a few seconds).
  void stop();
  // While draining: /health answers 503, POSTs 503, responses close their connection.
  void set_draining(bool draining);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dserve::server
