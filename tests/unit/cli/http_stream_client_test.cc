#include "cli/http_stream_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <thread>

namespace dserve::cli {
namespace {

std::vector<std::string> feed_all(const std::vector<std::string>& chunks) {
  SseParser p;
  std::vector<std::string> out;
  for (const std::string& c : chunks) EXPECT_TRUE(p.feed(c, out).ok());
  p.finish(out);
  return out;
}

TEST(SseParser, DataLinesCommentsAndFields) {
  const auto out = feed_all(
      {": ping\n\nevent: x\ndata: {\"a\":1}\n\ndata:{\"b\":2}\nid: 7\n\ndata: [DONE]\n\n"});
  EXPECT_EQ(out, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "[DONE]"}));
}

TEST(SseParser, LinesSplitAnywhereGiveTheSameEvents) {
  const std::string stream =
      "data: {\"t\":\"h\\u00e9llo\"}\r\n\r\ndata: second\r\rdata: third\n\ndata: [DONE]\r\n\r\n";
  const std::vector<std::string> whole = feed_all({stream});
  ASSERT_EQ(whole,
            (std::vector<std::string>{"{\"t\":\"h\\u00e9llo\"}", "second", "third", "[DONE]"}));
  // Every split point, including between "\r" and "\n", and byte by byte.
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    EXPECT_EQ(feed_all({stream.substr(0, cut), stream.substr(cut)}), whole) << "cut at " << cut;
  }
  std::vector<std::string> bytes;
  for (char c : stream) bytes.emplace_back(1, c);
  EXPECT_EQ(feed_all(bytes), whole);
}

TEST(SseParser, LastLineWithoutNewlineAndEmptyData) {
  EXPECT_EQ(feed_all({"data: a\ndata\ndata: [DO", "NE]"}),
            (std::vector<std::string>{"a", "", "[DONE]"}));
}

TEST(SseParser, RejectsEndlessLine) {
  SseParser p;
  std::vector<std::string> out;
  const std::string big(1 << 20, 'x');
  Status s;
  for (size_t i = 0; i <= SseParser::kMaxLineBytes / big.size() && s.ok(); ++i)
    s = p.feed(big, out);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(out.empty());
}

// A listening socket on 127.0.0.1 that answers each connection with `response`,
// written in `pieces` (split points), then closes.
class TinyServer {
 public:
  TinyServer(std::string response, std::vector<size_t> cuts) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd_, 8), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, response = std::move(response), cuts = std::move(cuts)] {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string req;
      char buf[4096];
      // Headers, then the body by Content-Length.
      while (req.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = read(c, buf, sizeof(buf));
        if (n <= 0) break;
        req.append(buf, n);
      }
      size_t cl = 0;
      if (size_t p = req.find("Content-Length: "); p != std::string::npos)
        cl = std::stoul(req.substr(p + 16));
      while (req.size() < req.find("\r\n\r\n") + 4 + cl) {
        const ssize_t n = read(c, buf, sizeof(buf));
        if (n <= 0) break;
        req.append(buf, n);
      }
      request_ = req;
      size_t at = 0;
      for (size_t cut : cuts) {
        (void)!write(c, response.data() + at, cut - at);
        at = cut;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      (void)!write(c, response.data() + at, response.size() - at);
      close(c);
    });
  }
  ~TinyServer() {
    shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    close(fd_);
  }
  int port() const { return port_; }
  // What the client sent; waits for the connection to be served.
  std::string request() {
    if (thread_.joinable()) thread_.join();
    return request_;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::string request_;
};

struct Recorder final : StreamListener {
  std::map<uint64_t, std::vector<std::string>> events;
  std::map<uint64_t, StreamEnd> ends;
  std::string abort_on;  // an event with this payload aborts its stream
  Status on_event(uint64_t id, std::string_view data, SteadyTime) override {
    if (!abort_on.empty() && data == abort_on) return corrupt("bad event");
    events[id].emplace_back(data);
    return Status::Ok();
  }
  void on_end(uint64_t id, const StreamEnd& end) override { ends[id] = end; }
};

