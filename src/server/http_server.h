// HttpServer: dserve's OpenAI-compatible HTTP front end (cpp-httplib, one thread per
// connection from a pool large enough for hundreds of concurrent streams, keep-alive).
// Routes: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize;
// GET /v1/models, /health, /metrics, /version, /tokenizer_info. With an API key, every /v1 route needs
// `Authorization: Bearer KEY` (compared in constant time) and answers 401 otherwise.
// Errors of every kind (bad JSON, body over the size limit, unknown route) come back
// in OpenAI's error shape. One access-log line per request at info level. Every request
// gets an id (the client's X-Request-Id, else a random one; echoed in the response)
// that its log lines carry; with an AuditLog, every request but GET /health and
// /metrics (probes, scrapers) gets an audit line.
//
// Streams: the handler thread pulls the EventStream and writes each event as it comes;
// a failed write (the client went away, or stopped reading for the write timeout)
// cancels the request, so its KV blocks are freed before the engine's next step.
//
// Thread-safety: run() blocks the calling thread; shutdown() may be called from any
// thread (e.g. a signal-handling thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "base/status.h"

namespace dserve::server {

class AuditLog;
class OpenAiServing;
class ServerMetrics;

struct HttpServerConfig {
  std::string host = "0.0.0.0";
  int port = 8000;
  std::string api_key;                          // empty: no authentication
  size_t max_body_bytes = size_t{32} << 20;     // larger bodies get 413
  int n_http_threads = 512;                     // concurrent connections served at once
  AuditLog* audit_log = nullptr;                // --audit-log; must outlive the server
};

class HttpServer {
 public:
  HttpServer(HttpServerConfig config, OpenAiServing& serving, ServerMetrics& metrics);
  ~HttpServer();

  // Binds and serves until shutdown(); IoError when the address cannot be bound.
  Status run();
  // Stops accepting connections and returns from run() once open requests are done.
  void stop();
  // True while new requests are refused (503) because the server is draining.
  void set_draining(bool draining) { draining_ = draining; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> draining_{false};
  std::string host_;
  int port_ = 0;
};

}  // namespace dserve::server
