#include "server/http_server.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <openssl/ssl.h>
#include <sys/resource.h>

#include <condition_variable>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "base/log.h"
#include "base/log_format.h"
#include "server/api_error.h"
#include "server/audit_log.h"
#include "server/chat_page.h"
#include "server/client_watch.h"
#include "server/http_connection.h"
#include "server/http_exchange.h"
#include "server/metrics.h"
#include "server/random_id.h"
#include "server/serving.h"
#include "server/worker_pool.h"

namespace dserve::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using boost::system::error_code;
using json = nlohmann::ordered_json;

namespace {

constexpr const char* kVersion = "0.1.0";
constexpr int kListenBacklog = 4096;  // capped by net.core.somaxconn
// Deeper JSON is refused before parsing: the parser recurses, and a body of nothing
// but '[' must not exhaust the stack.
constexpr int kMaxJsonDepth = 256;
constexpr size_t kMaxRequestIdBytes = 128;
constexpr int kFdsBeyondConnections = 256;  // model files, engine sockets, logs
constexpr int kInitialWorkers = 4;
constexpr auto kWorkerIdleExit = std::chrono::seconds(60);
constexpr auto kStreamPoll = std::chrono::milliseconds(1000);
constexpr const char* kRetryAfterSeconds = "1";

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

// Equal strings in time that depends only on their lengths.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::string& ref = a.size() == b.size() ? b : a;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ ref[i]);
  return diff == 0;
}

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

constexpr const char* kChatPagePath = "/";

enum class RouteKind { kGet, kPost, kInference };

struct Route {
  const char* path;
  RouteKind kind;
};

constexpr Route kRoutes[] = {
    {"/v1/completions", RouteKind::kInference}, {"/v1/chat/completions", RouteKind::kInference},
    {"/v1/responses", RouteKind::kInference},
    {"/tokenize", RouteKind::kPost},            {"/detokenize", RouteKind::kPost},
    {"/v1/models", RouteKind::kGet},            {"/tokenizer_info", RouteKind::kGet},
    {"/health", RouteKind::kGet},               {"/version", RouteKind::kGet},
    {"/metrics", RouteKind::kGet},              {kChatPagePath, RouteKind::kGet},
};

const Route* find_route(const std::string& path) {
  for (const Route& r : kRoutes) {
    if (path == r.path) return &r;
  }
  return nullptr;
}

const char* method_of(RouteKind k) {
  switch (k) {
    case RouteKind::kGet: return "GET";
    case RouteKind::kPost:
    case RouteKind::kInference: return "POST";
  }
  return "";
}

}  // namespace

class HttpServer::Impl final : public ConnectionHost {
 public:
  Impl(HttpServerConfig config, OpenAiServing& serving, ServerMetrics& metrics)
      : config_(std::move(config)),
        serving_(serving),
        metrics_(metrics),
        ioc_(config_.n_io_threads),
        acceptor_(net::make_strand(ioc_)),
        accept_retry_(acceptor_.get_executor()),
        workers_(config_.max_connections, kWorkerIdleExit),
        key_id_(config_.api_key.empty() ? "" : AuditLog::key_id(config_.api_key)),
        max_connections_(config_.max_connections) {}

  Status run();
  void stop();
  void set_draining(bool d) { draining_ = d; }

  // ConnectionHost
  const HttpLimits& limits() const override { return config_.limits; }
  std::chrono::milliseconds head_timeout() const override { return ms(config_.head_timeout_s); }
  std::chrono::milliseconds body_timeout() const override { return ms(config_.body_timeout_s); }
  std::chrono::milliseconds keep_alive_timeout() const override { return ms(config_.keep_alive_timeout_s); }
  std::chrono::milliseconds write_timeout() const override { return ms(config_.write_timeout_s); }
  bool draining() const override { return draining_.load(); }
  void handle(std::shared_ptr<HttpExchange> ex) override;
  void connection_closed() override {
    --n_connections_;
    metrics_.add_connections(-1);
  }

 private:
  Status listen();
  Status load_tls();
  void raise_fd_limit();
  void stop_connections(bool graceful);
  void accept();
  void on_accept(error_code ec, tcp::socket socket);
  void refuse_connection(tcp::socket socket);

  void send_json(HttpExchange& ex, int status, const json& body,
                 std::vector<std::pair<std::string, std::string>> headers = {});
  void send_error(HttpExchange& ex, const ApiError& e,
                  std::vector<std::pair<std::string, std::string>> headers = {}) {
    send_json(ex, e.http_status, e.to_json(), std::move(headers));
  }
  void serve_get(HttpExchange& ex);
  void serve_post(HttpExchange& ex);
  void stream(HttpExchange& ex, EventStream& events);
  void log_done(HttpExchange& ex, int status, bool completed);

