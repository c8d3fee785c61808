#include "server/http_connection.h"

#include <boost/asio/post.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/status.hpp>
#include <fmt/format.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <type_traits>

#include "server/http_exchange.h"

namespace dserve::server {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

namespace {

constexpr size_t kReadChunk = 16 << 10;
constexpr size_t kMaxBufferedWhileHandling = 64 << 10;  // pipelined bytes held unparsed
constexpr size_t kMaxUnwrittenStreamBytes = 256 << 10;  // a stream's producer waits beyond
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr size_t kMaxLingerBytes = 1 << 20;

// Backpressure between a stream's producer (a worker thread) and the strand writing.
struct StreamFlow {
  std::mutex mu;
  std::condition_variable cv;
  size_t unwritten = 0;  // GUARDED_BY(mu)
  bool closed = false;   // GUARDED_BY(mu)

  void release(size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    unwritten -= n;
    cv.notify_all();
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
    cv.notify_all();
  }
  // Waits for room; false once closed.
  bool reserve(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return closed || unwritten < kMaxUnwrittenStreamBytes; });
    if (closed) return false;
    unwritten += n;
    return true;
  }
};

template <class Stream>
constexpr bool kIsTls = !std::is_same_v<Stream, tcp::socket>;

template <class Stream>
class ConnectionImpl;

template <class Stream>
class ExchangeImpl final : public HttpExchange {
 public:
  explicit ExchangeImpl(std::shared_ptr<ConnectionImpl<Stream>> conn) : conn_(std::move(conn)) {}
  void respond(HttpResponse r) override { conn_->post_response(std::move(r), /*stream=*/false); }
  void begin_stream(HttpResponse head) override { conn_->post_response(std::move(head), true); }
  bool write_chunk(std::string data) override {
    const size_t n = data.size();
    if (!flow->reserve(n)) return false;
    conn_->post_chunk(std::move(data));
    return true;
  }
  void end_stream() override { conn_->post_end(); }

  const std::shared_ptr<StreamFlow> flow = std::make_shared<StreamFlow>();

 private:
  std::shared_ptr<ConnectionImpl<Stream>> conn_;
};

