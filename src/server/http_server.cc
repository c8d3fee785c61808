#include "server/http_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <chrono>
#include <random>

#include "base/log.h"
#include "base/log_format.h"
#include "server/api_error.h"
#include "server/audit_log.h"
#include "server/metrics.h"
#include "server/serving.h"

namespace dserve::server {

using json = nlohmann::ordered_json;

namespace {

constexpr const char* kVersion = "0.1.0";
constexpr int kListenBacklog = 4096;  // capped by net.core.somaxconn
// Deeper JSON is refused before parsing: the parser recurses, and a body of nothing
// but '[' must not exhaust the stack.
constexpr int kMaxJsonDepth = 256;

bool json_too_deep(const std::string& s) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.http_status, e.to_json()); }

// Equal strings in time that depends only on their lengths.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::string& ref = a.size() == b.size() ? b : a;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ ref[i]);
  return diff == 0;
}

thread_local std::chrono::steady_clock::time_point t_request_start;

// What the audit line of the request this thread serves needs beyond the request
// and response the access logger sees: the model, the usage, and for a stream the
// hash of the bytes written (the response object holds no body then).
struct RequestAudit {
  std::string model;
  nlohmann::ordered_json usage;
  std::unique_ptr<Sha256> stream_hash;
};
thread_local std::shared_ptr<RequestAudit> t_audit;
thread_local std::unique_ptr<LogRequestScope> t_log_scope;

constexpr size_t kMaxRequestIdBytes = 128;

std::string new_request_id() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) s += hex[rng() % 16];
  return s;
}

bool audited(const httplib::Request& req) {
  return !(req.method == "GET" && (req.path == "/health" || req.path == "/metrics"));
}

}  // namespace

struct HttpServer::Impl {
  httplib::Server svr;
  std::atomic<int> listen_fd{-1};  // the listening socket, recorded when it is made
};

