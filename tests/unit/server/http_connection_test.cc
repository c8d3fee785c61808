// The HTTP front end's connection state machine (http_connection.cc) over real loopback
// sockets, with a scripted ConnectionHost in place of the server's routes: keep-alive,
// pipelining, deadlines, limits, a client that leaves while its request is handled or
// streamed. Runs under ASan/UBSan and TSan (two I/O threads, handler threads).
#include "server/http_connection.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/http_exchange.h"

namespace dserve::server {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using boost::system::error_code;
using namespace std::chrono_literals;

// Routes: "/hold" keeps the request unanswered until release_held(); "/stream?N"
// streams N chunks of 64 KiB from a thread of its own (until the client is gone);
// anything else is answered at once with "<path>:<body>". A parse error is answered
// with its status.
class ScriptedHost final : public ConnectionHost {
 public:
  ~ScriptedHost() override { join(); }

  const HttpLimits& limits() const override { return limits_; }
  std::chrono::milliseconds head_timeout() const override { return 300ms; }
  std::chrono::milliseconds body_timeout() const override { return 300ms; }
  std::chrono::milliseconds keep_alive_timeout() const override { return 300ms; }
  std::chrono::milliseconds write_timeout() const override { return 2000ms; }
  bool draining() const override { return false; }
  void connection_closed() override { --open_; }

  void handle(std::shared_ptr<HttpExchange> ex) override {
    ex->on_done = [this](HttpExchange&, int, bool completed) {
      std::lock_guard<std::mutex> lock(mu_);
      (completed ? n_completed_ : n_abandoned_)++;
      cv_.notify_all();
    };
    if (ex->parse_error_status != 0) {
      return ex->respond({ex->parse_error_status, "text/plain", ex->parse_error, {}});
    }
    const HttpRequest& r = ex->request;
    if (r.path == "/hold") {
      std::lock_guard<std::mutex> lock(mu_);
      held_.push_back(ex);
      cv_.notify_all();
      return;
    }
    if (r.path == "/stream") {
      const int n = std::stoi(r.target.substr(r.target.find('?') + 1));
      std::lock_guard<std::mutex> lock(mu_);
      threads_.emplace_back([this, ex, n] {
        ex->begin_stream({200, "text/event-stream", "", {}});
        int written = 0;
        while (written < n && ex->write_chunk(std::string(64 << 10, 'x'))) ++written;
        ex->end_stream();
        std::lock_guard<std::mutex> lock(mu_);
        stream_results_.push_back(written);
        cv_.notify_all();
      });
      return;
    }
    ex->respond({200, "text/plain", r.path + ":" + r.body, {}});
  }

  // Waits (at most 10 s) until pred() holds under the host's lock.
  template <class Pred>
  bool wait_for(Pred pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return pred(); });
  }
  std::shared_ptr<HttpExchange> take_held() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, 10s, [&] { return !held_.empty(); });
    if (held_.empty()) return nullptr;
    auto ex = held_.front();
    held_.erase(held_.begin());
    return ex;
  }
  void join() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  HttpLimits limits_;
  std::atomic<int> open_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  int n_completed_ = 0, n_abandoned_ = 0;           // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<HttpExchange>> held_;  // GUARDED_BY(mu_)
  std::vector<int> stream_results_;                  // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;                 // GUARDED_BY(mu_)
};

class HttpConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_.limits_.max_body_bytes = 1 << 20;
    acceptor_.open(tcp::v4());
    acceptor_.bind({net::ip::address_v4::loopback(), 0});
    acceptor_.listen();
    accept();
    for (int i = 0; i < 2; ++i) io_threads_.emplace_back([this] { ioc_.run(); });
  }
  void TearDown() override {
    host_.join();
    // Every connection ends by itself once its client has closed (or its deadline).
    EXPECT_TRUE(wait_until([&] { return host_.open_.load() == 0; })) << host_.open_.load();
    ioc_.stop();
    for (auto& t : io_threads_) t.join();
  }

  void accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](error_code ec, tcp::socket s) {
      if (ec) return;
      ++host_.open_;
      s.set_option(tcp::no_delay(true));
      start_connection(std::move(s), nullptr, host_);
      accept();
    });
  }

  // A blocking client socket whose reads give up after 5 s.
  tcp::socket connect() {
    tcp::socket s(client_ctx_);
    s.connect(acceptor_.local_endpoint());
    s.set_option(tcp::no_delay(true));
    timeval tv{5, 0};
    setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return s;
  }

  template <class Pred>
  static bool wait_until(Pred pred) {
    for (int i = 0; i < 1000 && !pred(); ++i) std::this_thread::sleep_for(10ms);
    return pred();
  }

  ScriptedHost host_;
  net::io_context ioc_;
  net::io_context client_ctx_;
  tcp::acceptor acceptor_{net::make_strand(ioc_)};
  std::vector<std::thread> io_threads_;
};

