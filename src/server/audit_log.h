// AuditLog: one JSON line per served request for audits (e.g. China's MLPS level 3,
// which asks that every request's input and output be traceable): time, request id,
// a key id (a hash prefix of the API key, never the key), client address, endpoint,
// model, SHA-256 of the request body and of the response body as sent, token counts,
// status and latency. Lines are appended and flushed one at a time by a writer thread
// of its own, so a slow disk never holds up an HTTP thread or the engine.
//
//   {"time":"2026-01-01T12:00:00.123Z","request_id":"...","key_id":"sha256:1a2b...",
//    "client":"10.0.0.7:53124","method":"POST","endpoint":"/v1/completions",
//    "model":"m","request_sha256":"...","response_sha256":"...","prompt_tokens":5,
//    "completion_tokens":16,"status":200,"latency_ms":812.4}
//
// Thread-safety: record() may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "base/status.h"

namespace dserve::server {

// SHA-256 over bytes given piece by piece (OpenSSL's implementation).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::string_view bytes);
  // Lower-case hex; the object is finished after this.
  std::string hex_digest();
  static std::string hex(std::string_view bytes);

 private:
  void* ctx_;  // EVP_MD_CTX
};

struct AuditRecord {
  std::string request_id;
  std::string key_id;  // empty: the server has no API key
  std::string client;  // address:port
  std::string method, endpoint, model;
  std::string request_sha256;  // empty (null): the body was never read (refused key)
  std::string response_sha256;
  std::optional<int64_t> prompt_tokens, completion_tokens;  // when the response has usage
  int status = 0;
  double latency_ms = 0.0;
};

class AuditLog {
 public:
  // Opens `path` for appending (created if missing) and starts the writer thread.
  static Result<std::unique_ptr<AuditLog>> open(const std::string& path);
  // Writes what is queued, then closes the file.
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Queues one line; never waits for the disk.
  void record(AuditRecord r);

  // The id logged for an API key: "sha256:" and the first 16 hex digits of its hash.
  static std::string key_id(std::string_view api_key);

 private:
  AuditLog(std::FILE* file, std::string path);
  void run();

  std::FILE* file_;
  const std::string path_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> lines_;  // GUARDED_BY(mu_)
  bool stopping_ = false;          // GUARDED_BY(mu_)
  std::thread writer_;
};

}  // namespace dserve::server