void run_until_done(HttpStreamClient& c, Recorder& r, size_t n) {
  for (int i = 0; i < 500 && r.ends.size() < n; ++i)
    ASSERT_TRUE(c.poll(std::chrono::milliseconds(20)).ok());
  ASSERT_EQ(r.ends.size(), n);
  EXPECT_EQ(c.n_active(), 0);
}

TEST(HttpStreamClient, StreamsEventsSplitAcrossPackets) {
  const std::string body = "data: one\n\ndata: two\n\ndata: [DONE]\n\n";
  const std::string resp =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + body;
  TinyServer server(resp, {resp.size() - body.size() + 8, resp.size() - 3});
  Recorder rec;
  auto client = HttpStreamClient::create(&rec);
  ASSERT_TRUE(client.ok());
  StreamRequest req{"http://127.0.0.1:" + std::to_string(server.port()) + "/v1/completions",
                    "{\"x\":1}",
                    {"Content-Type: application/json"}};
  ASSERT_TRUE((*client)->start(7, req).ok());
  EXPECT_FALSE((*client)->start(7, req).ok());  // the id is taken
  run_until_done(**client, rec, 1);
  EXPECT_TRUE(rec.ends[7].ok) << rec.ends[7].error;
  EXPECT_EQ(rec.events[7], (std::vector<std::string>{"one", "two", "[DONE]"}));
  EXPECT_NE(server.request().find("POST /v1/completions"), std::string::npos);
  EXPECT_NE(server.request().find("{\"x\":1}"), std::string::npos);
}

TEST(HttpStreamClient, HttpErrorCarriesStatusAndBody) {
  const std::string resp =
      "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 15\r\nConnection: close\r\n\r\n"
      "{\"error\":\"no\"}\n";
  TinyServer server(resp, {});
  Recorder rec;
  auto client = HttpStreamClient::create(&rec);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)
                  ->start(1, {"http://127.0.0.1:" + std::to_string(server.port()) + "/", "{}", {}})
                  .ok());
  run_until_done(**client, rec, 1);
  EXPECT_FALSE(rec.ends[1].ok);
  EXPECT_EQ(rec.ends[1].http_status, 500);
  EXPECT_EQ(rec.ends[1].error, "HTTP 500 Internal Server Error: {\"error\":\"no\"}");
  EXPECT_TRUE(rec.events[1].empty());
}

TEST(HttpStreamClient, ListenerAbortEndsTheStream) {
  const std::string resp =
      "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\ndata: ok\n\ndata: {bad\n\ndata: after\n\n";
  TinyServer server(resp, {});
  Recorder rec;
  rec.abort_on = "{bad";
  auto client = HttpStreamClient::create(&rec);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)
                  ->start(2, {"http://127.0.0.1:" + std::to_string(server.port()) + "/", "{}", {}})
                  .ok());
  run_until_done(**client, rec, 1);
  EXPECT_FALSE(rec.ends[2].ok);
  EXPECT_EQ(rec.ends[2].error, "bad event");
  EXPECT_EQ(rec.events[2], (std::vector<std::string>{"ok"}));
}

TEST(HttpStreamClient, ConnectionRefusedIsAnErrorNotACrash) {
  // A port that was just free: bind, read it, close.
  int port = 0;
  {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    close(fd);
  }
  Recorder rec;
  auto client = HttpStreamClient::create(&rec);
  ASSERT_TRUE(client.ok());
  for (uint64_t id = 0; id < 3; ++id) {
    ASSERT_TRUE(
        (*client)->start(id, {"http://127.0.0.1:" + std::to_string(port) + "/", "{}", {}}).ok());
  }
  run_until_done(**client, rec, 3);
  for (auto& [id, end] : rec.ends) {
    EXPECT_FALSE(end.ok);
    EXPECT_EQ(end.http_status, 0);
    EXPECT_NE(end.error.find("onnect"), std::string::npos) << end.error;
  }
}

}  // namespace
}  // namespace dserve::cli