std::string post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

void send(tcp::socket& s, const std::string& bytes) { net::write(s, net::buffer(bytes)); }

struct Response {
  int status = 0;        // 0: the connection ended (or the read timed out) first
  std::string head, body;
};

// Reads one response (Content-Length or chunked framing); `pending` keeps what was
// read beyond it.
Response read_response(tcp::socket& s, std::string& pending) {
  auto fill = [&]() {
    char buf[8192];
    error_code ec;
    const size_t n = s.read_some(net::buffer(buf), ec);
    if (ec) return false;
    pending.append(buf, n);
    return true;
  };
  Response r;
  size_t end;
  while ((end = pending.find("\r\n\r\n")) == std::string::npos) {
    if (!fill()) return r;
  }
  r.head = pending.substr(0, end + 2);
  pending.erase(0, end + 4);
  const int status = std::stoi(r.head.substr(9, 3));
  if (const size_t cl = r.head.find("Content-Length: "); cl != std::string::npos) {
    const size_t len = std::stoul(r.head.substr(cl + 16));
    while (pending.size() < len) {
      if (!fill()) return r;
    }
    r.body = pending.substr(0, len);
    pending.erase(0, len);
  } else {  // chunked
    for (;;) {
      size_t eol;
      while ((eol = pending.find("\r\n")) == std::string::npos) {
        if (!fill()) return r;
      }
      const size_t len = std::stoul(pending.substr(0, eol), nullptr, 16);
      while (pending.size() < eol + 2 + len + 2) {
        if (!fill()) return r;
      }
      r.body += pending.substr(eol + 2, len);
      pending.erase(0, eol + 2 + len + 2);
      if (len == 0) break;
    }
  }
  r.status = status;
  return r;
}

// The connection's end: a read returns end of stream (not a timeout).
bool reads_eof(tcp::socket& s) {
  char c;
  error_code ec;
  s.read_some(net::buffer(&c, 1), ec);
  return ec == net::error::eof || ec == net::error::connection_reset;
}

TEST_F(HttpConnectionTest, KeepAliveAnswersEveryRequestOfAConnectionInOrder) {
  tcp::socket s = connect();
  std::string pending;
  for (int i = 0; i < 200; ++i) {
    const std::string body(static_cast<size_t>(i * 37 % 3000), static_cast<char>('a' + i % 26));
    send(s, post("/r" + std::to_string(i), body));
    const Response r = read_response(s, pending);
    ASSERT_EQ(r.status, 200) << i;
    ASSERT_EQ(r.body, "/r" + std::to_string(i) + ":" + body) << i;
  }
  EXPECT_TRUE(pending.empty());
}

// Regression: the read that stays pending while a request is handled must not lose its
// bytes when the buffered pipelined requests behind it are parsed (the buffer rewinds).
TEST_F(HttpConnectionTest, PipelinedRequestsAndTheOneAfterThemAreAnsweredInOrder) {
  tcp::socket s = connect();
  std::string pending;
  for (int round = 0; round < 20; ++round) {
    const std::string a = "/a" + std::to_string(round), b = "/b" + std::to_string(round),
                      c = "/c" + std::to_string(round);
    send(s, post(a, "A") + post(b, "BB"));
    EXPECT_EQ(read_response(s, pending).body, a + ":A");
    EXPECT_EQ(read_response(s, pending).body, b + ":BB");
    send(s, post(c, "CCC"));
    EXPECT_EQ(read_response(s, pending).body, c + ":CCC");
  }
}