  const HttpServerConfig config_;
  OpenAiServing& serving_;
  ServerMetrics& metrics_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  net::steady_timer accept_retry_;
  std::unique_ptr<net::ssl::context> tls_;
  WorkerPool workers_;
  const std::string key_id_;
  int max_connections_;  // config_'s, lowered to what the open-file limit allows
  std::atomic<int> n_connections_{0};
  std::atomic<int64_t> n_inference_{0};  // completions admitted and not yet answered
  std::atomic<bool> draining_{false};

  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;                    // GUARDED_BY(mu_)
  std::vector<std::weak_ptr<Connection>> connections_;  // GUARDED_BY(mu_)
};

void HttpServer::Impl::raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const rlim_t want = static_cast<rlim_t>(config_.max_connections) + kFdsBeyondConnections;
  if (rl.rlim_cur < want) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min<rlim_t>(want, rl.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  if (rl.rlim_cur < want) {
    max_connections_ = std::max<int>(16, static_cast<int>(rl.rlim_cur) - kFdsBeyondConnections);
    DS_LOG_WARN("--max-connections {}: the open-file limit is {}; serving {} connections at most",
                config_.max_connections, rl.rlim_cur, max_connections_);
  }
}

Status HttpServer::Impl::load_tls() {
  if (config_.ssl_certfile.empty() && config_.ssl_keyfile.empty()) return Status::Ok();
  if (config_.ssl_certfile.empty() || config_.ssl_keyfile.empty()) {
    return invalid_argument("TLS needs both --ssl-certfile and --ssl-keyfile");
  }
  tls_ = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
  tls_->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                    net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                    net::ssl::context::no_tlsv1_1 | net::ssl::context::single_dh_use);
  SSL_CTX_set_min_proto_version(tls_->native_handle(), TLS1_2_VERSION);
  error_code ec;
  tls_->use_certificate_chain_file(config_.ssl_certfile, ec);
  if (ec) return invalid_argument("--ssl-certfile " + config_.ssl_certfile + ": " + ec.message());
  tls_->use_private_key_file(config_.ssl_keyfile, net::ssl::context::pem, ec);
  if (ec) return invalid_argument("--ssl-keyfile " + config_.ssl_keyfile + ": " + ec.message());
  if (SSL_CTX_check_private_key(tls_->native_handle()) != 1) {
    return invalid_argument("--ssl-keyfile " + config_.ssl_keyfile +
                            ": the key does not match the certificate in --ssl-certfile");
  }
  return Status::Ok();
}

Status HttpServer::Impl::listen() {
  const std::string where = config_.host + ":" + std::to_string(config_.port);
  error_code ec;
  tcp::endpoint endpoint;
  const net::ip::address address = net::ip::make_address(config_.host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, static_cast<unsigned short>(config_.port));
  } else {
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(config_.host, std::to_string(config_.port), ec);
    if (ec || results.empty()) {
      return io_error("cannot listen on " + where + ": " + (ec ? ec.message() : "no address"));
    }
    endpoint = results.begin()->endpoint();
  }
  // SO_REUSEADDR (a restart binds past TIME_WAIT) but never SO_REUSEPORT: a second
  // server on a port in use must fail, not split the traffic.
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(kListenBacklog, ec);
  if (ec) {
    return io_error("cannot listen on " + where + ": " + ec.message() +
                    (ec == net::error::address_in_use ? " (another server has this port)" : ""));
  }
  return Status::Ok();
}