HttpServer::HttpServer(HttpServerConfig config, OpenAiServing& serving, ServerMetrics& metrics)
    : impl_(std::make_unique<Impl>()) {
  httplib::Server& svr = impl_->svr;
  const int n_threads = config.n_http_threads;
  svr.new_task_queue = [n_threads] { return new httplib::ThreadPool(n_threads); };
  svr.set_payload_max_length(config.max_body_bytes);
  // Debian's cpp-httplib listens with a backlog of 5, so a burst of hundreds of
  // connections would be reset; run() raises it once the socket listens.
  svr.set_socket_options([impl = impl_.get()](socket_t sock) {
    httplib::default_socket_options(sock);
    impl->listen_fd = static_cast<int>(sock);
  });
  svr.set_keep_alive_max_count(100000);
  svr.set_keep_alive_timeout(5);
  svr.set_read_timeout(30);
  // A client that reads nothing for this long has its stream cancelled.
  svr.set_write_timeout(10);

  const std::string api_key = config.api_key;
  svr.set_pre_routing_handler([this, api_key](const httplib::Request& req,
                                              httplib::Response& res) {
    t_request_start = std::chrono::steady_clock::now();
    std::string request_id = req.get_header_value("X-Request-Id");
    if (request_id.empty() || request_id.size() > kMaxRequestIdBytes) request_id = new_request_id();
    res.set_header("X-Request-Id", request_id);
    t_log_scope = std::make_unique<LogRequestScope>(std::move(request_id));
    t_audit = std::make_shared<RequestAudit>();
    const bool protected_route = req.path.rfind("/v1/", 0) == 0;
    if (protected_route && !api_key.empty()) {
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      const std::string given = auth.rfind(prefix, 0) == 0 ? auth.substr(prefix.size()) : "";
      if (!constant_time_equal(given, api_key)) {
        send_error(res, {401, "Incorrect API key provided.", "authentication_error", "",
                         "invalid_api_key"});
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (draining_ && req.method == "POST") {
      send_error(res, {503, "the server is shutting down", "service_unavailable", "", ""});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Statuses set by the library itself (404 for an unknown route, 413, 400 for a bad
  // request line) get OpenAI's error shape too.
  svr.set_error_handler(httplib::Server::HandlerWithResponse(
      [](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e{res.status, "", "invalid_request_error", "", ""};
    switch (res.status) {
      case 404: e.message = "no route for " + req.method + " " + req.path; e.type = "not_found_error"; break;
      case 413: e.message = "the request body is larger than the limit"; e.code = "request_too_large"; break;
      case 405: e.message = "method not allowed"; break;
      default: e.message = "bad request (HTTP " + std::to_string(res.status) + ")"; break;
    }
    send_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                               std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    DS_LOG_ERROR("request failed: {}", what);
    send_error(res, {500, what, "server_error", "", ""});
  });
  AuditLog* audit_log = config.audit_log;
  const std::string key_id = config.api_key.empty() ? "" : AuditLog::key_id(config.api_key);
  svr.set_logger([audit_log, key_id](const httplib::Request& req, const httplib::Response& res) {
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - t_request_start)
                          .count();
    DS_LOG_INFO("{}:{} \"{} {}\" {} {:.1f} ms", req.remote_addr, req.remote_port, req.method,
                req.path, res.status, ms);
    if (audit_log && t_audit && audited(req)) {
      AuditRecord r;
      r.request_id = res.get_header_value("X-Request-Id");
      if (res.status != 401) r.key_id = key_id;  // a refused key identifies nobody
      r.client = req.remote_addr + ":" + std::to_string(req.remote_port);
      r.method = req.method;
      r.endpoint = req.path;
      r.model = t_audit->model;
      // A refused key ends the request before its body is read: no hash then.
      if (res.status != 401) r.request_sha256 = Sha256::hex(req.body);
      r.response_sha256 =
          t_audit->stream_hash ? t_audit->stream_hash->hex_digest() : Sha256::hex(res.body);
      const json& u = t_audit->usage;
      if (u.is_object() && u.contains("prompt_tokens")) {
        r.prompt_tokens = u["prompt_tokens"].get<int64_t>();
        r.completion_tokens = u.value("completion_tokens", int64_t{0});
      }
      r.status = res.status;
      r.latency_ms = ms;
      audit_log->record(std::move(r));
    }
    t_audit.reset();
    t_log_scope.reset();
  });

  // POST handlers: JSON body -> Reply -> JSON or an event stream.
  const std::string default_model = serving.model_name();
  auto post = [&svr, default_model](const char* path, std::function<Reply(const json&)> handle) {
    svr.Post(path, [handle, default_model](const httplib::Request& req, httplib::Response& res) {
      if (json_too_deep(req.body)) {
        return send_error(res, ApiError::bad_request("the JSON body is nested too deeply"));
      }
      json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
      if (body.is_discarded()) {
        return send_error(res, ApiError::bad_request("the request body is not valid JSON"));
      }
      std::shared_ptr<RequestAudit> audit = t_audit;
      if (audit) {
        audit->model = body.is_object() && body.contains("model") && body["model"].is_string()
                           ? body["model"].get<std::string>()
                           : default_model;
      }
      Reply reply = handle(body);
      if (!reply.stream) {
        if (audit && reply.body.is_object() && reply.body.contains("usage"))
          audit->usage = reply.body["usage"];
        return send_json(res, reply.status, reply.body);
      }
      std::shared_ptr<EventStream> stream = reply.stream;
      if (audit) audit->stream_hash = std::make_unique<Sha256>();
      res.status = 200;
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [stream, audit](size_t, httplib::DataSink& sink) {
            std::string events = stream->next(std::chrono::milliseconds(1000));
            // An SSE comment while idle (e.g. queued): a gone client shows up as a
            // failed write here rather than only when its first token comes.
            if (events.empty()) events = ": keep-alive\n\n";
            if (!sink.write(events.data(), events.size())) {
              stream->cancel();
              return false;
            }
            if (audit) audit->stream_hash->update(events);
            if (stream->done()) {
              if (audit) audit->usage = stream->usage();
              sink.done();
            }
            return true;
          },
          [stream](bool) {
            if (!stream->done()) stream->cancel();
          });
    });
  };
  post("/v1/completions", [&serving](const json& b) { return serving.completions(b); });
  post("/v1/chat/completions", [&serving](const json& b) { return serving.chat_completions(b); });
  post("/tokenize", [&serving](const json& b) { return serving.tokenize(b); });
  post("/detokenize", [&serving](const json& b) { return serving.detokenize(b); });

  svr.Get("/v1/models", [&serving](const httplib::Request&, httplib::Response& res) {
    Reply r = serving.models();
    send_json(res, r.status, r.body);
  });
  svr.Get("/tokenizer_info", [&serving](const httplib::Request&, httplib::Response& res) {
    Reply r = serving.tokenizer_info();
    send_json(res, r.status, r.body);
  });
  svr.Get("/health", [&serving](const httplib::Request&, httplib::Response& res) {
    res.status = serving.healthy() ? 200 : 503;
    res.set_content("", "text/plain");
  });
  svr.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"version", kVersion}});
  });
  svr.Get("/metrics", [&metrics](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(metrics.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  host_ = config.host;
  port_ = config.port;
}

HttpServer::~HttpServer() = default;

Status HttpServer::run() {
  if (!impl_->svr.bind_to_port(host_, port_)) {
    return io_error("cannot listen on " + host_ + ":" + std::to_string(port_) +
                    " (address in use, or not an address of this machine)");
  }
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, kListenBacklog);
  DS_LOG_INFO("serving the OpenAI API on http://{}:{}", host_, port_);
  if (!impl_->svr.listen_after_bind()) return io_error("the HTTP server stopped with an error");
  return Status::Ok();
}

void HttpServer::stop() { impl_->svr.stop(); }

}  // namespace dserve::server