TEST_F(HttpConnectionTest, ARequestHeadThatNeverEndsGets408AndTheConnectionCloses) {
  tcp::socket s = connect();
  send(s, "POST /slow HTTP/1.1\r\nHost: t\r\n");  // and nothing more
  std::string pending;
  const Response r = read_response(s, pending);
  EXPECT_EQ(r.status, 408);
  EXPECT_NE(r.head.find("Connection: close"), std::string::npos);
  EXPECT_TRUE(reads_eof(s));
}

TEST_F(HttpConnectionTest, ABodyThatStopsArrivingGets408) {
  tcp::socket s = connect();
  send(s, "POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc");
  std::string pending;
  EXPECT_EQ(read_response(s, pending).status, 408);
  EXPECT_TRUE(reads_eof(s));
}

TEST_F(HttpConnectionTest, AnIdleConnectionIsClosedAfterTheKeepAliveTimeout) {
  tcp::socket s = connect();
  std::string pending;
  send(s, post("/x", ""));
  EXPECT_EQ(read_response(s, pending).status, 200);
  EXPECT_TRUE(reads_eof(s));  // within the 5 s read timeout: the 300 ms deadline fired
}

TEST_F(HttpConnectionTest, OversizedBodiesGet413WhateverTheirFraming) {
  {
    tcp::socket s = connect();
    send(s, "POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\n");
    std::string pending;
    EXPECT_EQ(read_response(s, pending).status, 413);
  }
  {
    tcp::socket s = connect();
    send(s, "POST /big HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    const std::string chunk = "10000\r\n" + std::string(0x10000, 'z') + "\r\n";
    std::string pending;
    Response r;
    // The server answers once the limit is crossed, while the client is still sending.
    for (int i = 0; i < 40; ++i) {
      error_code ec;
      net::write(s, net::buffer(chunk), ec);
      if (ec) break;
    }
    r = read_response(s, pending);
    EXPECT_EQ(r.status, 413);
  }
}

TEST_F(HttpConnectionTest, AClientThatLeavesWhileItsRequestIsHandledIsSeenGone) {
  {
    tcp::socket s = connect();
    send(s, post("/hold", "x"));
    std::shared_ptr<HttpExchange> ex = host_.take_held();
    ASSERT_NE(ex, nullptr);
    EXPECT_FALSE(ex->watch->gone());
    s.close();
    EXPECT_TRUE(wait_until([&] { return ex->watch->gone(); }));
    // The handler answers late: the exchange still ends (and the connection with it).
    ex->respond({200, "text/plain", "late", {}});
  }
  EXPECT_TRUE(host_.wait_for([&] { return host_.n_completed_ + host_.n_abandoned_ == 1; }));
}

TEST_F(HttpConnectionTest, AStreamStopsProducingOnceItsClientLeaves) {
  tcp::socket s = connect();
  send(s, "GET /stream?100000 HTTP/1.1\r\nHost: t\r\n\r\n");
  char buf[4096];
  size_t got = 0;
  while (got < (256 << 10)) got += s.read_some(net::buffer(buf));
  s.close();
  ASSERT_TRUE(host_.wait_for([&] { return host_.stream_results_.size() == 1; }));
  // The producer was held back (backpressure) and stopped when the client left.
  EXPECT_LT(host_.stream_results_[0], 100000);
  // Its end is written if the socket still takes it, or dropped: either way it ends.
  EXPECT_TRUE(host_.wait_for([&] { return host_.n_completed_ + host_.n_abandoned_ == 1; }));
}

TEST_F(HttpConnectionTest, AStreamIsReadWholeAndTheConnectionServesTheNextRequest) {
  tcp::socket s = connect();
  std::string pending;
  send(s, "GET /stream?20 HTTP/1.1\r\nHost: t\r\n\r\n");
  const Response r = read_response(s, pending);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.size(), size_t{20} * (64 << 10));
  send(s, post("/after", "z"));
  EXPECT_EQ(read_response(s, pending).body, "/after:z");
  EXPECT_TRUE(host_.wait_for([&] { return host_.n_completed_ == 2; }));
}

}  // namespace
}  // namespace dserve::server
