#include "server/audit_log.h"

#include <openssl/evp.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/log.h"

namespace dserve::server {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  DS_CHECK_MSG(ctx_ != nullptr, "EVP_MD_CTX_new failed");
  DS_CHECK(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(std::string_view bytes) {
  DS_CHECK(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), bytes.data(), bytes.size()) == 1);
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  DS_CHECK(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &n) == 1);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

std::string Sha256::hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return h.hex_digest();
}

std::string AuditLog::key_id(std::string_view api_key) {
  return "sha256:" + Sha256::hex(api_key).substr(0, 16);
}

Result<std::unique_ptr<AuditLog>> AuditLog::open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return io_error("--audit-log " + path + ": " + std::strerror(errno));
  return std::unique_ptr<AuditLog>(new AuditLog(f, path));
}

AuditLog::AuditLog(std::FILE* file, std::string path) : file_(file), path_(std::move(path)) {
  writer_ = std::thread([this] { run(); });
}

AuditLog::~AuditLog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
  std::fclose(file_);
}

void AuditLog::record(AuditRecord r) {
  using json = nlohmann::ordered_json;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now - secs).count());
  const std::time_t t = static_cast<std::time_t>(secs.count());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[40];
  const size_t n = std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(stamp + n, sizeof stamp - n, ".%03dZ", ms);
  auto opt = [](const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); };
  json line = {{"time", stamp},
               {"request_id", r.request_id},
               {"key_id", r.key_id.empty() ? json(nullptr) : json(r.key_id)},
               {"client", r.client},
               {"method", r.method},
               {"endpoint", r.endpoint},
               {"model", r.model.empty() ? json(nullptr) : json(r.model)},
               {"request_sha256", r.request_sha256.empty() ? json(nullptr) : json(r.request_sha256)},
               {"response_sha256", r.response_sha256},
               {"prompt_tokens", opt(r.prompt_tokens)},
               {"completion_tokens", opt(r.completion_tokens)},
               {"status", r.status},
               {"latency_ms", r.latency_ms}};
  std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.push_back(std::move(text));
  }
  cv_.notify_one();
}

void AuditLog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !lines_.empty(); });
    while (!lines_.empty()) {
      std::string line = std::move(lines_.front());
      lines_.pop_front();
      lock.unlock();
      // One line, then flushed: a reader (or a crash) never sees half a record from
      // this process.
      if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() ||
          std::fflush(file_) != 0) {
        DS_LOG_ERROR("audit log {}: write failed: {}", path_, std::strerror(errno));
      }
      lock.lock();
    }
    if (stopping_) return;
  }
}

}  // namespace dserve::server