Status HttpServer::Impl::run() {
  raise_fd_limit();
  if (Status s = load_tls(); !s.ok()) return s;
  if (Status s = listen(); !s.ok()) return s;
  if (Status s = workers_.start(kInitialWorkers); !s.ok()) return s;
  auto work = net::make_work_guard(ioc_);
  std::vector<std::thread> io_threads;
  Status started = Status::Ok();
  for (int i = 0; i < config_.n_io_threads; ++i) {
    try {
      io_threads.emplace_back([this] {
        while (true) {
          try {
            ioc_.run();
            return;
          } catch (const std::exception& e) {
            DS_LOG_ERROR("HTTP I/O thread: {}", e.what());
          }
        }
      });
    } catch (const std::system_error& e) {
      started = Status(StatusCode::kResourceExhausted,
                       std::string("cannot create the HTTP I/O threads (") + e.what() +
                           "; the process or container limits threads: RLIMIT_NPROC, pids.max)");
      break;
    }
  }
  if (started.ok()) {
    accept();
    DS_LOG_INFO("serving the OpenAI API on {}://{}:{} ({} I/O threads, up to {} connections)",
                tls_ ? "https" : "http", config_.host, config_.port, config_.n_io_threads,
                max_connections_);
    if (config_.chat_page) {
      DS_LOG_INFO("chat page: {}://{}:{}/ (--disable-ui turns it off)", tls_ ? "https" : "http",
                  config_.host, config_.port);
    }
    std::unique_lock<std::mutex> lock(mu_);
    stop_cv_.wait(lock, [&] { return stop_requested_; });
  }
  // Stop: no more connections; idle ones close now, those with a request close once its
  // response is written; the POSTs still running get a few seconds to finish (the
  // engine has aborted what the shutdown timeout left), then every connection closes.
  net::post(acceptor_.get_executor(), [this] {
    error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
  });
  stop_connections(/*graceful=*/true);
  if (!workers_.shutdown(std::chrono::seconds(5))) {
    DS_LOG_WARN("HTTP workers still busy at shutdown");
  }
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (n_connections_.load() > 0 && std::chrono::steady_clock::now() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop_connections(/*graceful=*/false);
  work.reset();
  ioc_.stop();
  for (std::thread& t : io_threads) t.join();
  return started;
}

void HttpServer::Impl::stop_connections(bool graceful) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& w : connections_) {
    if (std::shared_ptr<Connection> c = w.lock()) c->stop(graceful);
  }
}

void HttpServer::Impl::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_requested_ = true;
  stop_cv_.notify_all();
}

void HttpServer::Impl::accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [this](error_code ec, tcp::socket socket) {
    on_accept(ec, std::move(socket));
  });
}

void HttpServer::Impl::on_accept(error_code ec, tcp::socket socket) {
  if (!acceptor_.is_open() || ec == net::error::operation_aborted) return;
  if (ec) {
    // Out of file descriptors (or a transient error): try again shortly rather than
    // spinning on the error.
    DS_LOG_WARN("accept: {}", ec.message());
    accept_retry_.expires_after(std::chrono::milliseconds(100));
    accept_retry_.async_wait([this](error_code e) {
      if (!e) accept();
    });
    return;
  }
  if (n_connections_.load() >= max_connections_) {
    refuse_connection(std::move(socket));
  } else {
    ++n_connections_;
    metrics_.add_connections(1);
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::shared_ptr<Connection> c = start_connection(std::move(socket), tls_.get(), *this);
    std::lock_guard<std::mutex> lock(mu_);
    if (connections_.size() >= 64 && connections_.size() > 2 * static_cast<size_t>(n_connections_.load())) {
      std::erase_if(connections_, [](const std::weak_ptr<Connection>& w) { return w.expired(); });
    }
    connections_.push_back(c);
  }
  accept();
}

// Over --max-connections: a 503 written without reading the request, then closed.
// (Over TLS nothing readable can be sent before a handshake: just closed.)
void HttpServer::Impl::refuse_connection(tcp::socket socket) {
  metrics_.count_rejected(ServerMetrics::Rejection::kMaxConnections);
  if (tls_) {
    error_code ignored;
    socket.close(ignored);
    return;
  }
  const std::string body =
      ApiError{503, "too many connections; retry later", "service_unavailable", "", ""}
          .to_json()
          .dump();
  auto s = std::make_shared<tcp::socket>(std::move(socket));
  auto out = std::make_shared<std::string>(
      "HTTP/1.1 503 Service Unavailable\r\nRetry-After: " + std::string(kRetryAfterSeconds) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n" + body);
  net::async_write(*s, net::buffer(*out), [s, out](error_code, size_t) {
    error_code ignored;
    s->shutdown(tcp::socket::shutdown_both, ignored);
    s->close(ignored);
  });
}

void HttpServer::Impl::send_json(HttpExchange& ex, int status, const json& body,
                                 std::vector<std::pair<std::string, std::string>> headers) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  if (config_.audit_log) ex.response_sha256 = Sha256::hex(r.body);
  r.headers = std::move(headers);
  r.headers.emplace_back("X-Request-Id", ex.request_id);
  ex.respond(std::move(r));
}

