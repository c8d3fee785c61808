// HTTP streaming client for `dserve bench serve`: many concurrent POST requests whose
// responses are Server-Sent Events, driven on ONE thread by libcurl's multi interface
// (non-blocking sockets + curl_multi_poll), so that a thousand open streams cost one
// thread and no locks.
//
// SseParser turns a byte stream, cut anywhere, into the payloads of its `data:` lines.
// HttpStreamClient runs the transfers and hands every payload, with the time it was
// read, to a StreamListener.
//
// Thread-safety: an HttpStreamClient and its listener belong to the thread that calls
// start() and poll(); nothing is shared with other threads. SseParser is a plain value.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace dserve::cli {

using SteadyTime = std::chrono::steady_clock::time_point;

// Splits an SSE byte stream into lines (ended by "\n", "\r\n" or "\r", possibly split
// across feed() calls) and collects the payload of each `data:` line, one leading
// space removed. Comment lines (":...") and other fields (event:, id:, retry:) are
// skipped. Each data line is its own event, as OpenAI-compatible servers send
// one-line JSON payloads and vLLM's benchmark client reads them line by line.
class SseParser {
 public:
  // Lines longer than this are an error (a server streaming garbage).
  static constexpr size_t kMaxLineBytes = size_t{16} << 20;

  // Appends the payloads of the lines completed by `bytes` to `out`.
  Status feed(std::string_view bytes, std::vector<std::string>& out);
  // End of stream: a last line without its newline still counts.
  void finish(std::vector<std::string>& out);

 private:
  void end_line(std::vector<std::string>& out);

  std::string line_;          // the current, incomplete line
  bool last_was_cr_ = false;  // a "\r" ended the last chunk: skip a leading "\n"
};

struct StreamRequest {
  std::string url;
  std::string body;                  // POSTed as is
  std::vector<std::string> headers;  // "Name: value"
};

// How a stream ended. ok: the server answered 2xx and the transfer completed.
struct StreamEnd {
  bool ok = false;
  int http_status = 0;  // 0 when no response came (connection refused, ...)
  std::string error;    // why !ok: the transport error, or "HTTP 500 ...: <body>"
  SteadyTime time;
};

// Receives the events of every stream. Called from inside HttpStreamClient::poll(),
// on its thread; must not call back into the client.
class StreamListener {
 public:
  virtual ~StreamListener() = default;
  // One SSE data payload of a 2xx response, read at `time`. A non-OK status aborts
  // this stream, which then ends with that status's message as its error.
  virtual Status on_event(uint64_t id, std::string_view data, SteadyTime time) = 0;
  // Exactly once per started stream, after its last on_event.
  virtual void on_end(uint64_t id, const StreamEnd& end) = 0;
};

class HttpStreamClient {
 public:
  static Result<std::unique_ptr<HttpStreamClient>> create(StreamListener* listener);
  ~HttpStreamClient();
  HttpStreamClient(const HttpStreamClient&) = delete;
  HttpStreamClient& operator=(const HttpStreamClient&) = delete;

  // Starts POSTing `request`; `id` (unique among active streams) names it to the
  // listener. The connection is made by later poll() calls.
  Status start(uint64_t id, StreamRequest request);

  // Waits at most `timeout` for network activity, then moves every stream as far as
  // its data allows, calling the listener. Returns early when data arrives.
  Status poll(std::chrono::milliseconds timeout);

  int n_active() const { return static_cast<int>(transfers_.size()); }

 private:
  struct Transfer;
  explicit HttpStreamClient(StreamListener* listener);
  void finish_done_transfers();
  static size_t on_body(char* data, size_t size, size_t n, void* user);
  static size_t on_header(char* data, size_t size, size_t n, void* user);

  StreamListener* listener_;
  void* multi_ = nullptr;  // CURLM*
  std::unordered_map<uint64_t, std::unique_ptr<Transfer>> transfers_;
};

// A blocking GET (for /v1/models before the run); the body when the status is 2xx.
Result<std::string> http_get(const std::string& url, const std::vector<std::string>& headers,
                             std::chrono::milliseconds timeout);

}  // namespace dserve::cli
