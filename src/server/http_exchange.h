// HttpExchange: one request on one connection, from its last byte read to its last
// byte written; what the connection (http_connection.cc) and the routes
// (http_server.cc) share. Internal to the HTTP front end.
//
// Thread-safety: the connection creates it on its I/O strand and hands it to the
// server there; respond / begin_stream / end_stream may then be called from any thread
// (each once, in that order for a stream), write_chunk from one thread at a time. The
// server's fields below are written by the one thread serving the request at a time
// (the I/O strand, then a worker) and read in on_done, after the last write.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/audit_log.h"
#include "server/client_watch.h"
#include "server/http_request_parser.h"

namespace dserve::server {

struct HttpResponse {
  int status = 200;
  std::string content_type;  // empty: none
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // beyond the framing ones
};

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;

  // The whole response.
  virtual void respond(HttpResponse response) = 0;
  // A response whose body follows in chunks (Transfer-Encoding: chunked).
  virtual void begin_stream(HttpResponse head) = 0;
  // Queues one chunk; blocks while the client lags (more than a few chunks unwritten).
  // False once the client is gone: stop producing.
  virtual bool write_chunk(std::string data) = 0;
  virtual void end_stream() = 0;

  // Set by the connection.
  HttpRequest request;
  std::string remote_addr;
  int remote_port = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  const std::shared_ptr<ClientWatch> watch = std::make_shared<ClientWatch>();
  // The parse failed (the status that says why): the server answers it as an error.
  int parse_error_status = 0;
  std::string parse_error;

  // Set by the server.
  std::string request_id;
  std::string model;                 // for the audit line
  nlohmann::ordered_json usage;      // the response's usage, when it has one
  std::string response_sha256;       // a whole response's
  std::unique_ptr<Sha256> stream_hash;  // a stream's, over the events written
  // Runs once on the connection's strand when the response has been written
  // (`completed`) or the connection ended first. `status` is the one sent.
  std::function<void(HttpExchange&, int status, bool completed)> on_done;
};

// What connections need from the server that owns them; every method may be called
// from any I/O strand.
class ConnectionHost {
 public:
  virtual ~ConnectionHost() = default;
  virtual const HttpLimits& limits() const = 0;
  virtual std::chrono::milliseconds head_timeout() const = 0;       // first byte to end of head
  virtual std::chrono::milliseconds body_timeout() const = 0;       // end of head to end of body
  virtual std::chrono::milliseconds keep_alive_timeout() const = 0;  // idle between requests
  virtual std::chrono::milliseconds write_timeout() const = 0;      // no write progress
  // Responses close their connection once this is true (shutdown).
  virtual bool draining() const = 0;
  // A parsed request (or one whose parse failed: parse_error_status).
  virtual void handle(std::shared_ptr<HttpExchange> exchange) = 0;
  virtual void connection_closed() = 0;
};

}  // namespace dserve::server