template <class Stream>
class ConnectionImpl final : public Connection,
                             public std::enable_shared_from_this<ConnectionImpl<Stream>> {
 public:
  template <class... Args>
  ConnectionImpl(ConnectionHost& host, Args&&... stream_args)
      : host_(host), stream_(std::forward<Args>(stream_args)...), timer_(stream_.get_executor()),
        write_timer_(stream_.get_executor()) {
    error_code ec;
    const tcp::endpoint peer = lowest().remote_endpoint(ec);
    if (!ec) {
      remote_addr_ = peer.address().to_string();
      remote_port_ = peer.port();
    }
  }
  ~ConnectionImpl() override { host_.connection_closed(); }

  void begin() {
    net::post(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kIsTls<Stream>) {
        self->phase_ = Phase::kHandshake;
        self->arm(self->host_.head_timeout());
        self->stream_.async_handshake(net::ssl::stream_base::server, [self](error_code ec) {
          if (self->phase_ == Phase::kClosed) return;
          if (ec) return self->close_now();
          self->next_request();
        });
      } else {
        self->next_request();
      }
    });
  }

  void stop(bool graceful) override {
    net::post(stream_.get_executor(), [self = this->shared_from_this(), graceful] {
      if (graceful && self->phase_ == Phase::kHandling) {
        self->close_after_ = true;
        self->keep_alive_ = false;
      } else {
        self->close_now();
      }
    });
  }

  // HttpExchange's calls, from any thread.
  void post_response(HttpResponse r, bool stream) {
    net::post(stream_.get_executor(), [self = this->shared_from_this(), r = std::move(r), stream]() mutable {
      self->send_head(std::move(r), stream);
    });
  }
  void post_chunk(std::string data) {
    net::post(stream_.get_executor(), [self = this->shared_from_this(), data = std::move(data)]() mutable {
      self->send_chunk(std::move(data));
    });
  }
  void post_end() {
    net::post(stream_.get_executor(), [self = this->shared_from_this()] { self->send_end(); });
  }

 private:
  enum class Phase { kHandshake, kIdle, kHead, kBody, kHandling, kLinger, kClosed };

  tcp::socket& lowest() {
    if constexpr (kIsTls<Stream>) return stream_.next_layer();
    else return stream_;
  }

  void arm(std::chrono::milliseconds d) {
    timer_.expires_after(d);
    const uint64_t gen = ++timer_gen_;
    timer_.async_wait([self = this->shared_from_this(), gen](error_code ec) {
      if (!ec && gen == self->timer_gen_) self->on_deadline();
    });
  }
  void disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  void on_deadline() {
    switch (phase_) {
      case Phase::kHead:
      case Phase::kBody:
        // Too slow (slowloris): answered, then closed.
        return reject(408, "the request was not received within the time allowed");
      case Phase::kHandshake:
      case Phase::kIdle:
      case Phase::kLinger:
      case Phase::kHandling:
      case Phase::kClosed:
        return close_now();
    }
  }

  void next_request() {
    if (peer_done_ && in_.size() == 0) return close_now();
    parser_ = std::make_unique<HttpRequestParser>(host_.limits());
    phase_ = Phase::kIdle;
    arm(host_.keep_alive_timeout());
    process_input();
  }

  void process_input() {
    while ((phase_ == Phase::kIdle || phase_ == Phase::kHead || phase_ == Phase::kBody) &&
           in_.size() > 0) {
      if (phase_ == Phase::kIdle) {
        phase_ = Phase::kHead;
        arm(host_.head_timeout());
      }
      error_code ec;
      const size_t n = parser_->put(in_.data(), ec);
      in_.consume(n);
      if (ec == http::error::need_more) break;
      if (ec) return reject(HttpRequestParser::status_for(ec), ec.message());
      if (phase_ == Phase::kHead && parser_->is_header_done()) {
        phase_ = Phase::kBody;
        arm(host_.body_timeout());
        if (!parser_->is_done() && parser_->request().version >= 11) {
          std::string expect = parser_->request().header("Expect");
          if (expect == "100-continue" || expect == "100-Continue") {
            queue_write("HTTP/1.1 100 Continue\r\n\r\n", 0);
          }
        }
      }
      if (parser_->is_done()) return dispatch();
      if (n == 0) break;
    }
    read_more();
  }

  void read_more() {
    if (reading_ || peer_done_) return;
    switch (phase_) {
      case Phase::kHandshake:
      case Phase::kClosed:
        return;
      case Phase::kHandling:
        if (in_.size() >= kMaxBufferedWhileHandling) return;
        break;
      case Phase::kIdle:
      case Phase::kHead:
      case Phase::kBody:
      case Phase::kLinger:
        break;
    }
    reading_ = true;
    // Into a buffer of its own, not in_.prepare(): in_ may be consumed (which rewinds
    // its storage) while this read is pending, when a buffered pipelined request is
    // parsed after a response; the bytes are appended to in_ once they arrive.
    stream_.async_read_some(net::buffer(read_chunk_.get(), kReadChunk),
                            [self = this->shared_from_this()](error_code ec, size_t n) {
                              self->on_read(ec, n);
                            });
  }

  void on_read(error_code ec, size_t n) {
    reading_ = false;
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      peer_done_ = true;
      // While handling: the client is gone; the response (if one comes) is still tried.
      if (phase_ == Phase::kHandling) return client_gone();
      return close_now();
    }
    if (phase_ == Phase::kLinger) {
      linger_bytes_ += n;
      if (linger_bytes_ > kMaxLingerBytes) return close_now();
      return read_more();
    }
    const auto room = in_.prepare(n);
    std::memcpy(room.data(), read_chunk_.get(), n);
    in_.commit(n);
    process_input();
  }

  void dispatch() {
    phase_ = Phase::kHandling;
    disarm();
    auto ex = std::make_shared<ExchangeImpl<Stream>>(this->shared_from_this());
    ex->request = std::move(parser_->request());
    begin_exchange(ex);
    host_.handle(ex);
    read_more();  // notices a client that leaves, buffers pipelined requests
  }

  // A request that could not be parsed: the server answers it; the connection closes.
  void reject(int status, std::string why) {
    phase_ = Phase::kHandling;
    disarm();
    close_after_ = true;
    auto ex = std::make_shared<ExchangeImpl<Stream>>(this->shared_from_this());
    if (parser_) ex->request = std::move(parser_->request());
    ex->parse_error_status = status;
    ex->parse_error = std::move(why);
    begin_exchange(ex);
    host_.handle(ex);
  }

  void begin_exchange(const std::shared_ptr<ExchangeImpl<Stream>>& ex) {
    ex->remote_addr = remote_addr_;
    ex->remote_port = remote_port_;
    exchange_ = ex;
    flow_ = ex->flow;
    response_started_ = response_complete_ = false;
    status_ = 0;
  }

  void client_gone() {
    if (exchange_) exchange_->watch->client_gone();
    if (flow_) flow_->close();
  }

  void send_head(HttpResponse r, bool stream) {
    if (!exchange_ || response_started_) return;
    response_started_ = true;
    status_ = r.status;
    if (phase_ == Phase::kClosed) {
      if (!stream) finish_exchange(false);
      return;
    }
    const HttpRequest& req = exchange_->request;
    // A client that half-closed after pipelining still gets the responses to what it
    // sent (next_request closes once the buffer is empty).
    keep_alive_ = req.keep_alive && !close_after_ && !host_.draining() &&
                  !(peer_done_ && in_.size() == 0);
    chunked_ = stream && req.version >= 11;
    if (stream && !chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends at the close
    const auto reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(r.status)));
    std::string out = fmt::format("HTTP/1.1 {} {}\r\n", r.status,
                                  std::string_view(reason.data(), reason.size()));
    for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
    if (!r.content_type.empty()) out += "Content-Type: " + r.content_type + "\r\n";
    if (chunked_) {
      out += "Transfer-Encoding: chunked\r\n";
    } else if (!stream && r.status != 204 && r.status != 304) {
      // A 204 or 304 has no body, and no Content-Length that could be read as its size
      // (RFC 9110 8.6: a 304's would be that of the 200 it stands for).
      out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
    }
    if (!keep_alive_) out += "Connection: close\r\n";
    else if (req.version < 11) out += "Connection: keep-alive\r\n";
    out += "\r\n";
    if (!stream) {
      out += r.body;
      response_complete_ = true;
    }
    queue_write(std::move(out), 0);
  }

  void send_chunk(std::string data) {
    const size_t n = data.size();
    if (phase_ == Phase::kClosed || !exchange_) {
      if (flow_) flow_->release(n);
      return;
    }
    if (chunked_) queue_write(fmt::format("{:x}\r\n", n) + data + "\r\n", n);
    else queue_write(std::move(data), n);
  }

  void send_end() {
    if (!exchange_) return;
    response_complete_ = true;
    if (phase_ == Phase::kClosed) return finish_exchange(false);
    if (chunked_) queue_write("0\r\n\r\n", 0);
    else if (!writing_) on_written();
  }

  // `accounted`: the stream bytes this write releases in the flow when done.
  void queue_write(std::string data, size_t accounted) {
    out_.emplace_back(std::move(data), accounted);
    write_next();
  }

  void write_next() {
    if (writing_ || out_.empty() || phase_ == Phase::kClosed) return;
    writing_ = true;
    current_ = std::move(out_.front());
    out_.pop_front();
    write_timer_.expires_after(host_.write_timeout());
    const uint64_t gen = ++write_gen_;
    write_timer_.async_wait([self = this->shared_from_this(), gen](error_code ec) {
      // The client reads nothing: it is as good as gone.
      if (!ec && gen == self->write_gen_) self->close_now();
    });
    net::async_write(stream_, net::buffer(current_.first),
                     [self = this->shared_from_this()](error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(error_code ec) {
    writing_ = false;
    ++write_gen_;
    write_timer_.cancel();
    if (flow_ && current_.second > 0) flow_->release(current_.second);
    current_ = {};
    if (phase_ == Phase::kClosed) {
      if (exchange_ && response_complete_) finish_exchange(false);
      return;
    }
    if (ec) return close_now();
    if (!out_.empty()) return write_next();
    on_written();
  }

  // Everything queued is written.
  void on_written() {
    if (!response_complete_ || !exchange_) return;
    finish_exchange(true);
    if (keep_alive_) return next_request();
    linger_close();
  }

  void finish_exchange(bool completed) {
    std::shared_ptr<HttpExchange> ex = std::move(exchange_);
    exchange_.reset();
    if (flow_) flow_->close();
    flow_.reset();
    if (ex && ex->on_done) ex->on_done(*ex, status_, completed);
  }

  // After a response that closes the connection: the write side ends at once; what the
  // client still sends is read and dropped for a moment, so that closing with unread
  // data does not reset the connection before the client has read the response.
  void linger_close() {
    phase_ = Phase::kLinger;
    error_code ignored;
    lowest().shutdown(tcp::socket::shutdown_send, ignored);
    if (peer_done_) return close_now();
    in_.consume(in_.size());
    arm(std::chrono::duration_cast<std::chrono::milliseconds>(kLingerTime));
    read_more();
  }

  void close_now() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    disarm();
    ++write_gen_;
    write_timer_.cancel();
    error_code ignored;
    lowest().shutdown(tcp::socket::shutdown_both, ignored);
    lowest().close(ignored);
    out_.clear();
    client_gone();
    // A request being handled finishes when its handler answers (send_head / send_end)
    // or, if a write is under way, when it completes (on_write).
    if (exchange_ && response_complete_ && !writing_) finish_exchange(false);
  }

  ConnectionHost& host_;
  Stream stream_;
  net::steady_timer timer_, write_timer_;
  uint64_t timer_gen_ = 0, write_gen_ = 0;
  std::string remote_addr_;
  int remote_port_ = 0;
  Phase phase_ = Phase::kIdle;
  boost::beast::flat_buffer in_;  // read, not yet parsed
  std::unique_ptr<char[]> read_chunk_ = std::make_unique<char[]>(kReadChunk);  // the pending read's
  std::unique_ptr<HttpRequestParser> parser_;
  bool reading_ = false;
  bool peer_done_ = false;  // the read side ended (EOF or error)
  size_t linger_bytes_ = 0;

  std::shared_ptr<HttpExchange> exchange_;  // the request being handled
  std::shared_ptr<StreamFlow> flow_;        // its stream's backpressure
  bool close_after_ = false;                // a parse error: close after the response
  bool response_started_ = false, response_complete_ = false;
  bool keep_alive_ = false, chunked_ = false;
  int status_ = 0;
  std::deque<std::pair<std::string, size_t>> out_;
  std::pair<std::string, size_t> current_;
  bool writing_ = false;
};

}  // namespace

std::shared_ptr<Connection> start_connection(tcp::socket socket, net::ssl::context* tls,
                                             ConnectionHost& host) {
  if (tls) {
    auto c = std::make_shared<ConnectionImpl<net::ssl::stream<tcp::socket>>>(host, std::move(socket), *tls);
    c->begin();
    return c;
  }
  auto c = std::make_shared<ConnectionImpl<tcp::socket>>(host, std::move(socket));
  c->begin();
  return c;
}

}  // namespace dserve::server