void HttpServer::Impl::handle(std::shared_ptr<HttpExchange> ex) {
  const HttpRequest& req = ex->request;
  std::string request_id = req.header("X-Request-Id");
  if (request_id.empty() || request_id.size() > kMaxRequestIdBytes) request_id = random_id();
  ex->request_id = std::move(request_id);
  ex->on_done = [this](HttpExchange& e, int status, bool completed) { log_done(e, status, completed); };
  LogRequestScope log_scope(ex->request_id);

  if (ex->parse_error_status != 0) {
    ApiError e{ex->parse_error_status, ex->parse_error, "invalid_request_error", "", ""};
    if (e.http_status == 413) {
      e.message = "the request body is larger than the limit (" +
                  std::to_string(config_.limits.max_body_bytes) + " bytes)";
      e.code = "request_too_large";
    }
    return send_error(*ex, e);
  }
  if (req.path.rfind("/v1/", 0) == 0 && !config_.api_key.empty()) {
    const std::string auth = req.header("Authorization");
    const std::string prefix = "Bearer ";
    const std::string given = auth.rfind(prefix, 0) == 0 ? auth.substr(prefix.size()) : "";
    if (!constant_time_equal(given, config_.api_key)) {
      return send_error(*ex, {401, "Incorrect API key provided.", "authentication_error", "",
                              "invalid_api_key"});
    }
  }
  const Route* route = find_route(req.path);
  if (route && std::string_view(route->path) == kChatPagePath && !config_.chat_page) {
    route = nullptr;  // --disable-ui
  }
  if (!route) {
    return send_error(*ex, {404, "no route for " + req.method + " " + req.path, "not_found_error",
                            "", ""});
  }
  const char* allowed = method_of(route->kind);
  if (req.method != allowed) {
    return send_error(*ex, {405, "method " + req.method + " is not allowed on " + req.path +
                                     " (use " + allowed + ")",
                            "invalid_request_error", "", ""},
                      {{"Allow", allowed}});
  }
  if (route->kind == RouteKind::kGet) return serve_get(*ex);
  if (draining_) {
    return send_error(*ex, {503, "the server is shutting down", "service_unavailable", "", ""});
  }
  const bool inference = route->kind == RouteKind::kInference;
  if (inference) {
    const int64_t before = n_inference_.fetch_add(1);
    if (config_.max_waiting_requests >= 0 &&
        before >= config_.max_num_seqs + config_.max_waiting_requests) {
      --n_inference_;
      metrics_.count_rejected(ServerMetrics::Rejection::kMaxWaitingRequests);
      return send_error(*ex,
                        {503, "too many requests waiting (--max-waiting-requests " +
                                  std::to_string(config_.max_waiting_requests) + "); retry later",
                         "service_unavailable", "", ""},
                        {{"Retry-After", kRetryAfterSeconds}});
    }
  }
  const bool started = workers_.try_run([this, ex, inference] {
    {
      ClientWatch::Scope watch(ex->watch);
      LogRequestScope log(ex->request_id);
      serve_post(*ex);
    }
    if (inference) --n_inference_;
  });
  if (!started) {
    if (inference) --n_inference_;
    metrics_.count_rejected(ServerMetrics::Rejection::kNoWorkerThread);
    send_error(*ex, {503, "the server cannot take more requests now; retry later",
                     "service_unavailable", "", ""},
               {{"Retry-After", kRetryAfterSeconds}});
  }
}

void HttpServer::Impl::serve_get(HttpExchange& ex) {
  const std::string& path = ex.request.path;
  if (path == "/health") {
    HttpResponse r;
    r.status = !draining_ && serving_.healthy() ? 200 : 503;
    r.content_type = "text/plain";
    r.headers.emplace_back("X-Request-Id", ex.request_id);
    return ex.respond(std::move(r));
  }
  if (path == "/metrics") {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_.render();
    r.headers.emplace_back("X-Request-Id", ex.request_id);
    return ex.respond(std::move(r));
  }
  if (path == "/version") return send_json(ex, 200, {{"version", kVersion}});
  if (path == kChatPagePath) {
    HttpResponse r = chat_page_response(ex.request);
    r.headers.emplace_back("X-Request-Id", ex.request_id);
    return ex.respond(std::move(r));
  }
  Reply reply = path == "/v1/models" ? serving_.models() : serving_.tokenizer_info();
  send_json(ex, reply.status, reply.body);
}

void HttpServer::Impl::serve_post(HttpExchange& ex) {
  bool streaming = false;
  try {
    const std::string& body_text = ex.request.body;
    if (json_too_deep(body_text)) {
      return send_error(ex, ApiError::bad_request("the JSON body is nested too deeply"));
    }
    json body = json::parse(body_text, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) {
      return send_error(ex, ApiError::bad_request("the request body is not valid JSON"));
    }
    ex.model = body.is_object() && body.contains("model") && body["model"].is_string()
                   ? body["model"].get<std::string>()
                   : serving_.model_name();
    const std::string& path = ex.request.path;
    Reply reply = path == "/v1/completions"        ? serving_.completions(body)
                  : path == "/v1/chat/completions" ? serving_.chat_completions(body)
                  : path == "/v1/responses"        ? serving_.responses(body)
                  : path == "/tokenize"            ? serving_.tokenize(body)
                                                   : serving_.detokenize(body);
    if (!reply.stream) {
      if (reply.body.is_object() && reply.body.contains("usage")) ex.usage = reply.body["usage"];
      return send_json(ex, reply.status, reply.body);
    }
    streaming = true;
    stream(ex, *reply.stream);
  } catch (const std::exception& e) {
    DS_LOG_ERROR("request failed: {}", e.what());
    if (streaming) return ex.end_stream();
    send_error(ex, {500, e.what(), "server_error", "", ""});
  }
}

// Pulls the stream and hands its events to the connection until [DONE] or the client
// is gone (then the request is cancelled; the ClientWatch has aborted it already).
void HttpServer::Impl::stream(HttpExchange& ex, EventStream& events) {
  if (config_.audit_log) ex.stream_hash = std::make_unique<Sha256>();
  HttpResponse head;
  head.content_type = "text/event-stream";
  head.headers = {{"Cache-Control", "no-cache"}, {"X-Request-Id", ex.request_id}};
  ex.begin_stream(std::move(head));
  while (true) {
    std::string chunk = events.next(kStreamPoll);
    // An SSE comment while idle (e.g. queued): a client that stopped reading shows up
    // at the write deadline even before its first token.
    if (chunk.empty()) chunk = ": keep-alive\n\n";
    if (ex.stream_hash) ex.stream_hash->update(chunk);
    if (!ex.write_chunk(std::move(chunk))) {
      events.cancel();
      break;
    }
    if (events.done()) {
      ex.usage = events.usage();
      break;
    }
  }
  ex.end_stream();
}

void HttpServer::Impl::log_done(HttpExchange& ex, int status, bool completed) {
  const HttpRequest& req = ex.request;
  const double latency_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ex.start).count();
  LogRequestScope log_scope(ex.request_id);
  DS_LOG_INFO("{}:{} \"{} {}\" {} {:.1f} ms{}", ex.remote_addr, ex.remote_port, req.method,
              req.path, status, latency_ms, completed ? "" : " (client gone)");
  const bool audited = !(req.method == "GET" && (req.path == "/health" || req.path == "/metrics"));
  if (!config_.audit_log || !audited) return;
  AuditRecord r;
  r.request_id = ex.request_id;
  if (status != 401) r.key_id = key_id_;  // a refused key identifies nobody
  r.client = ex.remote_addr + ":" + std::to_string(ex.remote_port);
  r.method = req.method;
  r.endpoint = req.path;
  r.model = ex.model;
  // A refused key ends the request before its body is looked at: no hash then.
  if (status != 401) r.request_sha256 = Sha256::hex(req.body);
  r.response_sha256 = ex.stream_hash ? ex.stream_hash->hex_digest() : ex.response_sha256;
  if (ex.usage.is_object() && ex.usage.contains("prompt_tokens")) {
    r.prompt_tokens = ex.usage["prompt_tokens"].get<int64_t>();
    r.completion_tokens = ex.usage.value("completion_tokens", int64_t{0});
  } else if (ex.usage.is_object() && ex.usage.contains("input_tokens")) {  // /v1/responses
    r.prompt_tokens = ex.usage["input_tokens"].get<int64_t>();
    r.completion_tokens = ex.usage.value("output_tokens", int64_t{0});
  }
  r.status = status;
  r.latency_ms = latency_ms;
  config_.audit_log->record(std::move(r));
}

HttpServer::HttpServer(HttpServerConfig config, OpenAiServing& serving, ServerMetrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(config), serving, metrics)) {}

HttpServer::~HttpServer() = default;

Status HttpServer::run() { return impl_->run(); }
void HttpServer::stop() { impl_->stop(); }
void HttpServer::set_draining(bool draining) { impl_->set_draining(draining); }

}  // namespace dserve::server
